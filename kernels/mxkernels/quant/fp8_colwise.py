"""The FP8 rowwise recipe's column-direction quantizer kernels: a scale per column of a group, the output transposed.

``fp8_rowwise`` checks the inputs of ``quantize_fp8_rowwise_3d(w, along="N")`` (one scale per column of each
expert's (N, K) matrix) and ``quantize_fp8_rowwise_k_groups(x, offs)`` (one per column of each token group), then
calls ``launch_colwise`` here; it also counts their costs, asking ``reads_twice`` which launches reread from device
memory. The scale and the cast are the recipe's (``block_math.fp8_scale_and_reciprocal``: amax floored at
``AMAX_FLOOR``, IEEE divisions), so every kernel is bit-exact against ``fp8_rowwise``'s references. This module does
not import ``fp8_rowwise``: that one imports it.

Kernels, each launched from a frozen config:

* strips (``ColwiseConfig``; split, the k_groups default), whose scale spans a whole column of a group (2048 to ~16k
  rows x 2 bytes: no program can hold it): a column strip (``strip_cols`` wide) of a group is cut into chunks of
  ``chunk_rows`` rows, one program each. A program reads its chunk once (pass 1), folds its column amax into a
  workspace with atomics and counts itself done; the program that finishes a strip's last chunk scales, casts and
  writes the whole strip transposed (pass 2), reading it again while it is still in L2 (it was read moments before
  by the chunks of that strip, which run side by side). So device memory sees one read; the cost counts one.
  ``ColwiseConfig(split=True)`` runs the two passes as two launches instead (the second read from device memory,
  counted by the cost), the fallback where L2 cannot hold the strips in flight.
* walking (``WalkConfig``), the 3D-along-N default: a persistent grid, one program per SM, each program walking
  whole strips (a group's rows x ``strip_cols``) and making both passes itself, so that only as many strips are in
  flight as there are programs and pass 2 can find its strip in L2; the cost counts one read.
* the two-pass colwise kernel (``TwoPassColwiseConfig``): one program per column block of a group reads its columns
  twice (amax, then scale and cast); both reads come from device memory at these sizes, and the cost counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.block_math import abs_max_bits, fp8_scale_and_reciprocal, to_e4m3_bits, to_fp32
from ..layouts.padding import group_bounds, locate, pick
from ..core.runtime import INTERPRET, InputError, check_fields_power_of_two, check_int, persistent_programs

# Rows per step of the strips kernel's pass 2 where a group is not on 16-row boundaries (byte stores).
_UNALIGNED_STEP: tl.constexpr = tl.constexpr(64)


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def group_columns(x_ptr, q_ptr, offs_ptr, g, c, rows, stride_xg, stride_xc, stride_qg, stride_qc,
                   HAS_OFFS: tl.constexpr):  # fmt: skip
    """Rows [start, end) of group g (from ``offs``, or all ``rows`` of the g-th matrix) and the pointers of its
    columns c in x and, transposed, in q (add a row index m: x_cols + m * stride_xm, q_cols + m)."""
    if HAS_OFFS:
        # Clamped to [0, rows] like padding.group_bounds: malformed offs never address outside x.
        start = tl.minimum(tl.maximum(tl.load(offs_ptr + g - 1, mask=g > 0, other=0), 0), rows)
        end = tl.minimum(tl.maximum(tl.load(offs_ptr + g), start), rows)
    else:
        start = 0
        end = rows
    x_cols = x_ptr + g.to(tl.int64) * stride_xg + c.to(tl.int64)[None, :] * stride_xc
    q_cols = q_ptr + g.to(tl.int64) * stride_qg + c.to(tl.int64)[None, :] * stride_qc
    return start, end, x_cols, q_cols


@triton.jit
def _colwise_kernel(
    x_ptr, offs_ptr, q_ptr, scale_ptr, rows, cols,
    stride_xg, stride_xm, stride_xc, stride_qg, stride_qc,
    HAS_OFFS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """Quantize BLOCK_C columns of one group's rows of x, one scale per column, and write the result transposed.

    Program (i, g): group g is rows [start, end) of the matrix at x + g * stride_xg, where start/end come from
    ``offs`` (HAS_OFFS) or are [0, rows). Column c's scale goes to scale[g * cols + c] and element (m, c) to
    q[g * stride_qg + c * stride_qc + m], so the output has the row dim (the next GEMM's contraction dim) contiguous.
    Two passes over the program's columns: the amax, then the scale and cast.
    """
    g = tl.program_id(1)
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = c < cols
    start, end, x_cols, q_cols = group_columns(x_ptr, q_ptr, offs_ptr, g, c, rows, stride_xg, stride_xc, stride_qg,
                                                stride_qc, HAS_OFFS)  # fmt: skip

    amax = tl.zeros((BLOCK_C,), tl.float32)
    for m0 in range(start, end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        mask = (m < end)[:, None] & col_ok[None, :]
        x = to_fp32(tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0))
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
    scale, recip = fp8_scale_and_reciprocal(amax)
    tl.store(scale_ptr + g * cols + c, scale, mask=col_ok)

    for m0 in range(start, end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        mask = (m < end)[:, None] & col_ok[None, :]
        x = to_fp32(tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0))
        tl.store(q_cols + m[:, None], to_e4m3_bits(x * recip[None, :], EXACT), mask=mask)


@triton.jit
def _strip_scale_pass(
    x_cols, q_cols, scale_ptr, amax_ptr, c, limit, scale_limit, lo, hi, stride_xm, STEP: tl.constexpr,
    STAGES: tl.constexpr, PREFETCH: tl.constexpr, FROM_ATOMICS: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """Pass 2 of the strips kernel over rows [lo, hi) of a strip's columns c (those below ``limit`` exist): the
    amax from the workspace (read with atomics where other programs of this launch wrote it), the scale of the
    columns below ``scale_limit``, then each STEP-row tile scaled, cast and stored transposed (q_cols + m: the row
    dim contiguous). Masks are built from limits, not scalar flags: the interpreter widens a scalar bool broadcast
    against a tensor to int32, which its loads reject as a mask."""
    col_ok = c < limit
    if FROM_ATOMICS:
        amax_bits = tl.atomic_add(amax_ptr, 0, mask=col_ok, sem="relaxed", scope="gpu")
    else:
        amax_bits = tl.load(amax_ptr, mask=col_ok, other=0)
    scale, recip = fp8_scale_and_reciprocal(amax_bits.to(tl.float32, bitcast=True))
    tl.store(scale_ptr, scale, mask=c < scale_limit)
    strip_scale_rows(x_cols, q_cols, recip, col_ok, lo, hi, stride_xm, STEP, STAGES, PREFETCH, EXACT)


@triton.jit
def strip_scale_rows(
    x_cols, q_cols, recip, col_ok, lo, hi, stride_xm, STEP: tl.constexpr, STAGES: tl.constexpr,
    PREFETCH: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """``_strip_scale_steps`` over rows [lo, hi). On 16-row boundaries (every group of a 16-aligned padding, every
    3D shape with N % 16 == 0), said so, the transposed store goes out as 16-byte vectors; otherwise byte by byte,
    in steps small enough that the byte stores' addresses do not set the kernel's register count. (Said by rounding,
    which here changes nothing: triton 3.6 drops tl.multiple_of on a scalar.)"""
    if (lo % 16 == 0) & (hi % 16 == 0):
        _strip_scale_steps(x_cols, q_cols, recip, col_ok, lo // 16 * 16, hi // 16 * 16, stride_xm, STEP, STAGES,
                           PREFETCH, EXACT)  # fmt: skip
    else:
        _strip_scale_steps(x_cols, q_cols, recip, col_ok, lo, hi, stride_xm, _UNALIGNED_STEP, 1, False, EXACT)


@triton.jit
def _strip_scale_steps(
    x_cols, q_cols, recip, col_ok, lo, hi, stride_xm, STEP: tl.constexpr, STAGES: tl.constexpr,
    PREFETCH: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """Scale, cast and store transposed rows [lo, hi) of a strip, STEP rows at a time. PREFETCH: the next step's
    load is issued before this step's work (a register double buffer: two steps in flight); else STAGES > 1 lets
    Triton pipeline the loads through shared memory. The rows' alignment follows from lo's (a loop variable
    starting at lo would hide it)."""
    if PREFETCH:
        m = lo + tl.arange(0, STEP)
        x = tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=(m < hi)[:, None] & col_ok[None, :], other=0.0)
        for _ in range(tl.cdiv(hi - lo, STEP)):
            m_next = m + STEP
            mask_next = (m_next < hi)[:, None] & col_ok[None, :]
            x_next = tl.load(x_cols + m_next.to(tl.int64)[:, None] * stride_xm, mask=mask_next, other=0.0)
            q = to_e4m3_bits(to_fp32(x) * recip[None, :], EXACT)
            tl.store(q_cols + m.to(tl.int64)[:, None], q, mask=(m < hi)[:, None] & col_ok[None, :])
            x, m = x_next, m_next
    else:
        for i in tl.range(0, tl.cdiv(hi - lo, STEP), num_stages=STAGES):
            m = lo + i * STEP + tl.arange(0, STEP)
            mask = (m < hi)[:, None] & col_ok[None, :]
            x = to_fp32(tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0))
            tl.store(q_cols + m.to(tl.int64)[:, None], to_e4m3_bits(x * recip[None, :], EXACT), mask=mask)


@triton.jit
def _strips_kernel(
    x_ptr, offs_ptr, q_ptr, scale_ptr, work_ptr, rows, cols, G,
    stride_xg, stride_xm, stride_xc, stride_qg, stride_qc,
    HAS_OFFS: tl.constexpr, CHUNK: tl.constexpr, STRIP: tl.constexpr, STEP: tl.constexpr, GROUP: tl.constexpr,
    PHASE: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_G: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """Per-group column scales of x, the output written transposed; the matrix of group g and its rows as in
    ``_colwise_kernel`` (offs: group ends; else G matrices of ``rows`` rows at x + g * stride_xg).

    Program (p, s): strip ``s * GROUP + p % GROUP`` (STRIP columns) of chunk ``p // GROUP`` (CHUNK rows of one
    group; groups counted back to back, an empty group as one empty chunk). The GROUP strips of one chunk are
    neighbours in launch order, so together they read whole lines of each row. ``work`` holds the amax bits
    (G, cols) int32 and a counter (G, cols / STRIP) of finished chunks per strip, zero at launch.

    PHASE 0, one launch: pass 1 (read the chunk, atomic max of its column amax into work, count the chunk) and,
    in the program that counts a strip's last chunk, pass 2 over the whole strip. PHASE 1 / 2: pass 1 / pass 2 of
    each program's own chunk, as two launches (the second sees the first's amax complete; chunk 0 writes the scale).
    """
    strip = tl.program_id(1) * GROUP + tl.program_id(0) % GROUP
    chunk = tl.program_id(0) // GROUP
    n_strips = tl.cdiv(cols, STRIP)
    if HAS_OFFS:
        starts, sizes = group_bounds(offs_ptr, G, rows, BLOCK_G)
        lane = tl.arange(0, BLOCK_G)
        n_chunks = tl.where(lane < G, tl.maximum(tl.cdiv(sizes, CHUNK), 1), 0)
        g, local = locate(n_chunks, chunk, BLOCK_G)
        start, size, chunks = pick(starts, g, BLOCK_G), pick(sizes, g, BLOCK_G), pick(n_chunks, g, BLOCK_G)
    else:
        chunks = tl.maximum(tl.cdiv(rows, CHUNK), 1)
        g, local = chunk // chunks, chunk % chunks
        start, size = 0, rows
    live = (g < G) & (strip < n_strips)
    c = strip * STRIP + tl.arange(0, STRIP)
    limit = tl.where(live, cols, 0)
    col_ok = c < limit
    lo = start + local * CHUNK
    hi = tl.minimum(lo + CHUNK, start + size)
    x_cols = x_ptr + g.to(tl.int64) * stride_xg + c.to(tl.int64)[None, :] * stride_xc
    q_cols = q_ptr + g.to(tl.int64) * stride_qg + c.to(tl.int64)[None, :] * stride_qc
    amax_ptr = work_ptr + g * cols + c
    scale_ptr = scale_ptr + g * cols + c
    if PHASE == 2:
        _strip_scale_pass(x_cols, q_cols, scale_ptr, amax_ptr, c, limit, tl.where(local == 0, limit, 0), lo, hi,
                          stride_xm, STEP, STAGES, PREFETCH, False, EXACT)  # fmt: skip
    else:
        m = lo + tl.arange(0, CHUNK)
        mask = (m < hi)[:, None] & col_ok[None, :]
        x = tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0)
        seen = tl.atomic_max(amax_ptr, abs_max_bits(x, 0), mask=col_ok, sem="relaxed", scope="gpu")
        if PHASE == 0:
            # The count must follow every thread's atomic max. The increment is computed from their results (always
            # 1: amax bits are >= 0, which the compiler cannot know), so no thread's max is still in flight, unlike a
            # fire-and-forget reduction, when the count is made; the count is a release, the last one's an acquire.
            one = 1 + (tl.min(tl.where(col_ok, seen, 0), 0) < 0).to(tl.int32)
            counter = work_ptr + G * cols + g * n_strips + strip
            done = tl.atomic_add(counter, one, mask=live, sem="acq_rel", scope="gpu")
            if live & (done == chunks - 1):
                _strip_scale_pass(x_cols, q_cols, scale_ptr, amax_ptr, c, limit, limit, start, start + size,
                                  stride_xm, STEP, STAGES, PREFETCH, True, EXACT)  # fmt: skip


@triton.jit
def strip_amax(x_cols, col_ok, lo, hi, stride_xm, STEP: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr):
    """amax bits (int32) of rows [lo, hi) of a strip's columns, STEP rows at a time, with the loads kept in flight as
    in ``_strip_scale_steps`` (PREFETCH: the next step's load issued first; else STAGES-deep pipelining)."""
    amax = tl.zeros((x_cols.shape[1],), tl.int32)
    if PREFETCH:
        m = lo + tl.arange(0, STEP)
        x = tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=(m < hi)[:, None] & col_ok[None, :], other=0.0)
        for _ in range(tl.cdiv(hi - lo, STEP)):
            m = m + STEP
            x_next = tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=(m < hi)[:, None] & col_ok[None, :],
                             other=0.0)  # fmt: skip
            amax = tl.maximum(amax, abs_max_bits(x, 0))
            x = x_next
    else:
        for i in tl.range(0, tl.cdiv(hi - lo, STEP), num_stages=STAGES):
            m = lo + i * STEP + tl.arange(0, STEP)
            x = tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=(m < hi)[:, None] & col_ok[None, :],
                        other=0.0)  # fmt: skip
            amax = tl.maximum(amax, abs_max_bits(x, 0))
    return amax


