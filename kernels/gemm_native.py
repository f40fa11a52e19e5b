"""The torch-native grouped GEMMs: backend "native" (``torch._scaled_grouped_mm`` for MXFP8 and FP8 rowwise,
``torch._grouped_mm`` for bf16), with the guards that refuse what these calls would get wrong on the device.

* MXFP8 ``torch._scaled_grouped_mm`` takes the blocked e8m0 scales of ``layouts`` as they are and runs on compute
  capability 10.x only. On SM90 that call is not rejected: it launches an SM100-only kernel and the CUDA context
  dies, so it is refused before any launch (``unavailable``).
* FP8 rowwise ``torch._scaled_grouped_mm`` runs on SM90 and SM100 and needs the contraction dim and the output's
  column count to be multiples of 16, bf16 output, and in 2D x 2D every group size a multiple of 16 (a device-side
  assert otherwise; not checked here, where offs is not read).
* bf16 ``torch._grouped_mm`` is graph-capturable on SM90 / SM100, where it reads offs on the device; below SM90 it
  loops over ``offs.cpu()``. Its kernel asserts on the device (the CUDA context dies) unless 2D x 2D groups are
  multiples of 8 tokens, and some torch versions were reported to ask the same of 2D x 3D groups: the pipeline pads
  groups to 16 (bf16, FP8 rowwise) or 32 (MXFP8).

Every call here writes bf16 only. The operands come checked by ``grouped_gemm``'s operand-level dispatchers.
"""

from __future__ import annotations

import torch

from .format import SCALE_DTYPE
from .runtime import InputError


def unavailable(recipe: str, cap: tuple[int, int] | None, device: torch.device) -> str | None:
    """Why the native backend cannot run ``recipe`` on ``device`` of compute capability ``cap`` (None: not a CUDA
    device), or None if it can."""
    if recipe == "bf16":
        return None  # torch._grouped_mm: graph-safe on SM90/SM100, a host loop over offs elsewhere
    if cap is None:
        return f"torch._scaled_grouped_mm needs a CUDA device, got {device}"
    if recipe == "fp8_rowwise" and not (cap == (9, 0) or cap[0] == 10):
        return f"FP8 rowwise torch._scaled_grouped_mm runs on compute capability 9.0 and 10.x, not {cap}"
    if recipe == "mxfp8" and cap[0] != 10:
        return (
            f"MXFP8 torch._scaled_grouped_mm needs compute capability 10.x (SM100), this GPU is {cap}: on SM90 "
            "it launches an SM100-only kernel and the CUDA context dies; use backend 'triton_fp8', 'triton' "
            "or 'emulated'"
        )
    return None


def run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype: torch.dtype) -> torch.Tensor:
    """MXFP8 ``torch._scaled_grouped_mm`` on checked TN operands with blocked scales."""
    sa, sb = a_sb.view(SCALE_DTYPE), b_sb.view(SCALE_DTYPE)
    if b_q.dim() == 3:
        return torch._scaled_grouped_mm(
            a_q, b_q.transpose(-2, -1), sa, sb.reshape(b_q.shape[0], -1), offs=offs, out_dtype=out_dtype
        )
    return torch._scaled_grouped_mm(a_q, b_q.t(), sa, sb, offs=offs, out_dtype=out_dtype)


def run_fp8_rowwise(
    a_q, a_scale, b_q, b_scale, offs, out_dtype: torch.dtype, use_fast_accum: bool = False
) -> torch.Tensor:
    """FP8 rowwise ``torch._scaled_grouped_mm`` on checked TN operands with fp32 scales; refuses (``InputError``,
    before the launch) a contraction dim or output column count that is not a multiple of 16. In 2D x 2D torch
    reads the per-group scales flattened group-major."""
    if b_q.dim() == 3:
        contraction, out_cols = b_q.shape[2], b_q.shape[1]
    else:
        contraction, out_cols = a_q.shape[1], b_q.shape[0]
    for what, value in (("the contraction dim", contraction), ("the output's column count", out_cols)):
        if value % 16:
            raise InputError(f"native FP8 rowwise grouped GEMM: {what} ({value}) must be a multiple of 16")
    if b_q.dim() == 2:
        a_scale, b_scale = a_scale.reshape(-1), b_scale.reshape(-1)
    return torch._scaled_grouped_mm(
        a_q, b_q.transpose(-2, -1), a_scale, b_scale, offs=offs, out_dtype=out_dtype, use_fast_accum=use_fast_accum
    )


def run_bf16(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """bf16 ``torch._grouped_mm`` in its own operand form (2D x 3D: a (M, K), b (G, K, N); 2D x 2D: a (N, M),
    b (M, K))."""
    return torch._grouped_mm(a, b, offs=offs)
