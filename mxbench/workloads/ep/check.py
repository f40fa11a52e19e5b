"""``mxbench ep --check``: every EP strategy checked, stage by stage and as a whole layer, on every rank.

1. Stages: the strategy's stages run in step order on the oracle's data (each stage's inputs are the oracle outputs
   of the stages before it, as ``mxbench check`` does); each implementation's outputs are compared with its spec's
   oracle by the spec's rule (bit for bit, or an SQNR floor for GEMMs). All-to-all oracles are built from
   ``all_gather`` alone. The first mismatch of a stage names where.
2. Layer: one forward + backward of the distributed module (``workload``: the expert projection of
   ``mxkernels.autograd.ep_projection``, or with ``--layer`` the whole MoE layer of ``mxkernels.stages.ep_layer``) on every rank; rank 0
   gathers every rank's inputs, outputs and gradients and compares y, grad_x and each weight gradient with the
   single-process reference of the same strategy and wgrad precision (``mxkernels.reference.ep`` /
   ``ep_layer_reference``: bf16 math for bf16, the emulated MXFP8 math for the MXFP8 strategies) by SQNR. The SQNR
   against another reference is printed beside it (the projection's bf16 one; an fp32 run of the single-GPU
   layer's oracle): the quantization error, information, not a verdict.

Exit code (``run_check``): 0 when every stage matches its oracle and every layer output clears ``LAYER_FLOOR_DB``,
1 otherwise; every rank returns the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from mxkernels.core import vjp
from mxkernels.ep.wgrad import Wgrad, resolve_wgrad
from mxkernels.stages.pipeline import Stage, with_impls

from ...measuring.dist import Context, any_rank, gather
from .workload import Compared, LayerOptions, workload

LAYER_FLOOR_DB = 40.0
"""Floor of a layer output's SQNR against the reference. The reference takes exact products and fp64 sums, rounded
once to bf16; an implementation that differs only in summation order and its bf16 roundings stays far above it (80
dB and more on the CPU, where the GEMMs are emulated in fp32). One misrouted row among a few hundred costs some 20
dB (its error is the size of the signal of two rows), so a wrong permutation cannot pass."""


@dataclass(frozen=True)
class EPOptions:
    """The layer and routing of a run (per rank: T tokens, E local experts)."""

    K: int
    N: int
    E: int
    T: int
    top_k: int
    groups: str
    seed: int
    mode: str = "rceil"
    backend: str | None = None
    wgrad: Wgrad | None = None  # the weight gradient's precision (None: each strategy's default)
    layer: LayerOptions | None = None  # the whole MoE layer (its router's options), else the expert projection


@dataclass(frozen=True)
class StageCheck:
    strategy: str
    stage: str
    rank: int
    verdict: str  # PASS, FAIL or ERROR
    detail: str


@dataclass(frozen=True)
class LayerCheck:
    strategy: str
    output: str
    sqnr_db: float
    vs_bf16_db: float | None
    vs_what: str = "bf16 reference"

    @property
    def ok(self) -> bool:
        return self.sqnr_db >= LAYER_FLOOR_DB


def rank_inputs(ctx: Context, o: EPOptions) -> dict[str, torch.Tensor]:
    """This rank's routing and tensors (the projection's or the layer's), on its device."""
    return workload(o).inputs(ctx, o)


def strategy_stages(ctx: Context, strategy: str, plan, o: EPOptions, impls: Sequence) -> list[Stage]:
    """The strategy's stages, with each ``--impl`` whose (recipe, stage) is one of them run in its place."""
    stages = workload(o).stages(ctx, strategy, plan, o)
    keys = {s.spec.key: s.name for s in stages}
    return with_impls(stages, {keys[i.recipe, i.stage]: i for i in impls if (i.recipe, i.stage) in keys})


def check_stages(ctx: Context, strategy: str, stages: Sequence[Stage], env: Mapping[str, torch.Tensor],
                 seen: dict | None = None):  # fmt: skip
    """This rank's verdict on every stage (see the module doc, part 1). ``seen``: filled with the oracles' tensors."""
    env, results = dict(env), []
    for stage in stages:
        inputs = [env[name] for name in stage.inputs]
        expected = stage.spec.oracle(*inputs, **stage.params)
        try:
            got = stage.fn(*inputs, **stage.params)
            mismatch = stage.spec.compare(got, expected, inputs)
            verdict, detail = ("PASS", stage.spec.rule.describe()) if mismatch is None else ("FAIL", mismatch.describe())
        except Exception as e:  # noqa: BLE001 -- the implementation under test raised: its row says how
            verdict, detail = "ERROR", f"{type(e).__name__}: {' '.join(str(e).split())}"
        results.append(StageCheck(strategy, stage.name, ctx.rank, verdict, detail))
        env.update({name: value for name, value in zip(stage.outputs, expected, strict=True) if name is not None})
    if seen is not None:
        seen.update(env)
    return results


