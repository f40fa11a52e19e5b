"""The single-process reference of the expert-parallel expert projection: every rank's tokens in one process.

Plain torch, written for clarity, no distributed calls and none of the EP kernels: the oracle the distributed
layer (``ep.ep_expert_projection``) is checked against. Each global expert's token copies are taken in the order
the EP layer hands them to its GEMM (source rank, then copy order), because the MXFP8 weight gradient quantizes
blocks of 32 consecutive tokens: the order is part of the math. Products are exact and sums are taken in fp64,
so the reference is at least as accurate as any implementation; results are rounded once to bf16.

Per expert g with tokens X (n, K), weights W (N, K), output gradient DY (n, N); mx(A) = dequantized MXFP8 of A in
1x32 blocks along its last dim (``format``'s oracle):

| strategy    | y                   | grad of the copies       |
|-------------|---------------------|--------------------------|
| bf16        | X W^T               | DY W                     |
| mxfp8       | mx(X) mx(W)^T       | mx(DY) mx(W^T)^T         |
| mxfp8_a2a   | as mxfp8            | as mxfp8                 |

grad_w = G^T A of the operands as the expert's rank holds them (A = X, G = DY; mx(X), mx(DY) under mxfp8_a2a, whose
rows arrive quantized), in the wgrad precision (``ep_wgrad``): bf16 (exact products) or MXFP8,
mx(G_32^T) mx(A_32^T)^T (blocks along the tokens, groups zero-padded to 32).

A token's gradient is the sum of its top_k copies' gradients (each rounded to bf16 first, as they travel), in
fp32 in choice order, rounded once to bf16.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.cost import ceil_to
from ..core.format import BLOCK_SIZE, dequantize_reference, quantize_reference
from . import ep_fp8


def _mx(a: torch.Tensor, mode: str) -> torch.Tensor:
    return dequantize_reference(*quantize_reference(a.contiguous(), mode)).double()


def _pad_tokens(a: torch.Tensor) -> torch.Tensor:
    """Zero rows up to a multiple of 32 (a block along the tokens never mixes two experts)."""
    rows = ceil_to(a.shape[0], BLOCK_SIZE)
    return torch.cat([a, a.new_zeros(rows - a.shape[0], a.shape[1])])


def _check(strategy: str) -> None:
    if strategy not in ("bf16", "mxfp8", "mxfp8_a2a", *ep_fp8.FP8_STRATEGIES):
        raise ValueError(f"unknown strategy {strategy!r}")


def forward_reference(x, w, strategy: str, mode: str = "rceil"):
    """x (n, K) @ w (N, K)^T in fp64, the operands quantized 1x32 along K unless bf16."""
    _check(strategy)
    if strategy in ep_fp8.FP8_STRATEGIES:  # FP8 rowwise (``ep_fp8``)
        return ep_fp8.forward_fp8(x, w)
    if strategy == "bf16":
        return x.double() @ w.double().T
    return _mx(x, mode) @ _mx(w, mode).T


def dgrad_reference(dy, w, strategy: str, mode: str = "rceil"):
    """dy (n, N) @ w (N, K) in fp64, dy quantized along N and w along N (its transpose's rows) unless bf16."""
    if strategy in ep_fp8.FP8_STRATEGIES:
        return ep_fp8.dgrad_fp8(dy, w)
    return forward_reference(dy, w.T, strategy, mode)


def wgrad_reference(dy, x, strategy: str, wgrad, mode: str = "rceil", *, crossed: tuple[bool, bool] = (True, True)):
    """grad_w (N, K) = dy^T x in fp64 (module doc): under mxfp8_a2a the operands that ``crossed`` an all-to-all in
    MXFP8 (dy, x) as they arrived (1x32 along their width, dequantized: exact in fp32), then the wgrad precision's
    GEMM."""
    from ..ep.wgrad import Wgrad, resolve_wgrad  # the option's meaning only, no kernels

    _check(strategy)
    if strategy in ep_fp8.FP8_STRATEGIES:
        return ep_fp8.wgrad_fp8(dy, x, strategy, resolve_wgrad(strategy, wgrad) == Wgrad.BF16, crossed)
    if strategy == "mxfp8_a2a":
        dy, x = (_mx(t, mode).float() if q else t for t, q in zip((dy, x), crossed, strict=True))
    if strategy == "bf16" or resolve_wgrad(strategy, wgrad) == Wgrad.BF16:
        return dy.double().T @ x.double()
    return _mx(_pad_tokens(dy).T, mode) @ _mx(_pad_tokens(x).T, mode).T


def expert_reference(x, w, dy, strategy: str, mode: str = "rceil", wgrad=None):
    """(y, grad of the copies, grad_w) of one expert, fp64 (see the module table). ``wgrad``: ``ep_wgrad.Wgrad``
    (None: the strategy's default)."""
    return (forward_reference(x, w, strategy, mode), dgrad_reference(dy, w, strategy, mode),
            wgrad_reference(dy, x, strategy, wgrad, mode))  # fmt: skip


def ep_layer_reference(
    xs: Sequence[torch.Tensor],
    experts: Sequence[torch.Tensor],
    w: torch.Tensor,
    dys: Sequence[torch.Tensor],
    strategy: str,
    mode: str = "rceil",
    wgrad=None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Outputs and gradients of every rank, computed in one process.

    xs[r] (T, K) bf16 and experts[r] (T, top_k) global ids of rank r; w (W * E, N, K) bf16 all experts (global
    expert g = rank g // E, local g % E); dys[r] (T * top_k, N) bf16. Returns (ys[r] (T * top_k, N), grad_xs[r]
    (T, K), grad_w (W * E, N, K)), all bf16.
    """
    top_k = experts[0].shape[1]
    flat = [e.reshape(-1).long().cpu() for e in experts]
    ys = [torch.zeros(d.shape, dtype=torch.float64) for d in dys]
    copy_grads = [torch.zeros(e.numel(), x.shape[1], dtype=torch.float64) for e, x in zip(flat, xs, strict=True)]
    grad_w = torch.zeros(w.shape, dtype=torch.float64)
    for g in range(w.shape[0]):
        members = [(r, torch.nonzero(f == g).flatten()) for r, f in enumerate(flat)]
        if not any(len(c) for _, c in members):
            continue
        x = torch.cat([xs[r].cpu()[c // top_k] for r, c in members])
        dy = torch.cat([dys[r].cpu()[c] for r, c in members])
        y, grad, grad_w[g] = expert_reference(x, w[g].cpu(), dy, strategy, mode, wgrad)
        start = 0
        for r, c in members:
            ys[r][c] = y[start : start + len(c)]
            copy_grads[r][c] = grad[start : start + len(c)]
            start += len(c)
    grad_xs = []
    for cg, x in zip(copy_grads, xs, strict=True):
        copies = cg.to(torch.bfloat16).float().view(x.shape[0], top_k, -1)
        total = copies[:, 0]
        for j in range(1, top_k):
            total = total + copies[:, j]
        grad_xs.append(total.to(torch.bfloat16))
    return [y.to(torch.bfloat16) for y in ys], grad_xs, grad_w.to(torch.bfloat16)
