"""The FP8 rowwise recipe's quantizers (what Hopper's ``torch._scaled_grouped_mm`` runs natively).

Every row of the operand, along the GEMM's contraction dim, gets one fp32 scale:

    amax = max(max |x[row, :]|, 2**-112)      scale = amax / 448      q = e4m3(clamp(x * (448 / amax), -448, 448))

and dequantizes as ``q * scale``. The floor keeps 448 / amax finite (it overflows fp32 below amax ~ 2**-119); it
only touches rows of magnitude < 2**-112, and gives an all-zero row zero data (and scale 2**-112 / 448). Both
divisions are IEEE round-to-nearest and the cast rounds to nearest even (the fp32 -> e4m3 cast and the exact bf16
widening are ``block_math``'s interpreter-safe helpers), so the Triton kernels are bit-exact against the plain-torch
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
* for the last two, whose scale spans a whole column of a group, the column-direction kernels with their configs:
  ``fp8_hold``'s holding kernel (``HoldConfig``: a strip of a group's rows read once and held in registers; the
  default where a strip fits, ``fp8_hold.along_n_config`` / ``k_groups_config``) and ``fp8_colwise``'s strips
  (``ColwiseConfig``; split, the k_groups default for long groups ``K_GROUPS_CONFIG``), walking (``WalkConfig``, the
  3D-along-N default for long columns ``ALONG_N_CONFIG``) and two-pass colwise (``TwoPassColwiseConfig``) kernels.
  The wrappers here check the inputs and launch the kernel the config names; the costs here count a second read
  where ``fp8_colwise.reads_twice`` says the launch rereads from device memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import fp8_colwise, fp8_hold
from ..core.block_math import (
    AMAX_FLOOR,
    abs_max_bits,
    fp8_scale_and_reciprocal,
    load_rows,
    masked_load,
    masked_store,
    to_e4m3_bits,
    to_fp32,
)
from ..core.cost import Cost
from ..core.format import DATA_DTYPE, E4M3_MAX
from ..core.runtime import (
    INTERPRET,
    MAX_GROUPS,
    InputError,
    check_config,
    check_fields_power_of_two,
    check_group_offsets,
    check_tensor,
)

INPUT_DTYPES = (torch.bfloat16, torch.float32)
# The column-direction kernels' configs (3D along N, k_groups). Used through the module, not imported by name, so
# that this module's namespace holds none of fp8_colwise's names.
_COLWISE_CONFIGS = (
    fp8_hold.HoldConfig,
    fp8_colwise.ColwiseConfig,
    fp8_colwise.WalkConfig,
    fp8_colwise.TwoPassColwiseConfig,
)


# ---------------------------------------------------------------------------------------------------------------
# Plain-torch references (the oracle of the tests)
# ---------------------------------------------------------------------------------------------------------------


def quantize_fp8_rowwise_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) bf16/fp32 -> (q (..., K) e4m3, scale (...) fp32), one scale per row along the last dim.

    To quantize along another dim, move it last first: ``quantize_fp8_rowwise_reference(w.transpose(-2, -1))`` is
    the oracle of ``quantize_fp8_rowwise_3d(w, along="N")``.
    """
    return quantize_with_amax_reference(x, x.float().abs().amax(dim=-1))


