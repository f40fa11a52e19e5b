"""The single-process reference of the expert-parallel expert projection: every rank's tokens in one process.

Plain torch, written for clarity, no distributed calls and none of the EP kernels: the oracle the distributed
layer (``ep.ep_expert_projection``) is checked against. Each global expert's token copies are taken in the order
the EP layer hands them to its GEMM (source rank, then copy order), because the MXFP8 weight gradient quantizes
blocks of 32 consecutive tokens: the order is part of the math. Products are exact and sums are taken in fp64,
so the reference is at least as accurate as any implementation; results are rounded once to bf16.

Per expert g with tokens X (n, K), weights W (N, K), output gradient DY (n, N); mx(A) = dequantized MXFP8 of A in
1x32 blocks along its last dim (``format``'s oracle):

| strategy    | y                   | grad of the copies       | grad_w                                    |
|-------------|---------------------|--------------------------|-------------------------------------------|
| bf16        | X W^T               | DY W                     | DY^T X                                    |
| mxfp8       | mx(X) mx(W)^T       | mx(DY) mx(W^T)^T         | mx(DY_32^T) mx(X_32^T)^T (blocks along tokens, groups zero-padded to 32) |
| mxfp8_a2a   | as mxfp8            | as mxfp8                 | mx(DY)^T mx(X) (bf16 GEMM of the dequantized MXFP8 rows) |

A token's gradient is the sum of its top_k copies' gradients (each rounded to bf16 first, as they travel), in
fp32 in choice order, rounded once to bf16.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .cost import ceil_to
from .format import BLOCK_SIZE, dequantize_reference, quantize_reference


def _mx(a: torch.Tensor, mode: str) -> torch.Tensor:
    return dequantize_reference(*quantize_reference(a.contiguous(), mode)).double()


def _pad_tokens(a: torch.Tensor) -> torch.Tensor:
    """Zero rows up to a multiple of 32 (a block along the tokens never mixes two experts)."""
    rows = ceil_to(a.shape[0], BLOCK_SIZE)
    return torch.cat([a, a.new_zeros(rows - a.shape[0], a.shape[1])])


def expert_reference(x, w, dy, strategy: str, mode: str = "rceil"):
    """(y, grad of the copies, grad_w) of one expert, fp64 (see the module table)."""
    if strategy == "bf16":
        xd, wd, dyd = x.double(), w.double(), dy.double()
        return xd @ wd.T, dyd @ wd, dyd.T @ xd
    if strategy not in ("mxfp8", "mxfp8_a2a"):
        raise ValueError(f"unknown strategy {strategy!r}")
    y = _mx(x, mode) @ _mx(w, mode).T
    grad = _mx(dy, mode) @ _mx(w.T, mode).T
    if strategy == "mxfp8":
        grad_w = _mx(_pad_tokens(dy).T, mode) @ _mx(_pad_tokens(x).T, mode).T
    else:
        grad_w = _mx(dy, mode).T @ _mx(x, mode)
    return y, grad, grad_w


def ep_layer_reference(
    xs: Sequence[torch.Tensor],
    experts: Sequence[torch.Tensor],
    w: torch.Tensor,
    dys: Sequence[torch.Tensor],
    strategy: str,
    mode: str = "rceil",
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
        y, grad, grad_w[g] = expert_reference(x, w[g].cpu(), dy, strategy, mode)
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
