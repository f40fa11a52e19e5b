"""The router's weight gradient, grad_wr (E, K) = grad_logits (T, E)^T @ x (T, K): a skinny GEMM with a T-long
contraction, split along T so that the whole GPU streams x.

Why: as one GEMM the output has only ceil(E / BM) x ceil(K / BN) tiles (DeepSeek-V3's layer: 8 x 7168 -> 56 tiles of
128 columns; Qwen3-30B-A3B's: 128 x 2048 -> 16), so a library GEMM without split-K runs on a third or less of the
SMs, each streaming its columns of x over all 131072 tokens: at DeepSeek-V3 shapes on an H200 the stage took 2.8 ms
where reading x once (1.9 GB) takes ~0.4 ms. Here ``splits`` programs per output tile each sum one range of
tokens into fp32 (``tl.dot``, fp32 accumulator), written as partials (splits, E, K); a second kernel sums the
partials in split order (deterministic: the same bits every run) and rounds once to bf16.

Count (``gate_weight_grad_cost``): reads grad_logits (T x E x 2 bytes) and x (T x K x 2) once, writes E x K x 2; the
partials add splits x E x K x 4 written and read, splits ~ SMs / tiles, so a few MB against x's gigabytes (mostly
L2 hits). FLOPs 2 x T x E x K: at E <= 128 the stream of x is the floor (Qwen3: 67 MB, ~16 us at 4.3 TB/s; 8.6
GFLOP, ~12 us at 700 TFLOP/s), from E ~ 150 on the bf16 tensor core is.

Contract: grad_logits (T, E) and x (T, K) bf16, any strides, E <= 256 per program (more: several E blocks, x read
once per block); returns (E, K) bf16, the fp32 sum rounded once (``gate_weight_grad_reference``: fp64, rounded once).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.cost import Cost
from ..core.runtime import (
    INTERPRET,
    InputError,
    check_int,
    check_power_of_two,
    check_same_device,
    check_tensor,
    sm_count,
)


@triton.jit
def _partials_kernel(g_ptr, x_ptr, part_ptr, T, E, K, ROWS, s_gt, s_ge, s_xt, s_xk,
                     BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                     EXACT: tl.constexpr):  # fmt: skip
    """part[split, e, k] = sum over tokens [split * ROWS, +ROWS) of g[t, e] * x[t, k], fp32. ``EXACT`` (the
    interpreter, whose bf16 ``tl.dot`` is not faithful) multiplies fp32 copies: the same products, exactly."""
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    split = tl.program_id(2)
    t0 = split * ROWS
    t1 = tl.minimum(t0 + ROWS, T)
    k_ok = k < K
    e_ok = e < E
    acc = tl.zeros((BLOCK_E, BLOCK_K), tl.float32)
    for t in tl.range(t0, t1, BLOCK_T, num_stages=STAGES):
        rows = t + tl.arange(0, BLOCK_T)
        row_ok = rows < t1
        rows64 = rows.to(tl.int64)
        # grad_logits loaded as its (E, T) transpose: the few bytes a step (E x BLOCK_T) need no coalescing
        g_t = tl.load(g_ptr + e[:, None] * s_ge + rows64[None, :] * s_gt, mask=e_ok[:, None] & row_ok[None, :],
                      other=0.0)  # fmt: skip
        x = tl.load(x_ptr + rows64[:, None] * s_xt + k[None, :] * s_xk, mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)  # fmt: skip
        if EXACT:
            g_t = g_t.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(g_t, x, acc)
    at = part_ptr + (split.to(tl.int64) * E + e[:, None]) * K + k[None, :]
    tl.store(at, acc, mask=e_ok[:, None] & k_ok[None, :])


@triton.jit
def _sum_kernel(part_ptr, out_ptr, SPLITS, ELEMS, BLOCK: tl.constexpr):
    """out[i] = bf16(sum over splits s in order of part[s, i])."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < ELEMS
    total = tl.zeros((BLOCK,), tl.float32)
    for s in range(SPLITS):
        total += tl.load(part_ptr + s * ELEMS + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, total.to(out_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class GateGradConfig:
    """One launch of ``gate_weight_grad``."""

    # Tokens per step: a (block_t x block_k) slice of x and (block_t x E) of grad_logits per step; 64 x 128 bf16 is
    # 16 KiB of x, three steps in flight (~48 KiB with grad_logits at E = 8) cover the memory latency of one SM's
    # share of the stream (4.8 TB/s / 132 ~ 36 GB/s a SM).
    block_t: int = 64
    # Output columns per program; with E rows of fp32 accumulator: E x block_k / (32 x num_warps) registers a thread.
    block_k: int = 128
    # The E rows a program sums at once (None: E rounded up to a power of two, 16 to 256): x is read once per block.
    block_e: int | None = None
    num_warps: int = 8
    num_stages: int = 3
    # Programs per SM the splits aim at: tiles x splits ~ SMs x this (more splits: more partial bytes).
    programs_per_sm: int = 1
    # The most splits (tests use 1 and a few to check both paths).
    max_splits: int | None = None

    def __post_init__(self):
        check_power_of_two("GateGradConfig.block_t", self.block_t, lo=16)
        check_power_of_two("GateGradConfig.block_k", self.block_k, lo=16)
        if self.block_e is not None:
            check_power_of_two("GateGradConfig.block_e", self.block_e, lo=16)
        if self.num_warps not in (1, 2, 4, 8):
            raise InputError(f"GateGradConfig.num_warps must be 1, 2, 4 or 8, got {self.num_warps!r}")
        for name in ("num_stages", "programs_per_sm"):
            check_int(f"GateGradConfig.{name}", getattr(self, name), 1)
        if self.max_splits is not None:
            check_int("GateGradConfig.max_splits", self.max_splits, 1)


DEFAULT_CONFIG = GateGradConfig()
# The interpreter: small tiles, so a test's few tokens still make several steps and splits.
_INTERPRETER_CONFIG = GateGradConfig(block_t=16, block_k=32, num_warps=4, num_stages=1, programs_per_sm=2)


def _launch(T: int, E: int, K: int, config: GateGradConfig, device: torch.device) -> tuple[int, int, int, int]:
    """(block_e, splits, tokens a split, column tiles) of a call."""
    block_e = config.block_e or min(max(triton.next_power_of_2(E), 16), 256)
    tiles = triton.cdiv(K, config.block_k) * triton.cdiv(E, block_e)
    splits = max(min(triton.cdiv(sm_count(device) * config.programs_per_sm, tiles), triton.cdiv(T, config.block_t),
                     config.max_splits or T), 1)  # fmt: skip
    rows = triton.cdiv(triton.cdiv(T, splits), config.block_t) * config.block_t  # whole steps a split
    return block_e, triton.cdiv(T, rows), rows, tiles


def gate_weight_grad(grad_logits: torch.Tensor, x: torch.Tensor, *, config: GateGradConfig | None = None) -> torch.Tensor:
    """grad_wr (E, K) bf16 = grad_logits (T, E)^T @ x (T, K), summed in fp32 over splits of the tokens (module doc)."""
    grad_logits = check_tensor("grad_logits", grad_logits, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    x = check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    check_same_device("x", x, grad_logits, "grad_logits")
    (T, E), K = grad_logits.shape, x.shape[1]
    if x.shape[0] != T:
        raise InputError(f"x must be ({T}, K) like grad_logits' tokens, got {tuple(x.shape)}")
    if config is not None and not isinstance(config, GateGradConfig):
        raise InputError(f"config must be a GateGradConfig or None, got {config!r}")
    config = config or (_INTERPRETER_CONFIG if INTERPRET else DEFAULT_CONFIG)
    if T == 0:  # no tokens: the empty sum
        return torch.zeros(E, K, dtype=torch.bfloat16, device=x.device)
    if E * K == 0:
        return torch.empty(E, K, dtype=torch.bfloat16, device=x.device)
    block_e, splits, rows, _ = _launch(T, E, K, config, x.device)
    part = torch.empty(splits, E, K, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(K, config.block_k), triton.cdiv(E, block_e), splits)
    _partials_kernel[grid](grad_logits, x, part, T, E, K, rows, *grad_logits.stride(), *x.stride(),
                           BLOCK_T=config.block_t, BLOCK_E=block_e, BLOCK_K=config.block_k, STAGES=config.num_stages,
                           EXACT=INTERPRET, num_warps=config.num_warps)  # fmt: skip
    block = 1024
    # The interpreter's fp32 -> bf16 cast does not round to nearest even: there the sums leave as fp32, cast by torch
    # (on a GPU ``.to`` is a no-op: the kernel wrote bf16).
    out = torch.empty(E, K, dtype=torch.float32 if INTERPRET else torch.bfloat16, device=x.device)
    _sum_kernel[(triton.cdiv(E * K, block),)](part, out, splits, E * K, BLOCK=block, num_warps=4)
    return out.to(torch.bfloat16)


def gate_weight_grad_reference(grad_logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """fp64 product, rounded once to bf16."""
    return (grad_logits.double().t() @ x.double()).to(torch.bfloat16)


def gate_weight_grad_cost(T: int, K: int, E: int) -> Cost:
    """Each input read once, the output written once (the partials' few MB, mostly L2 hits, are not the floor)."""
    return Cost(T * E * 2 + T * K * 2, E * K * 2, 2 * T * E * K, "bf16")
