"""The whole MoE layer expert-parallel with autograd: the routing plan of a forced assignment and the layer run from
``stages.ep_layer``'s stage list (``moe_layer``'s staged autograd function), so a model runs what the harness times.
With ``overlap`` the shared experts' stages run on a second stream (``ep.overlap``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..ep.overlap import SideStream, run_overlapped
from ..stages.ep_shared import side_stage_names
from ..stages.pipeline import split_passes
from .ep_projection import RoutingPlan, plan_routing
from .layer import _StagedLayer
from .projection import save_for_stages


def plan_layer(assign: torch.Tensor, *, experts_per_rank: int, K: int, N: int, group=None):
    """The projection's routing plan of ``assign`` (T, k) global experts (``ep.plan_routing``: one host sync) plus
    ``copy_token`` (c // k), which the score gradients read, and ``shared_offs`` ([T], the shared experts' one
    token group)."""
    plan = plan_routing(assign, experts_per_rank=experts_per_rank, K=K, N=N, group=group)
    copies = torch.arange(assign.numel(), device=assign.device, dtype=torch.int32)
    shared_offs = torch.tensor([assign.shape[0]], device=assign.device, dtype=torch.int32)
    return RoutingPlan(plan.shape, {**plan.tensors, "copy_token": copies // assign.shape[1], "shared_offs": shared_offs})


class _OverlappedLayer(torch.autograd.Function):
    """``_StagedLayer`` with the shared experts' stages on a second stream in the forward and the backward."""

    @staticmethod
    def forward(ctx, forward, backward, names, extra, side, x, *weights):
        env = {"x": x, **dict(zip(names, weights, strict=True)), **extra}
        env = run_overlapped(forward, env, side_stage_names(forward), side)
        save_for_stages(ctx, env, backward, "dy")
        ctx.names, ctx.side = names, side
        return env["y"]

    @staticmethod
    def backward(ctx, dy):
        env = dict(zip(ctx.keys, ctx.saved_tensors, strict=True))
        env[ctx.grad_name] = dy.contiguous()
        env = run_overlapped(ctx.backward_stages, env, side_stage_names(ctx.backward_stages), ctx.side)
        return (None, None, None, None, None, env["grad_x"], *(env[f"grad_{n}"] for n in ctx.names))


def ep_moe_layer(x: torch.Tensor, weights: Mapping[str, torch.Tensor], assign: torch.Tensor, plan, stages,
                 names=("wr", "w13", "w2"), overlap: bool = False) -> torch.Tensor:  # fmt: skip
    """y (T, K) of this rank's tokens through the EP layer's ``stages`` (``ep_layer_stages`` of ``plan``),
    differentiable in x and the weights ``names`` (``EPLayerShape.weights``: wr, w13, w2, and ws13, ws2 with shared
    experts). ``overlap``: the shared experts' stages on a second stream (``ep.overlap``)."""
    forward, backward = split_passes(stages)
    extra = {"assign": assign.to(torch.int32), **plan.tensors}
    if overlap:
        return _OverlappedLayer.apply(forward, backward, names, extra, SideStream.of(x.device), x,
                                      *(weights[n] for n in names))  # fmt: skip
    return _StagedLayer.apply(forward, backward, names, extra, x, *(weights[n] for n in names))
