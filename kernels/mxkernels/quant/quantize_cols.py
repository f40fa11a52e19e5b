"""The cols kernel of ``quantize``: 32-blocks down the columns of a batch of row-major (R, C) matrices, each matrix
written transposed (C, R), so the blocked dim becomes contiguous (``quantize_dim1``, batch 1;
``quantize_3d(along="N")``, batch G; the K-groups and 3D blocked layouts of ``quantize_blocked``). The transpose
happens on chip (Triton stages it through shared memory), so both the loads (along C) and the stores (along R) are
coalesced. A program walks its tile 32 rows at a time (one block per column per step) and stores the tile's scale
bytes once at the end, a column's bytes as one word where they are contiguous. ``quantize``'s docstring has the
numerics, shared with its rows kernel (``block_math.quantize_blocks``); the tile checks and the scale-layout
constants shared by both kernels' configs and wrappers live here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.block_math import masked_load, masked_store, quantize_blocks
from ..core.format import BLOCK_SIZE, DATA_DTYPE, SCALE_DTYPE, ScaleMode
from ..layouts.scale_layout import blocked_3d_shape, blocked_byte, k_groups_images, k_groups_shape
from ..layouts.padding import locate, pick
from ..core.runtime import INTERPRET, InputError, check_int, check_power_of_two, default_launch, fit_interpreted

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
DIM1_COLS = ColsConfig(tile=(32, 64), num_warps=1, num_stages=1, group_cols=512)
ALONG_N_COLS = ColsConfig(tile=(128, 64), num_warps=1, num_stages=3, group_cols=2048)
# config=None under the interpreter (runtime.default_launch): 128-row tiles (within the K-groups limit) 512 columns wide.
INTERPRETER_COLS = ColsConfig(tile=(128, 512), num_warps=1, num_stages=1, group_cols=0)
DIM1_LAUNCH = default_launch(DIM1_COLS, INTERPRETER_COLS)
ALONG_N_LAUNCH = default_launch(ALONG_N_COLS, INTERPRETER_COLS)

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

def _quantize_cols(
    x: torch.Tensor, mode, config: ColsConfig, scales: str, offs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the cols kernel on a validated row-major batch x (B, R, C): q (B, C, R) e4m3 row-major and the
    scales (e8m0) by ``scales``: "row_major" (B, C, R/32); "col_major", each matrix of those column-major; "3d",
    each matrix's blocked image (``layouts.blocked_3d_shape(B, C, R/32)``); "k_groups" (B = 1), the K-groups
    buffer of the groups of rows that ``offs`` ends (``layouts.k_groups_shape(C, R/32, G)``)."""
    rceil = ScaleMode.parse(mode) is ScaleMode.RCEIL
    B, R, C = x.shape
    config = fit_interpreted(config, INTERPRETER_COLS, R, C)
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
