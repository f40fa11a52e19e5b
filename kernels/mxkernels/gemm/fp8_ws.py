"""FP8 rowwise grouped GEMMs for SM90 with torch's sums at the tensor core's pace: Gluon, warp-specialized.

Why a second kernel beside ``gemm_fp8_rowwise``: Hopper's fp8 wgmma sums into an accumulator that keeps fewer
mantissa bits than fp32, so a precise kernel (torch's, and ``gemm_fp8_rowwise`` with ``promote``) lets the tensor
core sum one 128-wide step into a fresh partial and adds that partial into an fp32 accumulator on the CUDA cores.
Inside one warpgroup the add has to wait for its wgmma, and the next wgmma for the add (ptxas serializes anything
else: warnings C7514/C7517), so a single-warpgroup schedule leaves the tensor core idle during every add. Here two
consumer warpgroups share each operand stage, each owning half of the tile's rows: while one adds its partial, the
other's wgmma runs, and the tensor core is never left waiting on the CUDA cores (CUTLASS's and DeepGEMM's answer).

Partitions (``gl.warp_specialize``), each walking the same persistent tile sequence:
* a producer warp issues the TMA loads of each step into a ring of STAGES slots, waiting on the slot's "empty"
  barrier (both consumers arrived: count 2) and arming its "ready" barrier with the bytes it expects;
* two consumer warpgroups (the default partition and one worker), rows [0, BLOCK_M / 2) and [BLOCK_M / 2, BLOCK_M)
  of the tile: per step wait "ready", one wgmma group into the partial (two, of 128 columns each, for 256-column
  tiles), wait for it, release the slot, add the partial into the fp32 sum; then the epilogue (both row scales;
  whole blocks through a staging buffer and TMA stores, blocks that end a group through masked stores).

The sums are torch's term for term (one partial per 128-wide step, added in order), so the outputs equal
``gemm_fp8_rowwise``'s precise configs' and torch's bit for bit.

Contract: ``gemm_fp8_rowwise``'s (``grouped_gemm.fp8_rowwise_scaled_grouped_mm`` checks the operands). 2D x 3D:
a_q (M, K), a_scale (M,), b_q (G, N, K), b_scale (G, N) -> (M, N), rows past offs[-1] unwritten. 2D x 2D (wgrad):
a_q (N, M), a_scale (G, N), b_q (K, M), b_scale (G, K) -> (G, N, K), empty groups zero; at a group's edges the
producer zeroes the neighbouring groups' columns of a box before its step is ready. The contraction a multiple of 16
(TMA row strides). SM90 only: Gluon has no interpreter, so the CPU tests cross-compile this file and run
``gemm_fp8_rowwise`` (the same sums) under the interpreter.
"""

# No ``from __future__ import annotations``: Triton's aggregates check their fields against the annotations' types.
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate

from .backend import FIRST, Arch, Backend, GemmCase, late
from .ws_config import WsConfig, default_config
from ..core.names import Recipe
from ..core.runtime import InputError, persistent_programs

# Gluon is experimental and renames as it goes: triton 3.6 (the GPU image) has async_copy_global_to_shared, later
# versions (this repo's CI, which cross-compiles the kernels) async_load.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@aggregate
class _Ring:
    """The operand ring: STAGES slots of A (BLOCK_M x BLOCK_K) and B (BLOCK_N x BLOCK_K), a "ready" barrier per slot
    (its operands are in place) and an "empty" one (both consumers' wgmma on it retired); and "landed", the one
    barrier of the producer's own TMA loads that it edits before they are ready (2D x 2D group boundaries); the
    output's descriptor and each consumer's staging buffer for its TMA stores (``_epilogue``)."""

    a_desc: tma.tensor_descriptor
    b_desc: tma.tensor_descriptor
    a_s: gl.shared_memory_descriptor
    b_s: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    landed: gl.shared_memory_descriptor
    out_desc: tma.tensor_descriptor
    out_s: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, a_desc, b_desc, a_s, b_s, ready, empty, landed, out_desc, out_s):
        self.a_desc, self.b_desc, self.a_s, self.b_s = a_desc, b_desc, a_s, b_s
        self.ready, self.empty, self.landed = ready, empty, landed
        self.out_desc, self.out_s = out_desc, out_s


