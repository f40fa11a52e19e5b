"""Expert parallelism, declared (``declaration.Workload``): ``mxbench ep`` and ``mxbench ep-project``, the EP
tables (per stage, per strategy, and per EP degree over several runs), the EP figure and the EP-degree figure of
several runs, and the all-to-all ceiling that ``mxbench ceilings`` measures under torchrun."""

from __future__ import annotations

import click

from ..declaration import Figures, TableKind, Workload
from . import TABLE_KINDS
from .command import ep
from .project_command import ep_project

# The callables below import the tables, figures and torch.distributed when they run: `mxbench --help` builds the
# command line from this declaration.


def _per_run(kind, runs, request):
    """``--kind ep`` / ``ep-summary``: each run's table; the EP tables choose their strategies themselves (--recipe)."""
    from .tables import ep_table

    return "\n".join(ep_table(run, kind, request.fmt, columns=request.columns, strategies=request.recipes)
                     for _, run in runs)  # fmt: skip


def _scaling(runs, request):
    """``--kind ep-scaling``: one table over all the runs, each one EP degree."""
    from .scaling import scaling_table

    return scaling_table([run for _, run in runs], request.fmt, columns=request.columns, strategies=request.recipes)


def _figures(run, out, spec=None, project=None):
    from mxkernels.core.errors import InputError

    from ...storage.outputs import IMAGE_SUFFIXES
    from .figure import plot_ep

    if project is not None:
        raise InputError("an expert-parallel run has no single-GPU step to project")
    return [plot_ep(run, out if out.suffix.lower() in IMAGE_SUFFIXES else out / "ep.png")]


def _several(paths, out, hardware=None, project=None):
    """The EP-degree figure of the runs of one layer at ``paths`` (``out`` a folder: ``ep-scaling.png`` in it)."""
    from ...storage.outputs import IMAGE_SUFFIXES
    from ...storage.results import load_run
    from .scaling import plot_scaling

    if hardware or project:
        raise click.BadParameter("several runs draw the EP-degree figure, which takes no --hardware/--project")
    target = out if out.suffix.lower() in IMAGE_SUFFIXES else out / "ep-scaling.png"
    return plot_scaling([load_run(path) for path in paths], target)


def _ceiling(out_dir, echo):
    from .ceiling import run_alltoall_ceiling

    return run_alltoall_ceiling(out_dir, echo=echo)


def _table(kind):
    if kind == "ep-scaling":
        return TableKind(kind, _scaling)
    return TableKind(kind, lambda runs, request: _per_run(kind, runs, request))


EP = Workload(
    name="ep",
    commands=(ep, ep_project),
    tables=tuple(_table(kind) for kind in TABLE_KINDS),
    figures=Figures(_figures, several=_several),
    ceiling=_ceiling,
)
