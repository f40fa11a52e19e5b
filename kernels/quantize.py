"""MXFP8 quantization kernels: bf16/fp32 -> (e4m3 data, e8m0 scales), bit-exact to ``format.quantize_reference``.

Two kernels cover the four quantizers of an MoE training step:

* ``_quantize_rows_kernel``: 32-blocks along the contiguous dim of a row-major (R, C) matrix; the data keeps the
  input's layout. ``quantize_dim0`` (x (M, K)) and ``quantize_3d(along="K")`` (w (G, N, K) seen as (G*N, K)).
* ``_quantize_cols_kernel``: 32-blocks down the columns of a batch of row-major (R, C) matrices; each matrix is
  written transposed (C, R), so the blocked dim becomes contiguous. ``quantize_dim1`` (batch 1) and
  ``quantize_3d(along="N")`` (batch G). The transpose happens on chip (Triton stages it through shared memory),
  so both the loads (along C) and the stores (along R) are coalesced.

A rows program streams one (rows, cols) tile with no loop; a cols program walks its tile 32 rows at a time (one
block per column per step) and stores the tile's scale bytes once at the end. The GPU keeps several tiles in flight
per SM through occupancy. Each kernel's launch is a frozen config passed as ``config=`` (``RowsConfig``,
``ColsConfig``; None: the measured default), never autotuned: callers capture CUDA graphs. Offsets are 64-bit, so
tensors may pass 2**31 elements.

Numerics, shared by both kernels (``_quantize_blocks``): amax is the integer max of the fp32 bit patterns with the
sign cleared, so a NaN (bits above +Inf) wins the max like +Inf; the scale byte is computed from those bits with
integer operations only (no SM100-only ``cvt ... ue8m0`` PTX), so one kernel runs on SM90 and SM100. The fp32 -> e4m3
cast is the hardware ``cvt.rn.satfinite`` on a GPU; under ``TRITON_INTERPRET=1`` the interpreter's own cast is wrong
for a few percent of values, so the wrappers switch (constexpr ``EXACT``) to an integer round-to-nearest-even cast
that the GPU build never contains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .cost import Cost
from .format import (
    BLOCK_SIZE,
    DATA_DTYPE,
    E4M3_NAN_BYTE,
    E8M0_MAX_FINITE,
    E8M0_NAN,
    SCALE_DTYPE,
    ScaleMode,
)
from .runtime import (
    INTERPRET,
    MAX_GROUPS,
    InputError,
    check_config,
    check_int,
    check_multiple,
    check_power_of_two,
    check_tensor,
)

IN_DTYPES = (torch.bfloat16, torch.float32)
# The cols kernel packs a column's scale bytes of one tile into an int64: at most 8 blocks (256 rows) per tile.
COLS_MAX_ROWS = 8 * BLOCK_SIZE


# ---------------------------------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------------------------------


def _check_tile(owner: str, tile: object, blocked: int, max_blocked: int) -> None:
    """A (rows, cols) tile of powers of two whose entry ``blocked`` runs along the blocked dim: 32 to max_blocked."""
    if not (
        isinstance(tile, (tuple, list))
        and len(tile) == 2
        and all(isinstance(t, int) and t > 0 and t & (t - 1) == 0 for t in tile)
    ):
        raise InputError(f"{owner}.tile must be a (rows, cols) pair of powers of two, got {tile!r}")
    if not BLOCK_SIZE <= tile[blocked] <= max_blocked:
        raise InputError(
            f"{owner}.tile[{blocked}] runs along the blocked dim: {BLOCK_SIZE} to {max_blocked}, got {tile!r}"
        )


def _tile_post_init(config, blocked: int, max_blocked: int) -> None:
    """Check a config's tile and num_warps; a tile given as a list is kept as a tuple (the config stays hashable)."""
    name = type(config).__name__
    _check_tile(name, config.tile, blocked, max_blocked)
    object.__setattr__(config, "tile", tuple(config.tile))
    check_power_of_two(f"{name}.num_warps", config.num_warps, hi=32)


@dataclass(frozen=True)
class RowsConfig:
    """One launch of the rows kernel (``quantize_dim0``, ``quantize_3d(along="K")``)."""

    # (rows, cols) of the input one program quantizes, powers of two, cols (the blocked dim) at least one 32-block.
    # Triton picks the register layout from the tile and the warps: the default gives each thread 16 contiguous
    # elements, loaded as one vector and stored as 16 e4m3 bytes in one 16-byte vector.
    tile: tuple[int, int]
    # Warps per program.
    num_warps: int

    def __post_init__(self):
        _tile_post_init(self, blocked=1, max_blocked=2**30)


