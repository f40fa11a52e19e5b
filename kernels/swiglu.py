"""SwiGLU, the experts' activation: ``act = silu(h1) * h3`` and its backward.

h1 and h3 are the gate and up projections of the same rows: two (M, N) tensors, or the two halves of one (M, 2N)
output of a fused gate/up GEMM (views with row stride 2N: no copy). Numerics (the contract): fp32 arithmetic on the
bf16 inputs, ``sigmoid(x) = 1 / (1 + exp(-x))``, one rounding to bf16 (nearest even) per output.

* forward  ``act = bf16(h1 * sigmoid(h1) * h3)``
* backward ``grad_h1 = bf16(g * h3 * s * (1 + h1 * (1 - s)))``, ``grad_h3 = bf16(g * h1 * s)`` with
  ``s = sigmoid(h1)``, ``g = grad_act``; written packed as one (M, 2N) tensor [grad_h1 | grad_h3] (the fused GEMM's
  layout) or as two (M, N) tensors.
"""

from __future__ import annotations

import torch

from .cost import Cost
from .runtime import InputError, check_tensor


def _check_halves(h1: object, h3: object) -> tuple[torch.Tensor, torch.Tensor]:
    h1 = check_tensor("h1", h1, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    h3 = check_tensor("h3", h3, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    if h1.shape != h3.shape:
        raise InputError(f"h1 and h3 must have one shape, got {tuple(h1.shape)} and {tuple(h3.shape)}")
    for name, h in (("h1", h1), ("h3", h3)):
        if h.stride(1) != 1 or h.stride(0) < h.shape[1]:
            raise InputError(f"{name} must be row-major with contiguous rows (a view of a wider row is fine)")
    return h1, h3


def split_halves(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (h1, h3) views of a fused gate/up output (M, 2N)."""
    n = h.shape[1] // 2
    return h[:, :n], h[:, n:]


def swiglu(h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    """(M, N) bf16 ``silu(h1) * h3`` (module doc)."""
    h1, h3 = _check_halves(h1, h3)
    return swiglu_reference(h1, h3)


def swiglu_reference(h1, h3):
    a, b = h1.float(), h3.float()
    return (a * (1.0 / (1.0 + torch.exp(-a))) * b).to(torch.bfloat16)


def swiglu_backward(grad_act: torch.Tensor, h1: torch.Tensor, h3: torch.Tensor, *, packed: bool = True):
    """(grad_h (M, 2N),) packed, else (grad_h1, grad_h3), each (M, N) bf16 (module doc)."""
    h1, h3 = _check_halves(h1, h3)
    grad_act = check_tensor("grad_act", grad_act, dtypes=(torch.bfloat16,), ndim=2)
    if grad_act.shape != h1.shape:
        raise InputError(f"grad_act must be {tuple(h1.shape)}, got {tuple(grad_act.shape)}")
    return swiglu_backward_reference(grad_act, h1, h3, packed=packed)


def swiglu_backward_reference(grad_act, h1, h3, *, packed: bool = True):
    g, a, b = grad_act.float(), h1.float(), h3.float()
    s = 1.0 / (1.0 + torch.exp(-a))
    d1 = (g * b * s * (1.0 + a * (1.0 - s))).to(torch.bfloat16)
    d3 = (g * a * s).to(torch.bfloat16)
    return (torch.cat([d1, d3], dim=1),) if packed else (d1, d3)


def swiglu_cost(M: int, N: int) -> Cost:
    """Read h1 and h3, write act (bf16)."""
    return Cost(2 * M * N * 2, M * N * 2)


def swiglu_backward_cost(M: int, N: int) -> Cost:
    """Read grad_act, h1 and h3, write both gradients (bf16)."""
    return Cost(3 * M * N * 2, 2 * M * N * 2)
