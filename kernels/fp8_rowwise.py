"""The FP8 rowwise recipe's quantizers (what Hopper's ``torch._scaled_grouped_mm`` runs natively).

Every row of the operand, along the GEMM's contraction dim, gets one fp32 scale:

    amax = max(max |x[row, :]|, 2**-112)      scale = amax / 448      q = e4m3(clamp(x * (448 / amax), -448, 448))

and dequantizes as ``q * scale``. The floor keeps 448 / amax finite (it overflows fp32 below amax ~ 2**-119); it
only touches rows of magnitude < 2**-112, and gives an all-zero row zero data (and scale 2**-112 / 448). Both
divisions are IEEE round-to-nearest and the cast rounds to nearest even (the fp32 -> e4m3 cast and the exact bf16
widening are ``quantize``'s interpreter-safe helpers), so the Triton kernels are bit-exact against the plain-torch
references here. Inputs must be finite (a row holding an Inf or a NaN has no meaningful scale).

What each GEMM of a training step needs (operands with the contraction dim contiguous, as ``_scaled_grouped_mm``
wants them):

| call | input | output | scales |
|---|---|---|---|
| ``quantize_fp8_rowwise(x)`` | (M, K) activations / grad_out | (M, K) | (M,) |
| ``quantize_fp8_rowwise_3d(w, along="K")`` | (G, N, K) expert weights | (G, N, K) | (G, N) |
| ``quantize_fp8_rowwise_3d(w, along="N")`` | (G, N, K) expert weights | (G, K, N) | (G, K) |
| ``quantize_fp8_rowwise_k_groups(x, offs)`` | (M, R), offs split M | (R, M) | (G, R) |

The last one serves the 2D x 2D weight-gradient GEMM, which contracts over the token dim M: each group (expert) is
its own GEMM, so every (group, row) pair gets its own scale, and ``_scaled_grouped_mm`` reads them as the flat
(G * R,) vector ``scale.reshape(-1)`` (group-major).

Kernels, each launched from a frozen config passed as ``config=`` (None: the default, see each wrapper):

* rows (``Fp8RowwiseConfig``), for the first two: a row whose length fits one step of the config
  (``next_pow2(K) <= block_cols``) is loaded once, held in registers while its amax is reduced, then scaled and
  cast: one read. Longer rows take two passes (amax, then scale and cast) in steps of ``block_cols``; the second
  read is real traffic, and ``quantize_fp8_rowwise_cost`` counts it.
* strips (``ColwiseConfig``; split, the k_groups default), for the last two, whose scale spans a whole column of a group (2048 to ~16k rows x 2
  bytes: no program can hold it): a column strip (``strip_cols`` wide) of a group is cut into chunks of
  ``chunk_rows`` rows, one program each. A program reads its chunk once (pass 1), folds its column amax into a
  workspace with atomics and counts itself done; the program that finishes a strip's last chunk scales, casts and
  writes the whole strip transposed (pass 2), reading it again while it is still in L2 (it was read moments before
  by the chunks of that strip, which run side by side). So device memory sees one read; the cost counts one.
  ``ColwiseConfig(split=True)`` runs the two passes as two launches instead (the second read from device memory,
  counted by the cost), the fallback where L2 cannot hold the strips in flight.
* walking (``WalkConfig``), the 3D-along-N default: a persistent grid, one program per SM, each program walking
  whole strips (a group's rows x ``strip_cols``) and making both passes itself, so that only as many strips are in
  flight as there are programs and pass 2 can find its strip in L2; the cost counts one read.
* the two-pass colwise kernel (``Fp8RowwiseConfig``): one program per column block of a group reads its columns
  twice (amax, then scale and cast); both reads come from device memory at these sizes, and the cost counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .block_math import abs_max_bits, masked_load, masked_store, to_e4m3_bits, to_fp32
from .cost import Cost
from .format import DATA_DTYPE, E4M3_MAX
from .padding import group_bounds, locate, pick
from .runtime import (
    INTERPRET,
    MAX_GROUPS,
    InputError,
    check_config,
    check_fields_power_of_two,
    check_group_offsets,
    check_int,
    check_tensor,
)

INPUT_DTYPES = (torch.bfloat16, torch.float32)
AMAX_FLOOR = 2.0**-112
_AMAX_FLOOR: tl.constexpr = tl.constexpr(AMAX_FLOOR)
# Rows per step of the strips kernel's pass 2 where a group is not on 16-row boundaries (byte stores).
_UNALIGNED_STEP: tl.constexpr = tl.constexpr(64)


# ---------------------------------------------------------------------------------------------------------------
# Plain-torch references (the oracle of the tests)
# ---------------------------------------------------------------------------------------------------------------


def quantize_fp8_rowwise_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) bf16/fp32 -> (q (..., K) e4m3, scale (...) fp32), one scale per row along the last dim.

    To quantize along another dim, move it last first: ``quantize_fp8_rowwise_reference(w.transpose(-2, -1))`` is
    the oracle of ``quantize_fp8_rowwise_3d(w, along="N")``.
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    # Tensor / tensor: torch turns `448.0 / t` into `t.reciprocal() * 448` (and, on CUDA, `t / 448.0` into
    # `t * (1 / 448)`), rounding twice.
    e4m3_max = torch.full_like(amax, E4M3_MAX)
    scale = amax / e4m3_max
    q = (xf * (e4m3_max / amax).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(DATA_DTYPE)
    return q.contiguous(), scale.contiguous()


def dequantize_fp8_rowwise_reference(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of q (..., K) e4m3 with scale (...) fp32: ``q * scale[..., None]``."""
    return q.float() * scale.unsqueeze(-1)


