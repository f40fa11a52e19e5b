"""FP8 rowwise quantizers that share one amax pass between the two quantizations of a tensor.

Every tensor of the FP8 rowwise step is quantized twice, once along each dim:

| tensor | first (reads every element) | second (a scale per column of a group, output transposed) |
|---|---|---|
| A (M, K) | rowwise along K, forward | per token group along M, backward_weight |
| grad_out (M, N) | rowwise along N, backward_input | per token group along M, backward_weight |
| w (G, N, K) | along K, forward | along N, backward_input |

The second one's scale is the amax down a whole column of a group (2048 to all M rows), more than a program can
hold, so on its own it reads the tensor twice (``fp8_colwise``). Here the first quantizer, which reads every element
anyway, also folds each group's column amax into a (G, C) fp32 table as it goes; the second then scales and casts
from that table in one read and one write (``fp8_colwise.launch_from_amax``, the strips kernel's pass 2). A max is
exact in any order, so both outputs are bit-identical to ``fp8_rowwise``'s unfused quantizers; the table costs
4 * G * C bytes, which the autograd function keeps from the forward to the backward (A, w) or from one backward
pass to the next (grad_out).

* ``quantize_fp8_rowwise_with_amax(x, offs)``, ``quantize_fp8_rowwise_3d_with_amax(w)``: the first quantizers
  (``quantize_fp8_rowwise``, ``quantize_fp8_rowwise_3d(along="K")``) plus the table.
* ``quantize_fp8_rowwise_k_groups_from_amax(x, amax, offs)``, ``quantize_fp8_rowwise_3d_from_amax(w, amax)``: the
  second ones (``quantize_fp8_rowwise_k_groups``, ``quantize_fp8_rowwise_3d(along="N")``) from the table.

The rows kernel here is a persistent grid: each program quantizes a contiguous span of rows, whole rows at a time
(``fp8_rowwise.quantize_whole_rows``), and keeps the running column amax of the group it is in in registers, folding
it into the table with one atomic max per column when the group changes and at the end. So the atomics number
programs x (groups crossed + 1) x columns, not rows x columns. Rows longer than ``fp8_rowwise.SINGLE_PASS_MAX``
(which the rows kernel reads twice) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.block_math import Producer, halves_lanes, magnitude, magnitude_fp32_bits, producer_args
from ..core.cost import Cost
from ..core.format import DATA_DTYPE
from ..core.runtime import (
    INTERPRET,
    MAX_GROUPS,
    InputError,
    check_config,
    check_fields_power_of_two,
    check_group_offsets,
    check_int,
    check_same_device,
    check_shape,
    check_tensor,
    launch_by_width,
    sm_count,
)
from ..layouts.padding import pick
from . import fp8_colwise, fp8_rowwise

# ---------------------------------------------------------------------------------------------------------------
# Plain-torch references
# ---------------------------------------------------------------------------------------------------------------


def column_amax_reference(x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x (M, C), offs (G,) group ends (read on the host) -> (G, C) fp32: max |x| down each column of each group's
    rows, 0 for an empty group."""
    amax = torch.zeros(offs.numel(), x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            amax[g] = x[start:end].float().abs().amax(dim=0)
        start = end
    return amax


def quantize_fp8_rowwise_with_amax_reference(x: torch.Tensor, offs: torch.Tensor):
    """Reference of ``quantize_fp8_rowwise_with_amax``: (q, scale, amax)."""
    return (*fp8_rowwise.quantize_fp8_rowwise_reference(x), column_amax_reference(x, offs))


def quantize_fp8_rowwise_3d_with_amax_reference(w: torch.Tensor):
    """Reference of ``quantize_fp8_rowwise_3d_with_amax``: (q, scale, amax), amax (G, K) over each expert's N rows."""
    return (*fp8_rowwise.quantize_fp8_rowwise_reference(w), w.float().abs().amax(dim=1))


def quantize_fp8_rowwise_k_groups_from_amax_reference(x: torch.Tensor, amax: torch.Tensor, offs: torch.Tensor):
    """Reference of ``quantize_fp8_rowwise_k_groups_from_amax``: scales from ``amax``, not from x."""
    return fp8_rowwise.quantize_fp8_rowwise_k_groups_reference(x, offs, amax)


def quantize_fp8_rowwise_3d_from_amax_reference(w: torch.Tensor, amax: torch.Tensor):
    """Reference of ``quantize_fp8_rowwise_3d_from_amax``: (q (G, K, N), scale (G, K)) scaled from ``amax``."""
    return fp8_rowwise.quantize_with_amax_reference(w.transpose(-2, -1), amax)


# ---------------------------------------------------------------------------------------------------------------
# The rows kernel with the column amax
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _fold(amax_ptr, acc, g, c, col_ok, cols, G):
    """Atomic max of one group's column amax bits ``acc`` (lanes at columns c, col_ok those inside the row) into row
    g of the (G, cols) int32 table; nothing for a g outside [0, G) (before the first group of a program, past the
    last group end)."""
    limit = tl.where((g >= 0) & (g < G), cols, 0)
    mask = col_ok & (c < limit)
    tl.atomic_max(amax_ptr + tl.maximum(g, 0).to(tl.int64) * cols + c, acc, mask=mask, sem="relaxed", scope="gpu")


@triton.jit
def _rows_amax_kernel(
    x_ptr, offs_ptr, q_ptr, scale_ptr, amax_ptr, rows, cols, G, group_rows, span, p_a, p_b, p_c, p_sa, p_sb,
    HAS_OFFS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
    EVEN: tl.constexpr, EXACT: tl.constexpr, PRODUCE: tl.constexpr, VARIANT: tl.constexpr, HALVES: tl.constexpr,
    AMAX: tl.constexpr,
):  # fmt: skip
    """``fp8_rowwise``'s rows kernel over rows [pid * span, (pid + 1) * span) of x (rows, cols), BLOCK_R whole rows
    at a time, folding the column amax of each group's rows into amax (G, cols) (int32 bits of fp32, zero at
    launch). The span is walked group by group: group g is rows [offs[g-1], offs[g]) (HAS_OFFS; the rows past the
    last end, "group" G, are quantized and folded nowhere) or [g * group_rows, (g + 1) * group_rows). Each
    group's part of the span is quantized in BLOCK_R-row steps (the last one masked at the group's end) while the
    running column amax stays in registers, then folded with one atomic max per column: x is dead by then, so the
    fold's addresses never share the registers with a row. The rows come from PRODUCE (``block_math.load_rows``'
    signature, its arguments p_*, VARIANT): the load of x, or a fused stage's producer that computes them and
    writes them to x (``moe_fused``). HALVES: the tile's lanes hold a row of two halves of cols / 2 as two halves of
    BLOCK_C / 2 (lane j of the second at column cols / 2 + j), for a producer that computes both halves of a column
    at once (``swiglu.swiglu_backward_halves_producer``). Without AMAX, no table: the rows quantized alone (one
    group of all rows), for a fused stage whose column amax nothing reads."""
    first = tl.program_id(0) * span
    last = tl.minimum(first + span, rows)
    if HALVES:
        c, col_ok = halves_lanes(BLOCK_C, cols)
    else:
        c = tl.arange(0, BLOCK_C)
        col_ok = c < cols
    if HAS_OFFS:
        # Ends clamped to [0, rows] as padding.group_bounds does: malformed offs never address outside x.
        lane = tl.arange(0, BLOCK_G)
        ends = tl.minimum(tl.maximum(tl.load(offs_ptr + lane, mask=lane < G, other=0), 0), rows)
        g_first = tl.sum(((lane < G) & (ends <= first)).to(tl.int32), 0)
        g_last = tl.sum(((lane < G) & (ends <= last - 1)).to(tl.int32), 0)
    else:
        g_first = first // group_rows
        g_last = (last - 1) // group_rows
    for g in range(g_first, g_last + 1):
        if HAS_OFFS:
            start = pick(ends, g - 1, BLOCK_G)
            end = tl.where(g < G, pick(ends, g, BLOCK_G), rows)
        else:
            start = g * group_rows
            end = start + group_rows
        hi = tl.minimum(end, last)
        acc = magnitude(tl.zeros((BLOCK_R, BLOCK_C), x_ptr.dtype.element_ty))
        for r0 in range(tl.maximum(start, first), hi, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            x = PRODUCE(x_ptr + r.to(tl.int64)[:, None] * cols + c[None, :], r.to(tl.int64), r < hi, c, col_ok, cols,
                        p_a, p_b, p_c, p_sa, p_sb, VARIANT, EVEN, EXACT)  # fmt: skip
            fp8_rowwise.quantize_rows_at(x, q_ptr, scale_ptr, r, r < hi, c, col_ok, cols, EVEN, EXACT)
            if AMAX:
                acc = tl.maximum(acc, magnitude(x))
        if AMAX:
            bits = tl.max(magnitude_fp32_bits(acc, x_ptr.dtype.element_ty == tl.bfloat16), 0)
            _fold(amax_ptr, bits, g, c, col_ok, cols, G)


@dataclass(frozen=True)
class AmaxRowsConfig:
    """One launch of the rows kernel with the column amax (``quantize_fp8_rowwise_with_amax``,
    ``quantize_fp8_rowwise_3d_with_amax``)."""

    # Programs per SM of the persistent grid (SMs x this programs, each a contiguous span of rows): more keeps more
    # rows in flight, fewer makes fewer atomics (each program folds every column of every group it crosses once).
    programs_per_sm: int = 2
    # Warps per program: a whole row of next_pow2(C) elements, and its column amax, are spread over them.
    num_warps: int = 8
    # Rows per step, a power of two; 0: ``fp8_rowwise.default_rowwise_config``'s (at least ROWS_TILE elements).
    block_rows: int = 0
    # Registers a thread may use (ptxas' maxnreg), 0: the compiler's choice. The kernel is occupancy-bound by its
    # registers (a row and its running column amax live in them): a cap buys programs per SM with spills.
    max_registers: int = 0

    def __post_init__(self):
        check_int("AmaxRowsConfig.programs_per_sm", self.programs_per_sm, 1, 64)
        check_int("AmaxRowsConfig.max_registers", self.max_registers, 0, 255)
        check_fields_power_of_two(self, "num_warps")
        if self.block_rows:
            check_fields_power_of_two(self, "block_rows")


# The longest row the rows kernel here takes: it holds whole rows (and their column amax) in registers.
MAX_COLS = fp8_rowwise.SINGLE_PASS_MAX
# The measured defaults (config=None), chosen by scripts/tune_fp8_and_fused_quantizers.py --only amax
# (docs/perf-log.md).
# Rows kernel: as many programs per SM as its registers allow. Rows of 8192-wide steps (K = 7168, 5120) run faster
# three to an SM under an 80-register cap, spills and all; narrower steps (four 2048-wide rows) lose with the cap.
WIDE_ROWS_CONFIG = AmaxRowsConfig(programs_per_sm=3, num_warps=8, max_registers=80)
AMAX_ROWS_CONFIG = AmaxRowsConfig(programs_per_sm=2, num_warps=8)
# The experts' weights along K (``quantize_fp8_rowwise_3d_with_amax``), by row width (``tune_fp8_and_fused_quantizers
# --only fine_amax``, an H200, the fine-grained models' weights and DeepSeek-V3's; numbers in docs/perf-log.md): rows
# of up to 2048 want six 4-warp programs an SM, 4096-wide steps (K = 2880) four capped at 64 registers; 8192-wide
# steps keep WIDE_ROWS_CONFIG, which no candidate beat. Activations keep the defaults above (not measured
# at these widths with their groups).
WEIGHT_ROWS_DEFAULTS = ((2048, AmaxRowsConfig(programs_per_sm=6, num_warps=4)),
                        (4096, AmaxRowsConfig(programs_per_sm=4, num_warps=8, max_registers=64)),
                        (MAX_COLS, WIDE_ROWS_CONFIG))  # fmt: skip


# The second quantization, the strips kernel's pass 2 alone: k_groups as the unfused k_groups launch (64-column
# strips of 512-row chunks; its ``split`` plays no part), 3D along N (shorter groups) in 256-row chunks of 64-row
# steps, 4 warps (faster than 128-row chunks at every fine-grained weight and DeepSeek-V3's in the fine_amax sweep).
K_GROUPS_FROM_AMAX = fp8_colwise.K_GROUPS_CONFIG
ALONG_N_FROM_AMAX = fp8_colwise.ColwiseConfig(strip_cols=64, chunk_rows=256, step_rows=64, group_cols=512,
                                              num_warps=4)  # fmt: skip


def _rows_with_amax(x2d, offs, groups, group_rows, config: AmaxRowsConfig | None, producer: Producer | None = None,
                    halves: bool = False):  # fmt: skip
    """Launch the rows kernel with the column amax on validated arguments: (q, scale, amax); with a ``producer``,
    x2d is the bf16 output it writes (``moe_fused``), its tile in the HALVES lane order if ``halves`` (an even
    number of columns). ``groups`` 0: no table, (q, scale) alone (``offs`` and ``group_rows`` unread)."""
    rows, cols = x2d.shape
    width = max(triton.next_power_of_2(max(cols, 1)), 16)
    config = config or (WIDE_ROWS_CONFIG if width >= 8192 else AMAX_ROWS_CONFIG)
    if cols > MAX_COLS:
        raise InputError(f"rows of {cols} elements are longer than the {MAX_COLS} the column-amax quantizer holds "
                         "whole; quantize without fused scales")  # fmt: skip
    q = torch.empty(rows, cols, dtype=DATA_DTYPE, device=x2d.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x2d.device)
    amax = torch.zeros(groups, cols, dtype=torch.int32, device=x2d.device)
    if not groups:  # the rows as one group, folded nowhere
        offs, group_rows = None, max(rows, 1)
    if rows and cols:
        block_r = config.block_rows or fp8_rowwise.default_rowwise_config(cols).block_rows
        span = triton.cdiv(triton.cdiv(rows, sm_count(x2d.device) * config.programs_per_sm), block_r) * block_r
        cap = {"maxnreg": config.max_registers} if config.max_registers and not INTERPRET else {}
        # A producer's arithmetic rounds every operation as its unfused kernel does: no FMA contraction.
        if producer is not None:
            cap["enable_fp_fusion"] = False
        args, produce = producer_args(producer, x2d)
        _rows_amax_kernel[(triton.cdiv(rows, span),)](
            x2d, offs if offs is not None else scale, q.view(torch.uint8), scale, amax if groups else scale, rows,
            cols, groups, group_rows, span, *args, HAS_OFFS=offs is not None, BLOCK_R=block_r, BLOCK_C=width,
            BLOCK_G=triton.next_power_of_2(max(groups, 1)),
            EVEN=width == cols and (block_r == 1 or (offs is None and group_rows % block_r == 0)), EXACT=INTERPRET,
            HALVES=halves, AMAX=groups > 0, num_warps=config.num_warps, **produce, **cap,
        )  # fmt: skip
    return (q, scale, amax.view(torch.float32)) if groups else (q, scale)


def quantize_fp8_rowwise_with_amax(
    x: torch.Tensor, offs: torch.Tensor, *, config: AmaxRowsConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``quantize_fp8_rowwise(x)`` (q (M, C) e4m3, scale (M,) fp32) and amax (G, C) fp32, the max |x| down each
    column of each token group (``offs`` int32 (G,) group ends, read on the device; 0 for an empty group; rows
    past offs[-1] in none), for ``quantize_fp8_rowwise_k_groups_from_amax``. ``config``: the rows kernel's launch
    (None: ``WIDE_ROWS_CONFIG`` for rows taken in 8192-wide steps or wider, else ``AMAX_ROWS_CONFIG``)."""
    check_tensor("x", x, dtypes=fp8_rowwise.INPUT_DTYPES, ndim=2)
    check_group_offsets(offs, x, x.shape[0])
    check_config("config", config, AmaxRowsConfig)
    return _rows_with_amax(x, offs, offs.numel(), 1, config)


def quantize_fp8_rowwise_3d_with_amax(
    w: torch.Tensor, *, config: AmaxRowsConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``quantize_fp8_rowwise_3d(w, along="K")`` (q (G, N, K), scale (G, N)) and amax (G, K) fp32, the max |w|
    down each column of each expert, for ``quantize_fp8_rowwise_3d_from_amax``. ``config``: the rows kernel's launch
    (None: ``WEIGHT_ROWS_DEFAULTS``' by the width of K; under the interpreter, the activations' default)."""
    check_tensor("w", w, dtypes=fp8_rowwise.INPUT_DTYPES, ndim=3)
    check_config("config", config, AmaxRowsConfig)
    G, N, K = w.shape
    if G > MAX_GROUPS:
        raise InputError(f"w must hold at most {MAX_GROUPS} experts (dim 0), got {G}")
    if not INTERPRET:  # the interpreter's time is its program count: keep its two programs an SM
        config = config or launch_by_width(WEIGHT_ROWS_DEFAULTS, K)
    if G:
        q, scale, amax = _rows_with_amax(w.view(G * N, K), None, G, max(N, 1), config)
    else:  # no experts, no table (to the rows kernel, groups 0 means "no table")
        (q, scale), amax = _rows_with_amax(w.view(0, K), None, 0, 1, config), torch.zeros(0, K, device=w.device)
    return q.view(G, N, K), scale.view(G, N), amax


def _check_amax(amax: object, like: torch.Tensor, shape: tuple[int, int]) -> None:
    check_tensor("amax", amax, dtypes=(torch.float32,), ndim=2)
    check_same_device("amax", amax, like)
    check_shape("amax", amax, shape)


def quantize_fp8_rowwise_k_groups_from_amax(
    x: torch.Tensor, amax: torch.Tensor, offs: torch.Tensor, *, config: fp8_colwise.ColwiseConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8_rowwise_k_groups(x, offs)`` (q (R, M) e4m3, scale (G, R) fp32) with the column amaxes given:
    amax (G, R) fp32 as ``quantize_fp8_rowwise_with_amax`` returns it for this x and offs. One read of x.
    ``config``: the strips kernel's launch (None: ``K_GROUPS_FROM_AMAX``; its ``split`` plays no part)."""
    check_tensor("x", x, dtypes=fp8_rowwise.INPUT_DTYPES, ndim=2, contiguous=False)
    check_group_offsets(offs, x, x.shape[0])
    check_config("config", config, fp8_colwise.ColwiseConfig)
    M, R = x.shape
    G = offs.numel()
    _check_amax(amax, x, (G, R))
    q = torch.empty(R, M, dtype=DATA_DTYPE, device=x.device)
    scale = torch.empty(G, R, dtype=torch.float32, device=x.device)
    if R:
        fp8_colwise.launch_from_amax(x, offs, amax, q, scale, G, rows=M, cols=R, x_strides=(0, *x.stride()),
                                     q_strides=(0, M), config=config or K_GROUPS_FROM_AMAX)  # fmt: skip
    return q, scale


def quantize_fp8_rowwise_3d_from_amax(
    w: torch.Tensor, amax: torch.Tensor, *, config: fp8_colwise.ColwiseConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_fp8_rowwise_3d(w, along="N")`` (q (G, K, N), scale (G, K)) with the column amaxes given: amax
    (G, K) fp32 as ``quantize_fp8_rowwise_3d_with_amax`` returns it for this w. One read of w. ``config``: the
    strips kernel's launch (None: ``ALONG_N_FROM_AMAX``)."""
    check_tensor("w", w, dtypes=fp8_rowwise.INPUT_DTYPES, ndim=3)
    check_config("config", config, fp8_colwise.ColwiseConfig)
    G, N, K = w.shape
    if G > MAX_GROUPS:
        raise InputError(f"w must hold at most {MAX_GROUPS} experts (dim 0), got {G}")
    _check_amax(amax, w, (G, K))
    q = torch.empty(G, K, N, dtype=DATA_DTYPE, device=w.device)
    scale = torch.empty(G, K, dtype=torch.float32, device=w.device)
    if q.numel():
        fp8_colwise.launch_from_amax(w, None, amax, q, scale, G, rows=N, cols=K, x_strides=w.stride(),
                                     q_strides=(K * N, N), config=config or ALONG_N_FROM_AMAX)  # fmt: skip
    return q, scale


# ---------------------------------------------------------------------------------------------------------------
# Costs: every input read once, every output written once (the table included)
# ---------------------------------------------------------------------------------------------------------------


def with_amax_cost(rows: int, cols: int, groups: int, in_dtype: torch.dtype) -> Cost:
    """``quantize_fp8_rowwise_with_amax`` of (rows, cols) in ``groups`` groups (and the 3D one, rows = G * N): the
    rowwise quantizer's one read and writes, plus the (groups, cols) fp32 table."""
    rowwise = fp8_rowwise.quantize_fp8_rowwise_cost(rows, cols, in_dtype)
    return Cost(rowwise.bytes_read, rowwise.bytes_written + 4 * groups * cols)


def from_amax_cost(rows: int, cols: int, groups: int, in_dtype: torch.dtype) -> Cost:
    """``quantize_fp8_rowwise_k_groups_from_amax`` / ``_3d_from_amax`` of (rows, cols) in ``groups`` groups: read
    the input and the table once, write (cols, rows) e4m3 and groups * cols fp32 scales."""
    return Cost(rows * cols * in_dtype.itemsize + 4 * groups * cols, rows * cols + 4 * groups * cols)
