"""What an EP run runs on every rank: the expert projection (``mxbench ep``) or the whole MoE layer (``--layer``).

A ``Workload`` is the seam the check and the measurement share: a rank's seeded inputs, its routing plan, the
strategy's stage list, one forward + backward of the distributed module (what the step times and the check
compares), and the comparison of every rank's gathered results with the single-process reference.

* ``Projection``: ``mxkernels.autograd.ep_projection`` (y = x @ w_e^T per copy) against ``ep_reference.ep_layer_reference``.
* ``Layer``: ``mxkernels.stages.ep_layer`` (router, gate/up, SwiGLU, down, combine) against
  ``ep_layer_reference.ep_moe_layer_reference`` (the verdict); the SQNR against an fp32 run of the single-GPU
  layer's plain-torch oracle (``moe_layer.moe_layer_reference``, gathered inputs) is printed beside it, for
  information (the recipe's quantization error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch
from mxkernels.core.comparison import sqnr_db

from .inputs import ep_layer_tensors, layer_tensors, routing


class Part(StrEnum):
    PROJECTION = "projection"
    LAYER = "layer"


@dataclass(frozen=True)
class LayerOptions:
    """The router's options of a ``--layer`` run (``ep_layer.EPLayerShape``)."""

    score_func: str = "sigmoid"
    score_before: bool = True
    shared: int = 0  # shared experts (each rank's own tokens, replicated weights)
    shared_in_recipe: bool = False  # their GEMMs in the strategy's recipe, else bf16
    overlap: bool = False  # the shared experts on a second stream beside the all-to-alls


@dataclass(frozen=True)
class Compared:
    """One output's SQNR against the verdict's reference, and against another one for information."""

    output: str
    sqnr_db: float
    vs_db: float | None
    vs_what: str


def _experts(ctx, o) -> torch.Tensor:
    return routing(o.T, o.top_k, ctx.world * o.E, o.groups, o.seed, ctx.rank).to(ctx.device)


class Projection:
    part = Part.PROJECTION
    weights = ("w",)

    def inputs(self, ctx, o) -> dict[str, torch.Tensor]:
        return {"experts": _experts(ctx, o), **layer_tensors(o.T, o.K, o.N, o.E, o.top_k, o.seed, ctx.rank, ctx.device)}

    def plan(self, ctx, inputs, o):
        from mxkernels.autograd.ep_projection import plan_routing

        return plan_routing(inputs["experts"], experts_per_rank=o.E, K=o.K, N=o.N, group=ctx.group)

    def stages(self, ctx, strategy, plan, o):
        from mxkernels.stages.ep_stages import ep_step_stages

        return ep_step_stages(strategy, plan.shape, group=ctx.group, mode=o.mode, backend=o.backend, wgrad=o.wgrad)

    def forward(self, ctx, inputs, plan, stages, leaves: Mapping[str, torch.Tensor], overlap=None) -> torch.Tensor:
        from mxkernels.autograd.ep_projection import ep_expert_projection

        return ep_expert_projection(leaves["x"], leaves["w"], plan, stages=stages, group=ctx.group)

    def compare(self, strategy: str, ranks: Sequence[Mapping[str, torch.Tensor]], o) -> list[Compared]:
        from mxkernels.reference.ep import ep_layer_reference
        from mxkernels.stages.ep_stages import BASELINE

        args = ([r["x"] for r in ranks], [r["experts"] for r in ranks], torch.cat([r["w"] for r in ranks]),
                [r["dy"] for r in ranks])  # fmt: skip
        names = ("y", "grad_x", "grad_w")
        ref = dict(zip(names, ep_layer_reference(*args, strategy, o.mode, o.wgrad), strict=True))
        bf16 = None if strategy == BASELINE else dict(zip(names, ep_layer_reference(*args, BASELINE), strict=True))
        out = []
        for name in names:
            got = torch.cat([r[name] for r in ranks])
            vs = None if bf16 is None else sqnr_db(got, _joined(bf16[name]))
            out.append(Compared(name, sqnr_db(got, _joined(ref[name])), vs, "bf16 reference"))
        return out


