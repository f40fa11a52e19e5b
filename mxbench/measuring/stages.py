"""Measuring one point: the timer that turns each stage (and the forward+backward) into its ``Record``.

Every stage of the point's step is timed alone, then the forward+backward of the recipe's autograd function; a
stage that fails becomes an error row naming the exception, and the rest of the point goes on. Records copy the
cost the stage declared; nothing here computes a cost.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxkernels.core.cost import Cost
from mxkernels.core.names import END_TO_END_STAGE, Category, Pass, end_to_end_kernel, end_to_end_purpose

from ..instruments.cards import DEFAULT_CARD
from ..instruments.hardware import get_spec
from ..instruments.kit import Instruments
from ..instruments.roofline import below_floor
from .fresh import SECOND_SEED, fresh_inputs
from ..plan.points import BASELINE, point_group_sizes
from ..storage.results import OURS, Point, Record


@dataclass(frozen=True)
class SweepOptions:
    """How ``run_sweep`` measures, and what it records beside the measurements.

    ``out``: results file, rewritten after every point so an interrupted sweep keeps what it measured.
    ``impls``: implementations (``registry.Implementation``) that run their stage in place of mxkernels' in the
    points of their recipe, in every stage timing and in the forward+backward.
    """

    cold_l2: bool = True
    use_graph: bool = True
    samples: int = 25
    device: int = 0
    backend: str | None = None
    out: Path | None = None
    results_dir: Path = Path("results")
    hardware: str | None = DEFAULT_CARD
    denominator: str = "datasheet"
    command: str = ""
    impls: tuple = ()

    def impls_for(self, recipe: str) -> dict[str, Any]:
        """Stage name -> implementation replacing mxkernels' at points of ``recipe``."""
        return {i.stage: i for i in self.impls if i.recipe == recipe}

    def timing(self) -> dict[str, Any]:
        return {"cold_l2": self.cold_l2, "use_graph": self.use_graph, "samples": self.samples}


def error_message(e: BaseException) -> str:
    """One line for an error row: the exception and where it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}{at}"


def _cost_fields(stage) -> dict[str, Any]:
    c = stage.cost
    return {"bytes_read": c.bytes_read, "bytes_written": c.bytes_written, "flops": c.flops, "precision": c.precision}


def stage_record(point: Point, stage, **fields) -> Record:
    """A Record of ``stage`` at ``point`` with the stage's own cost (copied, never recomputed) and ``fields``."""
    return Record(
        point=point, pass_name=str(stage.pass_name), stage=stage.name, kernel=stage.kernel,
        category=str(stage.category), purpose=stage.purpose, shapes=stage.shapes, backend=stage.backend,
        impl=getattr(stage, "impl", OURS), **_cost_fields(stage), **fields,
    )  # fmt: skip


def _timed_fields(t, telemetry: dict) -> dict[str, Any]:
    """Record fields of a ``Timing``: its samples and method; how it was taken goes beside the telemetry
    (``window_includes_flush``: whether the energy per call counts the cold-L2 flush before each call)."""
    details = {
        "calls_per_replay": t.calls_per_replay, "flush_us": t.flush_us, "kernels_per_call": t.kernels_per_call,
        "memcpy_nodes": t.memcpy_nodes, "memset_nodes": t.memset_nodes,
        "window_includes_flush": t.window_includes_flush,
    }  # fmt: skip
    return {"method": t.method, "samples_us": list(t.samples_us), "telemetry": {**telemetry, **details}}


@dataclass(frozen=True)
class EndToEnd:
    """The forward+backward of a recipe's autograd function as a pseudo-stage. Its cost is the sum of the costs
    its stages declare (zero when they could not be planned); ``impl`` names the implementations it ran."""

    recipe: str
    shapes: tuple[tuple[int, ...], ...]
    cost: Cost
    impl: str = OURS
    pass_name: str = Pass.END_TO_END
    name: str = END_TO_END_STAGE
    category: str = Category.END_TO_END
    backend: str | None = None

    @property
    def kernel(self) -> str:
        return end_to_end_kernel(self.recipe)

    @property
    def purpose(self) -> str:
        return end_to_end_purpose(self.recipe)


def end_to_end_stage(point: Point, stages: Sequence) -> EndToEnd:
    """The forward+backward of ``point``'s recipe as a pseudo-stage costing what ``stages`` declare together."""
    total = sum((s.cost for s in stages), Cost(0, 0))
    impls = sorted({s.impl for s in stages if getattr(s, "impl", OURS) != OURS})
    return EndToEnd(point.recipe, ((point.M, point.K), (point.G, point.K, point.N)), total, "+".join([OURS, *impls]))


