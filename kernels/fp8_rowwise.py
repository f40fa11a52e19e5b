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

The two kernels take their launch as ``config=`` (a ``Fp8RowwiseConfig``; None: ``ROWWISE_CONFIG`` or
``COLWISE_CONFIG``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .cost import Cost
from .format import DATA_DTYPE, E4M3_MAX
from .quantize import _to_e4m3_bits, _to_fp32
from .runtime import (
    INTERPRET,
    InputError,
    check_config,
    check_fields_power_of_two,
    check_host_offsets,
    check_offsets,
    check_same_device,
    check_tensor,
)

INPUT_DTYPES = (torch.bfloat16, torch.float32)
AMAX_FLOOR = 2.0**-112
_AMAX_FLOOR: tl.constexpr = tl.constexpr(AMAX_FLOOR)


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
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """One program quantizes BLOCK_R rows of row-major x (rows, cols): an amax pass, then a scale-and-cast pass."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = r < rows
    x_rows = x_ptr + r.to(tl.int64)[:, None] * cols
    q_rows = q_ptr + r.to(tl.int64)[:, None] * cols

    amax = tl.zeros((BLOCK_R,), tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (c < cols)[None, :]
        x = _to_fp32(tl.load(x_rows + c[None, :], mask=mask, other=0.0))
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    scale, recip = _scale_and_reciprocal(amax)
    tl.store(scale_ptr + r, scale, mask=row_ok)

    for c0 in range(0, cols, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (c < cols)[None, :]
        x = _to_fp32(tl.load(x_rows + c[None, :], mask=mask, other=0.0))
        tl.store(q_rows + c[None, :], _to_e4m3_bits(x * recip[:, None], EXACT), mask=mask)


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
        x = _to_fp32(tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0))
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
    scale, recip = _scale_and_reciprocal(amax)
    tl.store(scale_ptr + g * cols + c, scale, mask=col_ok)

    for m0 in range(start, end, BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        mask = (m < end)[:, None] & col_ok[None, :]
        x = _to_fp32(tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0))
        tl.store(q_cols + m[:, None], _to_e4m3_bits(x * recip[None, :], EXACT), mask=mask)


# ---------------------------------------------------------------------------------------------------------------
# Launch configurations
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fp8RowwiseConfig:
    """One launch of the rowwise kernel (``quantize_fp8_rowwise``, ``quantize_fp8_rowwise_3d(along="K")``) or the
    colwise kernel (``quantize_fp8_rowwise_3d(along="N")``, ``quantize_fp8_rowwise_k_groups``). A program owns whole
    rows (rowwise) or whole columns of one group (colwise), so it finds their amax alone, with no second launch or
    atomics, then scales and casts them in a second pass."""

    # Rows per program (rowwise), or per step of the two passes down the columns (colwise); a power of two.
    block_rows: int
    # Columns per step of the two passes along the rows (rowwise), or per program (colwise); a power of two.
    block_cols: int
    # Warps per program.
    num_warps: int = 4

    def __post_init__(self):
        check_fields_power_of_two(self, "block_rows", "block_cols", "num_warps")


# The defaults (config=None); not tuned yet (docs/perf-log.md). Under the interpreter the rowwise kernel takes fewer
# and larger tiles: the interpreter pays per program and per op, not per element.
ROWWISE_CONFIG = Fp8RowwiseConfig(16, 128) if INTERPRET else Fp8RowwiseConfig(4, 1024, num_warps=4)
COLWISE_CONFIG = Fp8RowwiseConfig(64, 64, num_warps=4)


# ---------------------------------------------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------------------------------------------


def _rowwise(x2d: torch.Tensor, config: Fp8RowwiseConfig) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x2d.shape
    q = torch.empty(rows, cols, dtype=DATA_DTYPE, device=x2d.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x2d.device)
    if rows and cols:
        grid = (triton.cdiv(rows, config.block_rows),)
        _rowwise_kernel[grid](
            x2d, q.view(torch.uint8), scale, rows, cols,
            BLOCK_R=config.block_rows, BLOCK_C=config.block_cols, EXACT=INTERPRET, num_warps=config.num_warps,
        )  # fmt: skip
    return q, scale


def quantize_fp8_rowwise(
    x: torch.Tensor, *, config: Fp8RowwiseConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) bf16/fp32 row-major -> (q (M, K) e4m3, scale (M,) fp32): one scale per row, along K. ``config``:
    the rowwise kernel's launch (None: ``ROWWISE_CONFIG``)."""
    check_tensor("x", x, dtypes=INPUT_DTYPES, ndim=2)
    check_config("config", config, Fp8RowwiseConfig)
    return _rowwise(x, config or ROWWISE_CONFIG)


def quantize_fp8_rowwise_3d(
    w: torch.Tensor, along: str = "K", *, config: Fp8RowwiseConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert weights w (G, N, K) bf16/fp32, contiguous, quantized along the next GEMM's contraction dim.

    along="K" (forward, out = x @ w_g.T): q (G, N, K), scale (G, N), amax over k.
    along="N" (backward input, dx = dy @ w_g): q (G, K, N) with N contiguous, scale (G, K), amax over n.
    ``config``: the launch (None: ``ROWWISE_CONFIG`` along K, ``COLWISE_CONFIG`` along N).
    """
    check_tensor("w", w, dtypes=INPUT_DTYPES, ndim=3)
    check_config("config", config, Fp8RowwiseConfig)
    G, N, K = w.shape
    if along == "K":
        q, scale = _rowwise(w.view(G * N, K), config or ROWWISE_CONFIG)
        return q.view(G, N, K), scale.view(G, N)
    if along != "N":
        raise InputError(f"along must be 'K' or 'N', got {along!r}")
    q = torch.empty(G, K, N, dtype=DATA_DTYPE, device=w.device)
    scale = torch.empty(G, K, dtype=torch.float32, device=w.device)
    if q.numel():
        _launch_colwise(w, None, q, scale, G, rows=N, cols=K, x_strides=w.stride(), q_strides=(K * N, N), config=config)
    return q, scale


def quantize_fp8_rowwise_k_groups(
    x: torch.Tensor, offs: torch.Tensor, *, config: Fp8RowwiseConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group scales for the 2D x 2D weight-gradient GEMM, which contracts over the token dim M.

    x (M, R) bf16/fp32 (grad_out (M, N) or the activations (M, K); any strides, so ``a.t()`` of an (R, M) matrix
    works without a copy); ``offs`` int32 (G,) cumulative group ends along M, read on the device only.
    Returns q (R, M) e4m3 row-major (M contiguous: pass ``q`` as ``_scaled_grouped_mm``'s row-major mat_a or
    ``q.t()`` as its column-major mat_b) and scale (G, R) fp32, scale[g, r] = amax over group g's rows of
    |x[:, r]| / 448 (floored as above; an empty group counts as all zero). Columns of q past ``offs[-1]`` are not
    written. ``config``: the colwise kernel's launch (None: ``COLWISE_CONFIG``).
    """
    check_tensor("x", x, dtypes=INPUT_DTYPES, ndim=2, contiguous=False)
    check_offsets(offs)
    check_same_device("offs", offs, x)
    check_host_offsets(offs, x.shape[0])
    check_config("config", config, Fp8RowwiseConfig)
    M, R = x.shape
    G = offs.numel()
    q = torch.empty(R, M, dtype=DATA_DTYPE, device=x.device)
    scale = torch.empty(G, R, dtype=torch.float32, device=x.device)
    if R:
        _launch_colwise(
            x, offs, q, scale, G, rows=M, cols=R, x_strides=(0, *x.stride()), q_strides=(0, M), config=config
        )
    return q, scale


def _launch_colwise(x, offs, q, scale, groups, *, rows, cols, x_strides, q_strides, config: Fp8RowwiseConfig | None):
    config = config or COLWISE_CONFIG
    grid = (triton.cdiv(cols, config.block_cols), groups)
    _colwise_kernel[grid](
        x, offs, q.view(torch.uint8), scale, rows, cols, *x_strides, *q_strides,
        HAS_OFFS=offs is not None, BLOCK_M=config.block_rows, BLOCK_C=config.block_cols, EXACT=INTERPRET,
        num_warps=config.num_warps,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Costs: every input read once, every output written once
# ---------------------------------------------------------------------------------------------------------------


def quantize_fp8_rowwise_cost(rows: int, cols: int, in_dtype: torch.dtype) -> Cost:
    """``quantize_fp8_rowwise`` of a (rows, cols) tensor: read it, write e4m3 data and one fp32 scale per row."""
    return Cost(bytes_read=rows * cols * in_dtype.itemsize, bytes_written=rows * cols + 4 * rows)


def quantize_fp8_rowwise_3d_cost(G: int, N: int, K: int, in_dtype: torch.dtype, along: str = "K") -> Cost:
    """``quantize_fp8_rowwise_3d`` of (G, N, K) weights: G*N scales along K, G*K along N."""
    scales = G * (N if along == "K" else K)
    return Cost(bytes_read=G * N * K * in_dtype.itemsize, bytes_written=G * N * K + 4 * scales)


def quantize_fp8_rowwise_k_groups_cost(M: int, R: int, G: int, in_dtype: torch.dtype) -> Cost:
    """``quantize_fp8_rowwise_k_groups`` of (M, R) in G groups: read it, write (R, M) e4m3 and G*R fp32 scales."""
    return Cost(bytes_read=M * R * in_dtype.itemsize, bytes_written=M * R + 4 * G * R)