class Layer:
    part = Part.LAYER

    def __init__(self, options: LayerOptions):
        self.options = options

    @property
    def weights(self) -> tuple[str, ...]:
        return ("wr", "w13", "w2", *(("ws13", "ws2") if self.options.shared else ()))

    def inputs(self, ctx, o) -> dict[str, torch.Tensor]:
        experts = _experts(ctx, o)
        tensors = ep_layer_tensors(o.T, o.K, o.N, o.E, ctx.world, o.seed, ctx.rank, ctx.device, self.options.shared)
        return {"experts": experts, "assign": experts.to(torch.int32), **tensors}

    def plan(self, ctx, inputs, o):
        from mxkernels.autograd.ep_layer import plan_layer

        return plan_layer(inputs["assign"], experts_per_rank=o.E, K=o.K, N=o.N, group=ctx.group)

    def stages(self, ctx, strategy, plan, o):
        from mxkernels.stages.ep_layer import EPLayerShape, ep_layer_stages

        L = self.options
        shape = EPLayerShape(plan.shape, L.score_func, L.score_before, L.shared, L.shared_in_recipe)
        return ep_layer_stages(strategy, shape, group=ctx.group, mode=o.mode, backend=o.backend, wgrad=o.wgrad)

    def forward(self, ctx, inputs, plan, stages, leaves: Mapping[str, torch.Tensor], overlap=None) -> torch.Tensor:
        """``overlap``: None runs as the options say; False / True force it (the measurement times both)."""
        from mxkernels.autograd.ep_layer import ep_moe_layer

        overlap = self.options.overlap if overlap is None else overlap
        return ep_moe_layer(leaves["x"], leaves, inputs["assign"], plan, stages, names=self.weights, overlap=overlap)

    def compare(self, strategy: str, ranks: Sequence[Mapping[str, torch.Tensor]], o) -> list[Compared]:
        from mxkernels.reference.ep_layer import ep_moe_layer_reference
        from mxkernels.reference.ep_shared import ep_moe_layer_shared_reference

        L = self.options
        weights = {"wr": ranks[0]["wr"], **{n: torch.cat([r[n] for r in ranks]) for n in ("w13", "w2")}}
        weights.update({n: ranks[0][n] for n in ("ws13", "ws2") if L.shared})  # replicated
        xs, assigns, dys = ([r[n] for r in ranks] for n in ("x", "assign", "dy"))
        kw = {"score_func": L.score_func, "score_before": L.score_before, "mode": o.mode, "wgrad": o.wgrad}
        if L.shared:
            ref = ep_moe_layer_shared_reference(xs, assigns, weights, dys, strategy, in_recipe=L.shared_in_recipe, **kw)
        else:
            ref = ep_moe_layer_reference(xs, assigns, weights, dys, strategy, **kw)
        fp32 = self._fp32_layer(ranks, weights, o)
        out = []
        replicated = ("grad_wr", "grad_ws13", "grad_ws2")  # every rank's share of a replicated weight's gradient
        for name in ("y", "grad_x", *(f"grad_{n}" for n in self.weights)):
            parts = [r[name] for r in ranks]
            got = torch.stack(parts).double().sum(0) if name in replicated else torch.cat(parts)
            out.append(
                Compared(name, sqnr_db(got, _joined(ref[name])), sqnr_db(got, fp32[name]), "fp32 single-GPU layer")
            )
        return out

    def _fp32_layer(self, ranks, weights, o) -> dict[str, torch.Tensor]:
        """y and the gradients of ``moe_layer_reference`` in fp32 on every rank's tokens at once."""
        from mxkernels.stages.layer import LayerShape
        from mxkernels.autograd.layer import layer_outputs

        G = weights["wr"].shape[0]
        shape = LayerShape(T=sum(r["x"].shape[0] for r in ranks), K=o.K, N=o.N, E=G, top_k=o.top_k,
                           shared=self.options.shared, score_func=self.options.score_func,
                           score_before=self.options.score_before)  # fmt: skip
        inputs = {"x": torch.cat([r["x"] for r in ranks]), "dy": torch.cat([r["dy"] for r in ranks]),
                  "assign": torch.cat([r["assign"] for r in ranks]), **weights}  # fmt: skip
        got = layer_outputs(None, inputs, shape)
        got["grad_w13"] = torch.cat([got.pop("grad_w1"), got.pop("grad_w3")], dim=1)
        return got


def _joined(value: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """A reference's output of every rank as one tensor (per-rank lists concatenated; weight gradients as they are)."""
    return value if isinstance(value, torch.Tensor) else torch.cat(list(value))


def workload(o) -> Projection | Layer:
    return Projection() if o.layer is None else Layer(o.layer)
