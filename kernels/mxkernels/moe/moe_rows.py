"""Row movements of the MoE layer: the permutation into padded expert groups, the weighted combine, and the score
gradients they owe the router.

Every data movement of the layer outside the GEMMs is one of three row operations:

* ``gather_weighted(x, src, weight)``: ``out[r] = x[src[r]] * weight[r]`` (zeros where ``src[r] < 0``). The permute
  (tokens into their experts' padded slots, scored before the experts or not) and the combine's backward (the
  output gradient into the same slots) are this gather.
* ``combine_rows(y, dest, weight, top_k)``: ``out[t] = sum_j y[dest[t*k + j]] * weight[t*k + j]``. The combine
  (each token's top_k expert outputs, scored after the experts or not) and the permute's backward (each token's
  top_k input-gradient copies) are this sum.
* ``row_dot(a, a_rows, b, b_rows)``: ``out[c] = <a[a_rows[c]], b[b_rows[c]]>``, the gradient of a score that
  multiplied a row.

Numerics (the contract every implementation is held to): products and sums in fp32, the sum over j in j order,
one rounding to bf16 at the end (round to nearest even); with ``weight`` None the gather copies bits. Index tensors
are int32 on the device, never read on the host (graph-capturable). Each function has a plain-torch ``*_reference``
and declares its cost (``*_cost``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.block_math import masked_store, to_bf16_bits, to_fp32
from ..core.cost import Cost
from ..core.runtime import (
    INTERPRET,
    InputError,
    check_config,
    check_fields_power_of_two,
    check_same_device,
    check_tensor,
    default_launch,
)

INDEX_DTYPE = torch.int32
_INDEX_BYTES, _WEIGHT_BYTES = 4, 4
# Raw-bit views: the unweighted gather copies rows of any dtype of one width through one kernel, bit for bit.
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class RowsMoveConfig:
    """One launch of a row-streaming kernel of the MoE layer: ``gather_weighted``, ``combine_rows``, ``row_dot``,
    ``token_permute.gather_rows`` (the same gather kernel) and ``swiglu``'s two kernels (tiles of rows)."""

    # Output rows (row_dot: pairs) per program, a power of two: each program loads its rows' indices (and weights)
    # once per tile, and a few rows keep several independent row reads in flight.
    block_rows: int = 8
    # Bytes of a row per program (of each bf16 input for swiglu; row_dot: per step along D), a power of two: 4 KiB
    # (2048 bf16), the padding kernels' width, streamed bf16 rows at 98% of an H200's measured copy ceiling
    # (padding._block_cols).
    block_bytes: int = 4096
    # Warps per program: 8 over 8 x 4 KiB give each thread 16-byte vector accesses.
    num_warps: int = 8

    def __post_init__(self):
        check_fields_power_of_two(self, "block_rows", "block_bytes", "num_warps")


# Not measured yet for these kernels: token_permute's launch (8 rows x 4 KiB, 8 warps), measured on the padding copy.
ROWS_MOVE_CONFIG = RowsMoveConfig()
# config=None under the interpreter (runtime.default_launch): 64 rows a program.
ROWS_MOVE_LAUNCH = default_launch(ROWS_MOVE_CONFIG, RowsMoveConfig(block_rows=64))

# ---------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _term(x_ptr, index_ptr, weight_ptr, e, row_ok, cols, col_ok, D, WEIGHTED: tl.constexpr):
    """fp32 of row x[index[e]] (bf16 bits, zeros where index[e] < 0) times weight[e] (WEIGHTED), and index[e] >= 0."""
    src = tl.load(index_ptr + e, mask=row_ok, other=-1)
    ok = src >= 0
    v = tl.load(x_ptr + src.to(tl.int64)[:, None] * D + cols[None, :], mask=ok[:, None] & col_ok[None, :], other=0)
    v = to_fp32(v.to(tl.bfloat16, bitcast=True))
    if WEIGHTED:
        v = v * tl.load(weight_ptr + e, mask=row_ok, other=0)[:, None]
    return v, ok


