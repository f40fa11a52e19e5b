"""The records of a layer run: per recipe (bf16 first, the baseline), every stage of the layer timed alone, then
the layer's forward + backward as one CUDA graph (``fwd+bwd``), then its accuracy: the SQNR of y and every gradient
against an fp32 run of the independent plain-torch layer on the same seeded inputs (``telemetry["sqnr_db"]`` of
the fwd+bwd record). Each stage's inputs come from one eager run of the whole layer, so every stage sees real data.
Without a GPU, ``model_layer_run`` prices the same stages over a hardware spec. Nothing here computes a cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from mxkernels.stages.layer import LayerShape, layer_stages
from mxkernels.autograd.layer import layer_inputs, layer_outputs, layer_sqnr, moe_layer
from mxkernels.core.names import Recipe, Wgrad, parse_wgrad
from mxkernels.stages.pipeline import run_stages

from ...measuring.loop import measure_points
from ...measuring.metadata import common_metadata, run_metadata
from ...measuring.stages import EndToEnd, StageTimer, SweepOptions, end_to_end_stage, error_message, stage_record
from ...storage.results import Point, Record, Run
from .amortize import amortized_us


class LayerStep(EndToEnd):
    """The layer's forward + backward as a pseudo-stage costing what its stages declare together."""

    @property
    def kernel(self) -> str:
        return f"{self.recipe} MoE layer (forward + backward, one graph)"

    @property
    def purpose(self) -> str:
        return f"One forward + backward of the {self.recipe} MoE layer"


def layer_step(point: Point, shape: LayerShape, stages: Sequence) -> LayerStep:
    step = end_to_end_stage(point, stages)
    return LayerStep(step.recipe, ((shape.T, shape.K), (shape.E, shape.N, shape.K)), step.cost, step.impl)


def layer_points(shape: LayerShape, recipes: Sequence[str], *, mode: str, seed: int, fuse: bool,
                 wgrad: Wgrad | str = Wgrad.RECIPE) -> list[Point]:  # fmt: skip
    """bf16 first (the baseline), then each recipe, and with ``fuse`` each recipe's fused twin beside it; each
    recipe's points at the ``wgrad`` precision (bf16's own is bf16 whatever it says: its point keeps the default)."""
    base = dict(M=shape.copies, N=shape.N, K=shape.K, G=shape.E, mode=mode, groups=shape.routing.value, seed=seed)
    points = [Point(recipe=Recipe.BF16.value, **base)]
    quantized = {**base, "wgrad": parse_wgrad(wgrad).value}
    for r in recipes:
        if r == Recipe.BF16:
            continue
        points.append(Point(recipe=r, **quantized))
        if fuse:
            points.append(Point(recipe=r, fuse_scales=True, **quantized))
    return points


def point_stages(point: Point, shape: LayerShape, *, backend: str | None, impls=None) -> list:
    """The layer's stages of ``point``: its recipe, scale mode, fused twin and wgrad precision."""
    return layer_stages(point.recipe, shape, mode=point.mode, backend=backend, fuse=point.fuse_scales, impls=impls,
                        wgrad=point.wgrad)  # fmt: skip


def layer_meta(shape: LayerShape, label: str = "", microbatches: int = 1, wgrad: Wgrad | str = Wgrad.RECIPE) -> dict:
    """The layer's metadata; ``microbatches`` (gradient accumulation: weight-only stages once per that many steps,
    ``amortize``) is stored only when above 1, ``wgrad`` (each recipe point's too) only when bf16, so runs without
    them read as before."""
    s = shape
    extra = {"microbatches": microbatches} if microbatches > 1 else {}
    if parse_wgrad(wgrad) != Wgrad.RECIPE:
        extra["wgrad"] = parse_wgrad(wgrad).value
    return {"kind": "layer", "layer": {**extra, "label": label or f"{s.K}x{s.N}", "tokens": s.T, "K": s.K, "N": s.N, "experts": s.E, "top_k": s.top_k,
            "shared_experts": s.shared, "score_func": s.score_func.value, "score_before_experts": s.score_before,
            "routing": s.routing.value, "fused_gate_up": s.fuse_up, "shared_in_recipe": s.shared_in_recipe,
            "precision": "router gate in bf16; every grouped GEMM in the point's recipe"
                         + ("" if "wgrad" not in extra else " but the weight gradients' (bf16 _grouped_mm)")
                         + "; shared experts "
                         + ("in the recipe (one-group grouped GEMMs)" if s.shared_in_recipe else "dense bf16")}}  # fmt: skip


def wgrad_of(points: Sequence[Point]) -> str:
    """The wgrad precision of a run's quantized points (``layer_points`` gives them all one)."""
    return next((p.wgrad for p in points if p.wgrad != Wgrad.RECIPE), Wgrad.RECIPE.value)


def shape_of(meta: dict) -> LayerShape:
    """The layer a run measured, from its metadata (``layer_meta``)."""
    m = meta["layer"]
    return LayerShape(m["tokens"], m["K"], m["N"], m["experts"], m["top_k"], m["shared_experts"], m["score_func"],
                      m["score_before_experts"], m["routing"], m["fused_gate_up"], m.get("shared_in_recipe", False))


