"""Sweeps: the run that measures (or models) every point.

A sweep is a list of ``Point``s (``points.plan_points``: the cross product of M, recipe and power limit for one N,
K, G). For each point ``run_sweep`` times every stage of the recipe's training step, the bf16 baseline at the same
point, and the forward+backward of both autograd functions (``measure.StageTimer``), and turns them into
``Record``s. Without a GPU, ``model_run`` turns the same stages' declared costs into the analytic model's Records
instead. Nothing here computes a cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

from ...instruments.kit import Instruments
from ...measuring.stages import StageTimer, SweepOptions, end_to_end_stage, error_message, stage_record
from ...measuring.metadata import common_metadata, now, run_metadata
from ...plan.points import point_group_sizes, with_baselines
from ...measuring.progress import Progress
from ...storage.results import Point, Record, Run, save_run


def _by_power_limit(points: Sequence[Point]) -> dict[float | None, list[Point]]:
    groups: dict[float | None, list[Point]] = {}
    for p in points:
        groups.setdefault(p.power_limit_w, []).append(p)
    return groups


def run_sweep(
    points: Sequence[Point],
    *,
    options: SweepOptions,
    progress: bool = True,
    instruments: Instruments | None = None,
    meta: dict | None = None,
) -> Run:
    """Measure every point (plus its bf16 baseline) and return the Run; see the module docstring.

    Points are grouped by power limit and each limit is applied once through ``PowerController.applied`` (a None
    limit is never touched). After each point GPU memory is released and, with ``options.out``, the Run saved.
    Ctrl-C stops the sweep: the limit is restored, the partial Run (the points measured whole) saved and returned
    with ``meta["interrupted"] = True`` and ``meta["partial"]`` saying how many points it holds. ``meta`` is added
    to the Run's metadata (a rank of a sharded sweep marks the file it saves as its share only:
    ``shard.sharded_sweep``).
    """
    ins = instruments or Instruments.real(options.device, options.results_dir)
    work = with_baselines(points)
    run = Run(meta={**run_metadata(work, options, ins), **(meta or {})})
    return measure_points(run, work, StageTimer(options, ins), ins, options.out, progress)


def measure_points(run: Run, work: Sequence[Point], timer, ins: Instruments, out: Path | None, progress: bool) -> Run:
    """Every point of ``work`` measured whole by ``timer`` into ``run`` (``run_sweep``'s loop, and ``mxbench
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


# ---------------------------------------------------------------------------------------------- the model


def model_run(
    points: Sequence[Point],
    *,
    spec,
    hardware: str,
    command: str = "",
    plan_step: Callable[..., list] | None = None,
    model_records: Callable[..., list[Record]] | None = None,
) -> Run:
    """The analytic model of every point (plus its bf16 baseline): the stages' declared costs over ``spec``.

    Records carry ``measured=False``; the Run's meta says "model, not measured".
    """
    if plan_step is None:
        from mxkernels.stages.pipeline import plan_step
    from ...instruments.roofline import MODEL_ASSUMPTION

    if model_records is None:
        from ...instruments.roofline import model_records
    work = with_baselines(points)
    run = Run(meta={**common_metadata(work, command), "hardware": hardware, "measured": False,
                    "label": "model, not measured", "model": MODEL_ASSUMPTION})  # fmt: skip
    for p in work:
        try:
            fused = {"fuse_scales": True} if p.fuse_scales else {}
            stages = plan_step(p.recipe, p.M, p.N, p.K, p.G, point_group_sizes(p), mode=p.mode, **fused)
            run.records += model_records(p, stages, spec)
        except Exception as e:  # noqa: BLE001 -- a point the model cannot price is its error row
            run.records.append(stage_record(p, end_to_end_stage(p, []), measured=False, error=error_message(e)))
    return run
