"""The "triton_fused" backend: MXFP8 grouped GEMMs that dequantize the token operand in the GEMM's load path.

On SM90 there is no block-scaled MMA. "triton_dequant" writes both operands back in bf16 and runs
``torch._grouped_mm``; "triton_fp8" multiplies in fp8 and rescales every 32-wide chunk of the fp32 accumulator on the
CUDA cores. Here the e4m3 tile of the token operand and its scale bytes go global -> shared memory as they are
(cp.async, software-pipelined), and each program turns them into bf16 in registers -- exactly: e4m3 x 2**k is a bf16
value but in the subnormal corner ``gemm_dequant`` documents -- right before a bf16 ``tl.dot`` (wgmma, the A operand
fed from registers, fp32 accumulation). No full-size bf16 copy of the token operand is ever written.

* 2D x 3D (forward, dgrad): a_q (M, K) is dequantized in the load path; the weights b_q (G, N, K), small next to it,
  are dequantized once by ``gemm_dequant.dequantize_blocked`` (its pass is part of every call and of its time).
* 2D x 2D (wgrad): both token-major operands, a_q (N, M) and b_q (K, M), are dequantized in the load path; the
  second one goes registers -> shared memory on its way to the tensor cores.

The products are the emulation's (exact bf16 operands, fp32 sums): only the summation order and the output's
rounding differ from ``gemm_emulated``. Scale byte 255 (NaN) decodes to NaN. e4m3 NaN codes (0x7F, 0xFF) decode to
finite values: the quantizers write them only into blocks whose scale byte is 255, whose every element is NaN anyway.

Scheduling is persistent: ``min(tiles, programs)`` programs walk the output tiles group after group (tile t, t +
programs, ...), each tile's group found on the device from ``offs``, so a call needs no host sync and can be captured
in a CUDA graph; each tile's contraction is a software-pipelined loop (cp.async stages, wgmma kept in flight). In
2D x 3D output rows past offs[-1] are left unwritten; in 2D x 2D an empty group's output is written as zeros.

Under ``TRITON_INTERPRET=1`` (CPU tests), whose bf16 arithmetic and bf16 ``tl.dot`` are not faithful, the same
indexing, groups and scales run with fp32 operands (``FusedConfig``'s ``exact_fp32``): every product exact, sums in
fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import Backend, GemmCase, late, triton_unavailable
from .dequant import dequantize_blocked
from ..core.names import Recipe
from ..layouts.scale_layout import blocked_word
from ..layouts.padding import group_bounds, locate, pick
from ..core.runtime import INTERPRET, InputError, check_int, check_tile_config, persistent_programs, tile_launch

# ---------------------------------------------------------------------------------------------------------------
# Dequantization in registers
# ---------------------------------------------------------------------------------------------------------------

# bf16 2**112: ``_e4m3_bf16_scaled_down`` returns v * 2**-112, brought back by one exact multiply.
_TWO_112 = tl.constexpr(2.0**112)


@triton.jit
def _e4m3_bf16_scaled_down(q):
    """bf16 v * 2**-112 of e4m3 q, exact (4 significant bits fit bf16's 8, and the exponent stays normal).

    Per pair of codes: the hardware cvt to f16x2 (exact; every e4m3 value is a normal f16 or zero), then the f16 bits
    shifted right by 3 land the exponent in the low bits of bf16's exponent field and the 3 mantissa bits at the top
    of its mantissa, i.e. bf16 bits of v * 2**(15 - 127), and the sign goes back in place. Four integer / conversion
    instructions per two elements, where Triton's fp8 -> bf16 cast goes through two F2F.BF16.F16 per pair, a
    quarter-rate conversion unit. An e4m3 NaN code gives a finite value (see the module doc).
    """
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 h, t, s;
        cvt.rn.f16x2.e4m3x2 h, $1;
        shr.b32 t, h, 3;
        and.b32 s, h, 0x80008000;
        lop3.b32 $0, t, 0x0FFF0FFF, s, 0xEA;
        }
        """,
        constraints="=r,h",
        args=[q],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=2,
    )