class StageTimer:
    """Times stages with the options and instruments of one run and turns each into its Record. A time below the
    stage's roofline floor on the run's card (``roofline.below_floor``) is recorded as impossible, not as a time."""

    def __init__(self, options: SweepOptions, ins: Instruments):
        self.options, self.ins = options, ins
        try:
            self.spec = get_spec(options.hardware) if options.hardware else None
        except ValueError:  # a spec this mxbench does not know: no floor to hold times to
            self.spec = None

    def _held_to_floor(self, record: Record, stage) -> Record:
        if self.spec is not None and record.ok and record.measured:
            record.impossible = below_floor(record.median_us, stage.cost, self.spec)
        return record

    def time(
        self, point: Point, stage, fn: Callable[[], object], *, use_graph: bool | None = None, eager_fallback=False,
        fresh=None,
    ) -> Record:
        """``fn`` timed with a telemetry sampler as the timer's ``window``, so the sampler sees only ``fn``'s timed
        replays (not warm-up, estimate, capture or flush-only replays) and energy per call = energy over the window
        / (replays x calls per replay). An exception becomes the record's error.

        ``use_graph`` overrides the options' for callables a CUDA graph cannot capture (host syncs). With
        ``eager_fallback`` a callable that fails under graph timing is timed again with eager events (its
        ``method`` says so and ``telemetry["graph_error"]`` why). ``fresh`` (``measuring.fresh.FreshInputs``): new
        input values between the timed calls and the last call's outputs held to the oracle.
        """
        o = self.options
        graph = o.use_graph if use_graph is None else use_graph
        cold = o.cold_l2 or not graph  # eager event timing flushes before every call: it is always cold
        try:
            sampler = self.ins.telemetry()
            kw = {} if fresh is None else {"fresh": fresh}  # a test's timing double may not take it
            with fresh if fresh is not None else nullcontext():
                t = self.ins.time_fn(fn, cold_l2=cold, use_graph=graph, samples=o.samples, window=lambda: sampler,
                                     **kw)  # fmt: skip
            calls = len(t.samples_us) * t.calls_per_replay
            fields = _timed_fields(t, dict(sampler.summary(calls)))
            if fresh is not None:
                fields["telemetry"]["refilled"] = True  # the window holds one copy of the inputs per replay too
            return self._held_to_floor(stage_record(point, stage, **fields), stage)
        except Exception as e:  # noqa: BLE001 -- a kernel that fails becomes its error row; the point goes on
            if eager_fallback and graph:
                eager = self.time(point, stage, fn, use_graph=False)
                if eager.ok:
                    eager.telemetry["graph_error"] = error_message(e)
                    return eager
            return stage_record(point, stage, error=error_message(e))

    def measure(self, point: Point) -> list[Record]:
        """Every stage of ``point`` timed alone, then its forward+backward; failures become error rows."""
        sizes = point_group_sizes(point)
        args = (point.recipe, point.M, point.N, point.K, point.G, sizes)
        kw = {"mode": point.mode, "backend": None if point.recipe == BASELINE else self.options.backend}
        impls = self.options.impls_for(point.recipe)
        if impls:
            kw["impls"] = impls
        if point.fuse_scales:
            kw["fuse_scales"] = True
        device = {"device": f"cuda:{self.options.device}", "seed": point.seed}
        try:
            planned = self.ins.plan_step(*args, **kw)
        except Exception as e:  # noqa: BLE001 -- a point that cannot be planned is one error row
            return [stage_record(point, end_to_end_stage(point, []), error=error_message(e))]
        records = []
        try:
            stages = self.ins.build_step(*args, **kw, **device)
            fresh = [None] * len(stages)
            if self.ins.step_env is not None:
                second = self.ins.step_env(stages, *args[1:], device=device["device"], seed=point.seed + SECOND_SEED)
                fresh = fresh_inputs(stages, second, impls)
            records += [self.time(point, s, s.run, fresh=f) for s, f in zip(stages, fresh, strict=True)]
        except Exception as e:  # noqa: BLE001 -- no tensors for the stages: each planned stage says why
            records += [stage_record(point, s, error=error_message(e)) for s in planned]
        stages = fresh = second = None  # drop the tensors before the end-to-end call allocates its own
        e2e = end_to_end_stage(point, planned)
        try:
            step = self.ins.end_to_end(*args, **kw, **device)
            records.append(self.time(point, e2e, step, eager_fallback=True))
        except Exception as e:  # noqa: BLE001 -- the forward+backward that cannot be built is its error row
            records.append(stage_record(point, e2e, error=error_message(e)))
        return records
