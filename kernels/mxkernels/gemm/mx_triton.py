"""The Triton MXFP8 grouped GEMMs: backends "triton" (``tl.dot_scaled``) and "triton_fp8" (fp8 ``tl.dot``).

Both take the operand-level inputs of ``grouped_gemm.mxfp8_scaled_grouped_mm`` (which checks them first): e4m3 data
with the contraction dim contiguous and the blocked e8m0 scales exactly as ``layouts`` produces them, read in place,
four 32-blocks (one int32 word, ``layouts.blocked_word``) per row per 128 contraction elements. Tiles are mapped to
groups on the device from offs: no host sync, so a call can be captured in a CUDA graph. The launch is a
``TileConfig`` (``config=None``: ``default_config(case, backend)``), fixed per case, never autotuned: reproducible, and
the first call may be inside a graph capture.

* "triton": ``tl.dot_scaled`` (e4m3 x e4m3, e8m0 scales): block-scaled tensor-core MMA (``tcgen05.mma ...
  block_scale``) on SM100; on SM90 Triton upcasts the operands to bf16 (correct, slow). Triton <= 3.8 decodes scale
  byte 0 (2**-127) as 0 and byte 255 (NaN) as Inf on that SM90 path: harmless for the quantizers' output, where
  byte 0 only scales blocks of |x| < 2**-118 (zero blocks above all) and a NaN block's data is NaN anyway.
* "triton_fp8": the SM90 fast path: fp8 ``tl.dot`` (wgmma e4m3) on every 32-wide contraction chunk, then
  ``acc += partial * sa * sb`` with the power-of-two scales decoded from their bytes, exactly the MX math
  (products of e4m3 values are exact; the chunk sums use the tensor core's fp8 accumulator). Scale byte 255
  decodes to +Inf rather than NaN (the quantizers write NaN data into those blocks, so the output is NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .backend import FIRST, LATER, Arch, Backend, GemmCase, late, triton_unavailable
from ..core.names import Recipe
from ..layouts.scale_layout import blocked_word
from ..layouts.padding import group_bounds, locate, pick
from ..core.runtime import INTERPRET, InputError, check_tile_config, tile_launch


@triton.jit
def _scale_bytes(words):
    """(R,) int32 scale words -> (R, 4) uint8 scale bytes, byte j = block j of the word's 128 elements."""
    shifts = 8 * tl.arange(0, 4)
    return ((words[:, None] >> shifts[None, :]) & 0xFF).to(tl.uint8)


@triton.jit
def _e8m0_to_fp32(words, shift):
    """fp32 2**(e - 127) of the scale byte e in bits [shift, shift + 8) of int32 ``words``.

    Exact for e = 0..254 (e = 0 is the subnormal 2**-127); e = 255 (NaN) gives +Inf, and since the quantizers
    write NaN data into such blocks the products stay NaN. Three integer ops with a constant ``shift`` (the shifts
    fold into one), because every thread decodes the scales of all its accumulator columns in every 32-wide step.
    """
    bits = ((words >> shift) << 23) & 0x7F800000
    return tl.maximum(bits, 0x400000).to(tl.float32, bitcast=True)


@triton.jit
def _fp8_dot(a_rows, a_ok, b_rows, b_ok, k0):
    """The unscaled partial product (BLOCK_M, BLOCK_N) fp32 of the 32-wide contraction chunk [k0, k0 + 32): an fp8
    ``tl.dot`` (wgmma e4m3 on SM90; the products are exact, the chunk sum uses the tensor core's accumulator)."""
    k = k0 + tl.arange(0, 32)
    a = tl.load(a_rows[:, None] + k[None, :], mask=a_ok[:, None], other=0.0)
    b = tl.load(b_rows[None, :] + k[:, None], mask=b_ok[None, :], other=0.0)
    return tl.dot(a, b)


@triton.jit
def _fp8_step(acc, pending, a_rows, a_ok, b_rows, b_ok, k0, sa_word, sb_word, shift):
    """One chunk of the software-pipelined fp8 main loop: issue chunk [k0, k0 + 32)'s dot, then fold the previous
    chunk's partial into acc while it runs. Returns (acc, the new pending chunk).

    ``pending`` = (partial, sa, sb): a chunk's dot and its decoded row / column scales. Triton waits for each wgmma
    right after issuing it, but ptxas moves the independent FMUL/FFMA of the previous partial in between, so the
    CUDA cores rescale chunk i while the tensor cores compute chunk i + 1 (scaling a chunk's own partial instead
    serializes the two units; docs/perf-log.md has the measurement). Costs a second live partial tile.
    """
    partial, sa, sb = pending
    issued = _fp8_dot(a_rows, a_ok, b_rows, b_ok, k0)
    acc = tl.fma(partial * sa[:, None], sb[None, :], acc)
    return acc, (issued, _e8m0_to_fp32(sa_word, shift), _e8m0_to_fp32(sb_word, shift))