def quantize_fp8_rowwise_k_groups_reference(x: torch.Tensor, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``quantize_fp8_rowwise_k_groups``: x (M, R), offs (G,) -> (q (R, M) e4m3, scale (G, R) fp32).

    Reads ``offs`` on the host. An empty group gets the scale of an all-zero column, AMAX_FLOOR / 448.
    """
    M, R = x.shape
    q = torch.zeros(R, M, dtype=DATA_DTYPE, device=x.device)
    scale = torch.full((offs.numel(), R), AMAX_FLOOR / E4M3_MAX, dtype=torch.float32, device=x.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            q[:, start:end], scale[g] = quantize_fp8_rowwise_reference(x[start:end].t())
        start = end
    return q, scale


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _scale_and_reciprocal(amax):
    """(amax / 448, 448 / amax) of the floored amax, with IEEE division."""
    amax = tl.maximum(amax, _AMAX_FLOOR)
    return tl.math.div_rn(amax, 448.0), tl.math.div_rn(448.0, amax)


@triton.jit
def _rowwise_kernel(
    x_ptr, q_ptr, scale_ptr, rows, cols,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SINGLE: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """One program quantizes BLOCK_R rows of row-major x (rows, cols).

    SINGLE (BLOCK_C >= cols): each row is loaded once, whole, and held in registers through its amax, scale and
    cast. Otherwise two passes in BLOCK_C steps: the amax, then the scale and cast. EVEN: the tile divides x (no
    masks)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = r < rows
    x_rows = x_ptr + r.to(tl.int64)[:, None] * cols
    q_rows = q_ptr + r.to(tl.int64)[:, None] * cols
    if SINGLE:
        c = tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (c < cols)[None, :]
        x = masked_load(x_rows + c[None, :], mask, EVEN)
        scale, recip = _scale_and_reciprocal(abs_max_bits(x, 1).to(tl.float32, bitcast=True))
        masked_store(scale_ptr + r, scale, row_ok, EVEN)
        masked_store(q_rows + c[None, :], to_e4m3_bits(to_fp32(x) * recip[:, None], EXACT), mask, EVEN)
    else:
        amax = tl.zeros((BLOCK_R,), tl.int32)
        for c0 in range(0, cols, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            mask = row_ok[:, None] & (c < cols)[None, :]
            amax = tl.maximum(amax, abs_max_bits(masked_load(x_rows + c[None, :], mask, EVEN), 1))
        scale, recip = _scale_and_reciprocal(amax.to(tl.float32, bitcast=True))
        masked_store(scale_ptr + r, scale, row_ok, EVEN)
        for c0 in range(0, cols, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            mask = row_ok[:, None] & (c < cols)[None, :]
            x = to_fp32(masked_load(x_rows + c[None, :], mask, EVEN))
            masked_store(q_rows + c[None, :], to_e4m3_bits(x * recip[:, None], EXACT), mask, EVEN)


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
    if HAS_OFFS:
        # Clamped to [0, rows] like padding.group_bounds: malformed offs never address outside x.
        start = tl.minimum(tl.maximum(tl.load(offs_ptr + g - 1, mask=g > 0, other=0), 0), rows)
        end = tl.minimum(tl.maximum(tl.load(offs_ptr + g), start), rows)
    else:
        start = 0
        end = rows
    x_cols = x_ptr + g.to(tl.int64) * stride_xg + c.to(tl.int64)[None, :] * stride_xc
    q_cols = q_ptr + g.to(tl.int64) * stride_qg + c.to(tl.int64)[None, :] * stride_qc

    amax = tl.zeros((BLOCK_C,), tl.float32)
    for m0 in range(start, end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        mask = (m < end)[:, None] & col_ok[None, :]
        x = to_fp32(tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0))
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
    scale, recip = _scale_and_reciprocal(amax)
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
    scale, recip = _scale_and_reciprocal(amax_bits.to(tl.float32, bitcast=True))
    tl.store(scale_ptr, scale, mask=c < scale_limit)
    # Rows [lo, hi) on 16-row boundaries (every group of a 16-aligned padding, every 3D shape with N % 16 == 0):
    # said so, the transposed store goes out as 16-byte vectors; otherwise byte by byte, in steps small enough that
    # the byte stores' addresses do not set the kernel's register count. (Said by rounding, which here changes
    # nothing: triton 3.6 drops tl.multiple_of on a scalar.)
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
def _strip_amax(x_cols, col_ok, lo, hi, stride_xm, STEP: tl.constexpr, STAGES: tl.constexpr, PREFETCH: tl.constexpr):
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
        g = item // n_strips
        c = (item % n_strips) * STRIP + tl.arange(0, STRIP)
        col_ok = c < cols
        if HAS_OFFS:  # clamped like padding.group_bounds: malformed offs never address outside x
            start = tl.minimum(tl.maximum(tl.load(offs_ptr + g - 1, mask=g > 0, other=0), 0), rows)
            end = tl.minimum(tl.maximum(tl.load(offs_ptr + g), start), rows)
        else:
            start = 0
            end = rows
        x_cols = x_ptr + g.to(tl.int64) * stride_xg + c.to(tl.int64)[None, :] * stride_xc
        q_cols = q_ptr + g.to(tl.int64) * stride_qg + c.to(tl.int64)[None, :] * stride_qc
        amax = _strip_amax(x_cols, col_ok, start, end, stride_xm, STEP, STAGES, PREFETCH)
        scale, recip = _scale_and_reciprocal(amax.to(tl.float32, bitcast=True))
        tl.store(scale_ptr + g * cols + c, scale, mask=col_ok)
        if (start % 16 == 0) & (end % 16 == 0):  # 16-byte transposed stores (see ``_strip_scale_pass``)
            _strip_scale_steps(x_cols, q_cols, recip, col_ok, start // 16 * 16, end // 16 * 16, stride_xm, STEP,
                               STAGES, PREFETCH, EXACT)  # fmt: skip
        else:
            _strip_scale_steps(x_cols, q_cols, recip, col_ok, start, end, stride_xm, _UNALIGNED_STEP, 1, False, EXACT)


# ---------------------------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fp8RowwiseConfig:
    """One launch of the rows kernel (``quantize_fp8_rowwise``, ``quantize_fp8_rowwise_3d(along="K")``) or of the
    two-pass colwise kernel (``quantize_fp8_rowwise_3d(along="N")``, ``quantize_fp8_rowwise_k_groups``). A program
    owns whole rows (rows kernel) or whole columns of one group (colwise), so it finds their amax alone, with no
    second launch or atomics."""

    # Rows per program (rows kernel), or per step of the two passes down the columns (colwise); a power of two.
    block_rows: int
    # Rows kernel: the longest row held whole in registers and read once (rows of K <= block_cols take one step of
    # next_pow2(K) columns); longer rows take two passes in steps of block_cols columns. Colwise: columns per
    # program. A power of two.
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

    def __post_init__(self):
        check_fields_power_of_two(self, "strip_cols", "step_rows", "num_warps")
        check_int("WalkConfig.programs_per_sm", self.programs_per_sm, 1, 32)
        check_int("WalkConfig.num_stages", self.num_stages, 1, 4)
        if not isinstance(self.prefetch, bool):
            raise InputError(f"WalkConfig.prefetch must be a bool, got {self.prefetch!r}")


# The rows kernel's default holds rows of up to SINGLE_PASS_MAX elements in registers (one read) and gives each
# program at least ROWS_TILE elements; not measured yet (docs/perf-log.md has the predictions).
SINGLE_PASS_MAX = 16384
ROWS_TILE = 8192
# The old default, kept as the two-pass control of the tuning script.
TWO_PASS_ROWS_CONFIG = Fp8RowwiseConfig(4, 1024, num_warps=4)
COLWISE_CONFIG = ColwiseConfig(strip_cols=16, chunk_rows=512, step_rows=512, group_cols=256, num_warps=8)
# 3D along N: the walking kernel, strips of 64 columns in 512-row steps, one program per SM (measured faster than the
# strips kernel on DeepSeek-V3's and Scout's weights; docs/perf-log.md).
ALONG_N_CONFIG = WalkConfig(strip_cols=64, step_rows=512, num_warps=8, programs_per_sm=1)
# k_groups: a group's strip holds up to all M rows, and the one-launch kernel's pass 2 did not find them in L2
# (slower than both reads from device memory: docs/perf-log.md); the split launch reads twice, and is counted so.
K_GROUPS_CONFIG = ColwiseConfig(strip_cols=16, chunk_rows=512, step_rows=512, group_cols=256, num_warps=8, split=True)
# The old colwise default: the two-pass kernel, both reads from device memory.
TWO_PASS_COLWISE_CONFIG = Fp8RowwiseConfig(64, 64, num_warps=4)


def default_rowwise_config(cols: int) -> Fp8RowwiseConfig:
    """The rows kernel's launch for rows of ``cols`` elements when none is given: whole rows (one read) up to
    SINGLE_PASS_MAX elements, ROWS_TILE elements per program at least; longer rows in two passes of 4096 columns.
    (The interpreter runs the same launch: its cost is per program and per op, and these tiles are large.)"""
    width = max(triton.next_power_of_2(max(cols, 1)), 16)
    if width > SINGLE_PASS_MAX:
        return Fp8RowwiseConfig(1, 4096, num_warps=8)
    return Fp8RowwiseConfig(max(ROWS_TILE // width, 1), width, num_warps=8 if width <= 8192 else 16)


def _takes_two_passes(config: Fp8RowwiseConfig, cols: int) -> bool:
    return triton.next_power_of_2(max(cols, 1)) > config.block_cols


# ---------------------------------------------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------------------------------------------


def _rowwise(x2d: torch.Tensor, config: Fp8RowwiseConfig | None) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x2d.shape
    config = config or default_rowwise_config(cols)
    q = torch.empty(rows, cols, dtype=DATA_DTYPE, device=x2d.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x2d.device)
    if rows and cols:
        single = not _takes_two_passes(config, cols)
        block_c = triton.next_power_of_2(cols) if single else config.block_cols
        even = cols % block_c == 0 and rows % config.block_rows == 0
        grid = (triton.cdiv(rows, config.block_rows),)
        _rowwise_kernel[grid](
            x2d, q.view(torch.uint8), scale, rows, cols,
            BLOCK_R=config.block_rows, BLOCK_C=block_c, SINGLE=single, EVEN=even, EXACT=INTERPRET,
            num_warps=config.num_warps,
        )  # fmt: skip
    return q, scale


def quantize_fp8_rowwise(
    x: torch.Tensor, *, config: Fp8RowwiseConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) bf16/fp32 row-major -> (q (M, K) e4m3, scale (M,) fp32): one scale per row, along K. ``config``:
    the rows kernel's launch (None: ``default_rowwise_config(K)``)."""
    check_tensor("x", x, dtypes=INPUT_DTYPES, ndim=2)
    check_config("config", config, Fp8RowwiseConfig)
    return _rowwise(x, config)


def quantize_fp8_rowwise_3d(
    w: torch.Tensor, along: str = "K", *, config: Fp8RowwiseConfig | ColwiseConfig | WalkConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert weights w (G, N, K) bf16/fp32, contiguous, quantized along the next GEMM's contraction dim.

    along="K" (forward, out = x @ w_g.T): q (G, N, K), scale (G, N), amax over k.
    along="N" (backward input, dx = dy @ w_g): q (G, K, N) with N contiguous, scale (G, K), amax over n.
    ``config``: the launch. Along K a ``Fp8RowwiseConfig`` (None: ``default_rowwise_config(K)``); along N a
    ``WalkConfig`` (the walking kernel; None: ``ALONG_N_CONFIG``), a ``ColwiseConfig`` (the strips kernel) or a
    ``Fp8RowwiseConfig`` (the two-pass colwise kernel).
    """
    check_tensor("w", w, dtypes=INPUT_DTYPES, ndim=3)
    G, N, K = w.shape
    if along == "K":
        check_config("config", config, Fp8RowwiseConfig, " along K (the rows kernel)")
        q, scale = _rowwise(w.view(G * N, K), config)
        return q.view(G, N, K), scale.view(G, N)
    if along != "N":
        raise InputError(f"along must be 'K' or 'N', got {along!r}")
    check_config("config", config, (ColwiseConfig, WalkConfig, Fp8RowwiseConfig))
    if G > MAX_GROUPS:
        raise InputError(f"w must hold at most {MAX_GROUPS} experts (dim 0), got {G}")
    q = torch.empty(G, K, N, dtype=DATA_DTYPE, device=w.device)
    scale = torch.empty(G, K, dtype=torch.float32, device=w.device)
    if q.numel():
        _launch_colwise(w, None, q, scale, G, rows=N, cols=K, x_strides=w.stride(), q_strides=(K * N, N),
                        config=config or ALONG_N_CONFIG)  # fmt: skip
    return q, scale


def quantize_fp8_rowwise_k_groups(
    x: torch.Tensor, offs: torch.Tensor, *, config: ColwiseConfig | WalkConfig | Fp8RowwiseConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group scales for the 2D x 2D weight-gradient GEMM, which contracts over the token dim M.

    x (M, R) bf16/fp32 (grad_out (M, N) or the activations (M, K); any strides, so ``a.t()`` of an (R, M) matrix
    works without a copy); ``offs`` int32 (G,) cumulative group ends along M, read on the device only.
    Returns q (R, M) e4m3 row-major (M contiguous: pass ``q`` as ``_scaled_grouped_mm``'s row-major mat_a or
    ``q.t()`` as its column-major mat_b) and scale (G, R) fp32, scale[g, r] = amax over group g's rows of
    |x[:, r]| / 448 (floored as above; an empty group counts as all zero). Columns of q past ``offs[-1]`` are not
    written. ``config``: a ``ColwiseConfig`` (the strips kernel; None: ``K_GROUPS_CONFIG``), a ``WalkConfig`` (the
    walking kernel) or a ``Fp8RowwiseConfig`` (the two-pass colwise kernel).
    """
    check_tensor("x", x, dtypes=INPUT_DTYPES, ndim=2, contiguous=False)
    check_group_offsets(offs, x, x.shape[0])
    check_config("config", config, (ColwiseConfig, WalkConfig, Fp8RowwiseConfig))
    config = config or K_GROUPS_CONFIG
    M, R = x.shape
    G = offs.numel()
    q = torch.empty(R, M, dtype=DATA_DTYPE, device=x.device)
    scale = torch.empty(G, R, dtype=torch.float32, device=x.device)
    if R:
        _launch_colwise(
            x, offs, q, scale, G, rows=M, cols=R, x_strides=(0, *x.stride()), q_strides=(0, M), config=config
        )
    return q, scale


def _launch_colwise(x, offs, q, scale, groups, *, rows, cols, x_strides, q_strides, config):
    if isinstance(config, WalkConfig):
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        items = groups * triton.cdiv(cols, config.strip_cols)
        programs = max(min(items, sms * config.programs_per_sm), 1)
        _walk_kernel[(programs,)](
            x, offs, q.view(torch.uint8), scale, rows, cols, groups, programs, *x_strides, *q_strides,
            HAS_OFFS=offs is not None, STRIP=config.strip_cols, STEP=config.step_rows, STAGES=config.num_stages,
            PREFETCH=config.prefetch, EXACT=INTERPRET, num_warps=config.num_warps,
        )  # fmt: skip
        return
    if isinstance(config, Fp8RowwiseConfig):
        grid = (triton.cdiv(cols, config.block_cols), groups)
        _colwise_kernel[grid](
            x, offs, q.view(torch.uint8), scale, rows, cols, *x_strides, *q_strides,
            HAS_OFFS=offs is not None, BLOCK_M=config.block_rows, BLOCK_C=config.block_cols, EXACT=INTERPRET,
            num_warps=config.num_warps,
        )  # fmt: skip
        return
    strip, chunk = config.strip_cols, config.chunk_rows
    n_strips = triton.cdiv(cols, strip)
    group = config.group_cols // strip
    # Chunks in all: an upper bound, so the launch needs no group sizes (each group rounds up, an empty one counts 1).
    chunks = triton.cdiv(rows, chunk) + groups if offs is not None else groups * max(triton.cdiv(rows, chunk), 1)
    grid = (chunks * group, triton.cdiv(n_strips, group))
    work = torch.zeros(groups * (cols + n_strips), dtype=torch.int32, device=x.device)
    phases = (1, 2) if config.split else (0,)
    for phase in phases:
        _strips_kernel[grid](
            x, offs, q.view(torch.uint8), scale, work, rows, cols, groups, *x_strides, *q_strides,
            HAS_OFFS=offs is not None, CHUNK=chunk, STRIP=strip, STEP=config.step_rows, GROUP=group, PHASE=phase,
            STAGES=config.num_stages, PREFETCH=config.prefetch, BLOCK_G=triton.next_power_of_2(groups), EXACT=INTERPRET,
            num_warps=config.num_warps,
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Costs: every input read once (twice where the kernel reads twice from device memory), every output written once
# ---------------------------------------------------------------------------------------------------------------


def quantize_fp8_rowwise_cost(
    rows: int, cols: int, in_dtype: torch.dtype, config: Fp8RowwiseConfig | None = None
) -> Cost:
    """``quantize_fp8_rowwise`` of a (rows, cols) tensor: read it, write e4m3 data and one fp32 scale per row. Rows
    too long for one step of the launch (``config``; None: the default) are read twice, and counted twice."""
    reads = 2 if _takes_two_passes(config or default_rowwise_config(cols), cols) else 1
    return Cost(bytes_read=reads * rows * cols * in_dtype.itemsize, bytes_written=rows * cols + 4 * rows)


def quantize_fp8_rowwise_3d_cost(G: int, N: int, K: int, in_dtype: torch.dtype, along: str = "K", config=None) -> Cost:
    """``quantize_fp8_rowwise_3d`` of (G, N, K) weights: G*N scales along K, G*K along N; a launch that reads twice
    from device memory (see ``quantize_fp8_rowwise_cost``, ``quantize_fp8_rowwise_k_groups_cost``) counts twice."""
    if along == "K":
        return quantize_fp8_rowwise_cost(G * N, K, in_dtype, config)
    return _colwise_cost(G * N, K, G, in_dtype, config or ALONG_N_CONFIG)


def quantize_fp8_rowwise_k_groups_cost(M: int, R: int, G: int, in_dtype: torch.dtype, config=None) -> Cost:
    """``quantize_fp8_rowwise_k_groups`` of (M, R) in G groups: read it, write (R, M) e4m3 and G*R fp32 scales.

    A group's column scale needs all of the group's rows (up to all M), more than a program can hold, so every
    launch reads the input twice: the amax, then the scale and cast. A one-launch ``ColwiseConfig`` and a
    ``WalkConfig`` take the second read from L2 when the strips in flight fit there, and the cost counts one read;
    the split ``ColwiseConfig`` (two launches) and the two-pass ``Fp8RowwiseConfig`` kernel reread from device
    memory, and the cost counts both."""
    return _colwise_cost(M, R, G, in_dtype, config or K_GROUPS_CONFIG)


def _colwise_cost(rows: int, cols: int, G: int, in_dtype: torch.dtype, config) -> Cost:
    reads = 2 if isinstance(config, Fp8RowwiseConfig) or (isinstance(config, ColwiseConfig) and config.split) else 1
    return Cost(bytes_read=reads * rows * cols * in_dtype.itemsize, bytes_written=rows * cols + 4 * G * cols)
