"""Several GEMM backends of one recipe timed in one invocation against one bf16 baseline.

Two ``mxbench roofline --backend X`` runs each time their own bf16 step, and the bf16 step moves between runs (17309
against 17730 us at DeepSeek-V3 on one H100): their "over bf16" ratios then divide by different numbers.
``compare_backends`` measures each bf16 baseline point once, then every recipe point once per backend, all with one
card, one set of instruments and the same timing options, and returns one ``Run`` per backend: that backend's recipe
records beside the *same* bf16 records (``meta["shared_baseline"]`` says so), so ``mxbench table A B --kind
speedup`` divides both backends by one measurement and the ratio of the two steps is exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from mxkernels.core.names import BASELINE

from ...instruments.kit import Instruments
from ...measuring.loop import measure_points
from ...measuring.metadata import run_metadata
from ...measuring.stages import StageTimer, SweepOptions
from ...plan.points import with_baselines
from ...storage.results import Point, Run, save_run


def compare_backends(points: Sequence[Point], backends: Sequence[str], *, options: SweepOptions,
                     instruments: Instruments, progress: bool = True) -> dict[str, Run]:  # fmt: skip
    """Backend -> its Run: the bf16 baselines of ``points`` measured once, each recipe point once per backend."""
    if len(set(backends)) != len(backends) or len(backends) < 2:
        raise ValueError(f"compare two or more distinct backends, got {list(backends)}")
    work = with_baselines(points)
    baselines = [p for p in work if p.recipe == BASELINE]
    recipe_points = [p for p in work if p.recipe != BASELINE]
    shared = measure_points(Run(meta={}), baselines, StageTimer(options, instruments), instruments, None, progress)
    note = (f"one bf16 measurement in this invocation, the same records in the runs of every backend compared "
            f"({', '.join(backends)})")  # fmt: skip
    runs = {}
    for backend in backends:
        opts = dataclasses.replace(options, backend=backend, out=None)
        run = Run(meta={**run_metadata(work, opts, instruments), "shared_baseline": note,
                        "backends_compared": list(backends)})  # fmt: skip
        run = measure_points(run, recipe_points, StageTimer(opts, instruments), instruments, None, progress)
        run.records += shared.records
        if shared.meta.get("interrupted"):
            run.meta["interrupted"], run.meta["partial"] = True, "bf16 baseline: " + shared.meta["partial"]
        runs[backend] = run
        if run.meta.get("interrupted"):
            break
    return runs


def save_backends(runs: dict[str, Run], folder: Path, stem: str) -> list[Path]:
    """Each backend's Run as ``<folder>/<stem>-<backend>.json`` (and its CSV)."""
    return [save_run(run, folder / f"{stem}-{backend}.json")[0] for backend, run in runs.items()]