@aggregate
class _Walk:
    """What every partition needs to walk the same tiles: the groups and the persistent grid."""

    offs_ptr: gl.tensor
    M: gl.tensor
    N: gl.tensor
    K: gl.tensor
    G: gl.tensor
    PROGRAMS: gl.tensor
    GROUP_M: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, offs_ptr, M, N, K, G, PROGRAMS, GROUP_M):
        self.offs_ptr, self.M, self.N, self.K, self.G, self.PROGRAMS = offs_ptr, M, N, K, G, PROGRAMS
        self.GROUP_M = gl.constexpr(GROUP_M)


@gluon.jit
def _band(tile, m_tiles, n_tiles, GROUP_M: gl.constexpr):
    """(row tile, column tile) of a group's ``tile``-th tile in bands of GROUP_M row tiles, column by column inside
    a band (``gemm_fused._band_tile``'s order): the SMs running at once share a few A and B panels in L2."""
    band = tile // (GROUP_M * n_tiles)
    band_rows = gl.minimum(m_tiles - band * GROUP_M, GROUP_M)
    in_band = tile % (GROUP_M * n_tiles)
    return band * GROUP_M + in_band % band_rows, in_band // band_rows


@gluon.jit
def _group(w: _Walk, g):
    """(start, size) of group g along the grouped dim (M), its end clamped to [its start, M] so that malformed offs
    (never checked on the device: that would need a host read) never address outside the operands."""
    start = gl.minimum(gl.maximum(gl.load(w.offs_ptr + g - 1, mask=g > 0, other=0), 0), w.M)
    end = gl.minimum(gl.maximum(gl.load(w.offs_ptr + g), start), w.M)
    return start, end - start