@triton.jit
def _mx_mainloop(
    a_rows, a_ok, b_rows, b_ok, sa_words, sb_words, k_len,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP8_DOT: tl.constexpr,
):  # fmt: skip
    """acc (BLOCK_M, BLOCK_N) fp32 = sum over k < k_len of (A[m, k] * sa) * (B[n, k] * sb), MX scales per 32 k.

    a_rows (BLOCK_M,) / b_rows (BLOCK_N,): pointers to element k = 0 of each row of A / B (e4m3, k contiguous);
    rows with a_ok / b_ok false read as zero. sa_words / sb_words: each row's scale word of k in [0, 128) inside its
    blocked image; the word of k in [128w, 128w + 128) is 128 words (one 512-byte tile) further, i.e. at offset
    k - k % 128. k_len is a multiple of 32 (the callers guarantee it): every 32-wide chunk is whole, so the loads
    need no contraction mask and stay 16-byte vectors (a mask of unknown alignment along k makes them byte loads).
    """
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if FP8_DOT:
        # One scale word per row covers 128 k: load it once for four chunks, each decoding its byte with constant
        # shifts. The pipeline starts with an empty pending chunk (a zero partial) and drains after the loops.
        pending = (acc, tl.full((BLOCK_M,), 1.0, tl.float32), tl.full((BLOCK_N,), 1.0, tl.float32))
        whole = k_len // 128 * 128  # (a product, so Triton knows the tail's chunks start 128-aligned)
        for k0 in range(0, whole, 128):
            sa_word = tl.load(sa_words + k0, mask=a_ok, other=0)
            sb_word = tl.load(sb_words + k0, mask=b_ok, other=0)
            for j in tl.static_range(4):
                k = k0 + 32 * j
                acc, pending = _fp8_step(acc, pending, a_rows, a_ok, b_rows, b_ok, k, sa_word, sb_word, 8 * j)
        for k0 in range(whole, k_len, 32):  # the last word's 1 to 3 chunks
            sa_word = tl.load(sa_words + whole, mask=a_ok, other=0)
            sb_word = tl.load(sb_words + whole, mask=b_ok, other=0)
            shift = k0 % 128 // 4
            acc, pending = _fp8_step(acc, pending, a_rows, a_ok, b_rows, b_ok, k0, sa_word, sb_word, shift)
        partial, sa, sb = pending
        acc = tl.fma(partial * sa[:, None], sb[None, :], acc)
    else:
        for k0 in range(0, k_len, 128):
            k = k0 + tl.arange(0, 128)
            a = tl.load(a_rows[:, None] + k[None, :], mask=a_ok[:, None] & (k < k_len)[None, :], other=0.0)
            b = tl.load(b_rows[None, :] + k[:, None], mask=b_ok[None, :] & (k < k_len)[:, None], other=0.0)
            sa = _scale_bytes(tl.load(sa_words + k0, mask=a_ok, other=0))
            sb = _scale_bytes(tl.load(sb_words + k0, mask=b_ok, other=0))
            acc = tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3", acc)
    return acc


