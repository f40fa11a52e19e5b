"""The grouped GEMMs of an MoE layer behind one front door, by recipe and backend.

Two cases, with ``torch._grouped_mm`` semantics (``offs`` int32 (G,) cumulative group ends, groups may be empty):

* 2D x 3D (forward, backward input): a (M, K), b (G, K, N) -> out (M, N); group g is rows [offs[g-1], offs[g]) of
  a and out and uses b[g]. Output rows past offs[-1] are unspecified.
* 2D x 2D (backward weight): a (N, M), b (M, K) -> out (G, N, K); offs splits the contraction dim M and
  out[g] = a[:, group g] @ b[group g, :]. An empty group's output is zero.

``grouped_mm(a, b, offs, recipe)`` takes high-precision operands, quantizes them for the recipe and runs the
operand-level call. The operand-level calls -- what the pipeline times -- take quantized operands with the contraction
dim contiguous for both ("TN", as every FP8/MX tensor-core GEMM wants them):

* 2D x 3D: a_q (M, K), b_q (G, N, K) -> out (M, N);
* 2D x 2D: a_q (N, M), b_q (K, M) -> out (G, N, K).

``mxfp8_grouped_mm`` takes e4m3 data and the *blocked* e8m0 scales exactly as ``layouts`` produces them, the same
inputs for every backend: 2D x 3D: a_sb = ``rearrange_m_groups`` buffer (128 * (ceil(M/128) + G), ceil_4(K/32)),
b_sb = ``rearrange_3d`` (G, ceil_128(N), ceil_4(K/32)); 2D x 2D: ``rearrange_k_groups`` buffers
(ceil_128(N), M/32 + 4G) and (ceil_128(K), M/32 + 4G), whose group sizes must be multiples of 32 (an MX block must
not straddle two experts; the kernels trust this, it is not checked on the device). Backends:

* "native": ``torch._scaled_grouped_mm`` with blocked e8m0 scales; compute capability 10.x only. On SM90 that call
  is not rejected: it launches an SM100-only kernel and the CUDA context dies, so it is refused here first.
* "triton": a Triton grouped GEMM on ``tl.dot_scaled`` (e4m3 x e4m3, e8m0 scales): block-scaled tensor-core MMA
  (``tcgen05.mma ... block_scale``) on SM100; on SM90 Triton upcasts the operands to bf16 (correct, slow). Triton
  <= 3.8 decodes scale byte 0 (2**-127) as 0 and byte 255 (NaN) as Inf on that SM90 path: harmless for the
  quantizers' output, where byte 0 only scales blocks of |x| < 2**-118 (zero blocks above all) and a NaN block's data
  is NaN anyway.
* "triton_fp8": the SM90 fast path: fp8 ``tl.dot`` (wgmma e4m3) on every 32-wide contraction chunk, then
  ``acc += partial * sa * sb`` with the power-of-two scales decoded from their bytes, exactly the MX math
  (products of e4m3 values are exact; the chunk sums use the tensor core's fp8 accumulator). Scale byte 255
  decodes to +Inf rather than NaN (the quantizers write NaN data into those blocks, so the output is NaN).
* "triton_dequant": the SM90 default: ``dequantize_blocked`` writes each operand in bf16 (a memory-bound Triton
  pass reading the blocked scales in place), then ``torch._grouped_mm`` multiplies on bf16 tensor cores with fp32
  accumulation. MX -> bf16 is exact: an e4m3 value has 4 significant bits and bf16 8, and bf16 keeps fp32's
  exponent range. Checked over all 256 codes x 256 scale bytes against fp64 (tests): the product is bf16's
  unless it overflows (|v| * 2**(e - 127) > bf16 max, bytes >= 247: +-Inf, as in fp32) or lies off the bf16
  subnormal grid (multiples of 2**-133): scale byte e <= 2 with v not a multiple of 2**(-6 - e), 96 pairs, which
  round once to the nearest bf16 subnormal (error <= 2**-134). Both cases match ``dequantize_reference(...)
  .to(bfloat16)`` bit for bit, and quantizing bf16 input never produces the second (its values are multiples of
  2**-133, so its quantized codes are multiples of 2**(-6 - e)). The GEMM is thus the emulation's math (exact
  products, fp32 sums) at bf16 GEMM speed plus the dequantize pass. bf16 output only. Graph-capturable on SM90 /
  SM100, where ``torch._grouped_mm`` reads offs on the device; below SM90 it loops over ``offs.cpu()``. Its
  bf16 kernel asserts on the device (the CUDA context dies) unless 2D x 2D groups are multiples of 8 tokens, and
  some torch versions were reported to ask the same of 2D x 3D groups: the pipeline pads MX groups to 32.
* "emulated": dequantize (scales unblocked per group with ``layouts.from_blocked``) and multiply in fp32 with a
  host loop over groups (reads offs on the host): the reference the others are checked against.

Default backend (``available_backends``, best first): SM100 native > triton > triton_dequant > triton_fp8; SM90
triton_dequant > triton_fp8 > triton; SM89 triton_fp8 > triton_dequant > triton; CPU emulated (the Triton
backends run there only under the interpreter, for tests).

The Triton kernels read the blocked scales in place, four 32-blocks (one int32 word) per row per 128 contraction
elements, and map tiles to groups on the device from offs: no host sync, so they can be captured in a CUDA graph
(launch configurations are fixed per case, ``default_config``, or passed as a
``TileConfig``: no autotuning). ``fp8_rowwise_grouped_mm`` is the FP8 rowwise sibling over
``torch._scaled_grouped_mm`` (SM90 and SM100); bf16 runs ``torch._grouped_mm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .cost import Cost, ceil_to
from .format import BLOCK_SIZE, DATA_DTYPE, SCALE_DTYPE, ScaleMode, dequantize_reference
from .fp8_rowwise import (
    dequantize_fp8_rowwise_reference,
    quantize_fp8_rowwise,
    quantize_fp8_rowwise_3d,
    quantize_fp8_rowwise_k_groups,
)
from .layouts import (
    from_blocked,
    k_groups_shape,
    m_groups_shape,
    rearrange_3d,
    rearrange_k_groups,
    rearrange_m_groups,
)
from .padding import group_bounds, locate, pick
from .quantize import quantize_3d, quantize_dim0, quantize_dim1
from .runtime import INTERPRET, check_host_offsets, check_offsets, check_same_device, check_tensor

RECIPES = ("mxfp8", "fp8_rowwise", "bf16")
BACKENDS = {
    "bf16": ("native", "emulated"),
    "fp8_rowwise": ("native", "emulated"),
    "mxfp8": ("native", "triton", "triton_dequant", "triton_fp8", "emulated"),
}
SCALE_DTYPES = (SCALE_DTYPE, torch.uint8)
OUT_DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class GroupedMMResult:
    """What ``grouped_mm`` returns: the output and the backend that computed it."""

    out: torch.Tensor
    backend: str


# ---------------------------------------------------------------------------------------------------------------
# Which backend runs where
# ---------------------------------------------------------------------------------------------------------------


def _capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, None for any other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def _unavailable(recipe: str, backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run ``recipe`` on ``device``, or None if it can."""
    cap = _capability(device)
    if backend == "emulated":
        return None
    if backend == "native":
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
    if cap is None:
        return None if INTERPRET else f"the Triton backends need a CUDA device (or TRITON_INTERPRET=1), got {device}"
    if cap < (8, 9):
        return f"the Triton MXFP8 backends need fp8 tensor cores (compute capability >= 8.9), this GPU is {cap}"
    return None