class LayerTimer(StageTimer):
    """``StageTimer`` for the layer: its stages, its one-graph forward + backward, its accuracy."""

    def __init__(self, options: SweepOptions, ins, shape: LayerShape, microbatches: int = 1):
        super().__init__(options, ins)
        self.shape, self._reference, self.microbatches = shape, None, microbatches

    def _stages(self, point: Point):
        backend = None if point.recipe == Recipe.BF16 else self.options.backend
        impls = {i.stage: i for i in self.options.impls if i.recipe in (Recipe.BF16, point.recipe)}  # common: bf16's
        return point_stages(point, self.shape, backend=backend, impls=impls or None)

    def measure(self, point: Point) -> list[Record]:
        try:
            stages = self._stages(point)
        except Exception as e:  # noqa: BLE001 -- a point that cannot be planned is one error row
            return [stage_record(point, layer_step(point, self.shape, []), error=error_message(e))]
        device = f"cuda:{self.options.device}"
        inputs = layer_inputs(self.shape, device=device, seed=point.seed)
        records = []
        try:
            env = run_stages(stages, dict(inputs))
            for s in stages:
                args, params, fn = [env[n] for n in s.inputs], dict(s.params), s.fn
                records.append(self.time(point, s, lambda fn=fn, args=args, params=params: fn(*args, **params)))
        except Exception as e:  # noqa: BLE001 -- no tensors for the stages: each says why
            records += [stage_record(point, s, error=error_message(e)) for s in stages[len(records):]]
        env = None
        self.ins.release()
        step = layer_step(point, self.shape, stages)
        record = self.time(point, step, self._step_call(inputs, stages))
        record.telemetry["sqnr_db"] = self._sqnr(point, inputs, stages)
        if self.microbatches > 1:
            record.telemetry["amortized_step_us"] = amortized_us(record.median_us if record.ok else None, records,
                                                                 self.microbatches)  # fmt: skip
        records.append(record)
        return records

    def _step_call(self, inputs, stages):
        s = self.shape
        x = inputs["x"].detach().clone().requires_grad_()
        weights = {n: inputs[n].detach().clone().requires_grad_() for n in s.weights}
        assign, shared_offs, dy = inputs.get("assign"), inputs.get("shared_offs"), inputs["dy"]

        def step():
            y = moe_layer(x, weights, s, assign=assign, shared_offs=shared_offs, stages=stages)
            return torch.autograd.grad(y, [x, *weights.values()], dy)

        return step

    def _sqnr(self, point: Point, inputs, stages) -> dict[str, float] | str:
        try:
            if self._reference is None:  # kept in host memory: on the GPU it starved the later points (Scout OOM)
                self._reference = {k: v.cpu() for k, v in layer_outputs(None, inputs, self.shape).items()}
            got = {k: v.cpu() for k, v in layer_outputs(point.recipe, inputs, self.shape, stages=stages).items()}
            return {k: round(v, 2) for k, v in layer_sqnr(got, self._reference).items()}
        except Exception as e:  # noqa: BLE001 -- the accuracy that cannot be computed says why, the timing stays
            return error_message(e)
        finally:
            self.ins.release()


def run_layer(shape: LayerShape, points: Sequence[Point], options: SweepOptions, ins, *, label: str = "",
              progress=True, microbatches: int = 1) -> Run:
    """Measure every point (``loop.measure_points``: saved after each to ``options.out``; Ctrl-C keeps what was
    measured). ``microbatches`` > 1: each fwd+bwd record also holds the step amortized over them (``amortize``)."""
    meta_points = [replace(p, groups="balanced") for p in points]  # the layer's groups come from its router
    run = Run(meta={**run_metadata(meta_points, options, ins), **layer_meta(shape, label, microbatches, wgrad_of(points))})
    _drop_group_sizes(run.meta)
    timer = LayerTimer(options, ins, shape, microbatches)
    return measure_points(run, points, timer, ins, options.out, progress)


def remeasure(baseline: Run, options: SweepOptions, instruments):
    """``regress``'s measurement of a layer baseline's points: its layer (``shape_of`` its metadata) with mxkernels'
    stages, refused (as Ctrl-C) when stopped part-way, since a verdict on part of a round would mislead."""

    def measure(points: list[Point]) -> Run:
        label = baseline.meta["layer"].get("label", "")
        run = run_layer(shape_of(baseline.meta), points, options, instruments, label=label)
        if run.meta.get("interrupted"):
            raise KeyboardInterrupt
        return run

    return measure


def _drop_group_sizes(meta: dict) -> None:
    """The projection's token-group fields do not describe a layer (its router makes the groups)."""
    for key in ("group_sizes", "group_sizes_method"):
        meta.pop(key, None)


def model_layer_run(shape: LayerShape, points: Sequence[Point], *, spec, hardware: str, command: str,
                    label: str = "", microbatches: int = 1) -> Run:
    """The analytic model of every point: each stage's declared cost over ``spec`` ("model, not measured")."""
    from ...instruments.roofline import MODEL_ASSUMPTION, model_records

    meta_points = [replace(p, groups="balanced") for p in points]
    run = Run(meta={**common_metadata(meta_points, command), "hardware": hardware, "measured": False,
                    "label": "model, not measured", "model": MODEL_ASSUMPTION, **layer_meta(shape, label, microbatches, wgrad_of(points))})  # fmt: skip
    _drop_group_sizes(run.meta)
    for p in points:
        try:
            stages = point_stages(p, shape, backend=_model_backend(p))
            run.records += model_records(p, stages, spec)
        except Exception as e:  # noqa: BLE001 -- a point the model cannot price is its error row
            run.records.append(stage_record(p, layer_step(p, shape, []), measured=False, error=error_message(e)))
    return run


def _model_backend(point: Point) -> str | None:
    """The model prices costs only: name the native backend, which the B200 the model stands for would run."""
    return None if point.recipe == Recipe.BF16 else "native"
