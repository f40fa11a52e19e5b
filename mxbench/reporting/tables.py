"""Tables of stored runs of any workload: which table kinds a run has (its workload's), and one table of a run.
The kinds and what renders each are the workloads' own (``Workload.tables``); nothing here names one."""

from __future__ import annotations

from typing import Any

from mxkernels.core.errors import InputError

from ..storage.results import Run
from ..workloads.declaration import TableKind
from ..workloads.registered import WORKLOADS, owner_of, table_kinds, workload_of


def table_kind(kind: str) -> TableKind:
    """The table kind named ``kind``; an unknown one is bad input naming them all."""
    found = {t.name: t for t in table_kinds()}
    if kind not in found:
        raise InputError(f"kind must be one of {list(found)}, got {kind!r}")
    return found[kind]


def check_kind(run: Run, kind: str, where: str = "this run") -> None:
    """Each kind of run has its workload's tables (a run that records no kind: the first workload's); a table asked
    of the wrong kind of run is refused, naming the right ones."""
    run_kind = run.meta.get("kind") or WORKLOADS[0].name
    mine = workload_of(run)
    if kind in mine.table_kinds:
        return
    table_kind(kind)  # an unknown kind: named as such
    if mine is WORKLOADS[0]:  # the first workload's run (or one of a kind no workload declares)
        raise InputError(f"--kind {kind} needs a run of `mxbench {owner_of(kind).name}`; {where} is not one: its "
                         f"tables are {', '.join(mine.table_kinds)}")  # fmt: skip
    raise InputError(f"{where} is a {run_kind} run (made by `mxbench {run_kind}`): its tables are --kind "
                     f"{', '.join(mine.table_kinds)}, not {kind}")  # fmt: skip


def table(run: Run, kind: str = "breakdown", fmt: str = "markdown", **kwargs: Any) -> str:
    """One table of ``run`` rendered in ``fmt``, preceded (except in csv) by its header block: ``kind`` one of
    ``table_kinds()`` that renders one run (the step's breakdown, speedup, sweep, power; the peers table).
    ``kwargs``: columns, denominator ("datasheet" | "measured" | None), header, and the filters (passes, M, recipe,
    card)."""
    check_kind(run, kind)
    found = table_kind(kind)
    if found.table is None:
        raise InputError(f"--kind {kind} renders through `mxbench table` only")
    return found.table(run, fmt, **kwargs)
