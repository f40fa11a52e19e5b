"""The peers, declared (``declaration.Workload``): ``mxbench peers``, its table and its figure. A peers baseline is
re-measured as the step's points are (``regress``: the first workload's)."""

from __future__ import annotations

from ..declaration import Figures, TableKind, Workload
from .command import peers

# The callables below import the tables and figures when they run: `mxbench --help` builds the command line from
# this declaration.


def _table(run, fmt="markdown", **kwargs):
    from .tables import peers_table

    return peers_table(run, fmt, **kwargs)


def _render(runs, request):
    from ..step.table_text import filtered_tables

    return filtered_tables(runs, "peers", request, _table)


def _figures(data, out, spec=None, project=None):
    from .figure import plot_peers

    return plot_peers(data, out, spec=spec, project=project)


PEERS = Workload(
    name="peers",
    commands=(peers,),
    tables=(TableKind("peers", _render, _table),),
    figures=Figures(_figures),
)