@triton.jit
def _e8m0_bits(byte, MANTISSA_BITS: tl.constexpr):
    """Bits of 2**(byte - 127) in a float with MANTISSA_BITS mantissa bits and an 8-bit exponent (fp32: 23, bf16: 7),
    of int32 scale bytes. 0 is the subnormal 2**-127 and 255 a quiet NaN: both carry the mantissa's top bit."""
    top = tl.where((byte == 0) | (byte == 255), 1 << (MANTISSA_BITS - 1), 0)
    return (byte << MANTISSA_BITS) | top


@triton.jit
def _dequantize(q, scale_bytes, EXACT_FP32: tl.constexpr):
    """(R, C) e4m3 ``q`` times its scales: ``scale_bytes`` (R, C // 32) int32, one per row and 32-element block.

    bf16, or fp32 with EXACT_FP32 (interpreter). The block dim is split off as a tensor dim of its own so that each
    scale broadcasts along its 32 elements with no data movement: the chunks of a row lie in registers of one thread
    in the wgmma operand layout Triton picks for the result.
    """
    R: tl.constexpr = q.shape[0]
    C: tl.constexpr = q.shape[1]
    if EXACT_FP32:
        scale = _e8m0_bits(scale_bytes, 23).to(tl.float32, bitcast=True)
        x = tl.reshape(q.to(tl.float32), (R, C // 32, 32)) * scale[:, :, None]
    else:
        scale = _e8m0_bits(scale_bytes, 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
        x = tl.reshape(_e4m3_bf16_scaled_down(q), (R, C // 32, 32)) * _TWO_112 * scale[:, :, None]
    return tl.reshape(x, (R, C))


@triton.jit
def _bf16_as_fp32(x):
    """fp32 of bf16 ``x`` through its bits (the interpreter's bf16 -> fp32 cast is not exact)."""
    return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _scale_bytes(s_ptr, row_bytes, k0, k_len, BLOCK_K: tl.constexpr):
    """(R, BLOCK_K // 32) int32 scale bytes of contraction elements [k0, k0 + BLOCK_K) (k0 a multiple of BLOCK_K),
    zeros from k0 >= k_len on: ``row_bytes`` (R,) is each row's byte offset of its first four blocks in a blocked image
    (``layouts``); blocks 4w..4w+3 are 512 bytes (one tile) further per w, a step's blocks within the image's padded
    width (ceil_4). The callers load the next step's scales one step ahead: a byte load is too narrow for the
    pipeliner's cp.async, and its global latency would otherwise sit between the shared-memory wait and the wgmma."""
    c = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    at = s_ptr + row_bytes[:, None] + (c // 4 * 512 + c % 4)[None, :]
    return tl.load(at, mask=(c * 32 < k_len)[None, :], other=0).to(tl.int32)


@triton.jit
def _band_tile(tile, m_tiles, n_tiles, GROUP_M: tl.constexpr):
    """(row tile, column tile) of a group's ``tile``-th tile in bands of GROUP_M row tiles, column by column inside a
    band (the matmul tutorial's grouped order): programs running at once then share a few row panels and a few column
    panels in L2. GROUP_M = 1 is row-major (the column tile moves fastest)."""
    band = tile // (GROUP_M * n_tiles)
    band_rows = tl.minimum(m_tiles - band * GROUP_M, GROUP_M)
    in_band = tile % (GROUP_M * n_tiles)
    return band * GROUP_M + in_band % band_rows, in_band // band_rows


@triton.jit
def _tile_barrier():
    """A barrier of the whole program before a tile's contraction starts.

    The previous tile's epilogue converts its accumulator to the store layout through shared memory that overlaps
    the contraction's cp.async stages, and Triton (3.6 and 3.9 alike) puts no barrier between that conversion's last
    shared-memory reads and the next tile's first cp.async (the loop's back edge): a warp that got ahead could
    overwrite rows another warp has still to store. ``tests/test_gemm_fused.py`` checks the barrier in the SM90 PTX.
    One barrier per tile costs next to nothing beside its contraction.
    """
    tl.debug_barrier()


# ---------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------

# What an operand of the contraction is in memory: e4m3 with blocked scales (dequantized in registers), or bf16.
_FP8 = tl.constexpr(0)
_BF16 = tl.constexpr(1)


@triton.jit
def _operand_step(
    ptr, rows, s_ptr, s_rows, scales, k, k_ok, k0, k_len, stride,
    KIND: tl.constexpr, BLOCK_K: tl.constexpr, EXACT_FP32: tl.constexpr,
):  # fmt: skip
    """One contraction step's (rows, BLOCK_K) tile of an operand (see ``_contract``), ready for the dot, and the scale
    bytes of the next step (an _FP8 operand: ``scales`` are this step's, loaded one step earlier; a _BF16 one passes
    ``scales`` through unread)."""
    tile = tl.load(ptr + rows.to(tl.int64)[:, None] * stride + k[None, :], mask=k_ok, other=0.0)
    scales_next = scales
    if KIND == _FP8:
        scales_next = _scale_bytes(s_ptr, s_rows, k0 + BLOCK_K, k_len, BLOCK_K)
        tile = _dequantize(tile, scales, EXACT_FP32)
    elif EXACT_FP32:
        tile = _bf16_as_fp32(tile)
    return tile, scales_next


@triton.jit
def _contract(
    x_ptr, x_rows, sx_ptr, sx_rows, y_ptr, y_rows, sy_ptr, sy_rows, k_start, k_len, stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    X_KIND: tl.constexpr, Y_KIND: tl.constexpr, EXACT_FP32: tl.constexpr,
):  # fmt: skip
    """acc (BLOCK_M, BLOCK_N) fp32 = sum over k in [k_start, k_start + k_len) of X[x_rows, k] * Y[y_rows, k].

    X and Y have the contraction contiguous, ``stride`` elements per row; ``x_rows`` (BLOCK_M,) / ``y_rows``
    (BLOCK_N,) are int32 row indices, ``sx_rows`` / ``sy_rows`` each row's byte offset in its blocked scale image
    (read for _FP8 operands only). X is the wgmma A operand: dequantized in registers and fed from there. Y is the B
    operand, read by the tensor cores from shared memory: bf16 straight from the cp.async stages, or (_FP8)
    dequantized in registers and stored back -- which triton 3.6 pipelines no further than one wgmma at a time.
    Contraction elements past k_len read as zero (a 2D x 2D group's last step).

    Addresses are formed here from int32 values; the scale bytes of the next step are loaded one step ahead.
    """
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    x_scales = 0
    y_scales = 0
    if X_KIND == _FP8:
        x_scales = _scale_bytes(sx_ptr, sx_rows, 0, k_len, BLOCK_K)
    if Y_KIND == _FP8:
        y_scales = _scale_bytes(sy_ptr, sy_rows, 0, k_len, BLOCK_K)
    for k0 in range(0, k_len, BLOCK_K):
        k = k_start + k0 + tl.arange(0, BLOCK_K)
        k_ok = (k < k_start + k_len)[None, :]
        x, x_scales = _operand_step(x_ptr, x_rows, sx_ptr, sx_rows, x_scales, k, k_ok, k0, k_len, stride, X_KIND,
                                    BLOCK_K, EXACT_FP32)  # fmt: skip
        y, y_scales = _operand_step(y_ptr, y_rows, sy_ptr, sy_rows, y_scales, k, k_ok, k0, k_len, stride, Y_KIND,
                                    BLOCK_K, EXACT_FP32)  # fmt: skip
        if EXACT_FP32:
            acc = tl.dot(x, tl.trans(y), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(y), acc)
    return acc


@triton.jit
def _tile_2d3d(t, starts, sizes, m_tiles, n_tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_G: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    """Scalars of 2D x 3D tile ``t`` (tiles numbered group after group): (group, its first row, the tile's first row
    inside the group, the group's rows from there on, the tile's first column)."""
    g, tile = locate(m_tiles * n_tiles, t, BLOCK_G)
    m_tile, n_tile = _band_tile(tile, pick(m_tiles, g, BLOCK_G), n_tiles, GROUP_M)
    local0 = m_tile * BLOCK_M
    return g, pick(starts, g, BLOCK_G), local0, pick(sizes, g, BLOCK_G) - local0, n_tile * BLOCK_N


@triton.jit
def _fused_2d3d_kernel(
    a_ptr, sa_ptr, b_ptr, offs_ptr, out_ptr, M, N, K, G, PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
    GROUP_M: tl.constexpr, A_KIND: tl.constexpr, EXACT_FP32: tl.constexpr,
):  # fmt: skip
    """out (M, N) = A (M, K) @ B_g (N, K)^T per row group g; B bf16 (G, N, K).

    A: e4m3 with ``sa_ptr`` its ``rearrange_m_groups`` buffer as bytes (group g's image starts at row
    sum_{j<g} ceil_128(size_j)), or (A_KIND _BF16, the control the tuning script times) bf16 with ``sa_ptr`` unread.
    Tiles are numbered group after group, row tile by row tile; a tile never straddles two groups.

    Each tile fills and drains its own pipeline: flattening the tile loop into the contraction loop
    (``tl.range(..., flatten=True)``) turns the accumulator's reset into a select inside the wgmma pipeline, and ptxas
    then serializes every wgmma with its A operand in registers (warning C7515). What keeps registers for the
    accumulator and the dequantized tile: the tile loop hands the contraction int32 values only; rows past the group's
    end (and columns past N) are clamped onto its last row (column) instead of masked, so the loads carry no row
    masks; the store recomputes its tile from a second counter rather than keep the loads' indices live.
    """
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    m_tiles = tl.cdiv(sizes, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    image_rows = tl.cdiv(sizes, 128) * 128
    images = tl.cumsum(image_rows, 0) - image_rows
    scale_cols = tl.cdiv(K, 128) * 4  # bytes per image row: ceil_4(K / 32)
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    t_out = tl.program_id(0)
    for t in range(tl.program_id(0), tl.sum(m_tiles, 0) * n_tiles, PROGRAMS):
        _tile_barrier()
        g, start, local0, rows_left, n0 = _tile_2d3d(t, starts, sizes, m_tiles, n_tiles, BLOCK_M, BLOCK_N, BLOCK_G,
                                                     GROUP_M)  # fmt: skip
        local = local0 + tl.minimum(r, rows_left - 1)
        s_rows = pick(images, g, BLOCK_G) * scale_cols + 4 * blocked_word(local, scale_cols // 4)
        acc = _contract(
            a_ptr, start + local, sa_ptr, s_rows, b_ptr, g * N + tl.minimum(n0 + c, N - 1), b_ptr, c, 0, K, K,
            BLOCK_M, BLOCK_N, BLOCK_K, A_KIND, _BF16, EXACT_FP32,
        )  # fmt: skip
        g, start, local0, rows_left, n0 = _tile_2d3d(t_out, starts, sizes, m_tiles, n_tiles, BLOCK_M, BLOCK_N,
                                                     BLOCK_G, GROUP_M)  # fmt: skip
        t_out += PROGRAMS
        out = out_ptr + (start + local0 + r).to(tl.int64)[:, None] * N + (n0 + c)[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(r < rows_left)[:, None] & (n0 + c < N)[None, :])


@triton.jit
def _fused_2d2d_kernel(
    x_ptr, sx_ptr, y_ptr, sy_ptr, offs_ptr, out_ptr, M, Y_ROWS, X_ROWS, G, PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
    GROUP_M: tl.constexpr, X_KIND: tl.constexpr, Y_KIND: tl.constexpr, EXACT_FP32: tl.constexpr,
):  # fmt: skip
    """out[g] (Y_ROWS, X_ROWS) = Y[:, group g] @ X[:, group g]^T with X (X_ROWS, M), Y (Y_ROWS, M); offs splits M.

    The wgrad GEMM out[g] = a[:, g] @ b[:, g]^T with x = b (the K-side operand, the large one: the register-fed
    wgmma operand, dequantized in the load path) and y = a (the N-side one). Scales: ``rearrange_k_groups`` buffers as
    bytes (complete images, one per group, back to back; an image row of group g holds ceil_4(size_g / 32) bytes),
    read for _FP8 operands. A tile is BLOCK_M rows of X by BLOCK_N rows of Y (stored transposed). Every group has the
    same tiles, numbered group after group; an empty group's tiles run no contraction step and store zeros. Loops,
    clamping and registers as in ``_fused_2d3d_kernel``.
    """
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    words = tl.cdiv(sizes, 128)  # int32 words per image row of each group
    words_before = tl.cumsum(words, 0) - words
    m_tiles = tl.cdiv(X_ROWS, BLOCK_M)
    n_tiles = tl.cdiv(Y_ROWS, BLOCK_N)
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    t_out = tl.program_id(0)
    for t in range(tl.program_id(0), G * m_tiles * n_tiles, PROGRAMS):
        _tile_barrier()
        g = t // (m_tiles * n_tiles)
        m_tile, n_tile = _band_tile(t % (m_tiles * n_tiles), m_tiles, n_tiles, GROUP_M)
        # Group sizes are multiples of 32, said by arithmetic rather than tl.multiple_of (which triton 3.6 drops on a
        # reduction's result): the contraction loads then stay 16-byte vectors under a mask of 32-element runs.
        start = pick(starts, g, BLOCK_G) // 32 * 32
        size = pick(sizes, g, BLOCK_G) // 32 * 32
        w = pick(words, g, BLOCK_G)
        before = pick(words_before, g, BLOCK_G)
        x_rows = tl.minimum(m_tile * BLOCK_M + r, X_ROWS - 1)
        y_rows = tl.minimum(n_tile * BLOCK_N + c, Y_ROWS - 1)
        sx_rows = 4 * (tl.cdiv(X_ROWS, 128) * 128 * before + blocked_word(x_rows, w))
        sy_rows = 4 * (tl.cdiv(Y_ROWS, 128) * 128 * before + blocked_word(y_rows, w))
        acc = _contract(
            x_ptr, x_rows, sx_ptr, sx_rows, y_ptr, y_rows, sy_ptr, sy_rows, start, size, M,
            BLOCK_M, BLOCK_N, BLOCK_K, X_KIND, Y_KIND, EXACT_FP32,
        )  # fmt: skip
        g = t_out // (m_tiles * n_tiles)
        m_tile, n_tile = _band_tile(t_out % (m_tiles * n_tiles), m_tiles, n_tiles, GROUP_M)
        t_out += PROGRAMS
        x_rows = m_tile * BLOCK_M + r
        y_rows = n_tile * BLOCK_N + c
        out = out_ptr + (g * Y_ROWS + y_rows).to(tl.int64)[None, :] * X_ROWS + x_rows[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(x_rows < X_ROWS)[:, None] & (y_rows < Y_ROWS)[None, :])


# ---------------------------------------------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FusedConfig:
    """One launch of the fused MXFP8 kernels.

    A tile is block_m rows of the register-fed operand (2D x 3D: tokens of A; 2D x 2D: rows of b, the K side) by
    block_n rows of the other. Per contraction step a program dequantizes block_m x block_k elements and issues
    block_m x block_n x block_k MACs: the wider block_n, the smaller the CUDA cores' share. The fp32 accumulator
    holds block_m * block_n / (32 * num_warps) registers a thread.
    """

    # Tile rows x columns, powers of two >= 16. A wgmma is issued by a warpgroup for 64 rows: block_m = 64 * (warps /
    # 4) gives each warpgroup one slab of 64 rows across the whole tile width.
    block_m: int
    block_n: int
    # Contraction elements per pipelined step: 32, 64 or 128, whole 32-blocks inside one 128-wide scale word.
    block_k: int = 64
    # 4 or 8 warps: one or two warpgroups.
    num_warps: int = 8
    # Software-pipeline depth: steps of both operands in flight through shared memory (cp.async).
    num_stages: int = 3
    # Row tiles per band of the tile order (see ``_band_tile``).
    group_m: int = 1
    # Persistent programs per SM (the grid is min(tiles, SMs * this)); more than one only where registers and shared
    # memory let that many programs share an SM.
    programs_per_sm: int = 1
    # Cap on the grid (None: none). Tests use a small one so that a program walks several tiles and groups.
    max_programs: int | None = None
    # Cap on registers per thread (None: ptxas decides).
    maxnreg: int | None = None
    # 2D x 2D: dequantize the N-side operand (grad_out^T) in the load path too, rather than once to bf16 by
    # ``dequantize_blocked``. In the load path it reaches the tensor cores through a shared-memory store from
    # registers, after which triton 3.6 waits for each wgmma to finish before the next step: the CUDA cores' work
    # and the tensor cores' then add up instead of overlapping.
    fuse_both: bool = False
    # fp32 operands (exact products, fp32 sums) instead of bf16 wgmma: the interpreter's path.
    exact_fp32: bool = False

    def __post_init__(self):
        check_tile_config(self, ("block_m", "block_n"), ("num_stages", "group_m", "programs_per_sm"), ("max_programs",))
        if self.block_k not in (32, 64, 128):
            raise InputError(f"FusedConfig.block_k must be 32, 64 or 128, got {self.block_k!r}")
        if self.maxnreg is not None:
            check_int("FusedConfig.maxnreg", self.maxnreg, 24, 255)
        for name in ("fuse_both", "exact_fp32"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"FusedConfig.{name} must be a bool, got {getattr(self, name)!r}")


# The defaults per case, chosen by reasoning and the SM90 SASS, then timed by scripts/tune_fused_gemm.py
# (docs/perf-log.md): 128 x 256 tiles with two warpgroups (the dequantization, about 7 instructions per pair of
# elements, amortized over 256 columns; 128 accumulator registers a thread, one program per SM) and 64-wide steps
# (40 KiB a stage). 2D x 3D runs three deep: four deep, its bf16 outputs came out wrong in whole 8-row slabs, different
# from run to run, on an H100 at DeepSeek-V3 sizes (scripts/diagnose_fused.py; fp32 outputs, 4 warps, 128-wide
# tiles and 1 to 3 stages were right), a race in what Triton 3.6 builds that the barrier above does not close.
_DEFAULT_CONFIGS = {
    GemmCase.A2D_B3D: FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=3),
    GemmCase.A2D_B2D: FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=4, group_m=8),
}
# The interpreter runs small tiles (any tile computes the same function; small ones run fastest there) in a few
# persistent programs, so that each walks several tiles and groups.
_INTERPRETER_CONFIG = FusedConfig(32, 32, block_k=64, num_warps=4, num_stages=1, max_programs=3, exact_fp32=True)


def default_config(case: GemmCase | str) -> FusedConfig:
    """The ``FusedConfig`` a call uses when none is given."""
    config = _DEFAULT_CONFIGS[GemmCase.parse(case)]  # parsed on the interpreter too: a bad case is refused there
    return _INTERPRETER_CONFIG if INTERPRET else config


# ---------------------------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------------------------

_KINDS = {torch.float8_e4m3fn: 0, torch.bfloat16: 1}  # _FP8, _BF16


def _launch(kernel, tiles: int, args: tuple, constexprs: dict, G: int, config: FusedConfig, device) -> None:
    programs = persistent_programs(tiles, device, config.programs_per_sm, config.max_programs)
    launch = {"BLOCK_K": config.block_k, "BLOCK_G": triton.next_power_of_2(G), "GROUP_M": config.group_m,
              "EXACT_FP32": config.exact_fp32, **tile_launch(config)}  # fmt: skip
    # The program count is a plain argument, not a constexpr: a call at another size reuses the compiled kernel.
    kernel[(programs,)](*args, G=G, PROGRAMS=programs, **constexprs, **launch)


def _run_2d3d(a, sa, b, offs, out_dtype: torch.dtype, config: FusedConfig | None) -> torch.Tensor:
    """a (M, K) e4m3 (``sa`` its scale bytes) or bf16, b (G, N, K) bf16 -> (M, N)."""
    config = config or default_config(GemmCase.A2D_B3D)
    (M, K), (G, N, _) = a.shape, b.shape
    out = torch.empty(M, N, dtype=out_dtype, device=a.device)
    if out.numel():
        tiles = (triton.cdiv(M, config.block_m) + G) * triton.cdiv(N, config.block_n)  # any group sizes
        kinds = {"A_KIND": _KINDS[a.dtype]}
        _launch(_fused_2d3d_kernel, tiles, (a, sa, b, offs, out, M, N, K), kinds, G, config, a.device)
    return out


def _run_2d2d(a, sa, b, sb, offs, out_dtype: torch.dtype, config: FusedConfig | None) -> torch.Tensor:
    """a (N, M), b (K, M), each e4m3 (with its scale bytes) or bf16 -> (G, N, K); b feeds the wgmma from registers."""
    config = config or default_config(GemmCase.A2D_B2D)
    (N, M), K, G = a.shape, b.shape[0], offs.numel()
    out = torch.empty(G, N, K, dtype=out_dtype, device=a.device)
    if out.numel():
        tiles = G * triton.cdiv(K, config.block_m) * triton.cdiv(N, config.block_n)
        kinds = {"X_KIND": _KINDS[b.dtype], "Y_KIND": _KINDS[a.dtype]}
        _launch(_fused_2d2d_kernel, tiles, (b, sb, a, sa, offs, out, M, N, K), kinds, G, config, a.device)
    return out


def run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype: torch.dtype, *, config: FusedConfig | None = None) -> torch.Tensor:
    """The "triton_fused" backend on operands ``grouped_gemm`` has checked: (M, N) in 2D x 3D (rows past offs[-1]
    unwritten), (G, N, K) in 2D x 2D. The operand that is not dequantized in the load path is dequantized once here,
    with ``dequantize_blocked`` (2D x 3D: the weights; 2D x 2D: a_q, unless ``config.fuse_both``)."""
    sa, sb = a_sb.view(torch.uint8), b_sb.view(torch.uint8)
    if b_q.dim() == 3:
        return _run_2d3d(a_q, sa, dequantize_blocked(b_q, b_sb, layout="3d"), offs, out_dtype, config)
    config = config or default_config(GemmCase.A2D_B2D)
    a = a_q if config.fuse_both else dequantize_blocked(a_q, a_sb, offs, layout="k_groups")
    return _run_2d2d(a, sa, b_q, sb, offs, out_dtype, config)


def run_bf16_control(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, config: FusedConfig | None = None):
    """The fused kernels' schedule and tiles on bf16 operands, no dequantization: 2D x 3D a (M, K), b (G, N, K);
    2D x 2D a (N, M), b (K, M); bf16 output. What the tuning script times to split a fused GEMM's time into the
    Triton GEMM's own and the dequantization's (operands contraction-contiguous, as ``run_mxfp8`` takes them)."""
    for name, x in (("a", a), ("b", b)):
        if x.dtype != torch.bfloat16 or not x.is_contiguous():
            raise InputError(f"{name} must be a contiguous bf16 tensor")
    if b.dim() == 3:
        return _run_2d3d(a, a, b, offs, torch.bfloat16, config)
    return _run_2d2d(a, a, b, b, offs, torch.bfloat16, config)


FUSED_WITHHELD = (
    "triton_fused is withheld on GPUs: four pipeline stages of its 2D x 3D kernel gave wrong bf16 outputs on an H100 "
    "(a race in the build, docs/perf-log.md), and the configurations measured right are no faster than triton_dequant; "
    "it runs under the interpreter for its tests, and on GPUs in its own GPU tests and tuning script"
)
"""Why the backend is unavailable on any GPU; its GPU tests and scripts set it to None to run it there."""


def _unavailable(recipe: Recipe, cap, device: torch.device) -> str | None:
    return triton_unavailable(recipe, cap, device) or (None if cap is None else FUSED_WITHHELD)


# Behind triton_dequant until it is measured faster at the DeepSeek-V3 shapes (scripts/tune_fused_gemm.py).
BACKEND = Backend("triton_fused", run={Recipe.MXFP8: late(__name__, "run_mxfp8")}, unavailable=_unavailable,
                  config_type=FusedConfig, interpreter_exact=False)  # fmt: skip