@triton.jit
def gather_tile(x_ptr, index_ptr, weight_ptr, rows, row_ok, cols, col_ok, D,
                TOPK: tl.constexpr, WEIGHTED: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """Bits of output rows ``rows`` (int64), columns ``cols`` of ``out[r] = sum_{j < TOPK} x[index[r*TOPK + j]]
    (* weight[r*TOPK + j])`` over x (., D) row-major. TOPK 1 without weights copies the raw bits of any dtype
    (x_ptr's); otherwise x_ptr holds bf16 bits (int16): each term is the fp32 product, the sum runs in j order
    starting from the first term (so -0 + -0 stays -0, as the references' sums do), one rounding to bf16 at the end
    (``block_math.to_bf16_bits``: the hardware cast unless EXACT).
    TOPK 1: a row whose index is < 0 is zeros (a padding slot)."""
    if TOPK == 1 and not WEIGHTED:
        src = tl.load(index_ptr + rows, mask=row_ok, other=-1)
        mask = (src >= 0)[:, None] & col_ok[None, :]
        out = tl.load(x_ptr + src.to(tl.int64)[:, None] * D + cols[None, :], mask=mask, other=0)
    else:
        acc, ok = _term(x_ptr, index_ptr, weight_ptr, rows * TOPK, row_ok, cols, col_ok, D, WEIGHTED)
        for j in tl.static_range(1, TOPK):
            v, _ = _term(x_ptr, index_ptr, weight_ptr, rows * TOPK + j, row_ok, cols, col_ok, D, WEIGHTED)
            acc = acc + v
        out = to_bf16_bits(acc, EXACT)
        if TOPK == 1:
            # 0 * weight may be -0 or NaN (a NaN router score): a padding row, and the columns past D that a
            # blocked quantizer's tile reads as zeros, are +0 whatever the weight.
            out = tl.where(ok[:, None] & col_ok[None, :], out, 0)
    return out


@triton.jit
def gather_producer(out_ptrs, rows, row_ok, cols, col_ok, n_cols, a_ptr, b_ptr, c_ptr, a_stride, b_stride,
                    VARIANT: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """``block_math.load_rows``'s producer signature: rows of ``gather_weighted(x, src, weight)`` (x a_ptr as bf16
    bits, src b_ptr, weight c_ptr when VARIANT, i.e. weighted), stored at out_ptrs (bf16 (., n_cols)) and returned."""
    tile = gather_tile(a_ptr, b_ptr, c_ptr, rows, row_ok, cols, col_ok, n_cols, 1, VARIANT, EXACT)
    tile = tile.to(tl.bfloat16, bitcast=True)
    masked_store(out_ptrs, tile, row_ok[:, None] & col_ok[None, :], EVEN)
    return tile


@triton.jit
def _gather_kernel(
    x_ptr, index_ptr, weight_ptr, out_ptr, rows_out, D,
    TOPK: tl.constexpr, WEIGHTED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_M output rows x BLOCK_D columns of gather_tile.
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok, col_ok = rows < rows_out, cols < D
    bits = gather_tile(x_ptr, index_ptr, weight_ptr, rows, row_ok, cols, col_ok, D, TOPK, WEIGHTED, EXACT)
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], bits, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _row_dot_kernel(a_ptr, a_rows_ptr, b_ptr, b_rows_ptr, out_ptr, C, D, BLOCK_M: tl.constexpr,
                    BLOCK_D: tl.constexpr):  # fmt: skip
    # One program: BLOCK_M pairs, walking D in BLOCK_D steps; fp32 partial sums per column lane, reduced at the end.
    c = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    ok = c < C
    ra = tl.load(a_rows_ptr + c, mask=ok, other=0).to(tl.int64)
    rb = tl.load(b_rows_ptr + c, mask=ok, other=0).to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = ok[:, None] & (d < D)[None, :]
        x = to_fp32(tl.load(a_ptr + ra[:, None] * D + d[None, :], mask=mask, other=0))
        y = to_fp32(tl.load(b_ptr + rb[:, None] * D + d[None, :], mask=mask, other=0))
        acc += x * y
    tl.store(out_ptr + c, tl.sum(acc, 1), mask=ok)


def launch_gather(x: torch.Tensor, index: torch.Tensor, weight: torch.Tensor | None, top_k: int,
                  config: RowsMoveConfig | None) -> torch.Tensor:  # fmt: skip
    """Run the gather kernel on validated arguments: (index.numel() // top_k, D) in x's dtype (``gather_tile``).
    Arithmetic (top_k > 1 or a weight) needs bf16 x; the plain copy takes any dtype."""
    config = config or ROWS_MOVE_LAUNCH
    bits = BITS[x.element_size()]
    rows, D = index.numel() // top_k, x.shape[1]
    out = torch.empty(rows, D, dtype=bits, device=x.device)
    if out.numel():
        block_d = min(triton.next_power_of_2(D), max(config.block_bytes // x.element_size(), 1))
        grid = (triton.cdiv(rows, config.block_rows), triton.cdiv(D, block_d))
        _gather_kernel[grid](x.view(bits), index, weight if weight is not None else index, out, rows, D, TOPK=top_k,
                             WEIGHTED=weight is not None, BLOCK_M=config.block_rows, BLOCK_D=block_d, EXACT=INTERPRET,
                             num_warps=config.num_warps, enable_fp_fusion=False)  # fmt: skip
    return out.view(x.dtype)


def _check_rows(
    name: str, index: object, weight: object, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    index = check_tensor(name, index, dtypes=(INDEX_DTYPE,), ndim=1)
    check_same_device(name, index, like)
    if weight is not None:
        weight = check_tensor("weight", weight, dtypes=(torch.float32,), ndim=1)
        check_same_device("weight", weight, like)
        if weight.shape != index.shape:
            raise InputError(f"weight must hold one value per entry of {name} ({index.numel()}), got "
                             f"{tuple(weight.shape)}")  # fmt: skip
    return index, weight


def check_gather(x: object, src: object, weight: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``gather_weighted``'s argument checks (shared with the fused gathers of ``moe_fused``)."""
    x = check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    return (x, *_check_rows("src", src, weight, x))


def gather_weighted(
    x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None = None, *, config: RowsMoveConfig | None = None
) -> torch.Tensor:
    """(R, D) bf16: row r is ``x[src[r]]`` (bits) or ``bf16(fp32(x[src[r]]) * weight[r])``; zeros where
    ``src[r] < 0``. x (T, D) bf16 row-major; src int32 (R,), entries in [-1, T) (not checked on the device).
    ``config``: the gather kernel's launch (None: ``ROWS_MOVE_CONFIG``)."""
    x, src, weight = check_gather(x, src, weight)
    check_config("config", config, RowsMoveConfig)
    return launch_gather(x, src, weight, 1, config)


def gather_weighted_reference(x, src, weight=None):
    valid = (src >= 0).unsqueeze(1)
    rows = x.index_select(0, src.clamp(min=0).long())
    if weight is not None:
        rows = (rows.float() * weight.unsqueeze(1)).to(torch.bfloat16)
    return torch.where(valid, rows, torch.zeros((), dtype=x.dtype, device=x.device))


def distinct_rows(copies: int, sources: int | None) -> int:
    """How many distinct rows ``copies`` row reads touch: ``sources`` (the rows they are gathered from), at most
    ``copies``; None: every read a row of its own."""
    return copies if sources is None else min(copies, sources)


def gather_weighted_cost(rows: int, D: int, tokens_rows: int, weighted: bool, *, sources: int | None = None) -> Cost:
    """Gather ``tokens_rows`` rows (the padding rows read nothing) into ``rows`` output rows: read the index (and
    weights) of every output row, write every output row, and read each distinct source row once (``sources`` of
    them, e.g. T tokens for T * top_k copies; None: each copy from a row of its own). The other copies of a source
    row are ``bytes_reread`` (``core.cost``: DRAM bytes only in ``bytes_read``)."""
    extra = rows * (_INDEX_BYTES + (_WEIGHT_BYTES if weighted else 0))
    distinct = distinct_rows(tokens_rows, sources)
    return Cost(distinct * D * 2 + extra, rows * D * 2, bytes_reread=(tokens_rows - distinct) * D * 2)


def combine_rows(
    y: torch.Tensor,
    dest: torch.Tensor,
    weight: torch.Tensor | None = None,
    top_k: int = 1,
    *,
    config: RowsMoveConfig | None = None,
):
    """(T, D) bf16: ``out[t] = bf16(sum_{j < top_k} fp32(y[dest[t*top_k + j]]) * weight[t*top_k + j])`` (weight 1
    where None), summed in j order. y (R, D) bf16 row-major; dest int32 (T*top_k,), entries in [0, R).
    ``config``: the gather kernel's launch (None: ``ROWS_MOVE_CONFIG``)."""
    y = check_tensor("y", y, dtypes=(torch.bfloat16,), ndim=2)
    dest, weight = _check_rows("dest", dest, weight, y)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1 or dest.numel() % top_k:
        raise InputError(f"top_k must be a positive int dividing dest's {dest.numel()} entries, got {top_k!r}")
    check_config("config", config, RowsMoveConfig)
    return launch_gather(y, dest, weight, top_k, config)


def combine_rows_reference(y, dest, weight=None, top_k=1):
    picked = y.index_select(0, dest.long()).float()
    if weight is not None:
        picked = picked * weight.unsqueeze(1)
    picked = picked.view(-1, top_k, y.shape[1])
    total = picked[:, 0]
    for j in range(1, top_k):
        total = total + picked[:, j]
    return total.to(torch.bfloat16)


def combine_rows_cost(tokens: int, D: int, top_k: int, weighted: bool) -> Cost:
    """Read every gathered row (and its index and weight), write one row per token. Each of the tokens * top_k
    copies is a row of its own (``dest`` is one-to-one), so no row is read twice."""
    per_copy = D * 2 + _INDEX_BYTES + (_WEIGHT_BYTES if weighted else 0)
    return Cost(tokens * top_k * per_copy, tokens * D * 2)


def row_dot(
    a: torch.Tensor,
    a_rows: torch.Tensor,
    b: torch.Tensor,
    b_rows: torch.Tensor,
    *,
    config: RowsMoveConfig | None = None,
) -> torch.Tensor:
    """(C,) fp32: ``sum_d fp32(a[a_rows[c], d]) * fp32(b[b_rows[c], d])``. a (R, D), b (T, D) bf16 row-major;
    row indices in range (not checked on the device). The order of the sum over d is the kernel's (fp32 partial
    sums per column lane, then a tree), not the reference's: equal to rounding. ``config``: the launch (None:
    ``ROWS_MOVE_CONFIG``; block_bytes is the step along D)."""
    a = check_tensor("a", a, dtypes=(torch.bfloat16,), ndim=2)
    b = check_tensor("b", b, dtypes=(torch.bfloat16,), ndim=2)
    check_same_device("b", b, a, "a")
    a_rows, _ = _check_rows("a_rows", a_rows, None, a)
    b_rows, _ = _check_rows("b_rows", b_rows, None, a)
    if a.shape[1] != b.shape[1] or a_rows.shape != b_rows.shape:
        raise InputError(f"a and b must share D and a_rows and b_rows their length; got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(a_rows.shape)}, {tuple(b_rows.shape)}")  # fmt: skip
    check_config("config", config, RowsMoveConfig)
    config = config or ROWS_MOVE_LAUNCH
    C, D = a_rows.numel(), a.shape[1]
    out = torch.empty(C, dtype=torch.float32, device=a.device)
    if C:
        block_d = min(triton.next_power_of_2(max(D, 1)), max(config.block_bytes // 2, 1))
        _row_dot_kernel[(triton.cdiv(C, config.block_rows),)](a, a_rows, b, b_rows, out, C, D,
                                                              BLOCK_M=config.block_rows, BLOCK_D=block_d,
                                                              num_warps=config.num_warps)  # fmt: skip
    return out


def row_dot_reference(a, a_rows, b, b_rows):
    return (a.index_select(0, a_rows.long()).float() * b.index_select(0, b_rows.long()).float()).sum(1)


def row_dot_cost(copies: int, D: int, *, b_sources: int | None = None) -> Cost:
    """Read the two indices of every pair, each pair's ``a`` row (a row of its own), and each distinct ``b`` row
    once (``b_sources`` of them, e.g. T token rows for T * top_k copies; None: a row of its own per pair); write one
    fp32 per pair. The other reads of a ``b`` row are ``bytes_reread``."""
    distinct = distinct_rows(copies, b_sources)
    reads = copies * (D * 2 + 2 * _INDEX_BYTES) + distinct * D * 2
    return Cost(reads, copies * 4, bytes_reread=(copies - distinct) * D * 2)