@dataclass(frozen=True)
class ColsConfig:
    """One launch of the cols kernel (``quantize_dim1``, ``quantize_3d(along="N")``)."""

    # (rows, cols) of the input one program quantizes, powers of two; rows (the blocked dim) 32 to COLS_MAX_ROWS. A
    # program walks its tile 32 rows at a time, so registers and the transpose stay those of a 32-row tile. One warp
    # on 32 x 128 holds 16 rows x 8 columns per thread: a block's amax is an in-thread max plus one shuffle, and the
    # transpose goes through shared memory by ldmatrix.
    tile: tuple[int, int]
    # Warps per program. More than one splits a block across warps, which then pay a shared-memory reduction.
    num_warps: int
    # Software-pipelining depth of the 32-row steps, 1 to 4: above 1, Triton copies the next steps' input
    # asynchronously into shared memory while a step computes.
    num_stages: int
    # Width in input columns of the column-tile groups programs run through, all row tiles of a group before the
    # next (0: the whole width): the programs resident at once then write long runs of each transposed output row.
    group_cols: int

    def __post_init__(self):
        _tile_post_init(self, blocked=0, max_blocked=COLS_MAX_ROWS)
        check_int("ColsConfig.num_stages", self.num_stages, 1, 4)
        check_int("ColsConfig.group_cols", self.group_cols, 0)


# The measured defaults (config=None), chosen by scripts/tune_quantize.py; see docs/perf-log.md. The cols kernel's
# best differs by use: dim1 wants short tiles in narrow groups, 3D along N taller pipelined tiles in wide groups.
ROWS_CONFIG = RowsConfig(tile=(32, 512), num_warps=8)
DIM1_COLS = ColsConfig(tile=(32, 64), num_warps=1, num_stages=1, group_cols=512)
ALONG_N_COLS = ColsConfig(tile=(128, 64), num_warps=1, num_stages=3, group_cols=2048)

_BLOCK: tl.constexpr = tl.constexpr(BLOCK_SIZE)
_NAN_BYTE: tl.constexpr = tl.constexpr(E4M3_NAN_BYTE)
_SCALE_NAN: tl.constexpr = tl.constexpr(E8M0_NAN)
_SCALE_MAX: tl.constexpr = tl.constexpr(E8M0_MAX_FINITE)
_F32_INF_BITS: tl.constexpr = tl.constexpr(0x7F800000)
_F32_NAN_BITS: tl.constexpr = tl.constexpr(0x7FC00000)
# fp32 bits of 448 = 1.75 * 2**8, the largest finite e4m3 value.
_F32_448_BITS: tl.constexpr = tl.constexpr(0x43E00000)


# ---------------------------------------------------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------------------------------------------------


@triton.jit
def _to_fp32(x):
    """bf16 or fp32 tile -> fp32, exactly. bf16 widens through its bits: the interpreter's bf16 cast flushes
    subnormals, and on a GPU the shift is what the cast compiles to anyway."""
    if x.dtype == tl.bfloat16:
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x


@triton.jit
def _scale_byte(amax_bits, RCEIL: tl.constexpr):
    """Biased e8m0 scale byte (int32) of each block from the fp32 bits of its amax (sign clear; > +Inf is NaN).

    FLOOR: E(amax) - 8, clamped to 0..254.
    RCEIL: ceil(log2(d)) + 127 with d = fp32(amax / 448), written on amax's own bits, so no division. With
    amax = 1.m * 2**e and 448 = 1.75 * 2**8, amax / 448 is an exact power of two only when 1.m == 1.75, and the fp32
    rounding of a normal d never lands on or leaves a power of two, so byte = e - 8 + (1.m > 1.75). Below
    d = 2**-126 the format's rule takes the subnormal d's rounding: byte 1 iff mantissa(d) > 0x400000, i.e.
    d > 2**-127 after rounding to a multiple of 2**-149. The formula agrees everywhere except amax = (1.75 + 2**-23)
    * 2**-119 (bits 0x04600001), whose d = 2**-127 * (1 + 2**-23 / 1.75) rounds down to 2**-127: byte 0, not 1.
    (Both modes were checked against ``format.scale_bytes_reference`` on all 2**31 non-negative fp32 patterns.)
    """
    exp = amax_bits >> 23
    if RCEIL:
        mant = amax_bits & 0x7FFFFF
        byte = exp - 8 + (mant > 0x600000).to(tl.int32)
        byte = tl.where(amax_bits == 0x04600001, 0, byte)
    else:
        byte = exp - 8
    byte = tl.minimum(tl.maximum(byte, 0), _SCALE_MAX)
    return tl.where(amax_bits >= _F32_INF_BITS, _SCALE_NAN, byte)


