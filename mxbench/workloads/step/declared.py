"""The step, declared (``declaration.Workload``): ``mxbench roofline``, its four tables, its figures, and how
``regress`` re-measures a baseline of it. Runs that record no kind are the step's."""

from __future__ import annotations

from functools import partial

from ..declaration import Figures, Remeasure, TableKind, Workload
from .command import roofline

# The callables below import the tables, figures and sweep when they run: pandas, matplotlib and the kernels stay out
# of `mxbench --help`, which builds the command line from this declaration.


def _table(kind, run, fmt="markdown", **kwargs):
    from .tables import step_table

    return step_table(run, kind, fmt, **kwargs)


def _render(kind, runs, request):
    from .table_text import filtered_tables

    return filtered_tables(runs, kind, request, partial(_table, kind))


def _figures(data, out, spec=None, project=None):
    from .plots import plot_step

    return plot_step(data, out, spec=spec, project=project)


def _measure(baseline, options, instruments):
    from .sweep import remeasure

    return remeasure(options, instruments)


def _sharded_regress(baseline, **kwargs):
    from .sharded import sharded_regress

    return sharded_regress(baseline, **kwargs)


STEP = Workload(
    name="roofline",
    commands=(roofline,),
    tables=tuple(TableKind(kind, partial(_render, kind), partial(_table, kind))
                 for kind in ("breakdown", "speedup", "sweep", "power")),  # fmt: skip
    figures=Figures(_figures),
    remeasure=Remeasure(_measure, sharded=_sharded_regress),
)
