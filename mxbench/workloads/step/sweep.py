"""Sweeps: the run that measures (or models) every point.

A sweep is a list of ``Point``s (``points.plan_points``: the cross product of M, recipe and power limit for one N,
K, G). For each point ``run_sweep`` times every stage of the recipe's training step, the bf16 baseline at the same
point, and the forward+backward of both autograd functions (``measure.StageTimer``), and turns them into
``Record``s. Without a GPU, ``model_run`` turns the same stages' declared costs into the analytic model's Records
instead. Nothing here computes a cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...instruments.kit import Instruments
from ...measuring.loop import measure_points
from ...measuring.metadata import common_metadata, run_metadata
from ...measuring.stages import StageTimer, SweepOptions, end_to_end_stage, error_message, stage_record
from ...plan.points import point_group_sizes, with_baselines
from ...storage.results import Point, Record, Run


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
    ``sharded.sharded_sweep``).
    """
    ins = instruments or Instruments.real(options.device, options.results_dir)
    work = with_baselines(points)
    run = Run(meta={**run_metadata(work, options, ins), **(meta or {})})
    return measure_points(run, work, StageTimer(options, ins), ins, options.out, progress)


def remeasure(options: SweepOptions, instruments: Instruments) -> Callable[[list[Point]], Run]:
    """``regress``'s measurement of a step baseline's points: a sweep of them, refused (as Ctrl-C) when stopped
    part-way, since a verdict on part of a round would mislead."""

    def measure(points: list[Point]) -> Run:
        run = run_sweep(points, options=options, instruments=instruments)
        if run.meta.get("interrupted"):  # the sweep kept its points; a verdict on part of a round would mislead
            raise KeyboardInterrupt
        return run

    return measure


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