def _preference(recipe: str, device: torch.device) -> tuple[str, ...]:
    cap = _capability(device)
    if recipe != "mxfp8":
        return BACKENDS[recipe]
    if cap is None:
        # On CPU the Triton backends run in the interpreter, for tests; the emulation is the fast one there.
        return ("emulated", "triton_dequant", "triton_fp8", "triton")
    if cap[0] == 10:
        return ("native", "triton", "triton_dequant", "triton_fp8", "emulated")
    if cap == (9, 0):
        return ("triton_dequant", "triton_fp8", "triton", "emulated")
    # Below SM90 torch._grouped_mm is a host loop over offs (a sync, not graph-capturable): not the default there.
    return ("triton_fp8", "triton_dequant", "triton", "emulated")


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def check_recipe(recipe: object) -> str:
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}; got {recipe!r}")
    return recipe


def available_backends(recipe: str, device: torch.device | str | None = None) -> list[str]:
    """Backends that can run ``recipe`` on ``device`` (default: the current GPU, else CPU), best first."""
    recipe = check_recipe(recipe)
    device = _default_device() if device is None else torch.device(device)
    return [b for b in _preference(recipe, device) if _unavailable(recipe, b, device) is None]


def default_backend(recipe: str, device: torch.device | str | None = None) -> str:
    """The backend a call with ``backend=None`` uses: the best available for ``recipe`` on ``device``."""
    return available_backends(recipe, device)[0]


