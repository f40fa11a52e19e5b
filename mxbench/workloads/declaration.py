"""What a workload declares, so that the command line and the readers of stored runs loop over the workloads and
name none: its commands, the table kinds of its runs (each with what renders it), its figures, its check, how a
baseline of it is re-measured (``mxbench regress``) and any ceiling only several processes measure.

A declaration imports nothing heavy: ``mxbench --help`` builds the command line from every declaration, so the
callables below import their modules when they run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click


@dataclass(frozen=True)
class TableRequest:
    """What ``mxbench table`` was asked for, handed whole to a table kind (each uses what its tables take)."""

    fmt: str
    passes: tuple[str, ...] | None = None
    Ms: tuple[int, ...] | None = None
    recipes: tuple[str, ...] | None = None
    card: str | None = None
    columns: tuple[str, ...] | None = None
    denominator: str | None = None
    """The --denominator given (None: the run's own; "none": no efficiency column)."""
    project: str | None = None


@dataclass(frozen=True)
class TableKind:
    """One ``table --kind``: ``render`` turns the chosen (path, run) pairs into the command's text; ``table``, where
    given, renders one run in Python (``reporting.tables.table``)."""

    name: str
    render: Callable[[Sequence[tuple[Path, Any]], TableRequest], str]
    table: Callable[..., str] | None = None


@dataclass(frozen=True)
class Figures:
    """``one(run_or_frame, out, spec, project) -> [paths]`` draws one run's figures; ``several(paths, out, hardware,
    project) -> path``, where given, one figure of several stored runs side by side (``mxbench plot A B ...``)."""

    one: Callable[..., list[Path]]
    several: Callable[..., Path] | None = None


@dataclass(frozen=True)
class Check:
    """A ``--<workload>`` flag of ``mxbench check``: ``run(...) -> exit code`` checks the workload's own stages;
    ``ignores`` are the check options it has no use for, refused with ``why``."""

    help: str
    run: Callable[..., int]
    ignores: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Remeasure:
    """How ``mxbench regress`` re-measures a baseline of this workload: ``measure(baseline, options, instruments)``
    returns ``points -> Run``; ``sharded(baseline, options, instruments, **kwargs)``, where given, runs the whole
    regress over every GPU of a torchrun launch; ``impl_refused``, where given, says why ``--impl`` is refused
    (the baseline's own implementations are re-measured, by name, otherwise)."""

    measure: Callable[..., Callable[[list], Any]]
    sharded: Callable[..., Any] | None = None
    impl_refused: str | None = None


@dataclass(frozen=True)
class Workload:
    """One workload. ``name`` is the ``kind`` its runs record in their metadata (and the command that makes them);
    a run that records none is the first registered workload's (``registered.WORKLOADS``)."""

    name: str
    commands: tuple[click.Command, ...]
    tables: tuple[TableKind, ...]
    figures: Figures
    check: Check | None = None
    remeasure: Remeasure | None = None
    ceiling: Callable[[Path, Callable[[str], None]], int] | None = None
    """Measures and stores a ceiling that only several processes measure (``mxbench ceilings`` under torchrun with
    more than one process): ``ceiling(out_dir, echo) -> exit code``."""

    @property
    def table_kinds(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)
