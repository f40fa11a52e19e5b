"""The whole MoE layer expert-parallel with autograd: the routing plan of a forced assignment and the layer run from
``stages.ep_layer``'s stage list (``moe_layer``'s staged autograd function), so a model runs what the harness times."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..stages.pipeline import split_passes
from .ep_projection import RoutingPlan, plan_routing
from .layer import _StagedLayer


def plan_layer(assign: torch.Tensor, *, experts_per_rank: int, K: int, N: int, group=None):
    """The projection's routing plan of ``assign`` (T, k) global experts (``ep.plan_routing``: one host sync) plus
    ``copy_token`` (c // k), which the score gradients read."""
    plan = plan_routing(assign, experts_per_rank=experts_per_rank, K=K, N=N, group=group)
    copies = torch.arange(assign.numel(), device=assign.device, dtype=torch.int32)
    return RoutingPlan(plan.shape, {**plan.tensors, "copy_token": copies // assign.shape[1]})


def ep_moe_layer(x: torch.Tensor, weights: Mapping[str, torch.Tensor], assign: torch.Tensor, plan,
                 stages) -> torch.Tensor:  # fmt: skip
    """y (T, K) of this rank's tokens through the EP layer's ``stages`` (``ep_layer_stages`` of ``plan``),
    differentiable in x and the weights wr, w13, w2 (``moe_layer``'s staged autograd function)."""
    names = ("wr", "w13", "w2")
    forward, backward = split_passes(stages)
    extra = {"assign": assign.to(torch.int32), **plan.tensors}
    return _StagedLayer.apply(forward, backward, names, extra, x, *(weights[n] for n in names))
