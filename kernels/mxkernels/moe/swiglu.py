"""SwiGLU, the experts' activation: ``act = silu(h1) * h3`` and its backward.

h1 and h3 are the gate and up projections of the same rows: two (M, N) tensors, or the two halves of one (M, 2N)
output of a fused gate/up GEMM (views with row stride 2N: no copy). Numerics (the contract): fp32 arithmetic on the
bf16 inputs, ``sigmoid(x) = 1 / (1 + exp(-x))``, one rounding to bf16 (nearest even) per output.

* forward  ``act = bf16(h1 * sigmoid(h1) * h3)``
* backward ``grad_h1 = bf16(g * h3 * s * (1 + h1 * (1 - s)))``, ``grad_h3 = bf16(g * h1 * s)`` with
  ``s = sigmoid(h1)``, ``g = grad_act``; written packed as one (M, 2N) tensor [grad_h1 | grad_h3] (the fused GEMM's
  layout) or as two (M, N) tensors.

Kernels: every operation of the formulas is its own fp32 rounding, in the references' order (launched with
``enable_fp_fusion=False``: no FMA contracts ``1 + h1 * (1 - s)``), the division is IEEE (``div_rn``, as torch's
reciprocal), and the bf16 rounding is round-to-nearest-even (``block_math.to_bf16_bits``: the hardware cast on a
GPU, integer arithmetic under the interpreter). ``exp`` is libdevice's
``expf`` on a GPU, the function torch's CUDA ``exp`` compiles to, so the kernels should match the references
evaluated on the GPU bit for bit (tests/test_moe_layer_gpu.py checks it); under the interpreter ``exp`` is numpy's,
which may differ from torch's CPU ``exp`` by an ulp, and an output then by one bf16 ulp, rarely. ``swiglu_producer``
and ``swiglu_backward_producer`` are the two as a quantizer's tile producer (``moe_fused``), the same arithmetic.
Launches: ``moe_rows.RowsMoveConfig`` as ``config=`` (``SWIGLU_CONFIG``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..core.block_math import masked_load, masked_store, to_bf16_bits, to_fp32
from ..core.cost import Cost
from ..core.runtime import INTERPRET, InputError, check_config, check_same_device, check_tensor, default_launch
from .moe_rows import RowsMoveConfig

# The launch: ``moe_rows.RowsMoveConfig``, rows of block_bytes of each bf16 input per program. Not measured yet
# (docs/perf-log.md has the predictions): 8 rows x 1024 columns, 32 elements a thread at 8 warps, four 16-byte
# vector loads per input.
SWIGLU_CONFIG = RowsMoveConfig(block_rows=8, block_bytes=2048, num_warps=8)
# config=None under the interpreter (runtime.default_launch): 64 rows a program.
_SWIGLU_LAUNCH = default_launch(SWIGLU_CONFIG, RowsMoveConfig(block_rows=64, block_bytes=2048, num_warps=8))

# ---------------------------------------------------------------------------------------------------------------
# Device functions and kernels
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _sigmoid(a, EXACT: tl.constexpr):
    """1 / (1 + exp(-a)), IEEE division; exp is libdevice's expf on a GPU (torch's), numpy's under the interpreter
    (EXACT), where libdevice does not exist."""
    if EXACT:
        e = tl.exp(-a)
    else:
        e = libdevice.exp(-a)
    return tl.math.div_rn(tl.full(a.shape, 1.0, tl.float32), 1.0 + e)


@triton.jit
def _grads(g, a, b, EXACT: tl.constexpr):
    """fp32 (grad_h1, grad_h3) of act = silu(a) * b for the output gradient g, in the references' order."""
    s = _sigmoid(a, EXACT)
    return g * b * s * (1.0 + a * (1.0 - s)), g * a * s


@triton.jit
def _load(ptr, rows, stride, cols, mask, EVEN: tl.constexpr):
    return to_fp32(masked_load(ptr + rows[:, None] * stride + cols[None, :], mask, EVEN))