@triton.jit
def _reciprocal_scale(byte):
    """fp32 2**(127 - byte), built from bits: byte 254 gives the subnormal 2**-127, the NaN byte 255 gives NaN."""
    bits = tl.where(byte == _SCALE_NAN, _F32_NAN_BITS, 0x400000)
    bits = tl.where(byte < _SCALE_MAX, (_SCALE_MAX - byte) << 23, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _to_e4m3_bits(y, EXACT: tl.constexpr):
    """fp32 tile -> e4m3fn bytes (uint8), round to nearest even, saturating to +-448.

    EXACT=False: the hardware cast (``cvt.rn.satfinite.e4m3x2.f32``; NaN -> 0x7F, since the NaN a multiply makes
    is the positive canonical one). EXACT=True: the same in integer arithmetic, for the interpreter.
    """
    if EXACT:
        bits = y.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = tl.minimum(bits & 0x7FFFFFFF, _F32_448_BITS)
        exp = a >> 23
        # e4m3 normals start at 2**-6 (fp32 biased exponent 121): keep 3 of the 23 mantissa bits (shift 20), the
        # exponent field rides along and a mantissa carry bumps it. Below, the result is round(|y| * 2**9), the
        # subnormal's integer mantissa (8 -> 0x08, the smallest normal): the 24-bit significand shifted right by
        # 141 - exp, capped at 25 (beyond which everything rounds to 0).
        normal = exp > 120
        mag = tl.where(normal, a, (a & 0x7FFFFF) | 0x800000)
        shift = tl.where(normal, 20, tl.minimum(141 - exp, 25))
        rounded = (mag + (1 << (shift - 1)) - 1 + ((mag >> shift) & 1)) >> shift
        q = tl.where(normal, rounded - (120 << 3), rounded) | sign
        return tl.where((bits & 0x7FFFFFFF) > _F32_INF_BITS, _NAN_BYTE, q).to(tl.uint8)
    else:
        return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def _abs_max_bits(x, AXIS: tl.constexpr):
    """fp32 bit pattern (int32) of max |x| along AXIS of a bf16/fp32 tile: the integer max of the magnitudes' bits,
    so a NaN (bits above +Inf) wins like +Inf. bf16 is reduced on its 16-bit patterns, so fp32 values exist only at
    the multiply that follows (fewer live registers)."""
    if x.dtype == tl.bfloat16:
        bits = tl.max(x.to(tl.int16, bitcast=True) & 0x7FFF, axis=AXIS).to(tl.int32) << 16
    else:
        bits = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=AXIS)
    return bits


@triton.jit
def _quantize_blocks(x, AXIS: tl.constexpr, RCEIL: tl.constexpr, EXACT: tl.constexpr):
    """Quantize a 3D fp32 tile whose dim ``AXIS`` (length 32) runs along one block.

    Returns (data bytes uint8, same shape as x; scale bytes uint8, x's shape without AXIS). A block holding a NaN or
    an Inf gets scale 255 and data 0x7F.
    """
    byte = _scale_byte(_abs_max_bits(x, AXIS), RCEIL)
    # A NaN/Inf block's reciprocal scale is NaN, so all its products are NaN and the cast writes 0x7F: no
    # per-element select.
    q = _to_e4m3_bits(_to_fp32(x) * tl.expand_dims(_reciprocal_scale(byte), AXIS), EXACT)
    return q, byte.to(tl.uint8)


