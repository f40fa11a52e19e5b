"""The measurement of an EP run: every stage of each strategy and its whole step, timed on every rank.

Per strategy, on every rank: the routing (``route`` on the device; the split counts' exchange, which copies to the
host and so is timed with events), then one eager run of the whole step so that every stage sees real data, then
each stage alone, then the forward + backward of the EP layer as one call (``fwd+bwd``: the step with its routing
fixed, since the exchange's host copy cannot be captured). Rank 0 gathers every rank's samples and writes one
Record per stage: its samples and cost are those of the slowest rank (the critical path of a collective step);
``telemetry["ranks"]`` keeps every rank's statistics and cost, ``telemetry["across_ranks"]`` the min / median / max
of the per-rank medians.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from mxkernels.core.cost import Cost
from mxkernels.autograd.ep_projection import exchange_split_counts
from mxkernels.ep.comm import exchange_counts_cost
from mxkernels.ep.wgrad import resolve_wgrad
from mxkernels.core.names import END_TO_END_STAGE, Category, Pass
from mxkernels.stages.pipeline import run_stages
from mxkernels.moe.token_permute import route

from ...measuring.dist import Context, gather
from ...storage.results import Point, Record
from .check import EPOptions, rank_inputs, strategy_stages
from .rank_timing import across_ranks, time_on_ranks
from .workload import workload

ROUTING_NOTE = "routing: not in the captured step (the split counts reach the host once per step)"


@dataclass(frozen=True)
class Timed:
    """What a record says about the call it times (a pipeline ``Stage`` or one of the routing calls)."""

    pass_name: str
    name: str
    kernel: str
    category: str
    purpose: str
    shapes: tuple[tuple[int, ...], ...]
    cost: Cost
    backend: str | None = None
    impl: str = "mxkernels"
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, stage) -> Timed:
        return cls(stage.pass_name.value, stage.name, stage.kernel, stage.category.value, stage.purpose, stage.shapes,
                   stage.cost, stage.backend, stage.impl)  # fmt: skip


def _entry(timed: Timed, t) -> dict[str, Any]:
    c = timed.cost
    return {"timed": timed, "samples_us": t.samples_us, "method": t.method, "error": t.error,
            "stats": {**t.summary(), "bytes_read": c.bytes_read, "bytes_written": c.bytes_written, "flops": c.flops,
                      "shapes": [list(s) for s in timed.shapes]}}  # fmt: skip


def _record(point: Point, entries: Sequence[dict[str, Any]], tags: dict[str, Any]) -> Record:
    """One Record from every rank's entry of the same call (module doc); ``tags`` go into its telemetry."""
    stats = [e["stats"] for e in entries]
    spread = across_ranks(stats)
    chosen = entries[spread["slowest_rank"]] if spread else entries[0]
    t: Timed = chosen["timed"]
    errors = sorted({f"rank {e['stats']['rank']}: {e['error']}" for e in entries if e["error"]})
    return Record(
        point=point, pass_name=t.pass_name, stage=t.name, kernel=t.kernel, category=t.category, purpose=t.purpose,
        shapes=t.shapes, bytes_read=t.cost.bytes_read, bytes_written=t.cost.bytes_written, flops=t.cost.flops,
        precision=t.cost.precision, backend=t.backend, method=chosen["method"], samples_us=list(chosen["samples_us"]),
        telemetry={"ranks": stats, "across_ranks": spread, **t.notes, **tags}, impl=t.impl,
        error="; ".join(errors) if errors and not spread else None,
    )  # fmt: skip


def _routing_calls(ctx: Context, inputs, o: EPOptions) -> list[tuple[Timed, Callable[[], object], bool]]:
    """(what, call, graph-capturable) of the two routing calls."""
    experts, world = inputs["experts"], ctx.world
    routed = route(experts, world * o.E)
    send = routed["counts"].view(world, o.E)
    S, note = o.T * o.top_k, {"note": ROUTING_NOTE}
    sort_cost = Cost(S * 8, S * 12 + world * o.E * 4)  # read the int64 ids; write order, token_of and pos; counts
    return [
        (Timed(Pass.FORWARD.value, "route", "argsort + scatter_add", Category.PERMUTE.value,
               "Sort the token copies by global expert and count them", ((o.T, o.top_k),), sort_cost, notes=note),
         lambda: route(experts, world * o.E), True),
        (Timed(Pass.FORWARD.value, "exchange_counts", "all_to_all_single + copy to host", Category.ALL_TO_ALL.value,
               "Exchange the per-expert counts; copy the split sizes to the host", ((world, o.E),),
               exchange_counts_cost(world, o.E), notes=note),
         lambda: exchange_split_counts(send, ctx.group), False),
    ]  # fmt: skip


