"""The expert-parallel MoE expert projection with autograd: routing plans and the layer built from EP stage lists.

Use (every rank of a ``torch.distributed`` group, EP degree = world size, E local experts per rank)::

    plan = plan_routing(experts, experts_per_rank=E, K=K, N=N, group=group)  # one host sync: the split sizes
    y = ep_expert_projection(x, w, plan, "mxfp8_a2a", group=group)          # (T * top_k, N), differentiable
    y.backward(dy)                                                          # x.grad (T, K), w.grad (E, N, K)

x (T, K) bf16 tokens, experts (T, top_k) global expert ids (distinct per token; expert g lives on rank g // E),
w (E, N, K) bf16 this rank's experts. The forward runs the strategy's forward stages (``ep_stages``), the backward
its backward_input and backward_weight stages, so a model runs exactly what the harness times.

``plan_routing`` = ``route`` (the sort of the copies by expert, on the device) + ``exchange_split_counts`` (one
all-to-all of the per-expert counts on the device, then the one device-to-host copy the all-to-alls' split sizes
need). A CUDA graph can capture the layer once a plan is fixed, not the plan itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .projection import run_saved_stages, save_for_stages
from ..ep.comm import exchange_counts
from ..stages.ep_stages import EPShape, check_layer, ep_step_stages
from ..stages.pipeline import Stage, run_stages, split_passes
from ..core.runtime import InputError
from ..stages.step_specs import StageImpl
from ..moe.token_permute import route


@dataclass(frozen=True)
class RoutingPlan:
    """One rank's routing: its host view (``shape``: sizes, split counts) and its device tensors (``tensors``:
    ``token_of``, ``order``, ``pos`` from ``route`` and ``counts``, the received counts (W, E))."""

    shape: EPShape
    tensors: Mapping[str, torch.Tensor]


def exchange_split_counts(send_counts: torch.Tensor, group=None) -> tuple[list[list[int]], list[list[int]]]:
    """(send counts, received counts) as host lists, W x E each: the counts' all-to-all on the device, then both
    copied to the host in one transfer (the sync)."""
    recv = exchange_counts(send_counts, group)
    both = torch.stack([send_counts, recv]).tolist()
    return both[0], both[1]


def plan_routing(experts: torch.Tensor, *, experts_per_rank: int, K: int, N: int, group=None) -> RoutingPlan:
    """The routing plan of this rank's token copies (see the module doc). experts: (T, top_k) integer ids."""
    if experts.dim() != 2:
        raise InputError(f"experts must be (tokens, top_k), got shape {tuple(experts.shape)}")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    T, top_k = experts.shape
    check_layer(T, K, N, experts_per_rank, top_k, world)
    routed = route(experts, world * experts_per_rank)
    send, recv = exchange_split_counts(routed["counts"].view(world, experts_per_rank), group)
    counts = torch.tensor(recv, dtype=torch.int32, device=experts.device)
    shape = EPShape(T, K, N, experts_per_rank, top_k, rank, world, _frozen(send), _frozen(recv))
    tensors = {"token_of": routed["token_of"], "order": routed["order"], "pos": routed["pos"], "counts": counts}
    return RoutingPlan(shape, tensors)


def _frozen(rows: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(v) for v in row) for row in rows)



class EPExpertProjection(torch.autograd.Function):
    """Forward: the forward stages on x, w and the routing tensors. Backward: the backward stages on dy."""

    @staticmethod
    def forward(ctx, x, w, routing, forward_stages, backward_stages):
        env = run_stages(forward_stages, {"x": x, "w": w, **routing})
        save_for_stages(ctx, env, backward_stages, "dy")
        return env["y"]

    @staticmethod
    def backward(ctx, dy):
        env = run_saved_stages(ctx, dy)
        return env["grad_x"], env["grad_w"], None, None, None


def ep_expert_projection(
    x: torch.Tensor,
    w: torch.Tensor,
    plan: RoutingPlan,
    strategy: str = "mxfp8_a2a",
    *,
    group=None,
    mode: str = "rceil",
    backend: str | None = None,
    impls: Mapping[str, StageImpl] | None = None,
    stages: Sequence[Stage] | None = None,
) -> torch.Tensor:
    """y (T * top_k, N) bf16 of the EP expert projection (module doc), differentiable in x and w.

    ``stages``: the step's stage list when the caller built it already (``ep_step_stages`` of this plan); else
    it is built from ``strategy``, ``mode``, ``backend`` and ``impls``.
    """
    s = plan.shape
    if tuple(x.shape) != (s.T, s.K) or tuple(w.shape) != (s.E, s.N, s.K):
        raise InputError(f"x must be ({s.T}, {s.K}) and w ({s.E}, {s.N}, {s.K}) for this plan; got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")  # fmt: skip
    if stages is None:
        stages = ep_step_stages(strategy, s, group=group, mode=mode, backend=backend, impls=impls)
    forward, backward = split_passes(stages)
    return EPExpertProjection.apply(x, w, dict(plan.tensors), forward, backward)
