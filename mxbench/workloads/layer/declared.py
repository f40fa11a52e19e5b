"""The MoE layer, declared (``declaration.Workload``): ``mxbench layer``, its tables (one row per recipe, and per
stage), its figure, ``mxbench check --layer`` (its own stages against their oracles), and how ``regress``
re-measures a layer baseline (its layer, with mxkernels' stages)."""

from __future__ import annotations

from ..declaration import Check, Figures, Remeasure, TableKind, Workload
from . import TABLE_KINDS
from .command import layer

# The callables below import the tables, figures, kernels and checks when they run: `mxbench --help` builds the
# command line from this declaration.


def _render(kind, runs, request):
    """A layer run's tables: its recipes and stages as measured (or modelled), and the projection where asked."""
    from ...instruments.roofline import run_denominator
    from .tables import layer_table

    texts = [layer_table(run, request.fmt, kind=kind, columns=request.columns,
                         denominator=run_denominator(run, request.denominator))
             + (layer_table(run, request.fmt, project=request.project, header=False, columns=request.columns)
                if request.project else "")
             for _, run in runs]  # fmt: skip
    return "\n".join(texts)


def _figures(run, out, spec=None, project=None):
    from .figure import plot_layer

    return plot_layer(run, out, project=project)


def _check(*args):
    from .check import check_command

    return check_command(*args)


def _measure(baseline, options, instruments):
    from .measure import remeasure

    return remeasure(baseline, options, instruments)


def _table(kind):
    return TableKind(kind, lambda runs, request: _render(kind, runs, request))


LAYER = Workload(
    name="layer",
    commands=(layer,),
    tables=tuple(_table(kind) for kind in TABLE_KINDS),
    figures=Figures(_figures),
    check=Check(
        help="The MoE layer's own stages instead (router, permute, SwiGLU, combine, shared experts, the recipe's fused "
        "stages) in a layer of M/8 tokens, K, N, G experts, top-2: mxkernels' and any --impl STAGE=module:function of "
        "a layer stage (`mxbench layer`'s).",
        run=_check,
        ignores=("pad", "names"),
        why="--layer checks the layer's own stages (mxkernels' and --impl's), padded",
    ),
    remeasure=Remeasure(
        _measure, impl_refused="a layer baseline is re-measured with mxkernels' stages; `mxbench layer --impl` times "
        "another implementation"
    ),
)
