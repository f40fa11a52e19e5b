"""MXFP8 quantization kernels: bf16/fp32 -> (e4m3 data, e8m0 scales), bit-exact to ``format.quantize_reference``.

Two kernels cover the four quantizers of an MoE training step:

* ``_quantize_rows_kernel``: 32-blocks along the contiguous dim of a row-major (R, C) matrix; the data keeps the
  input's layout. ``quantize_dim0`` (x (M, K)) and ``quantize_3d(along="K")`` (w (G, N, K) seen as (G*N, K)).
* ``_quantize_cols_kernel``: 32-blocks down the columns of a batch of row-major (R, C) matrices; each matrix is
  written transposed (C, R), so the blocked dim becomes contiguous. ``quantize_dim1`` (batch 1) and
  ``quantize_3d(along="N")`` (batch G). The transpose happens on chip (Triton stages it through shared memory),
  so both the loads (along C) and the stores (along R) are coalesced.

A rows program streams one (rows, cols) tile with no loop; a cols program walks its tile 32 rows at a time (one
block per column per step) and stores the tile's scale bytes once at the end, a column's bytes as one word where they
are contiguous. The GPU keeps several tiles in flight per SM through occupancy. Both kernels can also write their
scales straight into the blocked layouts of ``layouts`` (M-groups and 3D for the rows kernel, 3D and K-groups for the
cols kernel; the ``quantize_blocked`` wrappers), their programs then walking the blocked buffer so that its padding
and tail are written too. Each kernel's launch is a frozen config passed as ``config=`` (``RowsConfig``,
``ColsConfig``; None: the measured default), never autotuned: callers capture CUDA graphs. Offsets are 64-bit, so
tensors may pass 2**31 elements.

Numerics, shared by both kernels (``quantize_blocks``): amax is the integer max of the fp32 bit patterns with the
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

from .block_math import Producer, masked_load, masked_store, producer_args, quantize_blocks
from .cost import Cost
from .format import (
    BLOCK_SIZE,
    DATA_DTYPE,
    SCALE_DTYPE,
    ScaleMode,
)
from .layouts import (
    TILE_ROWS,
    blocked_3d_shape,
    blocked_byte,
    k_groups_images,
    k_groups_shape,
    m_groups_rows,
    m_groups_shape,
    m_groups_tail,
)
from .padding import locate, pick
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
    # A tile's scale bytes of one column, contiguous in the output (row-major along N; the blocked layouts), go out
    # as one word per column (int16 to int64 by the tile's steps; 4-byte words per 4 blocks in a blocked image)
    # rather than one byte store each: each byte store is an L2 write of its own, and along N, where a column's
    # bytes are contiguous, they added a third to the transactions of the data. False: bytes (the previous kernel).
    scale_words: bool = True
    # Issue each 32-row step's load before the previous step's work (two steps in registers, the loop unrolled):
    # reads in flight without a trip through shared memory. Only with num_stages == 1.
    prefetch: bool = False

    def __post_init__(self):
        _tile_post_init(self, blocked=0, max_blocked=COLS_MAX_ROWS)
        check_int("ColsConfig.num_stages", self.num_stages, 1, 4)
        check_int("ColsConfig.group_cols", self.group_cols, 0)
        for flag in ("scale_words", "prefetch"):
            if not isinstance(getattr(self, flag), bool):
                raise InputError(f"ColsConfig.{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.prefetch and self.num_stages != 1:
            raise InputError(f"ColsConfig.prefetch needs num_stages == 1, got {self.num_stages}")


# The measured defaults (config=None), chosen by scripts/tune_quantize.py; see docs/perf-log.md. The cols kernel's
# best differs by use: dim1 wants short tiles in narrow groups, 3D along N taller pipelined tiles in wide groups.
ROWS_CONFIG = RowsConfig(tile=(32, 512), num_warps=8)
DIM1_COLS = ColsConfig(tile=(32, 64), num_warps=1, num_stages=1, group_cols=512)
ALONG_N_COLS = ColsConfig(tile=(128, 64), num_warps=1, num_stages=3, group_cols=2048)

_BLOCK: tl.constexpr = tl.constexpr(BLOCK_SIZE)
# Where a kernel writes the scale bytes (its SCALES constexpr): see each kernel; the wrappers name them.
_STRIDED: tl.constexpr = tl.constexpr(0)
_M_GROUPS: tl.constexpr = tl.constexpr(1)
_BLOCKED_3D: tl.constexpr = tl.constexpr(2)
_K_GROUPS: tl.constexpr = tl.constexpr(3)
_SCALE_KINDS = {"row_major": 0, "col_major": 0, "m_groups": 1, "3d": 2, "k_groups": 3}

# ---------------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------------


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, offs_ptr, n_rows, n_cols, G, group_rows, s_cols, p_a, p_b, p_c, p_sa, p_sb,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, EVEN: tl.constexpr, RCEIL: tl.constexpr, EXACT: tl.constexpr,
    SCALES: tl.constexpr, BLOCK_G: tl.constexpr, PRODUCE: tl.constexpr, VARIANT: tl.constexpr, TAIL: tl.constexpr,
):  # fmt: skip
    """x (n_rows, n_cols) bf16/fp32 row-major, 32-blocks along each row -> q (n_rows, n_cols) e4m3 bytes, row-major,
    and the scale bytes. EVEN: no masks (the tiles divide every dim they walk).

    SCALES == _STRIDED: s (n_rows, n_cols / 32) row-major; one program per BLOCK_R x BLOCK_C tile of x.
    Blocked (_M_GROUPS, _BLOCKED_3D): s is a blocked buffer of s_cols (a multiple of 4) scale columns, and the
    programs walk its rows instead (BLOCK_R <= 128, so a tile lies in one 128-row block), each taking the source rows
    that land there: M-groups, group bounds from offs (G groups of the n_rows rows); 3D, G images of
    ceil_128(group_rows) rows, each holding group_rows source rows. Rows and columns with no source (an image's
    padding, the buffer's tail) read as zeros, so their scale bytes come out 0; q gets only source rows.

    The tile comes from PRODUCE (``block_math.load_rows``' signature, its arguments p_*, VARIANT): the load of x,
    or a fused stage's producer that computes the tile and writes it to x. TAIL (M-groups, with a producer): the
    buffer's tail blocks also take the rows past offs[-1], in no group, so the producer writes every row of x;
    they are quantized as zeros and their q rows are not written, as the unfused quantizer's are not."""
    pid = tl.program_id(0)
    if SCALES == _STRIDED:
        n_col_tiles = tl.cdiv(n_cols, BLOCK_C)
    else:
        n_col_tiles = tl.cdiv(s_cols * _BLOCK, BLOCK_C)
    tile_row = (pid // n_col_tiles).to(tl.int64) * BLOCK_R
    r = tl.arange(0, BLOCK_R)
    if SCALES == _M_GROUPS:
        first, n_data = m_groups_rows(offs_ptr, G, n_rows, tile_row // 128, BLOCK_G)
        local = tile_row % 128 + r
        rows, valid = first + local, local < n_data
        made = valid
        if TAIL:
            tail_first, n_tail = m_groups_tail(offs_ptr, G, n_rows, tile_row // 128, BLOCK_G)
            rows = tl.where(n_tail > 0, tail_first + local, rows)
            made = valid | (local < n_tail)
    elif SCALES == _BLOCKED_3D:
        image = tl.cdiv(group_rows, 128) * 128
        local = tile_row % image + r
        rows, valid = (tile_row // image) * group_rows + local, local < group_rows
        made = valid
    else:
        rows = tile_row + r
        valid = rows < n_rows
        made = valid
    cols = (pid % n_col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs = rows[:, None] * n_cols + cols[None, :]
    mask = valid[:, None] & (cols[None, :] < n_cols)

    x = PRODUCE(x_ptr + offs, rows, made, cols, cols < n_cols, n_cols, p_a, p_b, p_c, p_sa, p_sb, VARIANT, EVEN, EXACT)
    if TAIL:
        x = tl.where(valid[:, None], x, 0.0)
    q, scale = quantize_blocks(tl.reshape(x, (BLOCK_R, BLOCK_C // _BLOCK, _BLOCK)), 2, RCEIL, EXACT)
    masked_store(q_ptr + offs, tl.reshape(q, (BLOCK_R, BLOCK_C)), mask, EVEN)

    blocks = (pid % n_col_tiles) * (BLOCK_C // _BLOCK) + tl.arange(0, BLOCK_C // _BLOCK)
    if SCALES == _STRIDED:
        n_blocks = n_cols // _BLOCK
        s_mask = valid[:, None] & (blocks[None, :] < n_blocks)
        masked_store(s_ptr + rows[:, None] * n_blocks + blocks[None, :], scale, s_mask, EVEN)
    else:
        dest = blocked_byte((tile_row + r)[:, None], blocks[None, :], s_cols)
        masked_store(s_ptr + dest, scale, (blocks < s_cols)[None, :], EVEN)


@triton.jit
def _quantize_cols_kernel(
    x_ptr, q_ptr, s_ptr, offs_ptr, n_rows, n_cols, G, grid_rows, grid_cols, s_stride_batch, s_stride_col,
    s_stride_block,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, EVEN: tl.constexpr, RCEIL: tl.constexpr, EXACT: tl.constexpr,
    GROUP: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr, SCALES: tl.constexpr, WORDS: tl.constexpr,
    BLOCK_G: tl.constexpr,
):  # fmt: skip
    """x (B, n_rows, n_cols) bf16/fp32 row-major, 32-blocks down each column -> q (B, n_cols, n_rows) e4m3 bytes
    row-major (every matrix transposed) and the scale bytes. Grid: (tiles of a grid_rows x grid_cols grid, B).

    A program walks its BLOCK_R x BLOCK_C tile 32 rows (one block per column) at a time, so registers and the
    transpose stay those of a 32-row tile, and stores the tile's BLOCK_R / 32 scale bytes of each column at the end,
    packed in one int64 per column meanwhile. Where they are contiguous, each column's bytes go out as words (one
    int16/32/64 store instead of BLOCK_R / 32 scattered bytes). Scales, by SCALES:

    * _STRIDED: byte (b, col, row // 32) at b * s_stride_batch + col * s_stride_col + (row // 32) * s_stride_block;
      the grid is x (grid_rows = n_rows, grid_cols = n_cols). WORDS: s_stride_block == 1 and the tiles divide the
      rows, so a column's bytes of one tile are one aligned word.
    * _BLOCKED_3D: matrix b's blocked image (grid_cols = ceil_128(n_cols) rows, s_stride_col = its padded scale
      columns) at b * s_stride_batch; the grid covers the image (grid_rows = 32 x its columns), its padding reading
      zeros. WORDS: 4-block groups of a column as int32 words (BLOCK_R a multiple of 128).
    * _K_GROUPS (B = 1): the K-groups buffer of groups split the rows (offs); the grid's rows are the buffer's
      columns x 32 (images and tail), each tile of at most 4 of them inside one image or the tail, its rows taken
      from the group's rows (zeros in an image's padding columns).

    Programs run through the column tiles in groups of GROUP, all row tiles of one group before the next, so the
    programs resident at once write long runs of each output row (the transposed matrix's rows are n_rows apart)
    instead of one 32-row piece of every output row. STAGES > 1 software-pipelines the 32-row steps (Triton copies
    the next steps' input asynchronously into shared memory while this step computes); PREFETCH unrolls them and
    loads each step before the previous one's work instead."""
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    n_col_tiles = tl.cdiv(grid_cols, BLOCK_C)
    tiles_per_group = GROUP * tl.cdiv(grid_rows, BLOCK_R)
    first_col_tile = (pid // tiles_per_group) * GROUP
    group_cols = tl.minimum(n_col_tiles - first_col_tile, GROUP)
    first_row = ((pid % tiles_per_group) // group_cols).to(tl.int64) * BLOCK_R
    cols = (first_col_tile + (pid % tiles_per_group) % group_cols) * BLOCK_C + tl.arange(0, BLOCK_C)
    STEPS: tl.constexpr = BLOCK_R // _BLOCK
    steps = tl.arange(0, STEPS)
    if SCALES == _K_GROUPS:
        # The grid row is a buffer column x 32: find its image (or the tail, lane G) and the group's rows behind it.
        col0, n_blocks, width = k_groups_images(offs_ptr, G, n_rows // _BLOCK, BLOCK_G)
        g, local = locate(width, first_row // _BLOCK, BLOCK_G)
        src_first = (pick(col0, g, BLOCK_G) + local) * _BLOCK
        src_end = (pick(col0, g, BLOCK_G) + pick(n_blocks, g, BLOCK_G)) * _BLOCK
    else:
        src_first = first_row
        src_end = n_rows
    # Offsets within one 32-row step, the same for every step (which only moves the tile's base pointers).
    r = tl.arange(0, _BLOCK)
    x_offs = r[:, None].to(tl.int64) * n_cols + cols[None, :]
    q_offs = cols[:, None].to(tl.int64) * n_rows + r[None, :]
    x_tile = x_ptr + (batch * n_rows + src_first) * n_cols
    q_tile = q_ptr + batch * n_cols * n_rows + src_first

    # Byte i of a column's word is its scale of step i (STEPS <= 8): one register per column, not STEPS.
    packed = tl.zeros((1, BLOCK_C), dtype=tl.int64)
    if PREFETCH:
        x_next = masked_load(x_tile + x_offs, (src_first + r[:, None] < src_end) & (cols[None, :] < n_cols), EVEN)
        for i in tl.static_range(STEPS):
            x = x_next
            if i + 1 < STEPS:
                rows = src_first + (i + 1) * _BLOCK + r
                mask = (rows[:, None] < src_end) & (cols[None, :] < n_cols)
                x_next = masked_load(x_tile + (i + 1) * _BLOCK * n_cols + x_offs, mask, EVEN)
            packed = _quantize_col_step(x, q_tile + i * _BLOCK + q_offs, src_first + i * _BLOCK + r, src_end, cols,
                                        n_cols, packed, i, BLOCK_C, EVEN, RCEIL, EXACT)  # fmt: skip
    else:
        for i in tl.range(STEPS, num_stages=STAGES):
            rows = src_first + i * _BLOCK + r
            mask = (rows[:, None] < src_end) & (cols[None, :] < n_cols)
            x = masked_load(x_tile + i * _BLOCK * n_cols + x_offs, mask, EVEN)
            packed = _quantize_col_step(x, q_tile + i * _BLOCK + q_offs, rows, src_end, cols, n_cols, packed, i,
                                        BLOCK_C, EVEN, RCEIL, EXACT)  # fmt: skip

    block0 = first_row // _BLOCK
    if SCALES == _STRIDED:
        col_base = s_ptr + batch * s_stride_batch + cols[None, :] * s_stride_col
        if WORDS:
            _store_word(col_base + block0, packed, cols[None, :] < n_cols, STEPS, EVEN)
        else:
            blocks = block0 + steps
            s_mask = (blocks[:, None] < n_rows // _BLOCK) & (cols[None, :] < n_cols)
            masked_store(col_base + blocks[:, None] * s_stride_block, _unpack(packed, steps), s_mask, EVEN)
    elif SCALES == _BLOCKED_3D:
        image = s_ptr + batch * s_stride_batch
        if WORDS:
            for j in tl.static_range(STEPS // 4):
                word = image + blocked_byte(cols[None, :], block0 + 4 * j, s_stride_col)
                mask = cols[None, :] < tl.where(block0 + 4 * j < s_stride_col, grid_cols, 0)
                _store_word(word, packed >> (32 * j), mask, 4, EVEN)
        else:
            blocks = block0 + steps
            dest = blocked_byte(cols[None, :], blocks[:, None], s_stride_col)
            s_mask = (blocks[:, None] < s_stride_col) & (cols[None, :] < grid_cols)
            masked_store(image + dest, _unpack(packed, steps), s_mask, EVEN)
    else:
        # Image g: ceil_128(K) x width bytes at ceil_128(K) x (the widths before it); the tail (lane G) is flat,
        # one ceil_128(K)-byte run per buffer column.
        w = pick(width, g, BLOCK_G)
        image = pick(tl.cumsum(width, 0) - width, g, BLOCK_G).to(tl.int64) * grid_cols
        blocked = image + blocked_byte(cols[None, :], (local + steps)[:, None], w)
        dest = tl.where(g < G, blocked, (block0 + steps)[:, None] * grid_cols + cols[None, :])
        # Malformed offs could ask for more images than fit: never write past the buffer.
        s_mask = (cols[None, :] < grid_cols) & ((local + steps)[:, None] < w) & (dest < grid_rows // _BLOCK * grid_cols)
        masked_store(s_ptr + dest, _unpack(packed, steps), s_mask, False)


@triton.jit
def _quantize_col_step(
    x, q_ptrs, rows, src_end, cols, n_cols, packed, i, BLOCK_C: tl.constexpr, EVEN: tl.constexpr,
    RCEIL: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """One 32-row step of the cols kernel: quantize x (32, BLOCK_C) down its columns, store it transposed at q_ptrs
    (BLOCK_C, 32), and return ``packed`` with the step's scale bytes at bits 8i."""
    q, scale = quantize_blocks(tl.reshape(x, (1, _BLOCK, BLOCK_C)), 1, RCEIL, EXACT)
    # Transposed in registers (Triton stages it through shared memory), so the store runs along the output rows.
    q_t = tl.trans(tl.reshape(q, (_BLOCK, BLOCK_C)))
    masked_store(q_ptrs, q_t, (cols[:, None] < n_cols) & (rows[None, :] < src_end), EVEN)
    return packed | (scale.to(tl.int64) << (8 * i))


@triton.jit
def _store_word(ptrs, packed, mask, STEPS: tl.constexpr, EVEN: tl.constexpr):
    """Store the low STEPS bytes of each int64 in ``packed`` as one word at ``ptrs`` (byte pointers, STEPS-aligned)."""
    if STEPS == 2:
        masked_store(ptrs.to(tl.pointer_type(tl.int16)), packed.to(tl.int16), mask, EVEN)
    elif STEPS == 4:
        masked_store(ptrs.to(tl.pointer_type(tl.int32)), packed.to(tl.int32), mask, EVEN)
    else:
        masked_store(ptrs.to(tl.pointer_type(tl.int64)), packed, mask, EVEN)


@triton.jit
def _unpack(packed, steps):
    """(STEPS, BLOCK_C) scale bytes from the (1, BLOCK_C) words that pack byte i of each column at bits 8i."""
    return ((packed >> (8 * steps[:, None])) & 0xFF).to(tl.uint8)


# ---------------------------------------------------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------------------------------------------------


def _quantize_rows(
    x: torch.Tensor,
    mode,
    config: RowsConfig,
    scales: str = "row_major",
    offs: torch.Tensor | None = None,
    group_rows: int = 0,
    producer: Producer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the rows kernel on a validated row-major (R, C) matrix: q (R, C) e4m3 and the scales (e8m0) by
    ``scales``: "row_major" (R, C/32); "m_groups", the blocked buffer of the groups of rows that ``offs`` ends
    (``layouts.m_groups_shape``); "3d", the blocked buffer of R / group_rows experts (``layouts.blocked_3d_shape``).
    ``producer`` (M-groups only): x is the bf16 output the producer writes, every row of it (``moe_fused``)."""
    rceil = ScaleMode.parse(mode) is ScaleMode.RCEIL
    (tr, tc), num_warps = config.tile, config.num_warps
    R, C = x.shape
    Cb = C // BLOCK_SIZE
    q = torch.empty((R, C), dtype=DATA_DTYPE, device=x.device)
    G, kind = 1, _SCALE_KINDS[scales]
    if scales == "row_major":
        s = torch.empty((R, Cb), dtype=torch.uint8, device=x.device)
        grid_rows, width, s_cols = R, C, Cb
        even = R % tr == 0 and C % tc == 0
    else:
        if tr > TILE_ROWS:
            raise InputError(f"config.tile has {tr} rows; blocked scales take tiles of at most {TILE_ROWS} rows")
        if scales == "m_groups":
            G = offs.numel()
            shape = m_groups_shape(R, Cb, G)
        else:
            G = R // group_rows if group_rows else 0
            shape = blocked_3d_shape(G, group_rows, Cb)
        s = torch.empty(shape, dtype=torch.uint8, device=x.device)
        s_cols = shape[-1]
        grid_rows, width = s.numel() // s_cols, s_cols * BLOCK_SIZE
        even = scales == "3d" and group_rows % TILE_ROWS == 0 and C == width and C % tc == 0
    grid = (triton.cdiv(grid_rows, tr) * triton.cdiv(width, tc),)
    args, produce = producer_args(producer, x)
    # A producer's arithmetic rounds every operation as its unfused kernel does: no FMA contraction.
    fusion = {"enable_fp_fusion": False} if producer else {}
    if grid[0] and R * C:
        _quantize_rows_kernel[grid](
            x, q.view(torch.uint8), s, offs if offs is not None else s, R, C, G, group_rows, s_cols, *args,
            BLOCK_R=tr, BLOCK_C=tc, EVEN=even, RCEIL=rceil, EXACT=INTERPRET, SCALES=kind,
            BLOCK_G=triton.next_power_of_2(G), TAIL=producer is not None, num_warps=num_warps, **produce, **fusion,
        )  # fmt: skip
    elif s.numel():
        s.zero_()  # no data: every scale byte is padding
    return q, s.view(SCALE_DTYPE)


def _quantize_cols(
    x: torch.Tensor, mode, config: ColsConfig, scales: str, offs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the cols kernel on a validated row-major batch x (B, R, C): q (B, C, R) e4m3 row-major and the
    scales (e8m0) by ``scales``: "row_major" (B, C, R/32); "col_major", each matrix of those column-major; "3d",
    each matrix's blocked image (``layouts.blocked_3d_shape(B, C, R/32)``); "k_groups" (B = 1), the K-groups
    buffer of the groups of rows that ``offs`` ends (``layouts.k_groups_shape(C, R/32, G)``)."""
    rceil = ScaleMode.parse(mode) is ScaleMode.RCEIL
    B, R, C = x.shape
    (tr, tc), group_cols = config.tile, config.group_cols
    steps, Rb, G = tr // BLOCK_SIZE, R // BLOCK_SIZE, 1
    q = torch.empty((B, C, R), dtype=DATA_DTYPE, device=x.device)
    if scales == "k_groups":
        if steps > 4:
            raise InputError(f"config.tile has {tr} rows; K-groups scales take tiles of at most {4 * BLOCK_SIZE} rows")
        G = offs.numel()
        s = torch.empty(k_groups_shape(C, Rb, G), dtype=torch.uint8, device=x.device)
        grid_rows, grid_cols, strides = s.shape[1] * BLOCK_SIZE, s.shape[0], (0, 0, 0)
        words = even = False
    elif scales == "3d":
        s = torch.empty(blocked_3d_shape(B, C, Rb), dtype=torch.uint8, device=x.device)
        grid_rows, grid_cols = s.shape[2] * BLOCK_SIZE, s.shape[1]
        strides = (s.shape[1] * s.shape[2], s.shape[2], 0)
        words = config.scale_words and steps % 4 == 0
        even = (grid_rows, grid_cols) == (R, C) and R % tr == 0 and C % tc == 0
    else:
        if scales == "col_major":
            s = torch.empty_strided((B, C, Rb), (C * Rb, 1, C), dtype=torch.uint8, device=x.device)
        else:
            s = torch.empty((B, C, Rb), dtype=torch.uint8, device=x.device)
        grid_rows, grid_cols, strides = R, C, s.stride()
        words = config.scale_words and scales == "row_major" and steps in (2, 4, 8) and Rb % steps == 0
        even = R % tr == 0 and C % tc == 0
    n_col_tiles = triton.cdiv(grid_cols, tc)
    group = min(max(group_cols // tc, 1), n_col_tiles) if group_cols else n_col_tiles
    grid = (triton.cdiv(grid_rows, tr) * n_col_tiles, B)
    if grid[0] and B:
        _quantize_cols_kernel[grid](
            x, q.view(torch.uint8), s, offs if offs is not None else s, R, C, G, grid_rows, grid_cols, *strides,
            BLOCK_R=tr, BLOCK_C=tc, EVEN=even, RCEIL=rceil, EXACT=INTERPRET, GROUP=group, STAGES=config.num_stages,
            PREFETCH=config.prefetch, SCALES=_SCALE_KINDS[scales], WORDS=words, BLOCK_G=triton.next_power_of_2(G + 1),
            num_warps=config.num_warps,
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
    q, s = _quantize_cols(x.unsqueeze(0), mode, config or DIM1_COLS, "col_major")
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
    w = check_quantize_3d(w, along, config)
    G, N, K = w.shape
    if along == "K":
        q, s = _quantize_rows(w.view(G * N, K), mode, config or ROWS_CONFIG)
        return q.view(G, N, K), s.view(G, N, K // BLOCK_SIZE)
    return _quantize_cols(w, mode, config or ALONG_N_COLS, "row_major")


def check_quantize_3d(w: object, along: object, config: object) -> torch.Tensor:
    """The checks of a 3D quantizer's arguments (``quantize_3d`` and its blocked sibling); returns w."""
    w = check_tensor("w", w, dtypes=IN_DTYPES, ndim=3)
    G, N, K = w.shape
    if not 1 <= G <= MAX_GROUPS:
        raise InputError(f"w must hold 1 to {MAX_GROUPS} experts (dim 0), got {G}")
    if along not in ("K", "N"):
        raise InputError(f"along must be 'K' or 'N', got {along!r}")
    if along == "K":
        check_config("config", config, RowsConfig, " along K (the rows kernel: no num_stages or group_cols)")
        check_multiple("w", K, BLOCK_SIZE, "K (dim 2, the blocked dim)")
    else:
        check_config("config", config, ColsConfig, " along N (the cols kernel)")
        check_multiple("w", N, BLOCK_SIZE, "N (dim 1, the blocked dim)")
    return w


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
