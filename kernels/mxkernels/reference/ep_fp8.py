"""The FP8 rowwise strategies' expert math for the single-process EP references (``reference.ep``,
``reference.ep_layer``): plain torch, exact products summed in fp64, from the format's definition.

r(A) = A quantized with one fp32 scale per row of its last dim (``fp8_rowwise``'s oracle), dequantized exactly in
fp64 (q * scale). Per expert with tokens X (n, K), weights W (N, K), output gradient DY (n, N):

| strategy          | y             | grad of the copies | grad_w (recipe wgrad)                        |
|-------------------|---------------|--------------------|----------------------------------------------|
| fp8_rowwise       | r(X) r(W)^T   | r(DY) r(W^T)^T     | r(DY^T) r(X^T)^T (scales per expert column)  |
| fp8_rowwise_a2a   | as fp8_rowwise | as fp8_rowwise    | as fp8_rowwise, of X' and DY' where they crossed |

X' / DY': the rows as the expert's rank holds them after an FP8 all-to-all: bf16(fp32(q * scale)). A rowwise
quantization of X' gives r(X) again (X' rows are q * scale up to bf16 rounding; not bit-identical in general), so
the forward and dgrad take the rows as quantized before the all-to-all, which is what the GEMMs consume. With the
bf16 wgrad the product DY'^T X' is exact.
"""

from __future__ import annotations

import torch

from ..quant.fp8_rowwise import quantize_fp8_rowwise_reference

FP8_STRATEGIES = ("fp8_rowwise", "fp8_rowwise_a2a")


def _r(a: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_fp8_rowwise_reference(a.contiguous())
    return q.double() * scale.double().unsqueeze(-1)


def crossed_rows(a: torch.Tensor) -> torch.Tensor:
    """bf16 rows as they are after crossing an FP8 rowwise all-to-all and the dequantization: fp32(q * scale)
    rounded to bf16."""
    q, scale = quantize_fp8_rowwise_reference(a.contiguous())
    return (q.float() * scale.unsqueeze(-1)).to(torch.bfloat16)


def forward_fp8(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (n, K) @ w (N, K)^T, both quantized rowwise along K, fp64."""
    return _r(x) @ _r(w).T


def dgrad_fp8(dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dy (n, N) @ w (N, K), dy rowwise along N, w along N (its transpose's rows), fp64."""
    return _r(dy) @ _r(w.T).T


def wgrad_fp8(dy: torch.Tensor, x: torch.Tensor, strategy: str, bf16: bool, crossed: tuple[bool, bool]) -> torch.Tensor:
    """grad_w (N, K) = dy^T x of one expert, fp64: under fp8_rowwise_a2a the operands that ``crossed`` as they
    arrived (``crossed_rows``); then the bf16 wgrad (exact) or the recipe's (scales per column of the expert)."""
    if strategy == "fp8_rowwise_a2a":
        dy, x = (crossed_rows(t) if c else t for t, c in zip((dy, x), crossed, strict=True))
    if bf16:
        return dy.double().T @ x.double()
    return _r(dy.T) @ _r(x.T).T