@triton.jit
def _load(ptrs, mask, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store(ptrs, value, mask, EVEN: tl.constexpr):
    if EVEN:
        tl.store(ptrs, value)
    else:
        tl.store(ptrs, value, mask=mask)


# ---------------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------------


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n_rows,
    n_cols,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EVEN: tl.constexpr,
    RCEIL: tl.constexpr,
    EXACT: tl.constexpr,
):
    """x (n_rows, n_cols) bf16/fp32 row-major, 32-blocks along each row -> q (n_rows, n_cols) e4m3 bytes and
    s (n_rows, n_cols / 32) scale bytes, both row-major. One program per BLOCK_R x BLOCK_C tile; EVEN: the tiles
    divide the matrix (no masks)."""
    pid = tl.program_id(0)
    n_col_tiles = tl.cdiv(n_cols, BLOCK_C)
    rows = (pid // n_col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % n_col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs = rows[:, None] * n_cols + cols[None, :]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)

    x = _load(x_ptr + offs, mask, EVEN)
    q, scale = _quantize_blocks(tl.reshape(x, (BLOCK_R, BLOCK_C // _BLOCK, _BLOCK)), 2, RCEIL, EXACT)
    _store(q_ptr + offs, tl.reshape(q, (BLOCK_R, BLOCK_C)), mask, EVEN)

    n_blocks = n_cols // _BLOCK
    blocks = (pid % n_col_tiles) * (BLOCK_C // _BLOCK) + tl.arange(0, BLOCK_C // _BLOCK)
    s_mask = (rows[:, None] < n_rows) & (blocks[None, :] < n_blocks)
    _store(s_ptr + rows[:, None] * n_blocks + blocks[None, :], scale, s_mask, EVEN)


@triton.jit
def _quantize_cols_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n_rows,
    n_cols,
    s_stride_batch,
    s_stride_col,
    s_stride_block,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    EVEN: tl.constexpr,
    RCEIL: tl.constexpr,
    EXACT: tl.constexpr,
    GROUP: tl.constexpr,
    STAGES: tl.constexpr,
):
    """x (B, n_rows, n_cols) bf16/fp32 row-major, 32-blocks down each column -> q (B, n_cols, n_rows) e4m3 bytes
    row-major (every matrix transposed) and scale byte (b, col, row // 32) at
    b * s_stride_batch + col * s_stride_col + (row // 32) * s_stride_block. Grid: (tiles of one matrix, B).

    A program walks its BLOCK_R x BLOCK_C tile 32 rows (one block per column) at a time, so registers and the
    transpose stay those of a 32-row tile, and stores the tile's BLOCK_R / 32 scale bytes of each column at the end:
    where they are contiguous (s_stride_block == 1, 3D along N) each column's bytes go out as one vector store rather
    than one scattered byte per block.

    Programs run through the column tiles in groups of GROUP, all row tiles of one group before the next, so the
    programs resident at once write long runs of each output row (the transposed matrix's rows are n_rows apart)
    instead of one 32-row piece of every output row. STAGES > 1 software-pipelines the 32-row steps (Triton copies
    the next steps' input asynchronously into shared memory while this step computes)."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    n_col_tiles = tl.cdiv(n_cols, BLOCK_C)
    tiles_per_group = GROUP * tl.cdiv(n_rows, BLOCK_R)
    first_col_tile = (pid // tiles_per_group) * GROUP
    group_cols = tl.minimum(n_col_tiles - first_col_tile, GROUP)
    first_row = ((pid % tiles_per_group) // group_cols).to(tl.int64) * BLOCK_R
    cols = (first_col_tile + (pid % tiles_per_group) % group_cols) * BLOCK_C + tl.arange(0, BLOCK_C)
    STEPS: tl.constexpr = BLOCK_R // _BLOCK
    steps = tl.arange(0, STEPS)
    # Offsets within one 32-row step, the same for every step (which only moves the tile's base pointers).
    r = tl.arange(0, _BLOCK)
    x_offs = r[:, None].to(tl.int64) * n_cols + cols[None, :]
    q_offs = cols[:, None].to(tl.int64) * n_rows + r[None, :]
    x_tile = x_ptr + (batch * n_rows + first_row) * n_cols
    q_tile = q_ptr + batch * n_cols * n_rows + first_row

    # Byte i of a column's word is its scale of step i (STEPS <= 8): one register per column, not STEPS.
    packed = tl.zeros((1, BLOCK_C), dtype=tl.int64)
    for i in tl.range(STEPS, num_stages=STAGES):
        rows = first_row + i * _BLOCK + r
        x = _load(x_tile + i * _BLOCK * n_cols + x_offs, (rows[:, None] < n_rows) & (cols[None, :] < n_cols), EVEN)
        q, scale = _quantize_blocks(tl.reshape(x, (1, _BLOCK, BLOCK_C)), 1, RCEIL, EXACT)
        # Transposed in registers (Triton stages it through shared memory), so the store runs along the output rows.
        q_t = tl.trans(tl.reshape(q, (_BLOCK, BLOCK_C)))
        _store(q_tile + i * _BLOCK + q_offs, q_t, (cols[:, None] < n_cols) & (rows[None, :] < n_rows), EVEN)
        packed |= scale.to(tl.int64) << (8 * i)

    blocks = first_row // _BLOCK + steps
    s_offs = batch * s_stride_batch + blocks[:, None] * s_stride_block + cols[None, :] * s_stride_col
    s_mask = (blocks[:, None] < n_rows // _BLOCK) & (cols[None, :] < n_cols)
    scales = ((packed >> (8 * steps[:, None])) & 0xFF).to(tl.uint8)
    _store(s_ptr + s_offs, scales, s_mask, EVEN)


# ---------------------------------------------------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------------------------------------------------


def _quantize_rows(x: torch.Tensor, mode, config: RowsConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the rows kernel on a validated row-major (R, C) matrix: q (R, C) e4m3, s (R, C/32) e8m0, row-major."""
    rceil = ScaleMode.parse(mode) is ScaleMode.RCEIL
    (tr, tc), num_warps = config.tile, config.num_warps
    R, C = x.shape
    q = torch.empty((R, C), dtype=DATA_DTYPE, device=x.device)
    s = torch.empty((R, C // BLOCK_SIZE), dtype=torch.uint8, device=x.device)
    grid = (triton.cdiv(R, tr) * triton.cdiv(C, tc),)
    if grid[0]:
        even = R % tr == 0 and C % tc == 0
        _quantize_rows_kernel[grid](
            x, q.view(torch.uint8), s, R, C,
            BLOCK_R=tr, BLOCK_C=tc, EVEN=even, RCEIL=rceil, EXACT=INTERPRET, num_warps=num_warps
        )  # fmt: skip
    return q, s.view(SCALE_DTYPE)


def _quantize_cols(
    x: torch.Tensor, mode, config: ColsConfig, scales_col_major: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the cols kernel on a validated row-major batch x (B, R, C): q (B, C, R) e4m3 row-major and
    s (B, C, R/32) e8m0, each matrix of s row-major or, with ``scales_col_major``, column-major."""
    rceil = ScaleMode.parse(mode) is ScaleMode.RCEIL
    B, R, C = x.shape
    (tr, tc), group_cols = config.tile, config.group_cols
    Rb = R // BLOCK_SIZE
    q = torch.empty((B, C, R), dtype=DATA_DTYPE, device=x.device)
    if scales_col_major:
        s = torch.empty_strided((B, C, Rb), (C * Rb, 1, C), dtype=torch.uint8, device=x.device)
    else:
        s = torch.empty((B, C, Rb), dtype=torch.uint8, device=x.device)
    n_col_tiles = triton.cdiv(C, tc)
    group = min(max(group_cols // tc, 1), n_col_tiles) if group_cols else n_col_tiles
    grid = (triton.cdiv(R, tr) * n_col_tiles, B)
    if grid[0] and B:
        even = R % tr == 0 and C % tc == 0
        _quantize_cols_kernel[grid](
            x, q.view(torch.uint8), s, R, C, *s.stride(),
            BLOCK_R=tr, BLOCK_C=tc, EVEN=even, RCEIL=rceil, EXACT=INTERPRET, GROUP=group, STAGES=config.num_stages,
            num_warps=config.num_warps
        )  # fmt: skip
    return q, s.view(SCALE_DTYPE)


def quantize_dim0(
    x: torch.Tensor, mode: ScaleMode | str = "rceil", *, config: RowsConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize x (M, K) bf16/fp32 row-major in 1x32 blocks along K (dim 1).

    Returns q (M, K) ``float8_e4m3fn`` and scales (M, K/32) ``float8_e8m0fnu``, both row-major; bit-exact to
    ``quantize_reference(x, mode)``. K must be a multiple of 32; M is any size. ``config``: the rows kernel's
    launch (None: ``ROWS_CONFIG``).
    """
    x = check_tensor("x", x, dtypes=IN_DTYPES, ndim=2)
    check_multiple("x", x.shape[1], BLOCK_SIZE, "K (dim 1, the blocked dim)")
    check_config("config", config, RowsConfig)
    return _quantize_rows(x, mode, config or ROWS_CONFIG)


def quantize_dim1(
    x: torch.Tensor, mode: ScaleMode | str = "rceil", *, config: ColsConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize x (M, K) bf16/fp32 row-major in 32x1 blocks along M (dim 0), writing the transpose.

    Returns q (K, M) ``float8_e4m3fn`` row-major (so M, the blocked dim, is contiguous) and scales (K, M/32)
    ``float8_e8m0fnu`` **column-major** (strides (1, K)), the layout the kernel writes coalesced; bit-exact to
    ``quantize_reference(x.t().contiguous(), mode)``. M must be a multiple of 32; K is any size. ``config``: the
    cols kernel's launch (None: ``DIM1_COLS``).
    """
    x = check_tensor("x", x, dtypes=IN_DTYPES, ndim=2)
    check_multiple("x", x.shape[0], BLOCK_SIZE, "M (dim 0, the blocked dim)")
    check_config("config", config, ColsConfig)
    q, s = _quantize_cols(x.unsqueeze(0), mode, config or DIM1_COLS, scales_col_major=True)
    return q[0], s[0]


def quantize_3d(
    w: torch.Tensor,
    along: str = "K",
    mode: ScaleMode | str = "rceil",
    *,
    config: RowsConfig | ColsConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize expert weights w (G, N, K) bf16/fp32 row-major, 1 <= G <= MAX_GROUPS, in blocks of 32 along K
    or N.

    along="K": q (G, N, K) and scales (G, N, K/32), the oracle ``quantize_reference(w, mode)``; K a multiple of 32.
    along="N": q (G, K, N) (each expert transposed, N contiguous) and scales (G, K, N/32), both row-major; the
    oracle ``quantize_reference(w.transpose(1, 2).contiguous(), mode)``; N a multiple of 32.
    q is ``float8_e4m3fn``, scales ``float8_e8m0fnu``. ``config``: the launch over each expert's (N, K) matrix, a
    ``RowsConfig`` along K (None: ``ROWS_CONFIG``), a ``ColsConfig`` along N (None: ``ALONG_N_COLS``).
    """
    w = check_tensor("w", w, dtypes=IN_DTYPES, ndim=3)
    G, N, K = w.shape
    if not 1 <= G <= MAX_GROUPS:
        raise InputError(f"w must hold 1 to {MAX_GROUPS} experts (dim 0), got {G}")
    if along not in ("K", "N"):
        raise InputError(f"along must be 'K' or 'N', got {along!r}")
    if along == "K":
        check_config("config", config, RowsConfig, " along K (the rows kernel: no num_stages or group_cols)")
        check_multiple("w", K, BLOCK_SIZE, "K (dim 2, the blocked dim)")
        q, s = _quantize_rows(w.view(G * N, K), mode, config or ROWS_CONFIG)
        return q.view(G, N, K), s.view(G, N, K // BLOCK_SIZE)
    check_config("config", config, ColsConfig, " along N (the cols kernel)")
    check_multiple("w", N, BLOCK_SIZE, "N (dim 1, the blocked dim)")
    return _quantize_cols(w, mode, config or ALONG_N_COLS, scales_col_major=False)


# ---------------------------------------------------------------------------------------------------------------------
# Costs
# ---------------------------------------------------------------------------------------------------------------------


def quantize_2d_cost(rows: int, cols: int, in_dtype: torch.dtype) -> Cost:
    """Cost of quantizing a (rows, cols) ``in_dtype`` matrix along either dim: read it once, write one e4m3 byte per
    element and one scale byte per 32 elements."""
    if in_dtype not in IN_DTYPES:
        raise InputError(f"in_dtype must be torch.bfloat16 or torch.float32, got {in_dtype}")
    if rows < 0 or cols < 0 or (rows * cols) % BLOCK_SIZE:
        raise InputError(f"rows, cols must be >= 0 with one of them a multiple of {BLOCK_SIZE}, got {rows}, {cols}")
    n = rows * cols
    return Cost(bytes_read=n * in_dtype.itemsize, bytes_written=n + n // BLOCK_SIZE)


def quantize_3d_cost(G: int, N: int, K: int, in_dtype: torch.dtype) -> Cost:
    """Cost of ``quantize_3d`` on (G, N, K) ``in_dtype`` weights, along K or N (the same bytes either way)."""
    if G < 1:
        raise InputError(f"G must be >= 1, got {G}")
    return quantize_2d_cost(G * N, K, in_dtype)
