"""The figures of stored runs of any workload (``mxbench plot``): each run's figures are its workload's
(``Workload.figures``); several runs side by side, the figure of the workload that draws several."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..instruments.hardware import HardwareSpec
from ..storage.results import Run
from ..workloads.declaration import Workload
from ..workloads.registered import WORKLOADS, workload_of


def _workload(data: Run | pd.DataFrame) -> Workload:
    """The workload of a run, or of the one kind a frame's rows were made by (else the first workload's)."""
    if isinstance(data, Run):
        return workload_of(data)
    kinds = set(data["run_kind"]) if len(data) else set()
    named = {w.name: w for w in WORKLOADS}
    return named.get(next(iter(kinds)), WORKLOADS[0]) if len(kinds) == 1 else WORKLOADS[0]


def plot_all(data: Run | pd.DataFrame, out: str | Path, spec: HardwareSpec | None = None,
             project: str | None = None) -> list[Path]:  # fmt: skip
    """Every figure the run has data for (its workload's); with ``project`` (a spec key, e.g. "b200") the
    projection onto it too, where the workload has one.

    ``out`` ending in .png/.svg/.pdf: one sheet. Otherwise a folder: one file per figure. Returns the paths written.
    """
    return _workload(data).figures.one(data, Path(out), spec=spec, project=project)


def plot_several(paths: Sequence[Path], out: Path, hardware: str | None = None, project: str | None = None) -> Path:
    """One figure of the stored runs at ``paths`` side by side, by the first workload that draws several (it reads
    them, and says what it needs of them, and of ``hardware`` and ``project``)."""
    drawer = next(w for w in WORKLOADS if w.figures.several is not None)
    return drawer.figures.several(paths, out, hardware=hardware, project=project)
