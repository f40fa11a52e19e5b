"""The map, declared (``declaration.Workload``): ``mxbench map``, its table (``table --kind map``), its heatmaps, and
how ``regress`` re-measures a map baseline (its grid, each cell by its scope's measurement). ``compare`` pairs two
map runs' records by point, and a cell's points are its own (M = the cell's rows, G its experts): its verdicts are
per cell."""

from __future__ import annotations

from ..declaration import Figures, Remeasure, TableKind, Workload
from .command import map_cmd

# The callables below import the tables, figures and measurement when they run: `mxbench --help` builds the command
# line from this declaration.


def _table(run, fmt="markdown", recipes=None, **kwargs):
    from .tables import map_table

    return map_table(run, fmt, recipes=recipes)


def _render(runs, request):
    return "\n".join(_table(run, request.fmt, request.recipes) for _, run in runs)


def _figures(run, out, spec=None, project=None):
    from .figure import plot_map

    return plot_map(run, out, project=project)


def _measure(baseline, options, instruments):
    from .measure import remeasure

    return remeasure(baseline, options, instruments)


MAP = Workload(
    name="map",
    commands=(map_cmd,),
    tables=(TableKind("map", _render, _table),),
    figures=Figures(_figures),
    remeasure=Remeasure(_measure, impl_refused="a map baseline is re-measured with mxkernels' stages; `mxbench map` "
                        "measures a grid with them"),
)
