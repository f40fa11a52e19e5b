"""The "triton_dequant" backend: dequantize both MXFP8 operands to bf16, exactly, then ``torch._grouped_mm``.

``dequantize_blocked`` writes each operand in bf16: a memory-bound Triton pass reading the blocked scales of
``layouts`` in place. ``torch._grouped_mm`` (``gemm_native.run_bf16``, whose device rules apply) then multiplies on
bf16 tensor cores with fp32 accumulation. bf16 output only; graph-capturable where ``torch._grouped_mm`` is.

MX -> bf16 is exact: an e4m3 value has 4 significant bits and bf16 8, and bf16 keeps fp32's exponent range. Checked
over all 256 codes x 256 scale bytes against fp64 (tests): the product is bf16's unless it overflows
(|v| * 2**(e - 127) > bf16 max, bytes >= 247: +-Inf, as in fp32) or lies off the bf16 subnormal grid (multiples of
2**-133): scale byte e <= 2 with v not a multiple of 2**(-6 - e), 96 pairs, which round once to the nearest bf16
subnormal (error <= 2**-134). Both cases match ``dequantize_reference(...).to(bfloat16)`` bit for bit, and
quantizing bf16 input never produces the second (its values are multiples of 2**-133, so its quantized codes are
multiples of 2**(-6 - e)). The GEMM is thus the emulation's math (exact products, fp32 sums) at bf16 GEMM speed
plus the dequantize pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import Backend, late, triton_unavailable
from ..core.format import BLOCK_SIZE, DATA_DTYPE
from ..core.names import Recipe
from .native import run_bf16
from ..layouts.scale_layout import SCALE_DTYPES, blocked_3d_shape, blocked_word, k_groups_shape, m_groups_shape
from ..layouts.padding import group_bounds
from ..core.runtime import (
    InputError,
    check_config,
    check_fields_power_of_two,
    check_host_offsets,
    check_offsets,
    check_same_device,
    check_shape,
    check_tensor,
    default_launch,
)

# How the rows and 32-blocks of a quantized operand (rows, contraction) map to its blocked scale buffer.
DEQUANT_LAYOUTS = ("m_groups", "3d", "k_groups")
_M_GROUPS = tl.constexpr(0)  # offs splits the rows: a ``rearrange_m_groups`` buffer (2D x 3D a_q)
_EXPERTS = tl.constexpr(1)  # every N_ROWS rows are one expert: a ``rearrange_3d`` buffer (2D x 3D b_q)
_K_GROUPS = tl.constexpr(2)  # offs splits the contraction dim: a ``rearrange_k_groups`` buffer (2D x 2D)


@dataclass(frozen=True)
class DequantConfig:
    """One launch of the dequantize kernel: a program converts block_rows rows x block_blocks 32-blocks."""

    # Rows per program, a power of two.
    block_rows: int
    # 32-blocks of each row per program, a power of two: the default 16 (512 elements) lets every thread load
    # 16-byte runs of e4m3 and store 16-byte runs of bf16.
    block_blocks: int
    # Warps per program.
    num_warps: int

    def __post_init__(self):
        check_fields_power_of_two(self, "block_rows", "block_blocks", "num_warps")


# The default (config=None): 16 rows x 512 elements with 8 warps, 24 KiB moved per program, sized like the padding
# kernels' programs, which stream near the copy rate (docs/perf-log.md).
DEQUANT_CONFIG = DequantConfig(block_rows=16, block_blocks=16, num_warps=8)
# config=None under the interpreter (runtime.default_launch): 128 rows a program.
_DEQUANT_LAUNCH = default_launch(DEQUANT_CONFIG, DequantConfig(block_rows=128, block_blocks=16, num_warps=8))


@triton.jit
def _e8m0_to_fp32_nan(byte):
    """fp32 2**(e - 127) of scale bytes e (int32), 255 -> NaN: e4m3 x this product is the spec's value."""
    tiny_or_nan = (byte == 0) | (byte == 255)  # the subnormal 2**-127 and the quiet NaN carry mantissa bit 22
    return ((byte << 23) | tl.where(tiny_or_nan, 0x400000, 0)).to(tl.float32, bitcast=True)