def dispatch_error(strategy: str, stages: Sequence[Stage], env: Mapping[str, torch.Tensor]) -> tuple[float, float]:
    """(signal, noise) sums of squares of the rows a quantized dispatch sends, dequantized, against the bf16 rows they
    were quantized from (the first quantizer of the forward: the one before the dispatch); (0, 0) for a strategy
    whose dispatch carries bf16."""
    from mxkernels.core.format import dequantize_reference
    from mxkernels.core.names import Category, Pass, Recipe
    from mxkernels.ep.strategy import get_strategy

    payload = get_strategy(strategy).payload
    if payload == Recipe.BF16:
        return 0.0, 0.0
    q = next(s for s in stages if s.category == Category.QUANTIZE and s.pass_name == Pass.FORWARD)
    rows, (data, scales) = env[q.inputs[0]].double(), (env[n] for n in q.outputs[:2])
    if payload == Recipe.MXFP8:
        got = dequantize_reference(data, scales).double()
    else:
        got = data.double() * scales.double().unsqueeze(1)
    return float(rows.square().sum()), float((got - rows).square().sum())


def run_module(ctx: Context, o: EPOptions, inputs, plan, stages) -> dict[str, torch.Tensor]:
    """One forward + backward of the distributed module on this rank: y and the gradients of x and each weight."""
    part = workload(o)
    leaves = {n: inputs[n].clone().requires_grad_() for n in ("x", *part.weights)}
    y = part.forward(ctx, inputs, plan, stages, leaves)
    vjp.backward(y, inputs["dy"])  # y.backward(dy), without importing sympy on every worker
    return {"y": y.detach(), **{f"grad_{n}": t.grad for n, t in leaves.items()}}


def compare_layer(strategy: str, ranks: Sequence[Mapping[str, torch.Tensor]], o: EPOptions) -> list[LayerCheck]:
    """Gathered inputs and results of every rank against the reference (module doc, part 2)."""
    found: list[Compared] = workload(o).compare(strategy, ranks, o)
    return [LayerCheck(strategy, c.output, c.sqnr_db, c.vs_db, c.vs_what) for c in found]


def check_strategy(ctx: Context, strategy: str, o: EPOptions, impls: Sequence = (), report: dict | None = None):
    """(stage checks of every rank, layer checks) on rank 0; (None, None) elsewhere. ``report``: rank 0 sets its
    ``dispatch_sqnr_db`` where the dispatch carries quantized rows (``dispatch_error``, every rank's rows)."""
    inputs = rank_inputs(ctx, o)
    plan = workload(o).plan(ctx, inputs, o)
    stages = strategy_stages(ctx, strategy, plan, o, impls)
    seen: dict = {}
    stage_checks = check_stages(ctx, strategy, stages, {**inputs, **plan.tensors}, seen)
    errors = dispatch_error(strategy, stages, seen)
    results = run_module(ctx, o, inputs, plan, stages)
    mine = {k: v.detach().cpu() for k, v in {**inputs, **results}.items()}
    every_stage, every_rank, every_error = gather(ctx, stage_checks), gather(ctx, mine), gather(ctx, errors)
    if not ctx.root:
        return None, None
    signal, noise = (sum(e[i] for e in every_error) for i in (0, 1))
    if signal and report is not None:  # the quantized dispatch's own error, all ranks' rows: information
        report["dispatch_sqnr_db"] = float("inf") if noise == 0 else 10 * math.log10(signal / noise)
    return [c for rank in every_stage for c in rank], compare_layer(strategy, every_rank, o)


def run_check(ctx: Context, strategies: Sequence[str], o: EPOptions, impls: Sequence = (), echo=print) -> int:
    """Check every strategy; rank 0 prints the verdicts with ``echo``. Returns the exit code on every rank."""
    from ...views.render import render

    failed = False
    for strategy in strategies:
        report: dict = {}
        stage_checks, layer_checks = check_strategy(ctx, strategy, o, impls, report)
        if ctx.root:
            bad = [c for c in stage_checks if c.verdict != "PASS"]
            failed |= bool(bad) or not all(c.ok for c in layer_checks)
            echo(render([_layer_row(c) for c in layer_checks], "plain"))
            stages_ok = len({c.stage for c in stage_checks}) - len({c.stage for c in bad})
            echo(f"{strategy}: {stages_ok} of {len({c.stage for c in stage_checks})} stages match their oracle "
                 f"on all {ctx.world} ranks (wgrad {resolve_wgrad(strategy, o.wgrad).value})")  # fmt: skip
            for c in bad:
                echo(f"  {c.verdict} {strategy}/{c.stage} on rank {c.rank}: {c.detail}")
            if "dispatch_sqnr_db" in report:
                echo(f"{strategy}: the dispatched rows as the experts receive them (dequantized) against the bf16 "
                     f"rows they were quantized from: SQNR {report['dispatch_sqnr_db']:.1f} dB (all ranks)")
    return 1 if any_rank(ctx, failed) else 0


def _layer_row(c: LayerCheck) -> dict:
    return {
        "Strategy": c.strategy,
        "Output": c.output,
        "SQNR vs reference (dB)": f"{c.sqnr_db:.1f}",
        "Floor (dB)": f"{LAYER_FLOOR_DB:g}",
        "Verdict": "PASS" if c.ok else "FAIL",
        f"SQNR vs {c.vs_what} (dB)": None if c.vs_bf16_db is None else f"{c.vs_bf16_db:.1f}",
    }
