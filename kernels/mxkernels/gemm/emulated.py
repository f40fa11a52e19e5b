"""The "emulated" backend: the reference every other backend is checked against.

It dequantizes the operands in fp32 (MXFP8 scales unblocked per group with ``layouts.from_blocked``; FP8 rowwise
scales per row, per group and row in 2D x 2D) and multiplies in fp32 with a host loop over the groups, so it reads
offs on the host (a sync; never graph-capturable). The operands come checked by ``grouped_gemm``'s dispatchers.
"""

from __future__ import annotations

import torch

from .backend import FIRST, LAST, Arch, Backend, always_available, late
from ..core.cost import ceil_to
from ..core.format import BLOCK_SIZE, dequantize_reference
from ..core.names import Recipe
from ..quant.fp8_rowwise import dequantize_fp8_rowwise_reference
from ..layouts.scale_layout import TILE_COLS, TILE_ROWS, from_blocked


def _bounds(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = offs.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def grouped_matmul_fp32(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``torch._grouped_mm`` semantics computed in fp32: a (M, K) x b (G, K, N) -> (M, N) (rows past offs[-1]
    zero), or a (N, M) x b (M, K) -> (G, N, K)."""
    bounds = _bounds(offs)
    if b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float32, device=a.device)
        for g, (start, end) in enumerate(bounds):
            out[start:end] = a[start:end].float() @ b[g].float()
    else:
        out = torch.zeros(len(bounds), a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
        for g, (start, end) in enumerate(bounds):
            out[g] = a[:, start:end].float() @ b[start:end].float()
    return out.to(out_dtype)


def _mx_dequantize(a_q, a_sb, b_q, b_sb, bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 operands in ``torch._grouped_mm`` form (a, b) of MXFP8 operands with blocked scales."""
    if b_q.dim() == 3:
        (M, K), (G, N, _) = a_q.shape, b_q.shape
        a = torch.zeros(M, K, dtype=torch.float32, device=a_q.device)
        image_row = 0
        for start, end in bounds:
            scales = from_blocked(a_sb[image_row:], end - start, K // BLOCK_SIZE)
            a[start:end] = dequantize_reference(a_q[start:end], scales)
            image_row += ceil_to(end - start, TILE_ROWS)
        b = torch.stack([dequantize_reference(b_q[g], from_blocked(b_sb[g], N, K // BLOCK_SIZE)) for g in range(G)])
        return a, b.transpose(-2, -1)
    deq = []
    for q, blocked in ((a_q, a_sb), (b_q, b_sb)):
        rows = q.shape[0]
        x = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        flat = blocked.reshape(-1)
        image = 0
        for start, end in bounds:
            cols = (end - start) // BLOCK_SIZE
            if cols:
                x[:, start:end] = dequantize_reference(q[:, start:end], from_blocked(flat[image:], rows, cols))
            image += ceil_to(rows, TILE_ROWS) * ceil_to(cols, TILE_COLS)  # one complete blocked image
        deq.append(x)
    return deq[0], deq[1].t()


def _fp8_dequantize(a_q, a_scale, b_q, b_scale, bounds) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 operands in ``torch._grouped_mm`` form (a, b) of FP8 rowwise operands."""
    if b_q.dim() == 3:
        a = dequantize_fp8_rowwise_reference(a_q, a_scale)
        return a, dequantize_fp8_rowwise_reference(b_q, b_scale).transpose(-2, -1)
    deq = []
    for q, scale in ((a_q, a_scale), (b_q, b_scale)):
        x = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for g, (start, end) in enumerate(bounds):
            x[:, start:end] = dequantize_fp8_rowwise_reference(q[:, start:end], scale[g])
        deq.append(x)
    return deq[0], deq[1].t()


def run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype: torch.dtype) -> torch.Tensor:
    """MXFP8 TN operands with blocked scales, dequantized and multiplied in fp32."""
    a, b = _mx_dequantize(a_q, a_sb, b_q, b_sb, _bounds(offs))
    return grouped_matmul_fp32(a, b, offs, out_dtype)


def run_fp8_rowwise(a_q, a_scale, b_q, b_scale, offs, out_dtype: torch.dtype, use_fast_accum: bool = False
                    ) -> torch.Tensor:  # fmt: skip
    """FP8 rowwise TN operands with fp32 scales, dequantized and multiplied in fp32 (``use_fast_accum`` asks the
    native kernel for its fast sums; there is no faster sum here)."""
    a, b = _fp8_dequantize(a_q, a_scale, b_q, b_scale, _bounds(offs))
    return grouped_matmul_fp32(a, b, offs, out_dtype)


BACKEND = Backend(
    "emulated",
    run={Recipe.MXFP8: late(__name__, "run_mxfp8"), Recipe.FP8_ROWWISE: late(__name__, "run_fp8_rowwise"),
         Recipe.BF16: late(__name__, "grouped_matmul_fp32", out_dtype=torch.bfloat16)},
    unavailable=always_available,
    # A host loop: the slowest on every GPU, but on a CPU faster than the interpreted Triton kernels.
    preference={Arch.CPU: FIRST, Arch.SM100: LAST, Arch.SM90: LAST, Arch.OTHER: LAST},
)  # fmt: skip
