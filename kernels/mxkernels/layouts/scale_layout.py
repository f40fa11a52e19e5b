"""The blocked ("swizzled") scale layout that MX GEMMs consume, and the kernels that produce it per group.

A scale matrix S (R, C) -- R rows of the non-contracted dim, C = 32-blocks along the contraction dim -- is padded
with zeros to (ceil_128(R), ceil_4(C)) and cut into 128 x 4 tiles of 512 contiguous bytes each, ordered
row-block-major: tile t = (r // 128) * (C' / 4) + (c // 4). Inside a tile, element (r, c) sits at byte
(r % 32) * 16 + (r // 32) * 4 + c.

Per-group variants, each a Triton kernel with a plain-torch ``*_reference`` beside it (mxfp8.md section 2):
  * ``rearrange_m_groups``: token groups split the rows (forward A, dgrad grad_out); each group's rows get their own
    image, padded to 128 rows, images stacked in a buffer sized for any group sizes;
  * ``rearrange_k_groups``: token groups split the columns (wgrad); each group's columns get their own complete image,
    images back to back in one flat buffer;
  * ``rearrange_3d``: one image per expert of (G, R, C) weight scales.
Every byte of every output is written by the kernel, the zero padding and the unused tail included, and group
offsets are read on the device only, so each call can be captured in a CUDA graph. One program turns a 128-row x
``block_cols`` block of scales into its tiles: a coalesced load, a register/shared-memory permutation, and one
contiguous store. The launch is a ``RearrangeConfig`` (``config=None``: ``default_rearrange_config``).

The GEMM kernels read these buffers in place through ``blocked_word``: four 32-blocks of a row (one int32 word) per
128 contraction elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.cost import Cost, ceil_to
from ..core.format import BLOCK_SIZE, SCALE_DTYPE
from .padding import group_bounds, locate, pick
from ..core.runtime import (
    InputError,
    check_config,
    check_fields_power_of_two,
    check_group_offsets,
    check_power_of_two,
    check_tensor,
)

TILE_ROWS = 128
TILE_COLS = 4
# The same two numbers as seen from inside kernels (Triton reads only constexpr globals).
_ROWS = tl.constexpr(TILE_ROWS)
_COLS = tl.constexpr(TILE_COLS)
_MX_BLOCK = tl.constexpr(BLOCK_SIZE)
SCALE_DTYPES = (SCALE_DTYPE, torch.uint8)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Reference: scales (R, C) (e8m0 or uint8) -> (ceil_128(R), ceil_4(C)) same dtype, memory in blocked order."""
    R, C = scales.shape
    Rp, Cp = ceil_to(R, TILE_ROWS), ceil_to(C, TILE_COLS)
    padded = torch.zeros(Rp, Cp, dtype=torch.uint8, device=scales.device)
    padded[:R, :C] = scales.view(torch.uint8)
    # row r = rb*128 + rh*32 + rl, col c = cb*4 + cl  ->  tile (rb, cb), byte rl*16 + rh*4 + cl
    tiles = padded.view(Rp // 128, 4, 32, Cp // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(Rp, Cp).view(scales.dtype)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Reference inverse of ``to_blocked``: the first ``rows`` x ``cols`` scales of one blocked image."""
    Rp, Cp = ceil_to(rows, TILE_ROWS), ceil_to(cols, TILE_COLS)
    flat = blocked.reshape(-1)[: Rp * Cp].view(torch.uint8)
    tiles = flat.view(Rp // 128, Cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(Rp, Cp)[:rows, :cols].contiguous().view(blocked.dtype)


# ---- output shapes, shared by the kernels, the references and the costs ---------------------------------------


def m_groups_shape(M: int, C: int, G: int) -> tuple[int, int]:
    """(128 * (ceil(M/128) + G), ceil_4(C)): room for G groups' images whatever their sizes."""
    return TILE_ROWS * (-(-M // TILE_ROWS) + G), ceil_to(C, TILE_COLS)


def k_groups_shape(R: int, cols: int, G: int) -> tuple[int, int]:
    """(ceil_128(R), cols + 4*G) for scales (R, cols = M/32): room for G images of ceil_4(cols_g) columns each."""
    return ceil_to(R, TILE_ROWS), cols + TILE_COLS * G


def blocked_3d_shape(G: int, rows: int, cols: int) -> tuple[int, int, int]:
    """(G, ceil_128(rows), ceil_4(cols)) for (G, rows, cols) scales: one complete blocked image per expert."""
    return G, ceil_to(rows, TILE_ROWS), ceil_to(cols, TILE_COLS)


# ---- launch configuration -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RearrangeConfig:
    """One launch of a rearrange kernel (``rearrange_m_groups``, ``rearrange_k_groups``, ``rearrange_3d``)."""

    # Scale columns per program, a power of two >= 4 (one tile's width): a program turns 128 rows x block_cols
    # scales into block_cols / 4 tiles of 512 contiguous bytes. For row-major scales, whole rows make its load one
    # contiguous read as well as its store one contiguous write.
    block_cols: int
    # Warps per program: they share the register/shared-memory permutation of the block.
    num_warps: int = 4

    def __post_init__(self):
        check_power_of_two("RearrangeConfig.block_cols", self.block_cols, lo=TILE_COLS)
        check_fields_power_of_two(self, "num_warps")


# The measured default of each kernel (config=None): whole rows of scales per program, up to this many columns, with
# 4 warps. Chosen by scripts/tune_layouts.py; see docs/perf-log.md. K-groups: a group's columns do not start on a
# block boundary, so a program covers part of one group's image whatever its width.
_WHOLE_ROWS_UP_TO = {"m_groups": 256, "k_groups": 128, "3d": 64}


def default_rearrange_config(kernel: str, cols: int) -> RearrangeConfig:
    """The launch a rearrange of scales ``cols`` columns wide uses when none is given (``kernel``: "m_groups",
    "k_groups" or "3d")."""
    if kernel not in _WHOLE_ROWS_UP_TO:
        raise InputError(f"kernel must be one of {', '.join(_WHOLE_ROWS_UP_TO)}; got {kernel!r}")
    whole_rows = max(triton.next_power_of_2(cols), TILE_COLS)
    return RearrangeConfig(min(whole_rows, _WHOLE_ROWS_UP_TO[kernel]), num_warps=4)


# ---- kernels ------------------------------------------------------------------------------------------------


@triton.jit
def blocked_word(row, words_per_row):
    """Index of the int32 word holding scales (row, 0..3) inside one blocked image whose padded rows hold
    ``words_per_row`` words; scales (row, 4w..4w+3) are 128 words further per w.

    Tile (row // 128, c // 4) is 512 bytes = 128 words; (r, c) sits at byte (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4.
    """
    return (row // 128) * words_per_row * 128 + (row % 32) * 4 + (row // 32) % 4


@triton.jit
def blocked_byte(row, col, width):
    """Offset of scale (row, col) inside one blocked image of ``width`` padded columns (a multiple of 4)."""
    return 4 * blocked_word(row, width // _COLS) + (col // _COLS) * 512 + col % _COLS


@triton.jit
def m_groups_rows(offs_ptr, G, M, block, BLOCK_G: tl.constexpr):
    """Where row block ``block`` (128 rows) of an M-groups buffer takes its scales from: (the first source row, how
    many source rows from there hold data; <= 0 in a group's padding and past the last image)."""
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    g, local = locate(tl.cdiv(sizes, _ROWS), block, BLOCK_G)
    return pick(starts, g, BLOCK_G) + local * _ROWS, pick(sizes, g, BLOCK_G) - local * _ROWS


@triton.jit
def m_groups_tail(offs_ptr, G, M, block, BLOCK_G: tl.constexpr):
    """For row block ``block`` of an M-groups buffer past the last image (its tail, which has room for them): (the
    first of the rows past the last group end that the block carries, 128 blocks apart in order; how many from
    there are < M). How many is <= 0 for a block inside an image."""
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    past = block - tl.sum(tl.cdiv(sizes, _ROWS), 0)
    first = tl.max(starts + sizes, 0) + past * _ROWS
    return first, tl.where(past >= 0, M - first, 0)


@triton.jit
def k_groups_images(offs_ptr, G, cols, BLOCK_G: tl.constexpr):
    """The images of a K-groups buffer for scales of ``cols`` columns, as BLOCK_G (> G) lanes: (each group's first
    scale column, its scale columns, its image width ceil_4 of that). Lane G is the buffer's tail after the last
    image: no source columns, the width left of cols + 4G."""
    lane = tl.arange(0, BLOCK_G)
    starts, sizes = group_bounds(offs_ptr, G, cols * _MX_BLOCK, BLOCK_G)
    col0 = starts // _MX_BLOCK
    n_cols = (starts + sizes) // _MX_BLOCK - col0
    width = tl.cdiv(n_cols, _COLS) * _COLS
    tail = tl.maximum(cols + _COLS * G - tl.sum(width, 0), 0)
    return col0, n_cols, tl.where(lane == G, tail, width)


@triton.jit
def _blocked_block(src, stride_r, stride_c, n_rows, n_cols, dst, n_out, BLOCK_C: tl.constexpr):
    """Write the blocked image of a 128 x BLOCK_C block of scales -- its BLOCK_C/4 tiles of 512 bytes -- to
    dst[0 : n_out]. Source rows >= n_rows and columns >= n_cols read as zero: that is the padding."""
    r = tl.arange(0, _ROWS)
    c = tl.arange(0, BLOCK_C)
    mask = (r < n_rows)[:, None] & (c < n_cols)[None, :]
    block = tl.load(src + r.to(tl.int64)[:, None] * stride_r + c.to(tl.int64)[None, :] * stride_c, mask=mask, other=0)
    # row r = rh*32 + rl, column c = cb*4 + cl  ->  byte cb*512 + rl*16 + rh*4 + cl
    tiles = tl.permute(tl.reshape(block, (4, 32, BLOCK_C // 4, 4)), (2, 1, 0, 3))
    f = tl.arange(0, _ROWS * BLOCK_C)
    tl.store(dst + f, tl.reshape(tiles, (_ROWS * BLOCK_C,)), mask=f < n_out)


@triton.jit
def _m_groups_kernel(
    s_ptr, offs_ptr, out_ptr, M, C, G, stride_r, stride_c, out_cols, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr
):
    # One program: 128 output rows (one row of tiles) x BLOCK_C columns. Output row block ob lies in group g's
    # image, or past the last image, where the group picked is empty and the block comes out zero.
    ob = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK_C
    row, n_rows = m_groups_rows(offs_ptr, G, M, ob, BLOCK_G)
    src = s_ptr + row.to(tl.int64) * stride_r + c0.to(tl.int64) * stride_c
    dst = out_ptr + ob.to(tl.int64) * _ROWS * out_cols + c0 * _ROWS
    _blocked_block(src, stride_r, stride_c, n_rows, C - c0, dst, (out_cols - c0) * _ROWS, BLOCK_C)


@triton.jit
def _k_groups_kernel(
    s_ptr, offs_ptr, out_ptr, R, cols, G, stride_r, stride_c, out_rows, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr
):
    # One program: 128 rows x BLOCK_C columns of one group's image. The buffer's tail after the last image is one
    # more slot (lane G) with no source columns, so the same code zero-fills it.
    rb = tl.program_id(0)
    chunk = tl.program_id(1)
    col0, n_cols, width = k_groups_images(offs_ptr, G, cols, BLOCK_G)
    g, k = locate(tl.cdiv(width, BLOCK_C), chunk, BLOCK_G)
    w = pick(width, g, BLOCK_G)
    c = k * BLOCK_C
    image = pick(tl.cumsum(width, 0) - width, g, BLOCK_G)
    dst = image.to(tl.int64) * out_rows + rb.to(tl.int64) * _ROWS * w + c * _ROWS
    # Malformed offs could ask for more images than fit: never write past the buffer.
    n_out = tl.minimum((w - c) * _ROWS, out_rows.to(tl.int64) * (cols + _COLS * G) - dst)
    src = s_ptr + (rb * _ROWS).to(tl.int64) * stride_r + (pick(col0, g, BLOCK_G) + c).to(tl.int64) * stride_c
    n_src = pick(n_cols, g, BLOCK_G) - c
    _blocked_block(src, stride_r, stride_c, R - rb * _ROWS, n_src, out_ptr + dst, n_out, BLOCK_C)


@triton.jit
def _3d_kernel(s_ptr, out_ptr, R, C, row_blocks, out_cols, stride_g, stride_r, stride_c, BLOCK_C: tl.constexpr):
    # One program: 128 rows x BLOCK_C columns of one expert; program row p = expert * row_blocks + row block is also
    # the index of its row of tiles in the (G * ceil_128(R), ceil_4(C)) output.
    p = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK_C
    expert = (p // row_blocks).to(tl.int64)
    rb = p % row_blocks
    src = s_ptr + expert * stride_g + (rb * _ROWS).to(tl.int64) * stride_r + c0.to(tl.int64) * stride_c
    dst = out_ptr + p.to(tl.int64) * _ROWS * out_cols + c0 * _ROWS
    _blocked_block(src, stride_r, stride_c, R - rb * _ROWS, C - c0, dst, (out_cols - c0) * _ROWS, BLOCK_C)


# ---- wrappers -----------------------------------------------------------------------------------------------


def _check_scales(scales: object, ndim: int) -> torch.Tensor:
    return check_tensor("scales", scales, dtypes=SCALE_DTYPES, ndim=ndim, contiguous=False)


def _launch(kernel: str, cols: int, config: object) -> RearrangeConfig:
    check_config("config", config, RearrangeConfig)
    return default_rearrange_config(kernel, cols) if config is None else config


def rearrange_m_groups(
    scales: torch.Tensor, offs: torch.Tensor, *, config: RearrangeConfig | None = None
) -> torch.Tensor:
    """Blocked scales of a 2D operand whose token groups split the rows (forward A, dgrad grad_out).

    scales: (M, C) e8m0 or uint8, any strides; offs: int32 (G,) group end rows, any sizes, read on the device only.
    Returns (128 * (ceil(M/128) + G), ceil_4(C)), scales' dtype, row-major: group g's blocked image
    (ceil_128(size_g) rows x ceil_4(C)) starts at row sum_{j<g} ceil_128(size_j); every other byte is zero.
    Rows past offs[-1] belong to no group and are dropped. ``config``: the launch (None: whole rows of up to 256
    columns per program, ``default_rearrange_config("m_groups", C)``).
    """
    scales = _check_scales(scales, 2)
    M, C = scales.shape
    offs = check_group_offsets(offs, scales, M)
    config = _launch("m_groups", C, config)
    G = offs.numel()
    out = torch.empty(m_groups_shape(M, C, G), dtype=torch.uint8, device=scales.device)
    if out.numel():
        grid = (out.shape[0] // TILE_ROWS, triton.cdiv(out.shape[1], config.block_cols))
        _m_groups_kernel[grid](
            scales.view(torch.uint8), offs, out, M, C, G, *scales.stride(), out.shape[1],
            BLOCK_C=config.block_cols, BLOCK_G=triton.next_power_of_2(G), num_warps=config.num_warps,
        )  # fmt: skip
    return out.view(scales.dtype)


def rearrange_k_groups(
    scales: torch.Tensor, offs: torch.Tensor, *, config: RearrangeConfig | None = None
) -> torch.Tensor:
    """Blocked scales of a 2D operand whose token groups split the contraction dim (wgrad's grad_out_t and A_t).

    scales: (R, M/32) e8m0 or uint8, row-major or column-major (stride (1, R), as a dim1 quantizer may produce) or
    any strides; offs: int32 (G,) group end *tokens* (rows of the original M), so group g owns scale columns
    [offs[g-1]/32, offs[g]/32). Every group size must be a multiple of 32; that is checked only where offs can be
    read without a sync (CPU tensors): CUDA offs are not read on the host, and a size that is not a multiple of 32
    has its column bounds rounded down. Returns a (ceil_128(R), M/32 + 4*G) buffer, scales' dtype, whose bytes hold
    from byte 0 each group's complete blocked image (ceil_128(R) x ceil_4(size_g/32)) back to back in group
    order; every other byte is zero. ``config``: the launch (None: whole rows of up to 128 columns per program,
    ``default_rearrange_config("k_groups", M/32)``); a program covers part of one group's image.
    """
    scales = _check_scales(scales, 2)
    R, cols = scales.shape
    offs = check_group_offsets(offs, scales, cols * BLOCK_SIZE, BLOCK_SIZE)
    config = _launch("k_groups", cols, config)
    G = offs.numel()
    out = torch.empty(k_groups_shape(R, cols, G), dtype=torch.uint8, device=scales.device)
    if out.numel():
        # Images plus the tail slot: at most ceil((cols + 4G) / block_cols) + G chunks of block_cols columns.
        grid = (out.shape[0] // TILE_ROWS, triton.cdiv(out.shape[1], config.block_cols) + G)
        _k_groups_kernel[grid](
            scales.view(torch.uint8), offs, out, R, cols, G, *scales.stride(), out.shape[0],
            BLOCK_C=config.block_cols, BLOCK_G=triton.next_power_of_2(G + 1), num_warps=config.num_warps,
        )  # fmt: skip
    return out.view(scales.dtype)


def rearrange_3d(scales: torch.Tensor, *, config: RearrangeConfig | None = None) -> torch.Tensor:
    """Blocked scales of 3D expert weights: scales (G, R, C) e8m0 or uint8, any strides -> ``blocked_3d_shape(G, R,
    C)`` = (G, ceil_128(R), ceil_4(C)), scales' dtype, contiguous, each expert's blocked image. ``config``: the
    launch (None: whole rows of up to 64 columns per program, ``default_rearrange_config("3d", C)``)."""
    scales = _check_scales(scales, 3)
    G, R, C = scales.shape
    config = _launch("3d", C, config)
    out = torch.empty(blocked_3d_shape(G, R, C), dtype=torch.uint8, device=scales.device)
    if out.numel():
        row_blocks = out.shape[1] // TILE_ROWS
        grid = (G * row_blocks, triton.cdiv(out.shape[2], config.block_cols))
        _3d_kernel[grid](
            scales.view(torch.uint8), out, R, C, row_blocks, out.shape[2], *scales.stride(),
            BLOCK_C=config.block_cols, num_warps=config.num_warps,
        )  # fmt: skip
    return out.view(scales.dtype)


# ---- references ---------------------------------------------------------------------------------------------


def rearrange_m_groups_reference(scales: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Plain-torch ``rearrange_m_groups`` (reads offs on the host)."""
    ends = offs.tolist()
    out = torch.zeros(m_groups_shape(*scales.shape, len(ends)), dtype=torch.uint8, device=scales.device)
    row, start = 0, 0
    for end in ends:
        image = to_blocked(scales[start:end]).view(torch.uint8)
        out[row : row + image.shape[0]] = image
        row, start = row + image.shape[0], end
    return out.view(scales.dtype)


def rearrange_k_groups_reference(scales: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Plain-torch ``rearrange_k_groups`` (reads offs on the host)."""
    ends = offs.tolist()
    out = torch.zeros(k_groups_shape(*scales.shape, len(ends)), dtype=torch.uint8, device=scales.device)
    flat = out.view(-1)
    pos, start = 0, 0
    for end in ends:
        image = to_blocked(scales[:, start // BLOCK_SIZE : end // BLOCK_SIZE]).view(torch.uint8).reshape(-1)
        flat[pos : pos + image.numel()] = image
        pos, start = pos + image.numel(), end
    return out.view(scales.dtype)


def rearrange_3d_reference(scales: torch.Tensor) -> torch.Tensor:
    """Plain-torch ``rearrange_3d``."""
    return torch.stack([to_blocked(expert) for expert in scales])


# ---- costs --------------------------------------------------------------------------------------------------


def rearrange_m_groups_cost(M: int, C: int, G: int) -> Cost:
    """``rearrange_m_groups`` of (M, C) scales in G groups: read M*C bytes, write the whole output buffer."""
    rows, cols = m_groups_shape(M, C, G)
    return Cost(M * C, rows * cols)


def rearrange_k_groups_cost(R: int, M: int, G: int) -> Cost:
    """``rearrange_k_groups`` of (R, M/32) scales, M tokens in G groups: read R*M/32 bytes, write the whole buffer."""
    if M % BLOCK_SIZE:
        raise InputError(f"M must be a multiple of {BLOCK_SIZE}, got {M}")
    rows, cols = k_groups_shape(R, M // BLOCK_SIZE, G)
    return Cost(R * (M // BLOCK_SIZE), rows * cols)


def rearrange_3d_cost(G: int, R: int, C: int) -> Cost:
    """``rearrange_3d`` of (G, R, C) scales: read G*R*C bytes, write the whole ``blocked_3d_shape(G, R, C)``."""
    return Cost(G * R * C, math.prod(blocked_3d_shape(G, R, C)))