@triton.jit
def _walk_kernel(
    x_ptr, offs_ptr, q_ptr, scale_ptr, rows, cols, G, PROGRAMS,
    stride_xg, stride_xm, stride_xc, stride_qg, stride_qc,
    HAS_OFFS: tl.constexpr, STRIP: tl.constexpr, STEP: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr,
    EXACT: tl.constexpr,
):  # fmt: skip
    """Per-group column scales, the output transposed (groups and strides as in ``_colwise_kernel``), by PROGRAMS
    persistent programs that each walk whole strips (STRIP columns of one group), strip p, p + PROGRAMS, ...: pass 1
    reads the strip for its amax, pass 2 reads it again, scales, casts and stores it transposed. Only PROGRAMS strips
    are in flight at a time, so when they fit in L2 pass 2 finds its strip there, and programs side by side walk
    neighbouring strips of one group, which share their rows' sectors."""
    n_strips = tl.cdiv(cols, STRIP)
    for item in range(tl.program_id(0), G * n_strips, PROGRAMS):
        g, c, col_ok, start, end, x_cols, q_cols = strip_of(item, n_strips, x_ptr, q_ptr, offs_ptr, rows, cols,
                                                            stride_xg, stride_xc, stride_qg, stride_qc, STRIP,
                                                            HAS_OFFS)  # fmt: skip
        walk_strip(x_cols, q_cols, scale_ptr + g * cols + c, col_ok, start, end, stride_xm, STEP, STAGES, PREFETCH,
                   EXACT)  # fmt: skip


