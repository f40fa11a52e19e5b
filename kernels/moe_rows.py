"""Row movements of the MoE layer: the permutation into padded expert groups, the weighted combine, and the score
gradients they owe the router.

Every data movement of the layer outside the GEMMs is one of three row operations:

* ``gather_weighted(x, src, weight)``: ``out[r] = x[src[r]] * weight[r]`` (zeros where ``src[r] < 0``). The permute
  (tokens into their experts' padded slots, scored before the experts or not) and the combine's backward (the
  output gradient into the same slots) are this gather.
* ``combine_rows(y, dest, weight, top_k)``: ``out[t] = sum_j y[dest[t*k + j]] * weight[t*k + j]``. The combine
  (each token's top_k expert outputs, scored after the experts or not) and the permute's backward (each token's
  top_k input-gradient copies) are this sum.
* ``row_dot(a, a_rows, b, b_rows)``: ``out[c] = <a[a_rows[c]], b[b_rows[c]]>``, the gradient of a score that
  multiplied a row.

Numerics (the contract every implementation is held to): products and sums in fp32, the sum over j in j order,
one rounding to bf16 at the end (round to nearest even); with ``weight`` None the gather copies bits. Index tensors
are int32 on the device, never read on the host (graph-capturable). Each function has a plain-torch ``*_reference``
and declares its cost (``*_cost``).
"""

from __future__ import annotations

import torch

from .cost import Cost
from .runtime import InputError, check_tensor

INDEX_DTYPE = torch.int32
_INDEX_BYTES, _WEIGHT_BYTES = 4, 4


def _check_rows(name: str, index: object, weight: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    index = check_tensor(name, index, dtypes=(INDEX_DTYPE,), ndim=1)
    if weight is not None:
        weight = check_tensor("weight", weight, dtypes=(torch.float32,), ndim=1)
        if weight.shape != index.shape:
            raise InputError(f"weight must hold one value per entry of {name} ({index.numel()}), got "
                             f"{tuple(weight.shape)}")  # fmt: skip
    return index, weight


def gather_weighted(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """(R, D) bf16: row r is ``x[src[r]]`` (bits) or ``bf16(fp32(x[src[r]]) * weight[r])``; zeros where
    ``src[r] < 0``. x (T, D) bf16 row-major; src int32 (R,), entries in [-1, T) (not checked on the device)."""
    x = check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    src, weight = _check_rows("src", src, weight)
    return gather_weighted_reference(x, src, weight)


def gather_weighted_reference(x, src, weight=None):
    valid = (src >= 0).unsqueeze(1)
    rows = x.index_select(0, src.clamp(min=0).long())
    if weight is not None:
        rows = (rows.float() * weight.unsqueeze(1)).to(torch.bfloat16)
    return torch.where(valid, rows, torch.zeros((), dtype=x.dtype, device=x.device))


def gather_weighted_cost(rows: int, D: int, tokens_rows: int, weighted: bool) -> Cost:
    """Read the ``tokens_rows`` source rows that are gathered, the index (and weights); write every output row."""
    extra = rows * (_INDEX_BYTES + (_WEIGHT_BYTES if weighted else 0))
    return Cost(tokens_rows * D * 2 + extra, rows * D * 2)


def combine_rows(y: torch.Tensor, dest: torch.Tensor, weight: torch.Tensor | None = None, top_k: int = 1):
    """(T, D) bf16: ``out[t] = bf16(sum_{j < top_k} fp32(y[dest[t*top_k + j]]) * weight[t*top_k + j])`` (weight 1
    where None), summed in j order. y (R, D) bf16 row-major; dest int32 (T*top_k,), entries in [0, R)."""
    y = check_tensor("y", y, dtypes=(torch.bfloat16,), ndim=2)
    dest, weight = _check_rows("dest", dest, weight)
    if not isinstance(top_k, int) or top_k < 1 or dest.numel() % top_k:
        raise InputError(f"top_k must be a positive int dividing dest's {dest.numel()} entries, got {top_k!r}")
    return combine_rows_reference(y, dest, weight, top_k)


def combine_rows_reference(y, dest, weight=None, top_k=1):
    picked = y.index_select(0, dest.long()).float()
    if weight is not None:
        picked = picked * weight.unsqueeze(1)
    picked = picked.view(-1, top_k, y.shape[1])
    total = picked[:, 0]
    for j in range(1, top_k):
        total = total + picked[:, j]
    return total.to(torch.bfloat16)


def combine_rows_cost(tokens: int, D: int, top_k: int, weighted: bool) -> Cost:
    """Read every gathered row (and its index and weight), write one row per token."""
    per_copy = D * 2 + _INDEX_BYTES + (_WEIGHT_BYTES if weighted else 0)
    return Cost(tokens * top_k * per_copy, tokens * D * 2)


def row_dot(a: torch.Tensor, a_rows: torch.Tensor, b: torch.Tensor, b_rows: torch.Tensor) -> torch.Tensor:
    """(C,) fp32: ``sum_d fp32(a[a_rows[c], d]) * fp32(b[b_rows[c], d])``. a (R, D), b (T, D) bf16 row-major."""
    a = check_tensor("a", a, dtypes=(torch.bfloat16,), ndim=2)
    b = check_tensor("b", b, dtypes=(torch.bfloat16,), ndim=2)
    a_rows, _ = _check_rows("a_rows", a_rows, None)
    b_rows, _ = _check_rows("b_rows", b_rows, None)
    if a.shape[1] != b.shape[1] or a_rows.shape != b_rows.shape:
        raise InputError(f"a and b must share D and a_rows and b_rows their length; got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(a_rows.shape)}, {tuple(b_rows.shape)}")  # fmt: skip
    return row_dot_reference(a, a_rows, b, b_rows)


def row_dot_reference(a, a_rows, b, b_rows):
    return (a.index_select(0, a_rows.long()).float() * b.index_select(0, b_rows.long()).float()).sum(1)


def row_dot_cost(copies: int, D: int) -> Cost:
    """Read both rows of every pair and the two indices, write one fp32 per pair."""
    return Cost(copies * (2 * D * 2 + 2 * _INDEX_BYTES), copies * 4)
