"""The GEMM stages' oracles: fp64 products of the exactly dequantized operands, rounded once to the output dtype.

Written apart from every backend of ``grouped_gemm`` (the "emulated" backend included, which multiplies in fp32):
an oracle that is one of the backends would let that backend pass against itself (SQNR inf dB), whatever it gets
wrong. Here each operand is dequantized in fp64 (e4m3 and 2**e are exact there, so is their product), the groups
are walked from the host offsets, and the products are summed in fp64. The blocked scales are read back with
``layouts.from_blocked``, the layout's definition (the inverse of ``to_blocked``), not a kernel.
"""

from __future__ import annotations

import torch

from ..core.cost import ceil_to
from ..core.format import BLOCK_SIZE, E8M0_BIAS, E8M0_NAN
from ..layouts.scale_layout import TILE_COLS, TILE_ROWS, from_blocked


def _groups(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = [int(e) for e in offs.tolist()]
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _mx_fp64(q: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """q (R, C) e4m3 with scale bytes (R, C/32) -> fp64 values; byte 255 (NaN scale) gives NaN."""
    byte = scale_bytes.view(torch.uint8).to(torch.int64)
    scale = torch.ldexp(torch.ones_like(byte, dtype=torch.float64), byte - E8M0_BIAS)
    scale = torch.where(byte == E8M0_NAN, torch.full_like(scale, float("nan")), scale)
    return q.double() * scale.repeat_interleave(BLOCK_SIZE, dim=-1)


def _matmul_groups(a: torch.Tensor, b: torch.Tensor, groups, out_dtype: torch.dtype) -> torch.Tensor:
    """``torch._grouped_mm`` semantics in fp64: a (M, K) x b (G, K, N) -> (M, N) with rows past the last group
    zero, or a (N, M) x b (M, K) -> (G, N, K) (contraction split by the groups)."""
    if b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64, device=a.device)
        for g, (start, end) in enumerate(groups):
            out[start:end] = a[start:end] @ b[g]
    else:
        out = torch.stack([a[:, start:end] @ b[start:end] for start, end in groups])
    return out.to(out_dtype)


def mxfp8_reference(a_q, a_sb, b_q, b_sb, offs, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """MXFP8 TN operands with blocked scales (``grouped_gemm.mxfp8_scaled_grouped_mm``'s contract) in fp64."""
    groups = _groups(offs)
    if b_q.dim() == 3:  # 2D x 3D: a's scales in M-groups images, each ceil_128(size) rows; b's per expert
        (M, K), (G, N, _) = a_q.shape, b_q.shape
        a = torch.zeros(M, K, dtype=torch.float64, device=a_q.device)
        image = 0
        for start, end in groups:
            a[start:end] = _mx_fp64(a_q[start:end], from_blocked(a_sb[image:], end - start, K // BLOCK_SIZE))
            image += ceil_to(end - start, TILE_ROWS)
        b = torch.stack([_mx_fp64(b_q[g], from_blocked(b_sb[g], N, K // BLOCK_SIZE)) for g in range(G)])
        return _matmul_groups(a, b.transpose(-2, -1), groups, out_dtype)
    # 2D x 2D: both operands' scales in K-groups images laid back to back, one per group's columns
    operands = []
    for q, blocked in ((a_q, a_sb), (b_q, b_sb)):
        x = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
        rows, flat, image = q.shape[0], blocked.reshape(-1), 0
        for start, end in groups:
            cols = (end - start) // BLOCK_SIZE
            if cols:
                x[:, start:end] = _mx_fp64(q[:, start:end], from_blocked(flat[image:], rows, cols))
            image += ceil_to(rows, TILE_ROWS) * ceil_to(cols, TILE_COLS)
        operands.append(x)
    return _matmul_groups(operands[0], operands[1].t(), groups, out_dtype)


def fp8_rowwise_reference(a_q, a_scale, b_q, b_scale, offs, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """FP8 rowwise TN operands with fp32 scales (per row; 2D x 2D per group and row) in fp64."""
    groups = _groups(offs)
    if b_q.dim() == 3:
        a = a_q.double() * a_scale.double().unsqueeze(-1)
        b = b_q.double() * b_scale.double().unsqueeze(-1)
        return _matmul_groups(a, b.transpose(-2, -1), groups, out_dtype)
    operands = []
    for q, scale in ((a_q, a_scale), (b_q, b_scale)):
        x = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
        for g, (start, end) in enumerate(groups):
            x[:, start:end] = q[:, start:end].double() * scale[g].double().unsqueeze(-1)
        operands.append(x)
    return _matmul_groups(operands[0], operands[1].t(), groups, out_dtype)


def bf16_reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(a, b, offs)`` on bf16 operands in fp64, rounded once to bf16."""
    return _matmul_groups(a.double(), b.double(), _groups(offs), torch.bfloat16)


def mxfp8_oracle(a_q, a_sb, b_q, b_sb, offs) -> tuple[torch.Tensor]:
    """The MXFP8 GEMM stages' oracle: ``mxfp8_reference`` in the stage contract's form (a tuple of outputs)."""
    return (mxfp8_reference(a_q, a_sb, b_q, b_sb, offs),)


def fp8_rowwise_oracle(a_q, a_scale, b_q, b_scale, offs) -> tuple[torch.Tensor]:
    """The FP8 rowwise GEMM stages' oracle: ``fp8_rowwise_reference`` as a tuple of outputs."""
    return (fp8_rowwise_reference(a_q, a_scale, b_q, b_scale, offs),)