@triton.jit
def strip_of(item, n_strips, x_ptr, q_ptr, offs_ptr, rows, cols, stride_xg, stride_xc, stride_qg, stride_qc,
             STRIP: tl.constexpr, HAS_OFFS: tl.constexpr):  # fmt: skip
    """The strip a persistent program takes as work item ``item`` (n_strips strips a group, groups one after the
    other): its group g, columns c (col_ok: those that exist), rows [start, end) and pointers (``group_columns``)."""
    g = item // n_strips
    c = (item % n_strips) * STRIP + tl.arange(0, STRIP)
    start, end, x_cols, q_cols = group_columns(x_ptr, q_ptr, offs_ptr, g, c, rows, stride_xg, stride_xc, stride_qg,
                                               stride_qc, HAS_OFFS)  # fmt: skip
    return g, c, c < cols, start, end, x_cols, q_cols


@triton.jit
def walk_strip(x_cols, q_cols, scale_ptr, col_ok, start, end, stride_xm, STEP: tl.constexpr, STAGES: tl.constexpr,
               PREFETCH: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """Both passes of the walking kernel over a strip's rows [start, end): the amax, the scale (to scale_ptr, one a
    column), then the scale and cast stored transposed."""
    amax = strip_amax(x_cols, col_ok, start, end, stride_xm, STEP, STAGES, PREFETCH)
    scale, recip = fp8_scale_and_reciprocal(amax.to(tl.float32, bitcast=True))
    tl.store(scale_ptr, scale, mask=col_ok)
    strip_scale_rows(x_cols, q_cols, recip, col_ok, start, end, stride_xm, STEP, STAGES, PREFETCH, EXACT)


# ---------------------------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoPassColwiseConfig:
    """One launch of the two-pass colwise kernel (``quantize_fp8_rowwise_3d(along="N")``,
    ``quantize_fp8_rowwise_k_groups``). A program owns whole columns of one group, so it finds their amax alone, with
    no second launch or atomics. (The rows kernel's ``Fp8RowwiseConfig`` has the same fields, but a config names its
    kernel, and this module cannot import ``fp8_rowwise``, which imports it.)"""

    # Rows per step of the two passes down the columns, a power of two.
    block_rows: int
    # Columns per program, a power of two.
    block_cols: int
    # Warps per program.
    num_warps: int = 4

    def __post_init__(self):
        check_fields_power_of_two(self, "block_rows", "block_cols", "num_warps")


@dataclass(frozen=True)
class ColwiseConfig:
    """One launch of the strips kernel (``quantize_fp8_rowwise_3d(along="N")``, ``quantize_fp8_rowwise_k_groups``)."""

    # Columns of a strip, a power of two: the columns one program scales in pass 2. The strip (a group's rows x
    # strip_cols) is what L2 must hold from its chunks' reads until pass 2 reads it again, for as long as that pass
    # takes: narrow strips keep the data in flight small.
    strip_cols: int
    # Rows of a chunk (what one program reads in pass 1), a power of two: chunk_rows x strip_cols elements in
    # registers at once.
    chunk_rows: int
    # Rows per step of the pass 2 loop down a strip, a power of two; each step is transposed on chip, so its store
    # runs along the output rows.
    step_rows: int
    # Width in input columns of the strip groups the launch runs through (all chunks of a group's strips before the
    # next group's), a multiple of strip_cols: neighbouring strips of one chunk run side by side, so their pass 1
    # reads together cover whole 128-byte lines of each row (for bf16, 64 columns) or longer runs of it, as the
    # MX dim1 kernel's column groups do; wider groups spread a strip's chunks over more programs (longer in L2).
    group_cols: int
    # Warps per program.
    num_warps: int = 4
    # Pass 2 streams a whole strip alone, and its pace sets how long the strip must stay in L2, so its loop keeps
    # reads in flight while a step computes: prefetch=True issues the next step's load first (two steps in
    # registers); else num_stages (1 to 4) > 1 lets Triton pipeline the loads through shared memory (which every
    # program of the launch then reserves, pass 1 ones included).
    prefetch: bool = True
    num_stages: int = 1
    # False: one launch, pass 2 in the program that finishes a strip (the second read served from L2). True: two
    # launches, every chunk read again by its own program once all amaxes are known (the second read from device
    # memory, counted by the cost).
    split: bool = False

    def __post_init__(self):
        check_fields_power_of_two(self, "strip_cols", "chunk_rows", "step_rows", "num_warps")
        check_int("ColwiseConfig.num_stages", self.num_stages, 1, 4)
        group = self.group_cols
        if not isinstance(group, int) or group < self.strip_cols or group % self.strip_cols:
            raise InputError(f"ColwiseConfig.group_cols must be a positive multiple of strip_cols, got {group!r}")
        for flag in ("prefetch", "split"):
            if not isinstance(getattr(self, flag), bool):
                raise InputError(f"ColwiseConfig.{flag} must be a bool, got {getattr(self, flag)!r}")


@dataclass(frozen=True)
class WalkConfig:
    """One launch of the walking kernel (``quantize_fp8_rowwise_3d(along="N")``, ``quantize_fp8_rowwise_k_groups``):
    a persistent grid of programs that each read a whole strip twice, the second time from L2."""

    # Columns of a strip, a power of two. What L2 must hold is (programs in flight) x (a group's rows) x strip_cols x
    # the input's item size: narrow strips for long groups.
    strip_cols: int
    # Rows per step down a strip, a power of two (a step of strip_cols columns in registers at once).
    step_rows: int
    # Warps per program.
    num_warps: int = 8
    # Programs per SM in the persistent grid (SMs x this): the strips in flight.
    programs_per_sm: int = 1
    # Both passes keep loads in flight: prefetch=True issues the next step's load before this step's work (two steps
    # in registers); else num_stages (1 to 4) lets Triton pipeline them through shared memory.
    prefetch: bool = True
    num_stages: int = 1
    # ptxas register cap (maxnreg), 0: the compiler's choice (sm_90, triton 3.6: 150-255 registers a thread, so
    # fewer programs an SM run than programs_per_sm asks; a cap of 65536 / (32 x num_warps x programs_per_sm) lets
    # them, at the price of spills).
    max_registers: int = 0

    def __post_init__(self):
        check_fields_power_of_two(self, "strip_cols", "step_rows", "num_warps")
        check_int("WalkConfig.programs_per_sm", self.programs_per_sm, 1, 32)
        check_int("WalkConfig.num_stages", self.num_stages, 1, 4)
        check_int("WalkConfig.max_registers", self.max_registers, 0, 255)
        if not isinstance(self.prefetch, bool):
            raise InputError(f"WalkConfig.prefetch must be a bool, got {self.prefetch!r}")


# The strips kernel in one launch, pass 2 reading from L2 (K_GROUPS_CONFIG is the same launch split in two).
COLWISE_CONFIG = ColwiseConfig(strip_cols=16, chunk_rows=512, step_rows=512, group_cols=256, num_warps=8)
# 3D along N: the walking kernel, strips of 64 columns in 512-row steps, one program per SM (measured faster than the
# strips kernel on DeepSeek-V3's and Scout's weights; docs/perf-log.md).
ALONG_N_CONFIG = WalkConfig(strip_cols=64, step_rows=512, num_warps=8, programs_per_sm=1)
# k_groups: a group's strip holds up to all M rows, and the one-launch kernel's pass 2 did not find them in L2
# (slower than both reads from device memory: docs/perf-log.md); the split launch reads twice, and is counted so.
# 64-column strips: pass 2 reads whole 128-byte lines of each row (16-column strips read 32-byte pieces).
K_GROUPS_CONFIG = ColwiseConfig(strip_cols=64, chunk_rows=512, step_rows=128, group_cols=1024, num_warps=8, split=True)
# The old colwise default: the two-pass kernel, both reads from device memory.
TWO_PASS_COLWISE_CONFIG = TwoPassColwiseConfig(64, 64, num_warps=4)


def reads_twice(config) -> bool:
    """Whether a launch of ``config`` reads its input twice from device memory (what the costs count): the two-pass
    colwise kernel and the split strips launch do; the one-launch strips kernel and the walking kernel take their
    second read from L2, and so does ``fp8_hold``'s holding kernel (strips of up to ``hold_rows`` rows read once,
    longer ones walking)."""
    return isinstance(config, TwoPassColwiseConfig) or (isinstance(config, ColwiseConfig) and config.split)


# ---------------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------------


def launch_colwise(x, offs, q, scale, groups, *, rows, cols, x_strides, q_strides, config) -> None:
    """Run the kernel ``config`` names (a ``WalkConfig``, a ``TwoPassColwiseConfig`` or a ``ColwiseConfig``) on
    inputs the caller has checked. Group g is rows [start, end) of the matrix at x + g * x_strides[0], start/end from
    ``offs`` (int32 (groups,) group ends, read on the device) or [0, rows) where offs is None; x_strides are x's
    (group, row, column) strides and q_strides q's (group, column) ones, in elements. Element (m, c) of group g goes
    to q[g * q_strides[0] + c * q_strides[1] + m] (e4m3, the rows contiguous), column c's fp32 scale to
    scale[g * cols + c]."""
    if isinstance(config, WalkConfig):
        programs = persistent_programs(groups * triton.cdiv(cols, config.strip_cols), x.device, config.programs_per_sm)
        _walk_kernel[(programs,)](
            x, offs, q.view(torch.uint8), scale, rows, cols, groups, programs, *x_strides, *q_strides,
            HAS_OFFS=offs is not None, STRIP=config.strip_cols, STEP=config.step_rows, STAGES=config.num_stages,
            PREFETCH=config.prefetch, EXACT=INTERPRET, num_warps=config.num_warps,
            **({"maxnreg": config.max_registers} if config.max_registers and not INTERPRET else {}),
        )  # fmt: skip
        return
    if isinstance(config, TwoPassColwiseConfig):
        grid = (triton.cdiv(cols, config.block_cols), groups)
        _colwise_kernel[grid](
            x, offs, q.view(torch.uint8), scale, rows, cols, *x_strides, *q_strides,
            HAS_OFFS=offs is not None, BLOCK_M=config.block_rows, BLOCK_C=config.block_cols, EXACT=INTERPRET,
            num_warps=config.num_warps,
        )  # fmt: skip
        return
    n_strips = triton.cdiv(cols, config.strip_cols)
    work = torch.zeros(groups * (cols + n_strips), dtype=torch.int32, device=x.device)
    for phase in (1, 2) if config.split else (0,):
        _launch_strips(x, offs, q, scale, work, groups, rows, cols, x_strides, q_strides, config, phase)


def launch_from_amax(x, offs, amax, q, scale, groups, *, rows, cols, x_strides, q_strides, config: ColwiseConfig):
    """Pass 2 of the strips kernel alone, from column amaxes already known: ``amax`` (groups, cols) fp32, the max
    of |x| down each column of each group (``fp8_amax``'s rows kernel folds them). Groups, strides and outputs as in
    ``launch_colwise``; ``config.split`` plays no part (there is one launch). One read of x, one write of q."""
    _launch_strips(x, offs, q, scale, amax.view(torch.int32), groups, rows, cols, x_strides, q_strides, config, 2)


def _launch_strips(x, offs, q, scale, work, groups, rows, cols, x_strides, q_strides, config, phase) -> None:
    strip, chunk = config.strip_cols, config.chunk_rows
    group = config.group_cols // strip
    # Chunks in all: an upper bound, so the launch needs no group sizes (each group rounds up, an empty one counts 1).
    chunks = triton.cdiv(rows, chunk) + groups if offs is not None else groups * max(triton.cdiv(rows, chunk), 1)
    grid = (chunks * group, triton.cdiv(triton.cdiv(cols, strip), group))
    _strips_kernel[grid](
        x, offs, q.view(torch.uint8), scale, work, rows, cols, groups, *x_strides, *q_strides,
        HAS_OFFS=offs is not None, CHUNK=chunk, STRIP=strip, STEP=config.step_rows, GROUP=group, PHASE=phase,
        STAGES=config.num_stages, PREFETCH=config.prefetch, BLOCK_G=triton.next_power_of_2(groups), EXACT=INTERPRET,
        num_warps=config.num_warps,
    )  # fmt: skip