def _resolve_backend(recipe: str, backend: str | None, device: torch.device) -> str:
    if backend is None:
        return default_backend(recipe, device)
    if backend not in BACKENDS[recipe]:
        raise ValueError(f"backend for recipe {recipe!r} must be one of {', '.join(BACKENDS[recipe])}; got {backend!r}")
    reason = _unavailable(recipe, backend, device)
    if reason:
        raise RuntimeError(reason)
    return backend


# ---------------------------------------------------------------------------------------------------------------
# Triton MXFP8 grouped GEMM
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _blocked_word(row, words_per_row):
    """Index of the int32 word holding scales (row, 0..3) inside one blocked image whose padded rows hold
    ``words_per_row`` words; scales (row, 4w..4w+3) are 128 words further per w.

    Tile (row // 128, c // 4) is 512 bytes = 128 words; (r, c) sits at byte (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4.
    """
    return (row // 128) * words_per_row * 128 + (row % 32) * 4 + (row // 32) % 4


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
    serializes the two units: 240 TFLOP/s where 2 x 128 FMUL + FFMA per thread per 128-wide step allow twice that).
    Costs a second live partial tile.
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
        sa_ptr + image_row * words + _blocked_word(local, words),
        sb_ptr + g * tl.cdiv(N, 128) * 128 * words + _blocked_word(n, words),
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
    # byte with no cp.async pipelining (3.6 sm_90a: 200 ld.global.b8 and 850-byte spill frames, 68 TFLOP/s).
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
        sa_ptr + tl.cdiv(N, 128) * 128 * words_before + _blocked_word(i, words),
        sb_ptr + tl.cdiv(K, 128) * 128 * words_before + _blocked_word(j, words),
        size, BLOCK_M, BLOCK_N, FP8_DOT,
    )  # fmt: skip
    out = out_ptr + (g * N + i).to(tl.int64)[:, None] * K + j[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=a_ok[:, None] & b_ok[None, :])