def quantize_with_amax_reference(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) bf16/fp32 and its rows' amax (...) fp32 -> (q (..., K) e4m3, scale (...) fp32): the recipe's
    scale and cast of each row from the amax given (floored at AMAX_FLOOR), which need not be x's own."""
    xf = x.float()
    amax = amax.float().clamp_min(AMAX_FLOOR)
    # Tensor / tensor: torch turns `448.0 / t` into `t.reciprocal() * 448` (and, on CUDA, `t / 448.0` into
    # `t * (1 / 448)`), rounding twice.
    e4m3_max = torch.full_like(amax, E4M3_MAX)
    scale = amax / e4m3_max
    q = (xf * (e4m3_max / amax).unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(DATA_DTYPE)
    return q.contiguous(), scale.contiguous()


def dequantize_fp8_rowwise_reference(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of q (..., K) e4m3 with scale (...) fp32: ``q * scale[..., None]``."""
    return q.float() * scale.unsqueeze(-1)


def quantize_fp8_rowwise_k_groups_reference(
    x: torch.Tensor, offs: torch.Tensor, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``quantize_fp8_rowwise_k_groups``: x (M, R), offs (G,) -> (q (R, M) e4m3, scale (G, R) fp32).

    Reads ``offs`` on the host. An empty group gets the scale of an all-zero column, AMAX_FLOOR / 448. ``amax``
    (G, R) fp32: scale from these column amaxes instead of x's own (``fp8_amax``'s contract).
    """
    M, R = x.shape
    q = torch.zeros(R, M, dtype=DATA_DTYPE, device=x.device)
    scale = torch.full((offs.numel(), R), AMAX_FLOOR / E4M3_MAX, dtype=torch.float32, device=x.device)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if amax is not None:
            q[:, start:end], scale[g] = quantize_with_amax_reference(x[start:end].t(), amax[g])
        elif end > start:
            q[:, start:end], scale[g] = quantize_fp8_rowwise_reference(x[start:end].t())
        start = end
    return q, scale


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def quantize_whole_rows(x, q_ptr, scale_ptr, r, row_ok, cols, BLOCK_C: tl.constexpr, EVEN: tl.constexpr,
                        EXACT: tl.constexpr):  # fmt: skip
    """Quantize rows r (row_ok: those to store) of row-major (., cols), the tile ``x`` (len(r), BLOCK_C >= cols)
    holding them whole (zeros outside): their amax, scale and cast, in registers. The callers load it (or produce
    it: ``fp8_amax``'s fused stages) and fold more out of it (``fp8_amax``'s column amax)."""
    c = tl.arange(0, BLOCK_C)
    quantize_rows_at(x, q_ptr, scale_ptr, r, row_ok, c, c < cols, cols, EVEN, EXACT)


@triton.jit
def quantize_rows_at(x, q_ptr, scale_ptr, r, row_ok, c, col_ok, cols, EVEN: tl.constexpr, EXACT: tl.constexpr):
    """``quantize_whole_rows`` of a tile whose lanes hold the columns ``c`` (col_ok: those inside the row; the others
    hold zeros): a producer may lay a row out in another lane order (``fp8_amax``'s HALVES)."""
    scale, recip = fp8_scale_and_reciprocal(abs_max_bits(x, 1).to(tl.float32, bitcast=True))
    masked_store(scale_ptr + r, scale, row_ok, EVEN)
    masked_store(q_ptr + r.to(tl.int64)[:, None] * cols + c[None, :], to_e4m3_bits(to_fp32(x) * recip[:, None], EXACT),
                 row_ok[:, None] & col_ok[None, :], EVEN)  # fmt: skip


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
    if SINGLE:
        c = tl.arange(0, BLOCK_C)
        row_ok = r < rows
        x = load_rows(x_ptr + r.to(tl.int64)[:, None] * cols + c[None, :], r.to(tl.int64), row_ok, c, c < cols, cols,
                      x_ptr, x_ptr, x_ptr, 0, 0, False, EVEN, EXACT)  # fmt: skip
        quantize_whole_rows(x, q_ptr, scale_ptr, r, row_ok, cols, BLOCK_C, EVEN, EXACT)
    else:
        row_ok = r < rows
        x_rows = x_ptr + r.to(tl.int64)[:, None] * cols
        q_rows = q_ptr + r.to(tl.int64)[:, None] * cols
        amax = tl.zeros((BLOCK_R,), tl.int32)
        for c0 in range(0, cols, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            mask = row_ok[:, None] & (c < cols)[None, :]
            amax = tl.maximum(amax, abs_max_bits(masked_load(x_rows + c[None, :], mask, EVEN), 1))
        scale, recip = fp8_scale_and_reciprocal(amax.to(tl.float32, bitcast=True))
        masked_store(scale_ptr + r, scale, row_ok, EVEN)
        for c0 in range(0, cols, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            mask = row_ok[:, None] & (c < cols)[None, :]
            x = to_fp32(masked_load(x_rows + c[None, :], mask, EVEN))
            masked_store(q_rows + c[None, :], to_e4m3_bits(x * recip[:, None], EXACT), mask, EVEN)


# ---------------------------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fp8RowwiseConfig:
    """One launch of the rows kernel (``quantize_fp8_rowwise``, ``quantize_fp8_rowwise_3d(along="K")``). A program
    owns whole rows, so it finds their amax alone, with no second launch or atomics. (The two-pass colwise kernel
    has its own config with the same fields, ``fp8_colwise.TwoPassColwiseConfig``.)"""

    # Rows per program, a power of two.
    block_rows: int
    # The longest row held whole in registers and read once (rows of K <= block_cols take one step of next_pow2(K)
    # columns); longer rows take two passes in steps of block_cols columns. A power of two.
    block_cols: int
    # Warps per program.
    num_warps: int = 4

    def __post_init__(self):
        check_fields_power_of_two(self, "block_rows", "block_cols", "num_warps")


# The rows kernel's default holds rows of up to SINGLE_PASS_MAX elements in registers (one read) and gives each
# program at least ROWS_TILE elements; not measured yet (docs/perf-log.md has the predictions).
SINGLE_PASS_MAX = 16384
ROWS_TILE = 8192
# The old default, kept as the two-pass control of the tuning script.
TWO_PASS_ROWS_CONFIG = Fp8RowwiseConfig(4, 1024, num_warps=4)


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
    w: torch.Tensor,
    along: str = "K",
    *,
    config: Fp8RowwiseConfig
    | fp8_hold.HoldConfig
    | fp8_colwise.ColwiseConfig
    | fp8_colwise.WalkConfig
    | fp8_colwise.TwoPassColwiseConfig
    | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert weights w (G, N, K) bf16/fp32, contiguous, quantized along the next GEMM's contraction dim.

    along="K" (forward, out = x @ w_g.T): q (G, N, K), scale (G, N), amax over k.
    along="N" (backward input, dx = dy @ w_g): q (G, K, N) with N contiguous, scale (G, K), amax over n.
    ``config``: the launch. Along K a ``Fp8RowwiseConfig`` (None: ``default_rowwise_config(K)``); along N one of
    ``fp8_colwise``'s: a ``HoldConfig`` (the holding kernel), a ``WalkConfig`` (the walking kernel; None:
    ``fp8_hold.along_n_config(N)``, holding where a strip of N rows fits, else walking), a ``ColwiseConfig`` (the
    strips kernel) or a ``TwoPassColwiseConfig`` (the two-pass colwise kernel).
    """
    check_tensor("w", w, dtypes=INPUT_DTYPES, ndim=3)
    G, N, K = w.shape
    if along == "K":
        check_config("config", config, Fp8RowwiseConfig, " along K (the rows kernel)")
        q, scale = _rowwise(w.view(G * N, K), config)
        return q.view(G, N, K), scale.view(G, N)
    if along != "N":
        raise InputError(f"along must be 'K' or 'N', got {along!r}")
    check_config("config", config, _COLWISE_CONFIGS)
    if G > MAX_GROUPS:
        raise InputError(f"w must hold at most {MAX_GROUPS} experts (dim 0), got {G}")
    q = torch.empty(G, K, N, dtype=DATA_DTYPE, device=w.device)
    scale = torch.empty(G, K, dtype=torch.float32, device=w.device)
    if q.numel():
        _launch_columns(w, None, q, scale, G, rows=N, cols=K, x_strides=w.stride(), q_strides=(K * N, N),
                        config=config or fp8_hold.along_n_config(N))  # fmt: skip
    return q, scale


def quantize_fp8_rowwise_k_groups(
    x: torch.Tensor,
    offs: torch.Tensor,
    *,
    config: fp8_hold.HoldConfig
    | fp8_colwise.ColwiseConfig
    | fp8_colwise.WalkConfig
    | fp8_colwise.TwoPassColwiseConfig
    | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group scales for the 2D x 2D weight-gradient GEMM, which contracts over the token dim M.

    x (M, R) bf16/fp32 (grad_out (M, N) or the activations (M, K); any strides, so ``a.t()`` of an (R, M) matrix
    works without a copy); ``offs`` int32 (G,) cumulative group ends along M, read on the device only.
    Returns q (R, M) e4m3 row-major (M contiguous: pass ``q`` as ``_scaled_grouped_mm``'s row-major mat_a or
    ``q.t()`` as its column-major mat_b) and scale (G, R) fp32, scale[g, r] = amax over group g's rows of
    |x[:, r]| / 448 (floored as above; an empty group counts as all zero). Columns of q past ``offs[-1]`` are not
    written. ``config``: one of ``fp8_colwise``'s (None: ``fp8_hold.k_groups_config(M, G)``, holding for groups
    of up to ~3300 rows on average, else the split strips ``K_GROUPS_CONFIG``), a ``HoldConfig`` (the holding
    kernel), a ``ColwiseConfig`` (the strips kernel),
    a ``WalkConfig`` (the walking kernel) or a ``TwoPassColwiseConfig`` (the two-pass colwise kernel).
    """
    check_tensor("x", x, dtypes=INPUT_DTYPES, ndim=2, contiguous=False)
    check_group_offsets(offs, x, x.shape[0])
    check_config("config", config, _COLWISE_CONFIGS)
    M, R = x.shape
    G = offs.numel()
    config = config or fp8_hold.k_groups_config(M, G)
    q = torch.empty(R, M, dtype=DATA_DTYPE, device=x.device)
    scale = torch.empty(G, R, dtype=torch.float32, device=x.device)
    if R:
        _launch_columns(x, offs, q, scale, G, rows=M, cols=R, x_strides=(0, *x.stride()), q_strides=(0, M),
                        config=config)  # fmt: skip
    return q, scale


def _launch_columns(x, offs, q, scale, groups, *, config, **geometry) -> None:
    """The column kernel ``config`` names: ``fp8_hold``'s holding kernel or one of ``fp8_colwise``'s."""
    launch = fp8_hold.launch_hold if isinstance(config, fp8_hold.HoldConfig) else fp8_colwise.launch_colwise
    launch(x, offs, q, scale, groups, config=config, **geometry)


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
    return _colwise_cost(G * N, K, G, in_dtype, config or fp8_hold.along_n_config(N))


def quantize_fp8_rowwise_k_groups_cost(M: int, R: int, G: int, in_dtype: torch.dtype, config=None) -> Cost:
    """``quantize_fp8_rowwise_k_groups`` of (M, R) in G groups: read it, write (R, M) e4m3 and G*R fp32 scales.

    A group's column scale needs all of the group's rows (up to all M), more than a program can hold, so every
    launch reads the input twice: the amax, then the scale and cast. A one-launch ``ColwiseConfig`` and a
    ``WalkConfig`` take the second read from L2 when the strips in flight fit there, and the cost counts one read;
    the split ``ColwiseConfig`` (two launches) and the two-pass ``TwoPassColwiseConfig`` kernel reread from device
    memory, and the cost counts both (``fp8_colwise.reads_twice``)."""
    return _colwise_cost(M, R, G, in_dtype, config or fp8_hold.k_groups_config(M, G))


def _colwise_cost(rows: int, cols: int, G: int, in_dtype: torch.dtype, config) -> Cost:
    reads = 2 if fp8_colwise.reads_twice(config) else 1
    return Cost(bytes_read=reads * rows * cols * in_dtype.itemsize, bytes_written=rows * cols + 4 * G * cols)