def measure_strategy(ctx: Context, strategy: str, o: EPOptions, *, graph: bool, samples: int, impls=(),
                     progress: Callable[[str], None] = lambda _: None) -> list[Record] | None:  # fmt: skip
    """The Records of one strategy on rank 0 (None on the other ranks); see the module doc."""
    point = Point(o.T, o.N, o.K, o.E, strategy, o.mode, o.groups, o.seed)
    inputs = rank_inputs(ctx, o)
    entries = []
    for timed, call, capturable in _routing_calls(ctx, inputs, o):
        progress(f"{strategy}/{timed.name}")
        entries.append(_entry(timed, time_on_ranks(ctx, call, graph=graph and capturable, samples=samples)))
    part = workload(o)
    plan = part.plan(ctx, inputs, o)
    stages = strategy_stages(ctx, strategy, plan, o, impls)
    env = run_stages(stages, {**inputs, **plan.tensors})
    for stage in stages:
        progress(f"{strategy}/{stage.name}")
        entries.append(_entry(Timed.of(stage), _time_stage(ctx, stage, env, graph, samples)))
    env = None  # drop every intermediate before the step allocates its own
    _release(ctx)
    progress(f"{strategy}/{END_TO_END_STAGE}")
    entries.append(_entry(_step_timed(strategy, stages, o), _time_step(ctx, o, inputs, plan, stages, graph, samples)))
    _release(ctx)
    overlap = o.layer is not None and o.layer.overlap
    if overlap:  # the same step with the shared experts in line: the overlap's gain as a number
        progress(f"{strategy}/{END_TO_END_STAGE} (shared experts in line)")
        serial = _entry(_step_timed(strategy, stages, o), _time_step(ctx, o, inputs, plan, stages, graph, samples,
                                                                     overlap=False))  # fmt: skip
        _release(ctx)
    every = gather(ctx, entries + ([serial] if overlap else []))
    if not ctx.root:
        return None
    tags = {"part": part.part.value, "wgrad": resolve_wgrad(strategy, o.wgrad).value}  # what each record measured
    if o.layer is not None and o.layer.shared:
        tags.update(shared_experts=o.layer.shared, shared_in_recipe=o.layer.shared_in_recipe)
    records = [_record(point, [rank[i] for rank in every], tags) for i in range(len(entries))]
    if overlap:
        records[-1] = _with_serial(records[-1], _record(point, [rank[-1] for rank in every], tags))
    return records


def _with_serial(step: Record, serial: Record) -> Record:
    """The (overlapped) step's record, its telemetry saying what the same step took with the shared experts in
    line, each the slowest rank's median: ``overlap`` {serial_us, overlapped_us, gain_us, speedup}."""
    from dataclasses import replace

    if not (step.ok and serial.ok):
        return step
    over, ser = step.median_us, serial.median_us
    info = {"serial_us": ser, "overlapped_us": over, "gain_us": ser - over, "speedup": ser / over,
            "serial_samples_us": list(serial.samples_us)}  # fmt: skip
    return replace(step, telemetry={**step.telemetry, "overlap": info})


def _time_stage(ctx: Context, stage, env, graph: bool, samples: int):
    """One stage alone on its inputs from ``env`` (a function of its own, so no reference to them outlives it)."""
    args, params, fn = [env[n] for n in stage.inputs], dict(stage.params), stage.fn
    return time_on_ranks(ctx, lambda: fn(*args, **params), graph=graph, samples=samples)


def _step_timed(strategy: str, stages, o: EPOptions) -> Timed:
    total = sum((s.cost for s in stages), Cost(0, 0))
    part = workload(o).part.value
    shapes = ((o.T, o.K), (o.E, o.N, o.K))
    return Timed(Pass.END_TO_END.value, END_TO_END_STAGE, f"{strategy} EP {part} (forward + backward)",
                 Category.END_TO_END.value, f"One forward + backward of the {strategy} expert-parallel {part}", shapes,
                 total, notes={"note": "routing fixed (plan made once, outside the timed call)"})  # fmt: skip


def _time_step(ctx: Context, o: EPOptions, inputs, plan, stages, graph: bool, samples: int, overlap=None):
    """One forward + backward timed; ``overlap``: None as the options say, False the shared experts in line."""
    part = workload(o)
    leaves = {n: inputs[n].clone().requires_grad_() for n in ("x", *part.weights)}
    dy = inputs["dy"]

    def step():
        y = part.forward(ctx, inputs, plan, stages, leaves, overlap=overlap)
        return torch.autograd.grad(y, tuple(leaves.values()), dy)

    return time_on_ranks(ctx, step, graph=graph, samples=samples)


def _release(ctx: Context) -> None:
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
        torch.cuda.empty_cache()