@gluon.jit
def _tiles_2d3d(w: _Walk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    total = 0
    for g in range(w.G):
        total += (_group(w, g)[1] + BLOCK_M - 1) // BLOCK_M
    return total * ((w.N + BLOCK_N - 1) // BLOCK_N)


@gluon.jit
def _tiles_2d2d(w: _Walk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    return w.G * ((w.N + BLOCK_M - 1) // BLOCK_M) * ((w.K + BLOCK_N - 1) // BLOCK_N)


@gluon.jit
def _tiles(w: _Walk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WGRAD: gl.constexpr):
    if WGRAD:
        return _tiles_2d2d(w, BLOCK_M, BLOCK_N)
    return _tiles_2d3d(w, BLOCK_M, BLOCK_N)


@gluon.jit
def _locate_2d3d(w: _Walk, t, g, before, start, size, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """2D x 3D tile ``t`` (tiles numbered group after group), found from the cursor the previous tile left (group
    g, the tiles before it, its rows [start, start + size); (0, 0, group 0's) at first): a program walks its tiles in
    increasing order, so a tile's group is never before its previous tile's, and the walk goes on from there. Over a
    program's tiles that visits each group once, where a walk from group 0 for every tile cost G groups' loads a tile
    (at G = 128 more than a short contraction's main loop: docs/perf-log.md, 2026-11-29). Returns the cursor at the
    tile's group, then the tile's first row, the group's rows from there on and the tile's first column."""
    n_tiles = (w.N + BLOCK_N - 1) // BLOCK_N
    tiles = (size + BLOCK_M - 1) // BLOCK_M * n_tiles
    while (t >= before + tiles) & (g < w.G - 1):  # t < every group's tiles: it stops at the tile's group
        before += tiles
        g += 1
        start, size = _group(w, g)
        tiles = (size + BLOCK_M - 1) // BLOCK_M * n_tiles
    m_tile, n_tile = _band(t - before, (size + BLOCK_M - 1) // BLOCK_M, n_tiles, w.GROUP_M)
    return g, before, start, size, start + m_tile * BLOCK_M, size - m_tile * BLOCK_M, n_tile * BLOCK_N


@gluon.jit
def _locate_2d2d(w: _Walk, t, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """2D x 2D tile ``t`` (every group has the same m_tiles x n_tiles tiles of its (N, K) output, numbered group after
    group): (group, its first column of the contraction, its size, the tile's first X row, first Y row)."""
    m_tiles = (w.N + BLOCK_M - 1) // BLOCK_M
    n_tiles = (w.K + BLOCK_N - 1) // BLOCK_N
    g = t // (m_tiles * n_tiles)
    m_tile, n_tile = _band(t % (m_tiles * n_tiles), m_tiles, n_tiles, w.GROUP_M)
    start, size = _group(w, g)
    return g, start, size, m_tile * BLOCK_M, n_tile * BLOCK_N


@gluon.jit
def _steps_2d2d(start, size, BLOCK_K: gl.constexpr):
    """(first column, steps) of a 2D x 2D group's contraction: a TMA box's innermost coordinate must be a multiple of
    16 bytes, so the steps start at the 16-column boundary at or before the group's first column."""
    first = start - start % 16
    return first, gl.where(size > 0, (start + size - first + BLOCK_K - 1) // BLOCK_K, 0)


@gluon.jit
def _acquire(ring: _Ring, step):
    """Wait until ``step``'s slot is free (both consumers released it); returns the slot. A slot starts free: waiting
    for the phase before a barrier's first passes at once."""
    STAGES: gl.constexpr = ring.a_s.type.shape[0]
    slot = step % STAGES
    mbarrier.wait(ring.empty.index(slot), (step // STAGES & 1) ^ 1)
    return slot


@gluon.jit
def _load(ring: _Ring, slot, a_row, b_row, col):
    """TMA: rows [a_row, +BLOCK_M) of A and [b_row, +BLOCK_N) of B, columns [col, +BLOCK_K), into ``slot``."""
    bar = ring.ready.index(slot)
    mbarrier.expect(bar, ring.a_desc.block_type.nbytes + ring.b_desc.block_type.nbytes)
    _tma_load(ring.a_desc, [a_row, col], bar, ring.a_s.index(slot))
    _tma_load(ring.b_desc, [b_row, col], bar, ring.b_s.index(slot))


@gluon.jit
def _keep_cols(tile, lo, hi):
    """Zero columns outside [lo, hi) of a shared-memory tile (R x BLOCK_K e4m3), 8 rows at a time (a warp's
    registers)."""
    R: gl.constexpr = tile.type.shape[0]
    BLOCK_K: gl.constexpr = tile.type.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [1, 1], [1, 0])
    k = gl.expand_dims(gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, layout)), 0)
    keep = (k >= lo) & (k < hi)
    for i in gl.static_range(R // 8):
        rows = tile.slice(i * 8, 8)
        rows.store(gl.where(keep, rows.load(layout), 0.0).to(tile.dtype))


@gluon.jit
def _load_edge(ring: _Ring, slot, a_row, b_row, col, lo, hi, landed):
    """A 2D x 2D step at a group's edge: TMA loads the box, then the producer zeros its columns outside [lo, hi) (the
    neighbouring groups': their products must not reach this group, whatever they hold) before it is ready. The
    stores are ordered before the consumers' wgmma (the async proxy) by the fence; the arrival stands in for the TMA
    byte count."""
    mbarrier.expect(ring.landed, ring.a_desc.block_type.nbytes + ring.b_desc.block_type.nbytes)
    _tma_load(ring.a_desc, [a_row, col], ring.landed, ring.a_s.index(slot))
    _tma_load(ring.b_desc, [b_row, col], ring.landed, ring.b_s.index(slot))
    mbarrier.wait(ring.landed, landed & 1)
    _keep_cols(ring.a_s.index(slot), lo, hi)
    _keep_cols(ring.b_s.index(slot), lo, hi)
    fence_async_shared()
    mbarrier.arrive(ring.ready.index(slot), count=1)
    return landed + 1


@gluon.jit
def _producer(ring: _Ring, w: _Walk, WGRAD: gl.constexpr):
    """Every step of every tile into the ring: TMA, and at a 2D x 2D group's edges ``_load_edge``."""
    BLOCK_M: gl.constexpr = ring.a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = ring.a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = ring.b_desc.block_type.shape[0]
    step = 0
    landed = 0
    at_g, before = 0, 0  # the 2D x 3D walk's cursor (``_locate_2d3d``)
    at_start, at_size = _group(w, 0)
    for t in range(gl.program_id(0), _tiles(w, BLOCK_M, BLOCK_N, WGRAD), w.PROGRAMS):
        if WGRAD:
            _, start, size, m0, n0 = _locate_2d2d(w, t, BLOCK_M, BLOCK_N)
            first, steps = _steps_2d2d(start, size, BLOCK_K)
            for k in range(steps):
                slot = _acquire(ring, step)
                col = first + k * BLOCK_K
                lo = start - col  # the group's columns in this box: [lo, hi)
                hi = start + size - col
                if (lo > 0) | (hi < BLOCK_K):
                    landed = _load_edge(ring, slot, m0, n0, col, lo, hi, landed)
                else:
                    _load(ring, slot, m0, n0, col)
                step += 1
        else:
            at_g, before, at_start, at_size, row0, _, n0 = _locate_2d3d(w, t, at_g, before, at_start, at_size,
                                                                         BLOCK_M, BLOCK_N)  # fmt: skip
            for k in range((w.K + BLOCK_K - 1) // BLOCK_K):
                _load(ring, _acquire(ring, step), row0, at_g * w.N + n0, k * BLOCK_K)
                step += 1


@gluon.jit
def _partial(a, b, part):
    """a @ b into a fresh partial (use_acc=False: the registers' old values are not read), retired before anything
    reads it: the other warpgroup's wgmma keeps the tensor core busy meanwhile."""
    part = warpgroup_mma(a, b, part, use_acc=False, is_async=True)
    part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a, b))
    return part


@gluon.jit
def _contract(ring: _Ring, step, k_steps, part, HALF: gl.constexpr):
    """The fp32 sums over ``k_steps`` ring steps from ``step`` of this warpgroup's rows of the tile, one partial a step
    and column block: (the first SUB columns' sum, the next SUB's (if BLOCK_N = 2 SUB), the next step, the partial's
    registers). A 256-column tile is summed as two 128-column partials in turn, so that the partial and both sums fit
    a thread's registers (64 + 2 x 64)."""
    STAGES: gl.constexpr = ring.a_s.type.shape[0]
    ROWS: gl.constexpr = part.type.shape[0]
    SUB: gl.constexpr = part.type.shape[1]
    HALVES: gl.constexpr = ring.b_s.type.shape[1] // SUB
    acc = gl.zeros_like(part)
    acc_hi = gl.zeros_like(part)
    for k in range(k_steps):
        slot = step % STAGES
        mbarrier.wait(ring.ready.index(slot), step // STAGES & 1)
        a = ring.a_s.index(slot).slice(HALF * ROWS, ROWS)
        part = _partial(a, ring.b_s.index(slot).slice(0, SUB).permute((1, 0)), part)
        if HALVES == 1:
            mbarrier.arrive(ring.empty.index(slot), count=1)
        acc += part
        if HALVES == 2:
            part = _partial(a, ring.b_s.index(slot).slice(SUB, SUB).permute((1, 0)), part)
            mbarrier.arrive(ring.empty.index(slot), count=1)
            acc_hi += part
        step += 1
    return acc, acc_hi, step, part


@gluon.jit
def _store_masked(value, out_ptr, rows, cols, row_ok, col_ok, ROW_STRIDE):
    at = out_ptr + gl.expand_dims(rows.to(gl.int64) * ROW_STRIDE, 1) + gl.expand_dims(cols, 0)
    gl.store(at, value, mask=gl.expand_dims(row_ok, 1) & gl.expand_dims(col_ok, 0))


@gluon.jit
def _epilogue(ring: _Ring, acc, sa, sb, nonempty, out_ptr, rows, cols, row_ok, col_ok, ROW_STRIDE, whole, desc_row,
              desc_col, stores, HALF: gl.constexpr):  # fmt: skip
    """out[rows, cols] = acc * sa[:, None] * sb[None, :] (zeros where ``nonempty`` is false: ``where``, not a multiply
    by zero, which an inf scale would turn into NaN). Returns the count of this warpgroup's TMA stores.

    With TMA stores (staging buffers in the ring, ``PER`` a warpgroup) and ``whole`` (every row of the block belongs
    to the tile's group), TMA writes the block at (desc_row, desc_col) of the output's descriptor, clipping columns
    past the output's; otherwise masked stores from registers (rows past the group's end are the next group's). The
    warpgroup's stores take its buffers in turn, so a store waits only for the one PER stores back (the same buffer)
    to have read it: with two, a 256-column tile's second half no longer waits for its first half's store."""
    value = gl.where(nonempty, acc * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0), 0.0).to(out_ptr.dtype.element_ty)
    if ring.out_s.type.shape[1] == acc.type.shape[0]:
        if whole:
            PER: gl.constexpr = ring.out_s.type.shape[0] // 2
            if PER == 1:  # one buffer: no count kept, the launch the 8-expert shapes were measured with
                buf = ring.out_s.index(HALF)
            else:
                buf = ring.out_s.index(HALF * PER + stores % PER)
                stores += 1
            tma.store_wait(PER - 1)  # the buffer's previous store has read it (bulk groups complete in order)
            buf.store(value)
            fence_async_shared()
            _tma_store(ring.out_desc, [desc_row, desc_col], buf)
        else:
            _store_masked(value, out_ptr, rows, cols, row_ok, col_ok, ROW_STRIDE)
    else:
        _store_masked(value, out_ptr, rows, cols, row_ok, col_ok, ROW_STRIDE)
    return stores


@gluon.constexpr_function
def _mma_layout(sub):
    """One warpgroup's wgmma accumulator: BLOCK_M / 2 rows x ``sub`` columns in m64 x sub x k32 instructions."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, sub, 32])


# The scales' layout while the main loop runs: one warpgroup's 128 threads along the tile's rows or columns.
_SCALES = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))


@gluon.jit
def _consumer(ring: _Ring, w: _Walk, sa_ptr, sb_ptr, out_ptr, HALF: gl.constexpr, WGRAD: gl.constexpr,
              EARLY_SCALES: gl.constexpr):  # fmt: skip
    """Rows [HALF * BLOCK_M / 2, +BLOCK_M / 2) of every tile, in one warpgroup: A's rows (2D x 3D) or X's (WGRAD)."""
    BLOCK_M: gl.constexpr = ring.a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = ring.a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = ring.b_desc.block_type.shape[0]
    ROWS: gl.constexpr = BLOCK_M // 2
    SUB: gl.constexpr = min(BLOCK_N, 128)
    mma: gl.constexpr = _mma_layout(SUB)
    r = HALF * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
    c = gl.arange(0, SUB, layout=gl.SliceLayout(0, mma))
    cb = gl.arange(0, SUB, layout=_SCALES)
    step = 0
    stores = 0
    part = gl.zeros([ROWS, SUB], gl.float32, mma)
    at_g, before = 0, 0  # the 2D x 3D walk's cursor (``_locate_2d3d``)
    at_start, at_size = _group(w, 0)
    for t in range(gl.program_id(0), _tiles(w, BLOCK_M, BLOCK_N, WGRAD), w.PROGRAMS):
        # Per case: the tile's first row in its output block (row0, rows_left of that block from there), its first
        # column, the output's columns, where the tile's output block and scales start, its row in the descriptor.
        if WGRAD:  # out[g] (N, K), seen as rows [g * N, (g + 1) * N) of (G * N, K) by the descriptor
            g, start, size, row0, n0 = _locate_2d2d(w, t, BLOCK_M, BLOCK_N)
            k_steps = _steps_2d2d(start, size, BLOCK_K)[1]
            rows_left = w.N - row0
            cols_total = w.K
            out_block = out_ptr + g.to(gl.int64) * w.N * w.K
            sa_base = sa_ptr + g * w.N
            sb_base = sb_ptr + g * w.K
            desc_row = g * w.N + row0
            nonempty = size > 0
        else:  # out (M, N): rows past the group's end are the next group's
            at_g, before, at_start, at_size, row0, rows_left, n0 = _locate_2d3d(w, t, at_g, before, at_start, at_size,
                                                                                BLOCK_M, BLOCK_N)  # fmt: skip
            g = at_g
            k_steps = (w.K + BLOCK_K - 1) // BLOCK_K
            cols_total = w.N
            out_block = out_ptr
            sa_base = sa_ptr
            sb_base = sb_ptr + g * w.N
            desc_row = row0
            nonempty = True
        if EARLY_SCALES:
            # The scales loaded before the main loop, a few registers a thread in a blocked layout (the
            # accumulator's would take 32 a column block), so that their latency hides behind it.
            rb = HALF * ROWS + gl.arange(0, ROWS, layout=_SCALES)
            sa_early = gl.load(sa_base + row0 + rb, mask=rb < rows_left, other=0.0)
            sb_lo = gl.load(sb_base + n0 + cb, mask=n0 + cb < cols_total, other=0.0)
            if BLOCK_N // SUB == 2:
                sb_hi = gl.load(sb_base + n0 + SUB + cb, mask=n0 + SUB + cb < cols_total, other=0.0)
            else:
                sb_hi = sb_lo
        acc, acc_hi, step, part = _contract(ring, step, k_steps, part, HALF)
        row_ok = r < rows_left
        if EARLY_SCALES:
            sa = gl.convert_layout(sa_early, gl.SliceLayout(1, mma))
        else:
            sa = gl.load(sa_base + row0 + r, mask=row_ok, other=0.0)
        whole = rows_left >= (HALF + 1) * ROWS
        for h in gl.static_range(BLOCK_N // SUB):
            cols = n0 + h * SUB + c
            col_ok = cols < cols_total
            if EARLY_SCALES:
                sb = gl.convert_layout(sb_lo if h == 0 else sb_hi, gl.SliceLayout(0, mma))
            else:
                sb = gl.load(sb_base + cols, mask=col_ok, other=0.0)
            stores = _epilogue(ring, acc if h == 0 else acc_hi, sa, sb, nonempty, out_block, row0 + r, cols, row_ok,
                               col_ok, cols_total, whole, desc_row + HALF * ROWS, n0 + h * SUB, stores, HALF)  # fmt: skip


@gluon.jit
def _ring(a_desc, b_desc, out_desc, STAGES: gl.constexpr, TMA_STORE: gl.constexpr, STAGING: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_s = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    landed = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    mbarrier.init(landed, count=1)
    if TMA_STORE:  # STAGING buffers per consumer warpgroup, of its block's shape
        out_s = gl.allocate_shared_memory(out_desc.dtype, [2 * STAGING] + out_desc.block_type.shape, out_desc.layout)
    else:  # none (a stand-in no block matches)
        out_s = gl.allocate_shared_memory(out_desc.dtype, [2, 1, out_desc.block_type.shape[1]], out_desc.layout)
    return _Ring(a_desc, b_desc, a_s, b_s, ready, empty, landed, out_desc, out_s)


@gluon.jit
def _fp8_ws(
    a_desc, b_desc, out_desc, sa_ptr, sb_ptr, offs_ptr, out_ptr, M, N, K, G, PROGRAMS,
    WGRAD: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, TMA_STORE: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, STAGING: gl.constexpr = 1,
    EARLY_SCALES: gl.constexpr = False,
):  # fmt: skip
    """2D x 3D: out (M, N) = (A (M, K) @ B_g (N, K)^T) * sa[:, None] * sb[g][None, :] per row group g.
    WGRAD (2D x 2D): out[g] (N, K) = (X[:, group g] @ Y[:, group g]^T) * sx[g][:, None] * sy[g][None, :], X = a_q
    (N, M), Y = b_q (K, M), offs splitting the contraction M; sx (G, N), sy (G, K)."""
    ring = _ring(a_desc, b_desc, out_desc, STAGES, TMA_STORE, STAGING)
    w = _Walk(offs_ptr, M, N, K, G, PROGRAMS, GROUP_M)
    gl.warp_specialize([
        (_consumer, (ring, w, sa_ptr, sb_ptr, out_ptr, 0, WGRAD, EARLY_SCALES)),
        (_consumer, (ring, w, sa_ptr, sb_ptr, out_ptr, 1, WGRAD, EARLY_SCALES)),
        (_producer, (ring, w, WGRAD)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])  # fmt: skip


def run_fp8_rowwise(a_q, a_scale, b_q, b_scale, offs, out_dtype: torch.dtype, config: WsConfig | None = None,
                    use_fast_accum: bool = False):  # fmt: skip
    """The backend on operands ``grouped_gemm`` has checked (module doc: ``gemm_fp8_rowwise``'s contract); it always
    sums as torch's precise kernel does (``use_fast_accum`` is the native kernel's option)."""
    config = config or default_config(GemmCase.of_b(b_q))
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    contraction = a_q.shape[1]
    if contraction % 16:
        raise InputError(f"triton_ws FP8 rowwise grouped GEMM: the contraction dim's row stride ({contraction} bytes) "
                         "must be a multiple of 16 (TMA)")  # fmt: skip
    if b_q.dim() == 3:
        (M, K), (G, N, _) = a_q.shape, b_q.shape
        out = torch.empty(M, N, dtype=out_dtype, device=a_q.device)
        b_rows = b_q.view(G * N, K)  # group g's weights: rows [g * N, (g + 1) * N)
        out_rows = out
        tiles = (triton.cdiv(M, bm) + G) * triton.cdiv(N, bn)  # any group sizes
    else:
        (N, M), K, G = a_q.shape, b_q.shape[0], offs.numel()
        if M == 0:  # every group empty (and no columns for a descriptor to stride over)
            return torch.zeros(G, N, K, dtype=out_dtype, device=a_q.device)
        out = torch.empty(G, N, K, dtype=out_dtype, device=a_q.device)
        b_rows = b_q
        out_rows = out.view(G * N, K)
        tiles = G * triton.cdiv(N, bm) * triton.cdiv(K, bn)
    if out.numel() == 0:
        return out
    sub = min(bn, 128)
    layout = lambda rows, dtype: gl.NVMMASharedLayout.get_default_for([rows, bk], dtype)
    a_desc = TensorDescriptor.from_tensor(a_q, [bm, bk], layout(bm, gl.float8e4nv))
    b_desc = TensorDescriptor.from_tensor(b_rows, [bn, bk], layout(bn, gl.float8e4nv))
    # TMA stores: bf16 only (an fp32 staging block would take 32 KiB a consumer from the ring), and a row stride of
    # whole 16 bytes, as every TMA row needs.
    tma_store = config.tma_store and out_dtype == torch.bfloat16 and out_rows.shape[1] % 8 == 0
    out_type = gl.bfloat16 if out_dtype == torch.bfloat16 else gl.float32
    out_layout = gl.NVMMASharedLayout.get_default_for([bm // 2, sub], out_type)
    out_desc = TensorDescriptor.from_tensor(out_rows, [bm // 2, sub], out_layout)
    programs = persistent_programs(tiles, a_q.device, cap=config.max_programs)
    # The program count is a plain argument, not a constexpr: a call at another size reuses the compiled kernel.
    _fp8_ws[(programs,)](a_desc, b_desc, out_desc, a_scale, b_scale, offs, out, M, N, K, G, programs,
                        WGRAD=b_q.dim() == 2, STAGES=config.num_stages, GROUP_M=config.group_m, TMA_STORE=tma_store,
                        PRODUCER_REGS=config.producer_regs, CONSUMER_REGS=config.consumer_regs,
                        STAGING=config.staging, EARLY_SCALES=config.early_scales,
                        num_warps=4)  # fmt: skip
    return out


def _unavailable(recipe: Recipe, cap, device: torch.device) -> str | None:
    # Gluon has no interpreter, and the kernel is built of SM90's wgmma (SM100 has none).
    return None if cap == (9, 0) else f"triton_ws is an SM90 (Hopper) kernel, this device is {cap or device}"


# On SM90 it sums as torch's does and is faster in every pass (docs/perf-log.md).
BACKEND = Backend("triton_ws", run={Recipe.FP8_ROWWISE: late(__name__, "run_fp8_rowwise")}, unavailable=_unavailable,
                  config_type=WsConfig, preference={Arch.SM90: FIRST})  # fmt: skip