@dataclass(frozen=True)
class TileConfig:
    """One launch of the Triton MXFP8 kernels: output tiles of block_m x block_n (rows x columns of the output, or
    of each group's output in 2D x 2D), ``num_warps`` warps, ``num_stages`` software-pipeline stages (each one 128-wide
    contraction step: four 32-wide chunks for "triton_fp8"), ``group_m`` row tiles per band of the 2D x 2D tile
    order (ignored in 2D x 3D), and ``maxnreg``, a cap on registers per thread (None: ptxas decides).

    The fp8 kernel keeps three fp32 tiles live per thread (accumulator, the pending partial and the one in flight),
    block_m * block_n / (32 * num_warps) registers each. Its CUDA cores rescale one chunk while the tensor cores run
    the next, and other warpgroups on the SM fill the waits, so resident warpgroups matter more than tile size:
    block_m and block_n under 32 * num_warps also keep the scale vectors in the accumulator's layout (at or over it,
    triton 3.6 moves them through shared memory with two CTA barriers per chunk). maxnreg = 128 fits two 8-warp
    CTAs per SM.
    """

    block_m: int
    block_n: int
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 1
    maxnreg: int | None = None

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 16 and value & (value - 1) == 0):
                raise ValueError(f"{name} must be a power of two >= 16, got {value!r}")
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps must be 4 or 8 (one or two warpgroups), got {self.num_warps!r}")
        for name in ("num_stages", "group_m"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.maxnreg is not None and not (isinstance(self.maxnreg, int) and 24 <= self.maxnreg <= 255):
            raise ValueError(f"maxnreg must be None or an int in [24, 255], got {self.maxnreg!r}")


# Fixed per (case, backend), not autotuned: reproducible, and the first call may be inside a graph capture;
# scripts/tune_gemm.py times the candidates. The fp8 kernel is bound by CUDA-core issue slots (each accumulator element
# costs an FMUL and an FFMA per 32-wide chunk, plus the decode of its row's and column's scales). triton 3.6 sm_90a,
# 128-wide step: 128 x 64 with 8 warps runs 641 instructions per warp at 169 registers (one CTA per SM), 669 with 28
# L1 reloads at maxnreg 128 (two CTAs); 256 x 64 and 128 x 64 with 4 warps (block_m = threads) add two CTA barriers
# and a shared-memory round trip per chunk for the row scales, and spill at 255 registers. Measured all the same
# (H200, triton 3.6, M = 131072, cold L2), the bests were 2D x 3D 128 x 64 w4 s3 (15084 us, 255 TFLOP/s) and
# 2D x 2D 64 x 64 w4 s4 (21396 us, 180 TFLOP/s): those are the defaults.
_DEFAULT_CONFIGS = {
    ("2d3d", "triton_fp8"): TileConfig(128, 64, num_warps=4, num_stages=3),
    ("2d2d", "triton_fp8"): TileConfig(64, 64, num_warps=4, num_stages=4, group_m=8),
    ("2d3d", "triton"): TileConfig(128, 128, num_warps=8, num_stages=3),
    ("2d2d", "triton"): TileConfig(128, 128, num_warps=8, num_stages=3, group_m=8),
}
# The interpreter runs one small tile (any tile computes the same function; small ones run fastest there).
_INTERPRETER_CONFIG = TileConfig(32, 32, num_warps=4, num_stages=1)


def default_config(case: str, backend: str) -> TileConfig:
    """The ``TileConfig`` a Triton MXFP8 call uses when none is given (case "2d3d" / "2d2d", backend "triton" /
    "triton_fp8")."""
    if (case, backend) not in _DEFAULT_CONFIGS:
        raise ValueError(f"no Triton MXFP8 kernel for case {case!r} and backend {backend!r}")
    return _INTERPRETER_CONFIG if INTERPRET else _DEFAULT_CONFIGS[case, backend]


def _scale_words(blocked: torch.Tensor) -> torch.Tensor:
    """A blocked scale buffer as int32 words (its byte count is a multiple of 512)."""
    return blocked.view(torch.uint8).reshape(-1).view(torch.int32)


def _mx_triton(a_q, a_sb, b_q, b_sb, offs, out, backend: str, config: TileConfig) -> None:
    G = offs.numel()
    args = (a_q, b_q, _scale_words(a_sb), _scale_words(b_sb), offs, out)
    launch = {
        "G": G,
        "BLOCK_G": triton.next_power_of_2(G),
        "FP8_DOT": backend == "triton_fp8",
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }
    if config.maxnreg is not None:
        launch["maxnreg"] = config.maxnreg
    if b_q.dim() == 3:
        (M, K), N = a_q.shape, b_q.shape[1]
        grid = ((triton.cdiv(M, config.block_m) + G) * triton.cdiv(N, config.block_n),)
        _mx_2d3d_kernel[grid](*args, M=M, N=N, K=K, **launch)
    else:
        (N, M), K = a_q.shape, b_q.shape[0]
        grid = (triton.cdiv(N, config.block_m) * triton.cdiv(K, config.block_n), G)
        _mx_2d2d_kernel[grid](*args, M=M, N=N, K=K, GROUP_M=config.group_m, **launch)


# ---------------------------------------------------------------------------------------------------------------
# "triton_dequant": dequantize both operands to bf16 (exactly), then torch._grouped_mm on bf16 tensor cores
# ---------------------------------------------------------------------------------------------------------------

# How the rows and 32-blocks of a quantized operand (rows, contraction) map to its blocked scale buffer.
DEQUANT_LAYOUTS = ("m_groups", "3d", "k_groups")
_M_GROUPS = tl.constexpr(0)  # offs splits the rows: a ``rearrange_m_groups`` buffer (2D x 3D a_q)
_EXPERTS = tl.constexpr(1)  # every N_ROWS rows are one expert: a ``rearrange_3d`` buffer (2D x 3D b_q)
_K_GROUPS = tl.constexpr(2)  # offs splits the contraction dim: a ``rearrange_k_groups`` buffer (2D x 2D)
# One program: 16 rows x 16 blocks (512 elements) of each row, 8 warps: every thread loads 16-byte runs of e4m3
# and stores 16-byte runs of bf16; 24 KiB moved per program (the padding kernels' 4 KiB rows ran at 95% of copy
# bandwidth on an H200).
_DEQUANT_ROWS, _DEQUANT_BLOCKS, _DEQUANT_WARPS = 16, 16, 8


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
    inside the group's blocked image and that image's first int32 word; the byte is then ``_blocked_word`` + 128
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
    word = image.to(tl.int64) + _blocked_word(local, words) + (block // 4 * 128)[None, :]
    scale = _e8m0_to_fp32_nan(tl.load(s_ptr + word * 4 + (block % 4)[None, :], mask=ok, other=0).to(tl.int32))
    k = blocks[None, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    elements = rows.to(tl.int64)[:, None, None] * C * 32 + k
    q = tl.load(q_ptr + elements, mask=ok[:, :, None], other=0.0)
    # Both factors and their fp32 product are exact; the one rounding, to bf16, is exact too but in the subnormal
    # corner (module doc).
    tl.store(out_ptr + elements, (q.to(tl.float32) * scale[:, :, None]).to(tl.bfloat16), mask=in_bounds[:, :, None])


def dequantize_blocked(
    q: torch.Tensor, scales: torch.Tensor, offs: torch.Tensor | None = None, *, layout: str
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
    """
    if layout not in DEQUANT_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(DEQUANT_LAYOUTS)}; got {layout!r}")
    check_tensor("q", q, dtypes=(DATA_DTYPE,), ndim=3 if layout == "3d" else 2)
    check_tensor("scales", scales, dtypes=SCALE_DTYPES)
    _check_same_device(q, scales=scales)
    if q.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"q's last dim ({q.shape[-1]}) must be a multiple of {BLOCK_SIZE}")
    blocks = q.shape[-1] // BLOCK_SIZE
    if layout == "3d":
        G, N, _ = q.shape
        rows, n_rows = G * N, N
        _check_shape("scales", scales, (G, ceil_to(N, 128), ceil_to(blocks, 4)))
    else:
        check_offsets(offs)
        _check_same_device(q, offs=offs)
        G, (rows, cols), n_rows = offs.numel(), q.shape, 1
        if layout == "m_groups":
            check_host_offsets(offs, rows)
            _check_shape("scales", scales, m_groups_shape(rows, blocks, G))
        else:
            check_host_offsets(offs, cols, BLOCK_SIZE)
            _check_shape("scales", scales, k_groups_shape(rows, blocks, G))
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    if out.numel():
        grid = (triton.cdiv(rows, _DEQUANT_ROWS), triton.cdiv(blocks, _DEQUANT_BLOCKS))
        scale_bytes = scales.view(torch.uint8)
        _dequant_kernel[grid](
            q, scale_bytes, scale_bytes if offs is None else offs, out, rows, blocks, G, n_rows,  # "3d": offs unread
            LAYOUT=DEQUANT_LAYOUTS.index(layout), BLOCK_R=_DEQUANT_ROWS, BLOCK_B=_DEQUANT_BLOCKS,
            BLOCK_G=triton.next_power_of_2(G), num_warps=_DEQUANT_WARPS,
        )  # fmt: skip
    return out


def _mx_dequant_grouped_mm(a_q, a_sb, b_q, b_sb, offs) -> torch.Tensor:
    """The "triton_dequant" backend: bf16 operands in the layouts ``torch._grouped_mm`` takes as they are (2D x 3D:
    a (M, K) row-major, b (G, K, N) as a transposed view of (G, N, K); 2D x 2D: a (N, M) row-major, b (M, K) as a
    transposed view of (K, M)), so it copies nothing."""
    if b_q.dim() == 3:
        a = dequantize_blocked(a_q, a_sb, offs, layout="m_groups")
        b = dequantize_blocked(b_q, b_sb, layout="3d").transpose(-2, -1)
    else:
        a = dequantize_blocked(a_q, a_sb, offs, layout="k_groups")
        b = dequantize_blocked(b_q, b_sb, offs, layout="k_groups").t()
    return torch._grouped_mm(a, b, offs=offs)


# ---------------------------------------------------------------------------------------------------------------
# Emulation: dequantize, then multiply in fp32 group by group (host loops; reads offs on the host)
# ---------------------------------------------------------------------------------------------------------------


def _bounds(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = offs.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _grouped_matmul_fp32(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
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
            image_row += ceil_to(end - start, 128)
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
            image += ceil_to(rows, 128) * ceil_to(cols, 4)
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


# ---------------------------------------------------------------------------------------------------------------
# Operand checks
# ---------------------------------------------------------------------------------------------------------------


def _check_quantized(a_q, b_q, offs, group_multiple: int = 1) -> tuple[str, int, int, int, int]:
    """(case, M, N, K, G) of TN operands a_q, b_q (e4m3, contiguous): 2D x 3D or 2D x 2D, see the module doc.

    Where offs can be read without a sync (CPU), its values are checked too; in 2D x 2D every group size must be a
    multiple of ``group_multiple``.
    """
    check_tensor("a_q", a_q, dtypes=(DATA_DTYPE,), ndim=2)
    check_tensor("b_q", b_q, dtypes=(DATA_DTYPE,), ndim=(2, 3))
    check_offsets(offs)
    G = offs.numel()
    _check_same_device(a_q, b_q=b_q, offs=offs)
    if b_q.dim() == 3:
        (M, K), (Gb, N, Kb) = a_q.shape, b_q.shape
        if Kb != K:
            raise ValueError(f"b_q (G, N, K) must share K with a_q (M, K); got {tuple(b_q.shape)}, {tuple(a_q.shape)}")
        if Gb != G:
            raise ValueError(f"offs must hold one group end per expert of b_q ({Gb}), got {G}")
        check_host_offsets(offs, M)
        return "2d3d", M, N, K, G
    (N, M), (K, Mb) = a_q.shape, b_q.shape
    if Mb != M:
        raise ValueError(f"a_q (N, M) and b_q (K, M) must share M; got {tuple(a_q.shape)}, {tuple(b_q.shape)}")
    check_host_offsets(offs, M, group_multiple)
    return "2d2d", M, N, K, G


def _check_same_device(a_q: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        check_same_device(name, x, a_q, "a_q")


def _check_shape(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")


def _check_out_dtype(out_dtype: object, backend: str) -> torch.dtype:
    # torch._grouped_mm and the native MX kernel write bf16 only.
    allowed = (torch.bfloat16,) if backend in ("native", "triton_dequant") else OUT_DTYPES
    if out_dtype not in allowed:
        raise ValueError(f"out_dtype must be one of {allowed} for backend {backend!r}; got {out_dtype}")
    return out_dtype


# ---------------------------------------------------------------------------------------------------------------
# Operand-level calls
# ---------------------------------------------------------------------------------------------------------------


def mxfp8_grouped_mm(
    a_q: torch.Tensor,
    a_sb: torch.Tensor,
    b_q: torch.Tensor,
    b_sb: torch.Tensor,
    offs: torch.Tensor,
    *,
    backend: str | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """MXFP8 grouped GEMM on quantized TN operands with blocked scales (shapes in the module doc).

    2D x 3D: a_q (M, K), a_sb ``rearrange_m_groups`` buffer, b_q (G, N, K), b_sb (G, ceil_128(N), ceil_4(K/32))
    -> (M, N). 2D x 2D: a_q (N, M), b_q (K, M), a_sb / b_sb ``rearrange_k_groups`` buffers -> (G, N, K).
    e4m3 data and e8m0 (or uint8) scales, all contiguous; K (2D x 3D) or M (2D x 2D) a multiple of 32.
    ``backend``: None picks ``default_backend("mxfp8", device)``. ``out_dtype``: bf16, or fp32 (not "native" nor
    "triton_dequant").
    ``config``: the Triton backends' launch configuration (None: ``default_config``); other backends ignore it.
    """
    case, M, N, K, G = _check_quantized(a_q, b_q, offs, BLOCK_SIZE)
    contraction = K if case == "2d3d" else M
    if contraction % BLOCK_SIZE:
        raise ValueError(f"the contraction dim ({contraction}) must be a multiple of {BLOCK_SIZE}")
    check_tensor("a_sb", a_sb, dtypes=SCALE_DTYPES, ndim=2)
    check_tensor("b_sb", b_sb, dtypes=SCALE_DTYPES, ndim=3 if case == "2d3d" else 2)
    _check_same_device(a_q, a_sb=a_sb, b_sb=b_sb)
    if case == "2d3d":
        _check_shape("a_sb", a_sb, m_groups_shape(M, K // BLOCK_SIZE, G))
        _check_shape("b_sb", b_sb, (G, ceil_to(N, 128), ceil_to(K // BLOCK_SIZE, 4)))
    else:
        _check_shape("a_sb", a_sb, k_groups_shape(N, M // BLOCK_SIZE, G))
        _check_shape("b_sb", b_sb, k_groups_shape(K, M // BLOCK_SIZE, G))
    backend = _resolve_backend("mxfp8", backend, a_q.device)
    out_dtype = _check_out_dtype(out_dtype, backend)
    if config is not None and not isinstance(config, TileConfig):
        raise ValueError(f"config must be a TileConfig or None, got {config!r}")

    if backend == "native":
        sa, sb = a_sb.view(SCALE_DTYPE), b_sb.view(SCALE_DTYPE)
        if case == "2d3d":
            return torch._scaled_grouped_mm(
                a_q, b_q.transpose(-2, -1), sa, sb.reshape(G, -1), offs=offs, out_dtype=out_dtype
            )
        return torch._scaled_grouped_mm(a_q, b_q.t(), sa, sb, offs=offs, out_dtype=out_dtype)
    if backend == "emulated":
        a, b = _mx_dequantize(a_q, a_sb, b_q, b_sb, _bounds(offs))
        return _grouped_matmul_fp32(a, b, offs, out_dtype)
    if backend == "triton_dequant":
        return _mx_dequant_grouped_mm(a_q, a_sb, b_q, b_sb, offs)
    shape = (M, N) if case == "2d3d" else (G, N, K)
    out = torch.empty(shape, dtype=out_dtype, device=a_q.device)
    if out.numel():
        _mx_triton(a_q, a_sb, b_q, b_sb, offs, out, backend, config or default_config(case, backend))
    return out


def fp8_rowwise_grouped_mm(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    offs: torch.Tensor,
    *,
    backend: str | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """FP8 rowwise grouped GEMM on quantized TN operands with fp32 scales (``fp8_rowwise`` produces them).

    2D x 3D: a_q (M, K), a_scale (M,), b_q (G, N, K), b_scale (G, N) -> (M, N).
    2D x 2D: a_q (N, M), a_scale (G, N), b_q (K, M), b_scale (G, K) -> (G, N, K) (per-group scales; torch reads
    them flattened group-major). "native" (``torch._scaled_grouped_mm``, SM90/SM100) needs the contraction dim and
    the output's column count to be multiples of 16, bf16 output, and in 2D x 2D every group size a multiple of
    16 (a device-side assert otherwise). ``use_fast_accum``: the native kernel's fast (less precise) accumulation.
    """
    case, M, N, K, G = _check_quantized(a_q, b_q, offs)
    if case == "2d3d":
        scale_shapes = (M,), (G, N)
    else:
        scale_shapes = (G, N), (G, K)
    for name, scale, shape in zip(("a_scale", "b_scale"), (a_scale, b_scale), scale_shapes, strict=True):
        check_tensor(name, scale, dtypes=(torch.float32,))
        _check_shape(name, scale, shape)
    _check_same_device(a_q, a_scale=a_scale, b_scale=b_scale)
    backend = _resolve_backend("fp8_rowwise", backend, a_q.device)
    out_dtype = _check_out_dtype(out_dtype, backend)

    if backend == "emulated":
        a, b = _fp8_dequantize(a_q, a_scale, b_q, b_scale, _bounds(offs))
        return _grouped_matmul_fp32(a, b, offs, out_dtype)
    contraction, out_cols = (K, N) if case == "2d3d" else (M, K)
    for what, value in (("the contraction dim", contraction), ("the output's column count", out_cols)):
        if value % 16:
            raise ValueError(f"native FP8 rowwise grouped GEMM: {what} ({value}) must be a multiple of 16")
    b = b_q.transpose(-2, -1)
    if case == "2d2d":
        a_scale, b_scale = a_scale.reshape(-1), b_scale.reshape(-1)
    return torch._scaled_grouped_mm(
        a_q, b, a_scale, b_scale, offs=offs, out_dtype=out_dtype, use_fast_accum=use_fast_accum
    )


# ---------------------------------------------------------------------------------------------------------------
# The front door
# ---------------------------------------------------------------------------------------------------------------


def _mx_along_last(x: torch.Tensor, mode) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 blocks along the last dim of a 2D x (row- or column-major): q row-major, scales (R, C/32)."""
    if x.is_contiguous():
        return quantize_dim0(x, mode)
    return quantize_dim1(x.t().contiguous(), mode)


def quantize_mxfp8_operands(a, b, offs, mode: ScaleMode | str = "rceil"):
    """The operands of ``mxfp8_grouped_mm`` (a_q, a_sb, b_q, b_sb) of ``torch._grouped_mm`` operands a, b (2D x 3D:
    a (M, K), b (G, K, N); 2D x 2D: a (N, M), b (M, K); bf16 or fp32, any strides), quantized with ``mode``."""
    mode = ScaleMode.parse(mode)
    if b.dim() == 3:
        a_q, a_s = quantize_dim0(a.contiguous(), mode)
        b_q, b_s = quantize_3d(b.transpose(-2, -1).contiguous(), along="K", mode=mode)
        return a_q, rearrange_m_groups(a_s, offs), b_q, rearrange_3d(b_s)
    a_q, a_s = _mx_along_last(a, mode)
    b_q, b_s = _mx_along_last(b.t(), mode)
    return a_q, rearrange_k_groups(a_s, offs), b_q, rearrange_k_groups(b_s, offs)


def _quantize_fp8_rowwise(a, b, offs):
    if b.dim() == 3:
        a_q, a_scale = quantize_fp8_rowwise(a.contiguous())
        b_q, b_scale = quantize_fp8_rowwise_3d(b.transpose(-2, -1).contiguous(), along="K")
        return a_q, a_scale, b_q, b_scale
    return (*quantize_fp8_rowwise_k_groups(a.t(), offs), *quantize_fp8_rowwise_k_groups(b, offs))


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    recipe: str = "bf16",
    backend: str | None = None,
    mode: ScaleMode | str = "rceil",
) -> GroupedMMResult:
    """``torch._grouped_mm(a, b, offs=offs)`` in ``recipe``, on high-precision operands; bf16 output.

    2D x 3D: a (M, K), b (G, K, N) -> (M, N); 2D x 2D: a (N, M), b (M, K) -> (G, N, K) (module doc). Any strides
    (b is usually a transposed view of (G, N, K) weights). bf16 needs bf16 operands; fp8_rowwise and mxfp8 take
    bf16 or fp32, quantize them with this package's Triton quantizers (mxfp8: ``mode`` scales, blocked by the
    ``layouts`` kernels) and run ``fp8_rowwise_grouped_mm`` / ``mxfp8_grouped_mm``. ``backend``: None picks the
    best available on the device (``available_backends``). mxfp8 2D x 2D needs group sizes that are multiples of 32.
    """
    recipe = check_recipe(recipe)
    dtypes = (torch.bfloat16,) if recipe == "bf16" else (torch.bfloat16, torch.float32)
    check_tensor("a", a, dtypes=dtypes, ndim=2, contiguous=False)
    check_tensor("b", b, dtypes=dtypes, ndim=(2, 3), contiguous=False)
    check_offsets(offs)
    if b.dim() == 3:
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"a (M, K) and b (G, K, N) must agree on K; got {tuple(a.shape)}, {tuple(b.shape)}")
        if b.shape[0] != offs.numel():
            raise ValueError(f"offs must hold one group end per expert of b ({b.shape[0]}), got {offs.numel()}")
    elif a.shape[1] != b.shape[0]:
        raise ValueError(f"a (N, M) and b (M, K) must agree on M; got {tuple(a.shape)}, {tuple(b.shape)}")
    backend = _resolve_backend(recipe, backend, a.device)

    if recipe == "mxfp8":
        out = mxfp8_grouped_mm(*quantize_mxfp8_operands(a, b, offs, mode), offs, backend=backend)
    elif recipe == "fp8_rowwise":
        out = fp8_rowwise_grouped_mm(*_quantize_fp8_rowwise(a, b, offs), offs, backend=backend)
    elif backend == "native":
        out = torch._grouped_mm(a, b, offs=offs)
    else:
        out = _grouped_matmul_fp32(a, b, offs, torch.bfloat16)
    return GroupedMMResult(out, backend)


# ---------------------------------------------------------------------------------------------------------------
# Cost
# ---------------------------------------------------------------------------------------------------------------

_PRECISION = {"bf16": "bf16", "fp8_rowwise": "fp8", "mxfp8": "mxfp8"}


def grouped_mm_cost(M: int, N: int, K: int, G: int, recipe: str, case: str = "2d3d") -> Cost:
    """Cost of one grouped GEMM with bf16 output: 2*M*N*K FLOPs; bytes = operands + scales + output.

    2d3d: (M, K) x (G, K, N) -> (M, N); 2d2d: (N, M) x (M, K) -> (G, N, K) (M is the contraction dim). Operands
    are bf16 (2 bytes) or e4m3 (1 byte); fp8_rowwise scales are fp32, one per row (per group and row in 2d2d);
    mxfp8 scales are the blocked buffers as handed over (``layouts`` shapes, their padding included).
    """
    recipe = check_recipe(recipe)
    if case not in ("2d3d", "2d2d"):
        raise ValueError(f"case must be '2d3d' or '2d2d', got {case!r}")
    if min(M, N, K) < 0 or G < 1:
        raise ValueError(f"M, N, K must be >= 0 and G >= 1; got {M}, {N}, {K}, {G}")
    elt = 2 if recipe == "bf16" else 1
    if case == "2d3d":
        operands, out = (M * K + G * N * K) * elt, M * N * 2
    else:
        operands, out = (N * M + M * K) * elt, G * N * K * 2
    scales = 0
    if recipe == "fp8_rowwise":
        scales = 4 * (M + G * N if case == "2d3d" else G * (N + K))
    elif recipe == "mxfp8":
        contraction = K if case == "2d3d" else M
        if contraction % BLOCK_SIZE:
            raise ValueError(f"mxfp8: the contraction dim ({contraction}) must be a multiple of {BLOCK_SIZE}")
        if case == "2d3d":
            a_rows, a_cols = m_groups_shape(M, K // BLOCK_SIZE, G)
            scales = a_rows * a_cols + G * ceil_to(N, 128) * ceil_to(K // BLOCK_SIZE, 4)
        else:
            scales = sum(r * c for r, c in (k_groups_shape(R, M // BLOCK_SIZE, G) for R in (N, K)))
    return Cost(bytes_read=operands + scales, bytes_written=out, flops=2 * M * N * K, precision=_PRECISION[recipe])


# Transitional, until the rename of the operand-level calls lands from the kernels work: stages.py already calls
# them by their new names. Drop these two lines when merging that rename.
mxfp8_scaled_grouped_mm = mxfp8_grouped_mm
fp8_rowwise_scaled_grouped_mm = fp8_rowwise_grouped_mm
