"""The loop every measuring workload runs its points through: each power limit applied once, a point measured whole
or not at all, GPU memory released and the run saved after each point, Ctrl-C keeping what was measured."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from ..instruments.kit import Instruments
from ..storage.results import Point, Run, save_run
from .metadata import now
from .progress import Progress


def _by_power_limit(points: Sequence[Point]) -> dict[float | None, list[Point]]:
    groups: dict[float | None, list[Point]] = {}
    for p in points:
        groups.setdefault(p.power_limit_w, []).append(p)
    return groups


def measure_points(run: Run, work: Sequence[Point], timer, ins: Instruments, out: Path | None, progress: bool) -> Run:
    """Every point of ``work`` measured whole by ``timer`` into ``run`` (the step's ``run_sweep``, and ``mxbench
    layer``'s): each power limit applied once, GPU memory released and the run saved after each point, Ctrl-C
    keeping the points measured and marking the run partial."""
    done = 0
    try:
        with Progress(len(work), progress) as bar:
            for limit, group in _by_power_limit(work).items():
                with nullcontext() if limit is None else ins.controller().applied(limit):
                    run.meta.setdefault("power_snapshots", []).append({"requested_w": limit, **ins.snapshot()})
                    for point in group:
                        bar.start(point)
                        run.records += timer.measure(point)  # a point goes in whole or not at all
                        done += 1
                        ins.release()
                        _save(run, out)
                        bar.finish(point)
    except KeyboardInterrupt:
        run.meta["interrupted"] = True
        run.meta["partial"] = f"interrupted (Ctrl-C) after {done} of {len(work)} points"
    run.meta["finished"] = now()
    _save(run, out)
    return run


def _save(run: Run, out: Path | None) -> None:
    if out is not None:
        save_run(run, out)




def _save(run: Run, out: Path | None) -> None:
    if out is not None:
        save_run(run, out)
