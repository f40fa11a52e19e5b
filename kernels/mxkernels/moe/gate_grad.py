"""The router gate's token gradient, grad_x (T, K) = grad_logits (T, E) @ wr (E, K) (+ grad_x_in (T, K)): a stream of
grad_x with a contraction of only E = 8-128 experts.

Why: the stage's cost is bytes, not FLOPs. Adding into the other paths' grad_x (the layer's case) reads T x K x 2
bytes and writes as many; grad_logits (T x E x 2) and wr (E x K x 2) are small (DeepSeek-V3's layer: 131072 x 7168:
3.76 GB moved, 0.92 ms at the H200's measured 4.08 TB/s copy roof, for 15 GFLOP). ``torch.addmm`` ran it at 2415 us
there (39% of the roof; docs/perf-log.md 2026-11-29): a GEMM library tiles a K = E contraction as if it were long.

Here each program owns one (BLOCK_K)-column slice of the output, loads wr's (E, BLOCK_K) slice once, and walks
row blocks of the tokens (strided by the programs along T): per block one (BLOCK_T, E) x (E, BLOCK_K) ``tl.dot``
in fp32 (E padded with zeros to at least 16, the tensor core's smallest contraction: exact zero products, one code
path for every E), plus grad_x_in read as fp32, rounded once to bf16 -- as ``torch.addmm`` rounds (cuBLAS sums in
fp32 and adds beta x C in its fp32 epilogue); only the order of the fp32 sum over E may differ.

Contract: grad_logits (T, E), wr (E, K), grad_x_in (T, K) or None, all bf16, any strides; returns a new (T, K) bf16
tensor, the fp32 sum rounded once (``token_grad_reference``: fp64, rounded once). E <= 256 (one tile of wr a
program).
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

MAX_E = 256


@triton.jit
def _token_grad_kernel(g_ptr, w_ptr, add_ptr, out_ptr, T, E, K, s_gt, s_ge, s_we, s_wk, s_at, s_ak, s_ot, s_ok,
                       HAS_ADD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                       STAGES: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """out[t, k] = sum_e g[t, e] * w[e, k] (+ add[t, k]) in fp32 for this program's columns and every
    (program along T)-th row block. ``EXACT`` (the interpreter, whose bf16 ``tl.dot`` is not faithful) multiplies
    fp32 copies: the same products, exactly."""
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    e = tl.arange(0, BLOCK_E)
    k_ok = k < K
    e_ok = e < E
    w = tl.load(w_ptr + e[:, None] * s_we + k[None, :] * s_wk, mask=e_ok[:, None] & k_ok[None, :], other=0.0)
    if EXACT:
        w = w.to(tl.float32)
    blocks = tl.cdiv(T, BLOCK_T)
    for b in tl.range(tl.program_id(1), blocks, tl.num_programs(1), num_stages=STAGES):
        rows = b * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = rows < T
        rows64 = rows.to(tl.int64)
        g = tl.load(g_ptr + rows64[:, None] * s_gt + e[None, :] * s_ge, mask=row_ok[:, None] & e_ok[None, :],
                    other=0.0)  # fmt: skip
        if EXACT:
            g = g.to(tl.float32)
        acc = tl.dot(g, w)
        tile = row_ok[:, None] & k_ok[None, :]
        if HAS_ADD:
            acc += tl.load(add_ptr + rows64[:, None] * s_at + k[None, :] * s_ak, mask=tile, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows64[:, None] * s_ot + k[None, :] * s_ok, acc.to(out_ptr.dtype.element_ty), mask=tile)


@dataclass(frozen=True)
class TokenGradConfig:
    """One launch of ``token_grad``."""

    # Rows a step: a (block_t x block_k) tile of grad_x_in in and of grad_x out, 64 x 128 bf16 = 16 KiB each.
    block_t: int = 64
    # Output columns a program; its (E, block_k) slice of wr is loaded once (E = 128: 32 KiB).
    block_k: int = 128
    num_warps: int = 4
    # The row-block loop's pipelining depth (``tl.range``); the SM90 cross-compile shows no asynchronous copies for it,
    # so what is in flight is one row block's tiles a program (16 KiB of grad_x_in at 64 x 128).
    num_stages: int = 3
    # Programs an SM: the column slices x programs along T ~ SMs x this. Four: one row block in flight a program (no
    # asynchronous copies), so four programs keep ~64 KiB of reads in flight an SM, over the ~36 KiB that 4.8 TB/s
    # needs at ~1 us latency; two fell short at the 128-expert layers and four cost nothing at 8 experts
    # (docs/perf-log.md). Shared memory 14 KiB a program at E <= 16, 56 KiB at 128: four fit an SM's 227 KiB.
    programs_per_sm: int = 4

    def __post_init__(self):
        check_power_of_two("TokenGradConfig.block_t", self.block_t, lo=16)
        check_power_of_two("TokenGradConfig.block_k", self.block_k, lo=16)
        if self.num_warps not in (1, 2, 4, 8):
            raise InputError(f"TokenGradConfig.num_warps must be 1, 2, 4 or 8, got {self.num_warps!r}")
        for name in ("num_stages", "programs_per_sm"):
            check_int(f"TokenGradConfig.{name}", getattr(self, name), 1)


DEFAULT_CONFIG = TokenGradConfig()
# The interpreter: small tiles, so a test's few tokens still make several row blocks a program.
_INTERPRETER_CONFIG = TokenGradConfig(block_t=16, block_k=32, num_warps=4, num_stages=1, programs_per_sm=1)


def _launch(T: int, E: int, K: int, config: TokenGradConfig, device: torch.device) -> tuple[int, int, int]:
    """(block_e, column slices, programs along T) of a call."""
    block_e = max(triton.next_power_of_2(E), 16)
    slices = triton.cdiv(K, config.block_k)
    along_t = max(min(triton.cdiv(sm_count(device) * config.programs_per_sm, slices), triton.cdiv(T, config.block_t)), 1)
    return block_e, slices, along_t


def token_grad(grad_logits: torch.Tensor, wr: torch.Tensor, grad_x_in: torch.Tensor | None = None, *,
               config: TokenGradConfig | None = None) -> torch.Tensor:  # fmt: skip
    """grad_x (T, K) bf16 = grad_logits (T, E) @ wr (E, K) (+ grad_x_in), fp32 sums rounded once (module doc)."""
    grad_logits = check_tensor("grad_logits", grad_logits, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    wr = check_tensor("wr", wr, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
    check_same_device("wr", wr, grad_logits, "grad_logits")
    (T, E), K = grad_logits.shape, wr.shape[1]
    if wr.shape[0] != E:
        raise InputError(f"wr must be ({E}, K) like grad_logits' experts, got {tuple(wr.shape)}")
    if E > MAX_E:
        raise InputError(f"token_grad takes at most {MAX_E} experts, got {E}")
    if grad_x_in is not None:
        grad_x_in = check_tensor("grad_x_in", grad_x_in, dtypes=(torch.bfloat16,), ndim=2, contiguous=False)
        check_same_device("grad_x_in", grad_x_in, grad_logits, "grad_logits")
        if tuple(grad_x_in.shape) != (T, K):
            raise InputError(f"grad_x_in must be ({T}, {K}), got {tuple(grad_x_in.shape)}")
    if config is not None and not isinstance(config, TokenGradConfig):
        raise InputError(f"config must be a TokenGradConfig or None, got {config!r}")
    config = config or (_INTERPRETER_CONFIG if INTERPRET else DEFAULT_CONFIG)
    # The interpreter's fp32 -> bf16 cast does not round to nearest even: there the sums leave as fp32, cast by torch
    # (on a GPU ``.to`` is a no-op: the kernel wrote bf16).
    out = torch.empty(T, K, dtype=torch.float32 if INTERPRET else torch.bfloat16, device=grad_logits.device)
    if T * K == 0:
        return out.to(torch.bfloat16)
    if E == 0:  # the empty sum
        return (grad_x_in.clone() if grad_x_in is not None else torch.zeros_like(out)).to(torch.bfloat16)
    block_e, slices, along_t = _launch(T, E, K, config, grad_logits.device)
    add = grad_x_in if grad_x_in is not None else out  # not read without HAS_ADD
    _token_grad_kernel[(slices, along_t)](grad_logits, wr, add, out, T, E, K, *grad_logits.stride(), *wr.stride(),
                                          *add.stride(), *out.stride(), HAS_ADD=grad_x_in is not None,
                                          BLOCK_T=config.block_t, BLOCK_E=block_e, BLOCK_K=config.block_k,
                                          STAGES=config.num_stages, EXACT=INTERPRET,
                                          num_warps=config.num_warps)  # fmt: skip
    return out.to(torch.bfloat16)


def token_grad_reference(grad_logits: torch.Tensor, wr: torch.Tensor, grad_x_in: torch.Tensor | None = None):
    """fp64 product (+ grad_x_in), rounded once to bf16."""
    total = grad_logits.double() @ wr.double()
    if grad_x_in is not None:
        total = total + grad_x_in.double()
    return total.to(torch.bfloat16)


def token_grad_cost(T: int, K: int, E: int, add: bool) -> Cost:
    """Each input read once (wr's slices once a program: a few hundred KB, L2 hits, not the floor), grad_x written
    once; 2 T E K FLOPs (DeepSeek-V3: 15 GFLOP, ~21 us of the tensor core against ~0.9 ms of bytes)."""
    return Cost(T * E * 2 + E * K * 2 + (T * K * 2 if add else 0), T * K * 2, 2 * T * E * K, "bf16")
