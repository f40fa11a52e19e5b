"""Both FP8 rowwise copies of the experts' weights from one read of them.

The FP8 rowwise layer quantizes each expert weight w (G, N, K) twice a step: along K for the forward
(``quantize_fp8_rowwise_3d(along="K")``, a scale per row) and along N for dgrad (``along="N"``, a scale per column,
the output transposed to (G, K, N)). ``fp8_amax`` shares one amax pass between the two, yet each still reads w from
device memory. Here one launch writes both and w comes from device memory once.

A column's scale needs the whole column of its expert, so the expert is the unit, worked in two kinds of item:

* rows items (``row_span`` whole rows of expert g): quantized along K (a row's scale is its own), their column amax
  folded into a (G, K) table with one atomic max a column, then counted done for g;
* chunk items (``chunk_rows`` x ``strip_cols`` of expert g): once every rows item of g is counted, the column
  scales from the table and the chunk cast, stored transposed. This second read of w comes from L2: the rows items
  of g read it moments before.

Order: persistent programs take tickets from an atomic counter, so work goes out in ticket order whatever order the
programs run in, and ticket order is expert by expert: g's rows items, then the chunk items of expert g - lag. A
program holds its current ticket and the next. A chunk item waits (spins on g's count) only for rows items of
earlier tickets; the earliest waiting chunk item waits on rows items that are running (they never wait) or held
next by programs whose current item comes before them and so does not wait either: nothing deadlocks, whatever
fits on the GPU. The interpreter, which runs one program to its end first, never waits. L2 must hold about lag + 1
experts between their two reads (``fits_l2``), which bounds where one launch could beat ``fp8_amax``'s pair.

Measured (docs/perf-log.md, "Both copies of the experts' weights from one read"): on an H200 this launch is slower
than ``fp8_amax``'s pair at every weight shape tried (its best launch per shape: 1.1-1.6x), so no stage calls it; it
stays as the measured attempt, bit-exact and tested, with its sweep (``tune_fp8_and_fused_quantizers --only both``).

Arithmetic is ``fp8_rowwise``'s (the rows via ``quantize_rows_at``, the chunks via ``fp8_colwise.strip_scale_pass``;
a max is exact in any order), so both copies are bit-identical to the two unfused quantizers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.block_math import magnitude, magnitude_fp32_bits, masked_load
from ..core.cost import Cost
from ..core.format import DATA_DTYPE
from ..core.runtime import (
    INTERPRET,
    MAX_GROUPS,
    InputError,
    check_config,
    check_fields_power_of_two,
    check_int,
    check_tensor,
    persistent_programs,
)
from . import fp8_colwise, fp8_rowwise

# ---------------------------------------------------------------------------------------------------------------
# Plain-torch reference
# ---------------------------------------------------------------------------------------------------------------


def quantize_fp8_rowwise_3d_both_reference(w: torch.Tensor):
    """Reference of ``quantize_fp8_rowwise_3d_both``: along K (q (G, N, K), scale (G, N)) then along N (q (G, K, N),
    scale (G, K)), each ``fp8_rowwise``'s reference."""
    return (*fp8_rowwise.quantize_fp8_rowwise_reference(w),
            *fp8_rowwise.quantize_fp8_rowwise_reference(w.transpose(-2, -1)))  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _rows_item(w_ptr, qk_ptr, sk_ptr, amax_ptr, done_ptr, g, item, N, K, SPAN: tl.constexpr, BLOCK_R: tl.constexpr,
               BLOCK_C: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """Rows [item * SPAN, +SPAN) of expert g quantized along K, BLOCK_R whole rows at a time, their column amax
    folded into amax[g] (int32 bits of fp32) and the item counted in done[g]."""
    c = tl.arange(0, BLOCK_C)
    col_ok = c < K
    base = g.to(tl.int64) * N
    hi = tl.minimum(item * SPAN + SPAN, N)
    acc = magnitude(tl.zeros((BLOCK_R, BLOCK_C), w_ptr.dtype.element_ty))
    for r0 in range(item * SPAN, hi, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        row_ok = r < hi
        rows = base + r
        x = masked_load(w_ptr + rows[:, None] * K + c[None, :], row_ok[:, None] & col_ok[None, :], EVEN)
        fp8_rowwise.quantize_rows_at(x, qk_ptr, sk_ptr, rows, row_ok, c, col_ok, K, EVEN, EXACT)
        acc = tl.maximum(acc, magnitude(x))
    bits = tl.max(magnitude_fp32_bits(acc, w_ptr.dtype.element_ty == tl.bfloat16), 0)
    seen = tl.atomic_max(amax_ptr + g * K + c, bits, mask=col_ok, sem="relaxed", scope="gpu")
    # The count must follow every thread's atomic max: it is computed from their results (always 1, amax bits are
    # >= 0, which the compiler cannot know), as fp8_colwise's strips kernel counts its chunks; a release.
    one = 1 + (tl.min(tl.where(col_ok, seen, 0), 0) < 0).to(tl.int32)
    tl.atomic_add(done_ptr + g, one, sem="acq_rel", scope="gpu")


@triton.jit
def _chunk_item(w_ptr, qn_ptr, sn_ptr, amax_ptr, done_ptr, g, item, N, K, rows_items, CHUNK: tl.constexpr,
                STRIP: tl.constexpr, STEP: tl.constexpr, PREFETCH: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """Chunk ``item`` of expert g (strips fastest: neighbouring tickets read neighbouring columns of the same rows)
    scaled from the amax table once done[g] counts all ``rows_items``, cast and stored transposed. Under the
    interpreter (EXACT) programs run one at a time, so a wait could never end: there a chunk item does not wait,
    and one run before its rows items (a wrong ticket order) scales from a partial table, which its tests see."""
    n_strips = tl.cdiv(K, STRIP)
    strip = item % n_strips
    lo = (item // n_strips) * CHUNK
    c = strip * STRIP + tl.arange(0, STRIP)
    count = tl.atomic_add(done_ptr + g, 0, sem="acquire", scope="gpu")
    if not EXACT:
        while count < rows_items:
            count = tl.atomic_add(done_ptr + g, 0, sem="acquire", scope="gpu")
    fp8_colwise.strip_scale_pass(
        w_ptr + g.to(tl.int64) * N * K + c.to(tl.int64)[None, :], qn_ptr + g.to(tl.int64) * K * N
        + c.to(tl.int64)[None, :] * N, sn_ptr + g * K + c, amax_ptr + g * K + c, c, K, tl.where(lo == 0, K, 0), lo,
        tl.minimum(lo + CHUNK, N), K, STEP, 1, PREFETCH, True, EXACT,
    )  # fmt: skip


@triton.jit
def _both_kernel(
    w_ptr, qk_ptr, sk_ptr, qn_ptr, sn_ptr, work_ptr, G, N, K, rows_items, chunk_items, LAG,
    SPAN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, CHUNK: tl.constexpr, STRIP: tl.constexpr,
    STEP: tl.constexpr, PREFETCH: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """A persistent program working items by ticket (module doc) until they run out: slot s holds the rows items of
    expert s (s < G), then the chunk items of expert s - LAG (s >= LAG). The next ticket is taken before the current
    item runs, so its round trip hides behind the work. ``work``: the ticket counter, done (G,), amax (G, K) int32,
    zero at launch."""
    done_ptr = work_ptr + 1
    amax_ptr = done_ptr + G
    per_slot = rows_items + chunk_items
    total = (G + LAG) * per_slot
    ticket = tl.atomic_add(work_ptr, 1, sem="relaxed", scope="gpu")
    while ticket < total:
        upcoming = tl.atomic_add(work_ptr, 1, sem="relaxed", scope="gpu")
        slot = ticket // per_slot
        item = ticket % per_slot
        if item < rows_items:
            if slot < G:
                _rows_item(w_ptr, qk_ptr, sk_ptr, amax_ptr, done_ptr, slot, item, N, K, SPAN, BLOCK_R, BLOCK_C, EVEN,
                           EXACT)  # fmt: skip
        elif slot >= LAG:
            _chunk_item(w_ptr, qn_ptr, sn_ptr, amax_ptr, done_ptr, slot - LAG, item - rows_items, N, K, rows_items,
                        CHUNK, STRIP, STEP, PREFETCH, EXACT)  # fmt: skip
        ticket = upcoming


# ---------------------------------------------------------------------------------------------------------------
# Launch
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BothConfig:
    """One launch of ``quantize_fp8_rowwise_3d_both``'s kernel; every size a power of two."""

    # Rows a rows item quantizes (whole rows): more rows fold fewer atomics a column, fewer keep more items of an
    # expert side by side (and its chunk items waiting less on its last rows item).
    row_span: int = 64
    # Rows a step of a rows item holds in registers; 0: fp8_rowwise.default_rowwise_config's (ROWS_TILE elements).
    block_rows: int = 0
    # A chunk item: chunk_rows x strip_cols of one expert, walked step_rows at a time. 64 bf16 columns cover whole
    # 128-byte lines of each row; the transposed stores go out in 16-byte vectors on 16-row boundaries.
    strip_cols: int = 64
    chunk_rows: int = 256
    step_rows: int = 64
    # Slots between an expert's rows items and its chunk items. The programs in flight hold SMs x programs_per_sm
    # consecutive tickets; a chunk item spins (holding its program) while its expert's rows items are among them, so
    # lag x (items a slot) should pass that; more lag keeps more experts in L2 between the two reads.
    lag: int = 2
    num_warps: int = 4
    # Persistent programs an SM.
    programs_per_sm: int = 2
    # Chunk items keep the next step's load in flight (fp8_colwise's prefetch).
    prefetch: bool = True

    def __post_init__(self):
        check_fields_power_of_two(self, "row_span", "strip_cols", "chunk_rows", "step_rows", "num_warps")
        if self.block_rows:
            check_fields_power_of_two(self, "block_rows")
            if self.block_rows > self.row_span:
                raise InputError(f"BothConfig.block_rows ({self.block_rows}) must not exceed row_span "
                                 f"({self.row_span})")  # fmt: skip
        check_int("BothConfig.lag", self.lag, 0, 8)
        check_int("BothConfig.programs_per_sm", self.programs_per_sm, 1, 32)
        if not isinstance(self.prefetch, bool):
            raise InputError(f"BothConfig.prefetch must be a bool, got {self.prefetch!r}")


# The longest row a rows item holds whole in registers (as fp8_amax's rows kernel).
MAX_COLS = fp8_rowwise.SINGLE_PASS_MAX
DEFAULT_CONFIG = BothConfig()


def fits_l2(N: int, K: int, in_dtype: torch.dtype, l2_bytes: int, config: BothConfig = DEFAULT_CONFIG) -> bool:
    """Whether lag + 1 experts of (N, K) ``in_dtype`` and both their quantized copies fit in half of an L2 of
    ``l2_bytes``, the budget under which the chunk items find their expert still there (module doc)."""
    return (config.lag + 1) * N * K * (in_dtype.itemsize + 2) <= l2_bytes // 2


def quantize_fp8_rowwise_3d_both(
    w: torch.Tensor, *, config: BothConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``quantize_fp8_rowwise_3d(w, along="K")`` and ``(w, along="N")`` of expert weights w (G, N, K) bf16/fp32,
    contiguous, in one launch reading w from device memory once: (q (G, N, K), scale (G, N), q (G, K, N), scale
    (G, K)), bit-identical to the two. ``config``: the launch (None: ``DEFAULT_CONFIG``)."""
    check_tensor("w", w, dtypes=fp8_rowwise.INPUT_DTYPES, ndim=3)
    check_config("config", config, BothConfig)
    config = config or DEFAULT_CONFIG
    G, N, K = w.shape
    if G > MAX_GROUPS:
        raise InputError(f"w must hold at most {MAX_GROUPS} experts (dim 0), got {G}")
    if K > MAX_COLS:
        raise InputError(f"rows of {K} elements are longer than the {MAX_COLS} a rows item holds whole; quantize "
                         "along K and along N apart (fp8_amax)")  # fmt: skip
    qk = torch.empty(G, N, K, dtype=DATA_DTYPE, device=w.device)
    sk = torch.empty(G, N, dtype=torch.float32, device=w.device)
    qn = torch.empty(G, K, N, dtype=DATA_DTYPE, device=w.device)
    sn = torch.empty(G, K, dtype=torch.float32, device=w.device)
    if not qk.numel():
        return qk, sk, qn, sn
    width = max(triton.next_power_of_2(K), 16)
    block_r = min(config.block_rows or fp8_rowwise.default_rowwise_config(K).block_rows, config.row_span)
    rows_items = triton.cdiv(N, config.row_span)
    chunk_items = triton.cdiv(N, config.chunk_rows) * triton.cdiv(K, config.strip_cols)
    work = torch.zeros(1 + G + G * K, dtype=torch.int32, device=w.device)
    programs = persistent_programs((G + config.lag) * (rows_items + chunk_items), w.device, config.programs_per_sm)
    _both_kernel[(programs,)](
        w, qk.view(torch.uint8), sk, qn.view(torch.uint8), sn, work, G, N, K, rows_items, chunk_items, config.lag,
        SPAN=config.row_span, BLOCK_R=block_r, BLOCK_C=width, CHUNK=config.chunk_rows, STRIP=config.strip_cols,
        STEP=config.step_rows, PREFETCH=config.prefetch, EVEN=width == K and N % block_r == 0, EXACT=INTERPRET,
        num_warps=config.num_warps,
    )  # fmt: skip
    return qk, sk, qn, sn


def both_cost(G: int, N: int, K: int, in_dtype: torch.dtype) -> Cost:
    """``quantize_fp8_rowwise_3d_both`` of (G, N, K): w read once, both e4m3 copies and their scales written (the
    amax table and counters stay in L2, and are not counted)."""
    return Cost(G * N * K * in_dtype.itemsize, 2 * G * N * K + 4 * G * (N + K))