@triton.jit
def _mx_2d3d_kernel(
    a_ptr, b_ptr, sa_ptr, sb_ptr, offs_ptr, out_ptr, M, N, K, G,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, FP8_DOT: tl.constexpr,
):  # fmt: skip
    """out (M, N) = A (M, K) @ B_g (N, K)^T per row group g; scales as word pointers into the blocked buffers.

    Row tiles are numbered group after group, cdiv(size_g, BLOCK_M) per group, so a tile never straddles two groups;
    the grid covers the upper bound cdiv(M, BLOCK_M) + G row tiles (times the column tiles) and programs past the
    last group's tiles exit. Consecutive programs share a row tile (its K-long A panel is read once from DRAM) and
    sweep B_g, which (N x K bytes, 14.7 MB at DeepSeek-V3 sizes) stays in L2.
    """
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    g, m_tile = locate(tl.cdiv(sizes, BLOCK_M), pid // n_tiles, BLOCK_G)
    if g >= G:
        return
    words = tl.cdiv(K, 128)
    # Group g's blocked image (rows padded to 128) starts at row sum_{j<g} ceil_128(size_j) of A's scale buffer.
    image_row = tl.sum(tl.where(tl.arange(0, BLOCK_G) < g, tl.cdiv(sizes, 128) * 128, 0), 0)
    local = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pick(starts, g, BLOCK_G) + local
    n = (pid % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    a_ok = local < pick(sizes, g, BLOCK_G)
    b_ok = n < N
    acc = _mx_mainloop(
        a_ptr + rows.to(tl.int64) * K, a_ok,
        b_ptr + (g * N + n).to(tl.int64) * K, b_ok,
        sa_ptr + image_row * words + blocked_word(local, words),
        sb_ptr + g * tl.cdiv(N, 128) * 128 * words + blocked_word(n, words),
        K, BLOCK_M, BLOCK_N, FP8_DOT,
    )  # fmt: skip
    out = out_ptr + rows.to(tl.int64)[:, None] * N + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=a_ok[:, None] & b_ok[None, :])


@triton.jit
def _mx_2d2d_kernel(
    a_ptr, b_ptr, sa_ptr, sb_ptr, offs_ptr, out_ptr, M, N, K, G,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, FP8_DOT: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """out[g] (N, K) = A[:, group g] @ B[:, group g]^T with A (N, M), B (K, M); program (tile, g).

    Tiles go in bands of GROUP_M row tiles, column by column inside a band (the matmul tutorial's grouped order):
    the programs running at once then read GROUP_M panels of A and a few of B, where row-major order reads every
    panel of B (K x size_g bytes, 117 MB at DeepSeek-V3 sizes, more than L2) in every wave.
    """
    g = tl.program_id(1)
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(N, BLOCK_M)
    k_tiles = tl.cdiv(K, BLOCK_N)
    band_m = (pid // (GROUP_M * k_tiles)) * GROUP_M
    band_rows = tl.minimum(m_tiles - band_m, GROUP_M)
    in_band = pid % (GROUP_M * k_tiles)
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    # Group sizes are multiples of 32, so every group's columns start 32-byte aligned. Said by arithmetic, not
    # tl.multiple_of: triton 3.6 drops that hint on a reduction's result, and the contraction loads then go byte by
    # byte with no cp.async pipelining (docs/perf-log.md, v1 GEMM).
    start = pick(starts, g, BLOCK_G) // 32 * 32
    size = pick(sizes, g, BLOCK_G)
    # Group g's images follow the complete images of the groups before it; an image row of 128-row tiles holds
    # ceil_4(size/32) / 4 = cdiv(size, 128) words.
    words = tl.cdiv(size, 128)
    words_before = tl.sum(tl.where(tl.arange(0, BLOCK_G) < g, tl.cdiv(sizes, 128), 0), 0)
    i = (band_m + in_band % band_rows) * BLOCK_M + tl.arange(0, BLOCK_M)
    j = (in_band // band_rows) * BLOCK_N + tl.arange(0, BLOCK_N)
    a_ok = i < N
    b_ok = j < K
    acc = _mx_mainloop(
        a_ptr + i.to(tl.int64) * M + start, a_ok,
        b_ptr + j.to(tl.int64) * M + start, b_ok,
        sa_ptr + tl.cdiv(N, 128) * 128 * words_before + blocked_word(i, words),
        sb_ptr + tl.cdiv(K, 128) * 128 * words_before + blocked_word(j, words),
        size, BLOCK_M, BLOCK_N, FP8_DOT,
    )  # fmt: skip
    out = out_ptr + (g * N + i).to(tl.int64)[:, None] * K + j[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=a_ok[:, None] & b_ok[None, :])


# ---------------------------------------------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TileConfig:
    """One launch of the Triton MXFP8 kernels.

    The fp8 kernel keeps three fp32 tiles live per thread (accumulator, the pending partial and the one in flight),
    block_m * block_n / (32 * num_warps) registers each. Its CUDA cores rescale one chunk while the tensor cores run
    the next, and other warpgroups on the SM fill the waits, so resident warpgroups matter more than tile size.
    """

    # Output tile rows x columns per program (of each group's output in 2D x 2D), powers of two >= 16 (tl.dot's
    # smallest operand dim). For the fp8 kernel, under 32 * num_warps each keeps the scale vectors in the accumulator's
    # layout; at or over it, triton 3.6 moves them through shared memory with two CTA barriers per chunk.
    block_m: int
    block_n: int
    # 4 or 8 warps: one or two warpgroups, the units a Hopper MMA is issued by.
    num_warps: int = 8
    # Software-pipeline stages, each one 128-wide contraction step (four 32-wide chunks for "triton_fp8").
    num_stages: int = 3
    # Row tiles per band of the 2D x 2D tile order (ignored in 2D x 3D): see ``_mx_2d2d_kernel``.
    group_m: int = 1
    # Cap on registers per thread (None: ptxas decides); 128 fits two 8-warp CTAs per SM.
    maxnreg: int | None = None

    def __post_init__(self):
        check_tile_config(self, ("block_m", "block_n"), ("num_stages", "group_m"))
        if self.maxnreg is not None and not (isinstance(self.maxnreg, int) and 24 <= self.maxnreg <= 255):
            raise InputError(f"TileConfig.maxnreg must be None or an int in [24, 255], got {self.maxnreg!r}")


# The defaults per (case, backend), chosen by timing the candidates with scripts/tune_gemm.py (docs/perf-log.md). The
# fp8 kernel is bound by CUDA-core issue slots: each accumulator element costs an FMUL and an FFMA per 32-wide chunk,
# plus the decode of its row's and column's scales. Which config wins is measured, not derived: 2D x 3D's, with
# block_m = 32 * num_warps, pays the shared-memory round trip of the row scales that ``TileConfig`` describes.
_DEFAULT_CONFIGS = {
    (GemmCase.A2D_B3D, "triton_fp8"): TileConfig(128, 64, num_warps=4, num_stages=3),
    (GemmCase.A2D_B2D, "triton_fp8"): TileConfig(64, 64, num_warps=4, num_stages=4, group_m=8),
    (GemmCase.A2D_B3D, "triton"): TileConfig(128, 128, num_warps=8, num_stages=3),
    (GemmCase.A2D_B2D, "triton"): TileConfig(128, 128, num_warps=8, num_stages=3, group_m=8),
}
# The interpreter runs one small tile (any tile computes the same function; small ones run fastest there).
_INTERPRETER_CONFIG = TileConfig(32, 32, num_warps=4, num_stages=1)


def default_config(case: GemmCase | str, backend: str) -> TileConfig:
    """The ``TileConfig`` a Triton MXFP8 call uses when none is given (backend "triton" / "triton_fp8")."""
    key = GemmCase.parse(case), backend
    if key not in _DEFAULT_CONFIGS:
        raise InputError(f"no Triton MXFP8 kernel for case {case!r} and backend {backend!r}")
    return _INTERPRETER_CONFIG if INTERPRET else _DEFAULT_CONFIGS[key]


# ---------------------------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------------------------


def _scale_words(blocked: torch.Tensor) -> torch.Tensor:
    """A blocked scale buffer as int32 words (its byte count is a multiple of 512)."""
    return blocked.view(torch.uint8).reshape(-1).view(torch.int32)


def run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype: torch.dtype, *, backend: str, config: TileConfig | None = None):
    """The "triton" / "triton_fp8" backend on operands ``grouped_gemm`` has checked: (M, N) in 2D x 3D, (G, N, K)
    in 2D x 2D."""
    G = offs.numel()
    case = GemmCase.of_b(b_q)
    config = config or default_config(case, backend)
    if case is GemmCase.A2D_B3D:
        (M, K), N = a_q.shape, b_q.shape[1]
        out = torch.empty(M, N, dtype=out_dtype, device=a_q.device)
    else:
        (N, M), K = a_q.shape, b_q.shape[0]
        out = torch.empty(G, N, K, dtype=out_dtype, device=a_q.device)
    if not out.numel():
        return out
    args = (a_q, b_q, _scale_words(a_sb), _scale_words(b_sb), offs, out)
    launch = {"G": G, "BLOCK_G": triton.next_power_of_2(G), "FP8_DOT": backend == "triton_fp8", **tile_launch(config)}
    if case is GemmCase.A2D_B3D:
        grid = ((triton.cdiv(M, config.block_m) + G) * triton.cdiv(N, config.block_n),)
        _mx_2d3d_kernel[grid](*args, M=M, N=N, K=K, **launch)
    else:
        grid = (triton.cdiv(N, config.block_m) * triton.cdiv(K, config.block_n), G)
        _mx_2d2d_kernel[grid](*args, M=M, N=N, K=K, GROUP_M=config.group_m, **launch)
    return out


def _declare(name: str, preference: dict) -> Backend:
    # The two differ only in the kernel's main loop (``FP8_DOT``) and in where they rank.
    return Backend(name, run={Recipe.MXFP8: late(__name__, "run_mxfp8", backend=name)}, unavailable=triton_unavailable,
                   config_type=TileConfig, preference=preference, interpreter_exact=False)  # fmt: skip


# dot_scaled is native only on SM100; elsewhere Triton upcasts to bf16, behind the others (docs/perf-log.md).
TRITON = _declare("triton", {Arch.SM90: LATER, Arch.OTHER: LATER, Arch.CPU: LATER})
# Below SM90 the fastest: torch._grouped_mm (triton_dequant's) is a host loop over offs there.
TRITON_FP8 = _declare("triton_fp8", {Arch.OTHER: FIRST})
