"""The workloads mxbench knows, one line each (a new workload: its folder with a ``declared.py``, and a line here).
The command line, the tables, the figures, ``check`` and ``regress`` loop over them and name none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .declaration import TableKind, Workload
from .ep.declared import EP
from .layer.declared import LAYER
from .map.declared import MAP
from .peers.declared import PEERS
from .step.declared import STEP

if TYPE_CHECKING:  # the results module loads the kernels' errors: not at `mxbench --help`
    from ..storage.results import Run

WORKLOADS: tuple[Workload, ...] = (
    STEP,  # first: a run that records no kind is the step's
    PEERS,
    EP,
    LAYER,
    MAP,
)


def workload_of(run: Run) -> Workload:
    """The workload that made ``run`` (its ``meta["kind"]``; none, or one no workload declares: the first's)."""
    kind = run.meta.get("kind")
    return next((w for w in WORKLOADS if w.name == kind), WORKLOADS[0])


def table_kinds() -> tuple[TableKind, ...]:
    """Every workload's table kinds, in the order ``table --kind`` lists them."""
    return tuple(t for w in WORKLOADS for t in w.tables)


def owner_of(kind: str) -> Workload | None:
    """The workload whose runs have the table ``kind``."""
    return next((w for w in WORKLOADS if kind in w.table_kinds), None)