@triton.jit
def _dequant_kernel(
    q_ptr, s_ptr, offs_ptr, out_ptr, R, C, G, N_ROWS,
    LAYOUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    """out (R, 32 C) bf16 = q (R, 32 C) e4m3 * 2**(scale - 127), one scale byte per row and 32-block.

    Program (row block, block block): BLOCK_R rows x BLOCK_B 32-blocks, as a (rows, blocks, 32) tile so that each
    block's scale broadcasts along its 32 elements with no reshape. Each (row, block) finds its group, its row
    inside the group's blocked image and that image's first int32 word; the byte is then ``layouts.blocked_word`` + 128
    words per 4 blocks + block % 4. Elements in no group (rows past offs[-1] of m_groups, blocks past offs[-1] of
    k_groups) come out zero.
    """
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    blocks = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    lane = tl.arange(0, BLOCK_G)
    in_bounds = (rows < R)[:, None] & (blocks < C)[None, :]
    if LAYOUT == _K_GROUPS:
        starts, sizes = group_bounds(offs_ptr, G, C * 32, BLOCK_G)
        before = (starts + sizes)[None, :] // 32 <= blocks[:, None]  # (blocks, groups): groups ending at or before
        before &= (lane < G)[None, :]
        g = tl.sum(before.to(tl.int32), 1)
        local = rows[:, None]
        block = blocks - tl.sum(tl.where(before, sizes[None, :], 0), 1) // 32
        words = tl.cdiv(tl.sum(tl.where(lane[None, :] == g[:, None], sizes[None, :], 0), 1), 128)[None, :]
        # Complete images of ceil_128(R) rows, each row one word per 128 group tokens, back to back.
        image = tl.cdiv(R, 128) * 128 * tl.sum(tl.where(before, tl.cdiv(sizes, 128)[None, :], 0), 1)[None, :]
        ok = in_bounds & (g < G)[None, :]
    else:
        words = tl.cdiv(C, 4)
        if LAYOUT == _EXPERTS:
            local = (rows % N_ROWS)[:, None]
            image_row = rows // N_ROWS * (tl.cdiv(N_ROWS, 128) * 128)
            ok = in_bounds
        else:
            starts, sizes = group_bounds(offs_ptr, G, R, BLOCK_G)
            before = ((starts + sizes)[None, :] <= rows[:, None]) & (lane < G)[None, :]
            local = (rows - tl.sum(tl.where(before, sizes[None, :], 0), 1))[:, None]
            image_row = tl.sum(tl.where(before, tl.cdiv(sizes, 128)[None, :] * 128, 0), 1)
            ok = in_bounds & (tl.sum(before.to(tl.int32), 1) < G)[:, None]
        image = (image_row * words)[:, None]
        block = blocks
    word = image.to(tl.int64) + blocked_word(local, words) + (block // 4 * 128)[None, :]
    scale = _e8m0_to_fp32_nan(tl.load(s_ptr + word * 4 + (block % 4)[None, :], mask=ok, other=0).to(tl.int32))
    k = blocks[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    elements = rows.to(tl.int64)[:, None, None] * C * 32 + k
    q = tl.load(q_ptr + elements, mask=ok[:, :, None], other=0.0)
    # Both factors and their fp32 product are exact; the one rounding, to bf16, is exact too but in the subnormal
    # corner (module doc).
    tl.store(out_ptr + elements, (q.to(tl.float32) * scale[:, :, None]).to(tl.bfloat16), mask=in_bounds[:, :, None])


def dequantize_blocked(
    q: torch.Tensor,
    scales: torch.Tensor,
    offs: torch.Tensor | None = None,
    *,
    layout: str,
    config: DequantConfig | None = None,
) -> torch.Tensor:
    """bf16 values of an MXFP8 operand whose scales are in a ``layouts`` blocked buffer (graph-capturable).

    q: e4m3, contraction dim last and contiguous; scales: e8m0 or uint8, contiguous, by ``layout``:

    * "m_groups": q (M, K), scales ``rearrange_m_groups`` (128 * (ceil(M/128) + G), ceil_4(K/32)); rows past
      offs[-1] come out zero;
    * "3d": q (G, N, K), scales ``rearrange_3d`` (G, ceil_128(N), ceil_4(K/32)); offs unused (may be None);
    * "k_groups": q (R, M), scales ``rearrange_k_groups`` (ceil_128(R), M/32 + 4G), offs splits M (group sizes
      multiples of 32); columns past offs[-1] come out zero.

    Returns bf16 of q's shape, row-major: q * 2**(byte - 127), with NaN for scale byte 255. Bit-identical to
    ``dequantize_reference(q, unblocked scales).to(torch.bfloat16)`` (both round the exact fp32 product once).
    ``config``: the launch (None: ``DEQUANT_CONFIG``).
    """
    if layout not in DEQUANT_LAYOUTS:
        raise InputError(f"layout must be one of {', '.join(DEQUANT_LAYOUTS)}; got {layout!r}")
    check_tensor("q", q, dtypes=(DATA_DTYPE,), ndim=3 if layout == "3d" else 2)
    check_tensor("scales", scales, dtypes=SCALE_DTYPES)
    check_same_device("scales", scales, q, "q")
    if q.shape[-1] % BLOCK_SIZE:
        raise InputError(f"q's last dim ({q.shape[-1]}) must be a multiple of {BLOCK_SIZE}")
    blocks = q.shape[-1] // BLOCK_SIZE
    if layout == "3d":
        G, N, _ = q.shape
        rows, n_rows = G * N, N
        check_shape("scales", scales, blocked_3d_shape(G, N, blocks))
    else:
        check_offsets(offs)
        check_same_device("offs", offs, q, "q")
        G, (rows, cols), n_rows = offs.numel(), q.shape, 1
        if layout == "m_groups":
            check_host_offsets(offs, rows)
            check_shape("scales", scales, m_groups_shape(rows, blocks, G))
        else:
            check_host_offsets(offs, cols, BLOCK_SIZE)
            check_shape("scales", scales, k_groups_shape(rows, blocks, G))
    check_config("config", config, DequantConfig)
    config = config or _DEQUANT_LAUNCH
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    if out.numel():
        grid = (triton.cdiv(rows, config.block_rows), triton.cdiv(blocks, config.block_blocks))
        scale_bytes = scales.view(torch.uint8)
        _dequant_kernel[grid](
            q, scale_bytes, scale_bytes if offs is None else offs, out, rows, blocks, G, n_rows,  # "3d": offs unread
            LAYOUT=DEQUANT_LAYOUTS.index(layout), BLOCK_R=config.block_rows, BLOCK_B=config.block_blocks,
            BLOCK_G=triton.next_power_of_2(G), num_warps=config.num_warps,
        )  # fmt: skip
    return out


def run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The "triton_dequant" backend on operands ``grouped_gemm`` has checked: bf16 operands in the layouts
    ``torch._grouped_mm`` takes as they are (2D x 3D: a (M, K) row-major, b (G, K, N) as a transposed view of
    (G, N, K); 2D x 2D: a (N, M) row-major, b (M, K) as a transposed view of (K, M)), so it copies nothing.
    ``out_dtype``: bf16, all ``torch._grouped_mm`` writes (the front door refuses others, ``BACKEND.out_dtypes``)."""
    if b_q.dim() == 3:
        a = dequantize_blocked(a_q, a_sb, offs, layout="m_groups")
        b = dequantize_blocked(b_q, b_sb, layout="3d").transpose(-2, -1)
    else:
        a = dequantize_blocked(a_q, a_sb, offs, layout="k_groups")
        b = dequantize_blocked(b_q, b_sb, offs, layout="k_groups").t()
    return run_bf16(a, b, offs)


BACKEND = Backend("triton_dequant", run={Recipe.MXFP8: late(__name__, "run_mxfp8")},
                  unavailable=triton_unavailable,
                  out_dtypes=(torch.bfloat16,))  # fmt: skip
