"""MXFP8 quantization kernels: bf16/fp32 -> (e4m3 data, e8m0 scales), bit-exact to ``format.quantize_reference``.

Two kernels cover the four quantizers of an MoE training step (the cols kernel in ``quantize_cols``):

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

from ..core.block_math import Producer, halves_lanes, masked_store, producer_args, quantize_blocks
from ..core.cost import Cost
from ..core.format import BLOCK_SIZE, DATA_DTYPE, SCALE_DTYPE, ScaleMode
from ..layouts.scale_layout import TILE_ROWS, blocked_3d_shape, blocked_byte, m_groups_rows, m_groups_shape, m_groups_tail
from .quantize_cols import (  # noqa: F401  (ColsConfig, its defaults and the cols kernel are quantize's API too)
    _BLOCK,
    _BLOCKED_3D,
    _M_GROUPS,
    _SCALE_KINDS,
    _STRIDED,
    ALONG_N_COLS,
    ALONG_N_LAUNCH,
    COLS_MAX_ROWS,
    DIM1_COLS,
    DIM1_LAUNCH,
    ColsConfig,
    _quantize_cols,
    _quantize_cols_kernel,
    _tile_post_init,
)
from ..core.runtime import (
    INTERPRET,
    MAX_GROUPS,
    InputError,
    default_launch,
    fit_interpreted,
    check_config,
    check_multiple,
    check_tensor,
)

IN_DTYPES = (torch.bfloat16, torch.float32)
_ROWS_BLOCK = tl.constexpr(TILE_ROWS)  # rows of a blocked buffer's scale block

# ---------------------------------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------------------------------


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


# The measured default (config=None), chosen by scripts/tune_quantize.py; see docs/perf-log.md. The cols kernel's
# (``DIM1_COLS``, ``ALONG_N_COLS``) are in ``quantize_cols``.
ROWS_CONFIG = RowsConfig(tile=(32, 512), num_warps=8)
# config=None under the interpreter (runtime.default_launch): 128-row tiles; the cols kernel's in quantize_cols.
INTERPRETER_ROWS = RowsConfig(tile=(128, 512), num_warps=8)
_ROWS_LAUNCH = default_launch(ROWS_CONFIG, INTERPRETER_ROWS)

# ---------------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------------

@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, offs_ptr, n_rows, n_cols, G, group_rows, s_cols, p_a, p_b, p_c, p_sa, p_sb,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, EVEN: tl.constexpr, RCEIL: tl.constexpr, EXACT: tl.constexpr,
    SCALES: tl.constexpr, BLOCK_G: tl.constexpr, PRODUCE: tl.constexpr, VARIANT: tl.constexpr, TAIL: tl.constexpr,
    HALVES: tl.constexpr, WALK: tl.constexpr,
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
    they are quantized as zeros and their q rows are not written, as the unfused quantizer's are not.

    HALVES (M-groups, whole rows: BLOCK_C / 2 >= n_cols / 2, each half a whole number of 32-blocks, and as many
    blocks as the buffer has scale columns): the tile holds a row of two halves as two halves of BLOCK_C / 2 lanes
    (lane j of the second at column n_cols / 2 + j), for a producer that computes both halves of a column at once
    (``swiglu.swiglu_backward_halves_producer``); every 32-lane block is still 32 consecutive columns. WALK (M-groups,
    whole rows: BLOCK_C covers every scale column's blocks): a program walks a whole 128-row block, BLOCK_R rows a
    step, looking its group up once."""
    pid = tl.program_id(0)
    if WALK:  # a program walks a whole 128-row block of the scales, BLOCK_R rows a step
        n_col_tiles = 1
        tile_row = pid.to(tl.int64) * _ROWS_BLOCK
    elif HALVES:
        n_col_tiles = 1
        tile_row = pid.to(tl.int64) * BLOCK_R
    elif SCALES == _STRIDED:
        n_col_tiles = tl.cdiv(n_cols, BLOCK_C)
        tile_row = (pid // n_col_tiles).to(tl.int64) * BLOCK_R
    else:
        n_col_tiles = tl.cdiv(s_cols * _BLOCK, BLOCK_C)
        tile_row = (pid // n_col_tiles).to(tl.int64) * BLOCK_R
    col_tile = pid % n_col_tiles
    # Where the tile's 128-row block takes its rows from: looked up once a program (with WALK, once for the block's
    # 128 / BLOCK_R steps: each lookup loads and reduces the G group ends).
    first, n_data, tail_first, n_tail = 0, 0, 0, 0
    if SCALES == _M_GROUPS:
        first, n_data = m_groups_rows(offs_ptr, G, n_rows, tile_row // _ROWS_BLOCK, BLOCK_G)
        if TAIL:
            tail_first, n_tail = m_groups_tail(offs_ptr, G, n_rows, tile_row // _ROWS_BLOCK, BLOCK_G)
    if WALK:
        for step in range(0, _ROWS_BLOCK, BLOCK_R):
            _rows_tile(x_ptr, q_ptr, s_ptr, n_rows, n_cols, group_rows, s_cols, p_a, p_b, p_c, p_sa, p_sb,
                       tile_row + step, col_tile, first, n_data, tail_first, n_tail, BLOCK_R, BLOCK_C, EVEN, RCEIL,
                       EXACT, SCALES, PRODUCE, VARIANT, TAIL, HALVES)  # fmt: skip
    else:
        _rows_tile(x_ptr, q_ptr, s_ptr, n_rows, n_cols, group_rows, s_cols, p_a, p_b, p_c, p_sa, p_sb, tile_row,
                   col_tile, first, n_data, tail_first, n_tail, BLOCK_R, BLOCK_C, EVEN, RCEIL, EXACT, SCALES, PRODUCE,
                   VARIANT, TAIL, HALVES)  # fmt: skip


@triton.jit
def _rows_tile(
    x_ptr, q_ptr, s_ptr, n_rows, n_cols, group_rows, s_cols, p_a, p_b, p_c, p_sa, p_sb, tile_row, col_tile, first,
    n_data, tail_first, n_tail, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, EVEN: tl.constexpr,
    RCEIL: tl.constexpr, EXACT: tl.constexpr, SCALES: tl.constexpr, PRODUCE: tl.constexpr, VARIANT: tl.constexpr,
    TAIL: tl.constexpr, HALVES: tl.constexpr,
):  # fmt: skip
    """One BLOCK_R x BLOCK_C tile of ``_quantize_rows_kernel``: rows from ``tile_row`` of the walk (M-groups: of the
    128-row block whose source rows ``first``, ``n_data`` and tail rows ``tail_first``, ``n_tail`` are given),
    column tile ``col_tile``."""
    r = tl.arange(0, BLOCK_R)
    if SCALES == _M_GROUPS:
        local = tile_row % _ROWS_BLOCK + r
        rows, valid = first + local, local < n_data
        made = valid
        if TAIL:
            rows = tl.where(n_tail > 0, tail_first + local, rows)
            made = valid | (local < n_tail)
    elif SCALES == _BLOCKED_3D:
        image = tl.cdiv(group_rows, _ROWS_BLOCK) * _ROWS_BLOCK
        local = tile_row % image + r
        rows, valid = (tile_row // image) * group_rows + local, local < group_rows
        made = valid
    else:
        rows = tile_row + r
        valid = rows < n_rows
        made = valid
    if HALVES:
        cols, col_ok = halves_lanes(BLOCK_C, n_cols)
    else:
        cols = col_tile * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < n_cols
    offs = rows[:, None] * n_cols + cols[None, :]
    mask = valid[:, None] & col_ok[None, :]

    x = PRODUCE(x_ptr + offs, rows, made, cols, col_ok, n_cols, p_a, p_b, p_c, p_sa, p_sb, VARIANT, EVEN, EXACT)
    if TAIL:
        x = tl.where(valid[:, None], x, 0.0)
    q, scale = quantize_blocks(tl.reshape(x, (BLOCK_R, BLOCK_C // _BLOCK, _BLOCK)), 2, RCEIL, EXACT)
    masked_store(q_ptr + offs, tl.reshape(q, (BLOCK_R, BLOCK_C)), mask, EVEN)

    if HALVES:  # the blocks of each half: those of the columns its lanes hold
        blocks, block_ok = halves_lanes(BLOCK_C // _BLOCK, n_cols // _BLOCK)
    else:
        blocks = col_tile * (BLOCK_C // _BLOCK) + tl.arange(0, BLOCK_C // _BLOCK)
        block_ok = blocks < s_cols
    if SCALES == _STRIDED:
        n_blocks = n_cols // _BLOCK
        s_mask = valid[:, None] & (blocks[None, :] < n_blocks)
        masked_store(s_ptr + rows[:, None] * n_blocks + blocks[None, :], scale, s_mask, EVEN)
    else:
        dest = blocked_byte((tile_row + r)[:, None], blocks[None, :], s_cols)
        masked_store(s_ptr + dest, scale, block_ok[None, :], EVEN)


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
    halves: bool = False,
    walk: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the rows kernel on a validated row-major (R, C) matrix: q (R, C) e4m3 and the scales (e8m0) by
    ``scales``: "row_major" (R, C/32); "m_groups", the blocked buffer of the groups of rows that ``offs`` ends
    (``layouts.m_groups_shape``); "3d", the blocked buffer of R / group_rows experts (``layouts.blocked_3d_shape``).
    ``producer`` (M-groups only): x is the bf16 output the producer writes, every row of it (``moe_fused``);
    ``halves``: its tile in the kernel's HALVES lane order, whole rows (``config``'s columns at least C); ``walk``
    (M-groups, whole rows): a program a 128-row block of the scales."""
    rceil = ScaleMode.parse(mode) is ScaleMode.RCEIL
    R, C = x.shape
    config = fit_interpreted(config, INTERPRETER_ROWS, R, C)
    (tr, tc), num_warps = config.tile, config.num_warps
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
    if halves:
        if scales != "m_groups" or tc < C or (C // 2) % BLOCK_SIZE or s_cols != Cb:
            raise InputError(f"the halves lane order takes M-groups scales of whole rows, each half of {C} columns "
                             f"a number of 32-blocks and {s_cols} scale columns its blocks; tile {config.tile}")  # fmt: skip
        width, even = tc, False
    if walk and (scales != "m_groups" or tc < width):
        raise InputError(f"a walking launch takes M-groups scales of whole rows ({width} columns); tile {config.tile}")
    # walk: a program a 128-row block (the kernel walks its rows); otherwise a program a tile.
    grid = (triton.cdiv(grid_rows, TILE_ROWS) if walk else triton.cdiv(grid_rows, tr) * triton.cdiv(width, tc),)
    args, produce = producer_args(producer, x)
    # A producer's arithmetic rounds every operation as its unfused kernel does: no FMA contraction.
    fusion = {"enable_fp_fusion": False} if producer else {}
    if grid[0] and R * C:
        _quantize_rows_kernel[grid](
            x, q.view(torch.uint8), s, offs if offs is not None else s, R, C, G, group_rows, s_cols, *args,
            BLOCK_R=tr, BLOCK_C=tc, EVEN=even, RCEIL=rceil, EXACT=INTERPRET, SCALES=kind,
            BLOCK_G=triton.next_power_of_2(G), TAIL=producer is not None, HALVES=halves, WALK=walk,
            num_warps=num_warps, **produce,
            **fusion,
        )  # fmt: skip
    elif s.numel():
        s.zero_()  # no data: every scale byte is padding
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
    return _quantize_rows(x, mode, config or _ROWS_LAUNCH)


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
    q, s = _quantize_cols(x.unsqueeze(0), mode, config or DIM1_LAUNCH, "col_major")
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
        q, s = _quantize_rows(w.view(G * N, K), mode, config or _ROWS_LAUNCH)
        return q.view(G, N, K), s.view(G, N, K // BLOCK_SIZE)
    return _quantize_cols(w, mode, config or ALONG_N_LAUNCH, "row_major")


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