@triton.jit
def swiglu_producer(out_ptrs, rows, row_ok, cols, col_ok, n_cols, a_ptr, b_ptr, c_ptr, a_stride, b_stride,
                    VARIANT: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """``block_math.load_rows``'s producer signature: act = swiglu(h1, h3) of rows ``rows``, columns ``cols`` (h1 at
    a_ptr, row stride a_stride; h3 at b_ptr, b_stride), stored at out_ptrs (bf16 (., n_cols)) and returned."""
    mask = row_ok[:, None] & col_ok[None, :]
    a = _load(a_ptr, rows, a_stride, cols, mask, EVEN)
    act = to_bf16_bits(a * _sigmoid(a, EXACT) * _load(b_ptr, rows, b_stride, cols, mask, EVEN), EXACT)
    act = act.to(tl.bfloat16, bitcast=True)
    masked_store(out_ptrs, act, mask, EVEN)
    return act


@triton.jit
def swiglu_backward_producer(out_ptrs, rows, row_ok, cols, col_ok, n_cols, a_ptr, b_ptr, c_ptr, a_stride, b_stride,
                             VARIANT: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """``block_math.load_rows``'s producer signature: the packed grad_h = [grad_h1 | grad_h3] (., n_cols = 2N) of
    rows ``rows``, columns ``cols`` in [0, 2N) (h1 at a_ptr, h3 at b_ptr with row strides a_stride, b_stride;
    grad_act (., N) contiguous at c_ptr), stored at out_ptrs (bf16) and returned. Column c of either half reads
    column c mod N of the inputs: the two halves of a row come from programs next to each other in the quantizer's
    grid, so the inputs' second read is an L2 hit."""
    N = n_cols // 2
    upper = cols >= N
    src = tl.where(upper, cols - N, cols)
    mask = row_ok[:, None] & col_ok[None, :]
    d1, d3 = _grads(_load(c_ptr, rows, N, src, mask, EVEN), _load(a_ptr, rows, a_stride, src, mask, EVEN),
                    _load(b_ptr, rows, b_stride, src, mask, EVEN), EXACT)  # fmt: skip
    grad = to_bf16_bits(tl.where(upper[None, :], d3, d1), EXACT).to(tl.bfloat16, bitcast=True)
    masked_store(out_ptrs, grad, mask, EVEN)
    return grad


@triton.jit
def swiglu_backward_halves_producer(out_ptrs, rows, row_ok, cols, col_ok, n_cols, a_ptr, b_ptr, c_ptr, a_stride,
                                    b_stride, VARIANT: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """``swiglu_backward_producer`` for a rows kernel that lays each row out in halves (``fp8_amax``'s HALVES): lane
    j < H of the tile (H = len(cols) / 2) holds grad_h1[:, j] and lane H + j grad_h3[:, j]. Each input column is
    read and its sigmoid computed once for both halves (the plain producer computes them for each half's lane, so
    twice), then the two halves are laid side by side; the arithmetic, and so every bit, is the plain one's."""
    N = n_cols // 2
    HALF: tl.constexpr = cols.shape[0] // 2
    j = tl.arange(0, HALF)
    mask = row_ok[:, None] & (j < N)[None, :]
    d1, d3 = _grads(_load(c_ptr, rows, N, j, mask, EVEN), _load(a_ptr, rows, a_stride, j, mask, EVEN),
                    _load(b_ptr, rows, b_stride, j, mask, EVEN), EXACT)  # fmt: skip
    both = tl.reshape(tl.permute(tl.join(d1, d3), (0, 2, 1)), (d1.shape[0], 2 * HALF))
    grad = to_bf16_bits(both, EXACT).to(tl.bfloat16, bitcast=True)
    masked_store(out_ptrs, grad, row_ok[:, None] & col_ok[None, :], EVEN)
    return grad


@triton.jit
def _swiglu_kernel(h1_ptr, h3_ptr, out_ptr, M, N, s1, s3, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   EXACT: tl.constexpr):  # fmt: skip
    # One program: a BLOCK_M x BLOCK_N tile of act, the fused stage's producer run alone.
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    swiglu_producer(out_ptr + rows[:, None] * N + cols[None, :], rows, rows < M, cols, cols < N, N, h1_ptr, h3_ptr,
                    h1_ptr, s1, s3, 0, False, EXACT)  # fmt: skip


@triton.jit
def _swiglu_backward_kernel(g_ptr, h1_ptr, h3_ptr, d1_ptr, d3_ptr, M, N, s1, s3, s_out, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    # One program: a BLOCK_M x BLOCK_N tile of both gradients from one read of the inputs; d1/d3 rows s_out apart
    # (2N packed, with d3_ptr N past d1_ptr; N split).
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    d1, d3 = _grads(_load(g_ptr, rows, N, cols, mask, False), _load(h1_ptr, rows, s1, cols, mask, False),
                    _load(h3_ptr, rows, s3, cols, mask, False), EXACT)  # fmt: skip
    out = rows[:, None] * s_out + cols[None, :]
    tl.store(d1_ptr + out, to_bf16_bits(d1, EXACT), mask=mask)
    tl.store(d3_ptr + out, to_bf16_bits(d3, EXACT), mask=mask)


def _launch(M: int, N: int, config: RowsMoveConfig) -> tuple[tuple[int, int], dict]:
    """Grid and tile constexprs of a launch over (M, N) bf16 elements."""
    cols = max(config.block_bytes // 2, 1)
    grid = (triton.cdiv(M, config.block_rows), triton.cdiv(N, cols))
    return grid, {"BLOCK_M": config.block_rows, "BLOCK_N": cols, "num_warps": config.num_warps}


def check_halves(h1: object, h3: object) -> tuple[torch.Tensor, torch.Tensor]:
    h1 = check_tensor("h1", h1, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    h3 = check_tensor("h3", h3, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    if h1.shape != h3.shape:
        raise InputError(f"h1 and h3 must have one shape, got {tuple(h1.shape)} and {tuple(h3.shape)}")
    for name, h in (("h1", h1), ("h3", h3)):
        if h.stride(1) != 1 or h.stride(0) < h.shape[1]:
            raise InputError(f"{name} must be row-major with contiguous rows (a view of a wider row is fine)")
    check_same_device("h3", h3, h1, "h1")
    return h1, h3


def check_backward(grad_act: object, h1: object, h3: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``swiglu_backward``'s argument checks (shared with the fused stages of ``moe_fused``)."""
    h1, h3 = check_halves(h1, h3)
    grad_act = check_tensor("grad_act", grad_act, dtypes=(torch.bfloat16,), ndim=2)
    if grad_act.shape != h1.shape:
        raise InputError(f"grad_act must be {tuple(h1.shape)}, got {tuple(grad_act.shape)}")
    check_same_device("grad_act", grad_act, h1, "h1")
    return grad_act, h1, h3


def split_halves(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (h1, h3) views of a fused gate/up output (M, 2N)."""
    n = h.shape[1] // 2
    return h[:, :n], h[:, n:]


def swiglu(h1: torch.Tensor, h3: torch.Tensor, *, config: RowsMoveConfig | None = None) -> torch.Tensor:
    """(M, N) bf16 ``silu(h1) * h3`` (module doc). ``config``: the launch (None: ``SWIGLU_CONFIG``)."""
    h1, h3 = check_halves(h1, h3)
    check_config("config", config, RowsMoveConfig)
    config = config or _SWIGLU_LAUNCH
    M, N = h1.shape
    out = torch.empty(M, N, dtype=torch.bfloat16, device=h1.device)
    if out.numel():
        grid, tile = _launch(M, N, config)
        _swiglu_kernel[grid](h1, h3, out, M, N, h1.stride(0), h3.stride(0), EXACT=INTERPRET, enable_fp_fusion=False,
                             **tile)  # fmt: skip
    return out


def swiglu_reference(h1, h3):
    a, b = h1.float(), h3.float()
    return (a * (1.0 / (1.0 + torch.exp(-a))) * b).to(torch.bfloat16)


def swiglu_backward(
    grad_act: torch.Tensor,
    h1: torch.Tensor,
    h3: torch.Tensor,
    *,
    packed: bool = True,
    config: RowsMoveConfig | None = None,
):
    """(grad_h (M, 2N),) packed, else (grad_h1, grad_h3), each (M, N) bf16 (module doc). ``config``: the launch
    (None: ``SWIGLU_CONFIG``)."""
    grad_act, h1, h3 = check_backward(grad_act, h1, h3)
    if not isinstance(packed, bool):
        raise InputError(f"packed must be a bool, got {packed!r}")
    check_config("config", config, RowsMoveConfig)
    config = config or _SWIGLU_LAUNCH
    M, N = h1.shape
    if packed:
        grad_h = torch.empty(M, 2 * N, dtype=torch.bfloat16, device=h1.device)
        d1, d3, outs = grad_h[:, :N], grad_h[:, N:], (grad_h,)
    else:
        d1 = torch.empty(M, N, dtype=torch.bfloat16, device=h1.device)
        d3 = torch.empty_like(d1)
        outs = (d1, d3)
    if M * N:
        grid, tile = _launch(M, N, config)
        _swiglu_backward_kernel[grid](grad_act, h1, h3, d1.view(torch.int16), d3.view(torch.int16), M, N, h1.stride(0),
                                      h3.stride(0), d1.stride(0), EXACT=INTERPRET, enable_fp_fusion=False,
                                      **tile)  # fmt: skip
    return outs


def swiglu_backward_reference(grad_act, h1, h3, *, packed: bool = True):
    g, a, b = grad_act.float(), h1.float(), h3.float()
    s = 1.0 / (1.0 + torch.exp(-a))
    d1 = (g * b * s * (1.0 + a * (1.0 - s))).to(torch.bfloat16)
    d3 = (g * a * s).to(torch.bfloat16)
    return (torch.cat([d1, d3], dim=1),) if packed else (d1, d3)


def swiglu_cost(M: int, N: int) -> Cost:
    """Read h1 and h3, write act (bf16)."""
    return Cost(2 * M * N * 2, M * N * 2)


def swiglu_backward_cost(M: int, N: int) -> Cost:
    """Read grad_act, h1 and h3, write both gradients (bf16)."""
    return Cost(3 * M * N * 2, 2 * M * N * 2)
