"""The MoE layer's router: gate scores, top-k (or a forced assignment), and the padded expert layout of the tokens.

torchtitan's token-choice router, in the layer's stage contracts:

* ``router_gate(x, wr)``: logits (T, E) = x @ wr^T in bf16 (the gate is a bf16 linear under mixed precision);
* ``router_topk(logits, top_k, score_func)``: scores (T, E) fp32 = sigmoid or softmax of the fp32 logits, and each
  token's top_k (scores, experts); ``router_forced(logits, assign, score_func)``: the same scores, the experts
  given (a benchmark's balanced or skewed assignment, as torchao's layer benchmark forces balance), their scores
  gathered;
* ``route_tokens(experts, top, alignment, rows)``: where every token copy goes in the experts' padded groups
  (``dest``), which copy fills each padded row (``row_src``, ``row_w``) and the groups' slot ends ``offs``; no host
  sync (the buffer has the host-known upper bound ``rows`` = ``padding.padded_rows``), so a CUDA graph captures it;
* backward: ``router_grad`` (the top-k scores' gradient through the score function to the logits) and
  ``router_gate_grad`` (the logits' gradient through the gate linear, summed into grad_x with the other paths).

Index math and the small dense ops run as torch ops; each call has a reference written apart and a declared cost.
"""

from __future__ import annotations

from enum import StrEnum

import torch

from ..core import vjp
from ..core.cost import Cost, ceil_to
from ..core.runtime import InputError, check_tensor
from .gate_grad import token_grad

INDEX_DTYPE = torch.int32


class ScoreFunc(StrEnum):
    SIGMOID = "sigmoid"
    SOFTMAX = "softmax"


def _scores(logits: torch.Tensor, score_func: str) -> torch.Tensor:
    z = logits.float()
    return torch.sigmoid(z) if ScoreFunc(score_func) == ScoreFunc.SIGMOID else torch.softmax(z, dim=1)


# ---- forward ------------------------------------------------------------------------------------------------------


def router_gate(x: torch.Tensor, wr: torch.Tensor) -> tuple[torch.Tensor]:
    """(logits (T, E) bf16,) = x (T, K) @ wr (E, K)^T."""
    x = check_tensor("x", x, dtypes=(torch.bfloat16,), ndim=2)
    wr = check_tensor("wr", wr, dtypes=(torch.bfloat16,), ndim=2)
    if wr.shape[1] != x.shape[1]:
        raise InputError(f"wr must be (E, {x.shape[1]}), got {tuple(wr.shape)}")
    return (torch.mm(x, wr.t()),)


def router_gate_reference(x, wr):
    return ((x.double() @ wr.double().t()).to(torch.bfloat16),)


def router_topk(logits: torch.Tensor, *, top_k: int, score_func: str) -> tuple[torch.Tensor, ...]:
    """(scores (T, E) fp32, top (T, top_k) fp32, experts (T, top_k) int32): each token's top_k experts, best
    first, ties to the lower expert index (a NaN score ranks above every number, as in torch's sort)."""
    scores = _scores(check_tensor("logits", logits, ndim=2), score_func)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :top_k]
    return scores, scores.gather(1, order), order.to(INDEX_DTYPE)


def router_topk_reference(logits, *, top_k, score_func):
    """The same choice by counting: an expert's rank is the number of experts that beat it (a higher score, or the
    same score and a lower index); the experts of ranks 0..top_k-1 in rank order."""
    scores = _scores(logits, score_func)
    key = torch.where(torch.isnan(scores), torch.inf, scores)  # NaN first, as torch's descending sort puts it
    E = scores.shape[1]
    lower = torch.arange(E, device=scores.device).unsqueeze(1) < torch.arange(E, device=scores.device).unsqueeze(0)
    beats = (key.unsqueeze(2) > key.unsqueeze(1)) | ((key.unsqueeze(2) == key.unsqueeze(1)) & lower)  # [t, e', e]
    rank = beats.sum(1)
    experts = (rank.unsqueeze(1) == torch.arange(top_k, device=scores.device).view(1, -1, 1)).int().argmax(2)
    return scores, scores.gather(1, experts), experts.to(INDEX_DTYPE)


def router_forced(logits: torch.Tensor, assign: torch.Tensor, *, score_func: str) -> tuple[torch.Tensor, ...]:
    """``router_topk`` with the experts given: assign (T, top_k) int32, distinct within a row."""
    scores = _scores(check_tensor("logits", logits, ndim=2), score_func)
    assign = check_tensor("assign", assign, dtypes=(INDEX_DTYPE,), ndim=2)
    return scores, scores.gather(1, assign.long()), assign


def router_forced_reference(logits, assign, *, score_func):
    scores = _scores(logits, score_func)
    rows = torch.arange(assign.shape[0], device=assign.device).unsqueeze(1)
    return scores, scores[rows, assign.long()], assign.clone()


def route_tokens(experts: torch.Tensor, top: torch.Tensor, *, num_experts: int, alignment: int, rows: int,
                 weighted_rows: bool) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Where the token copies go (copy c = t * top_k + j is token t's j-th choice), on the device.

    Returns ``dest`` int32 (T*k,): the padded row of copy c (copies of one expert in copy order, each group from
    the start of its slot of ceil_alignment(count) rows); ``row_src`` int32 (rows,): the token of each padded row,
    -1 for padding; ``row_w`` fp32 (rows,): the score of each row's copy (``weighted_rows``; else ones), 0 for
    padding; ``offs`` int32 (E,): slot ends; ``copy_token`` int32 (T*k,): the token of each copy.
    """
    experts = check_tensor("experts", experts, dtypes=(INDEX_DTYPE,), ndim=2)
    T, k = experts.shape
    flat = experts.reshape(-1).long()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    sizes = (counts + alignment - 1) // alignment * alignment
    slot_end = sizes.cumsum(0)
    order = torch.argsort(flat, stable=True)
    group_start = counts.cumsum(0) - counts
    sorted_expert = flat[order]
    rank = torch.arange(flat.numel(), device=device) - group_start[sorted_expert]
    dest_sorted = (slot_end - sizes)[sorted_expert] + rank
    dest = torch.empty_like(dest_sorted)
    dest[order] = dest_sorted
    row_copy = torch.full((rows,), -1, dtype=torch.int64, device=device)
    row_copy[dest_sorted] = order
    valid = row_copy >= 0
    row_src = torch.where(valid, row_copy // k, -1)
    top_flat = top.reshape(-1)
    weights = top_flat[row_copy.clamp(min=0)] if weighted_rows else torch.ones(rows, device=device)
    row_w = torch.where(valid, weights, torch.zeros((), device=device))
    copy_token = torch.arange(T * k, device=device) // k
    return (dest.to(INDEX_DTYPE), row_src.to(INDEX_DTYPE), row_w.float(), slot_end.to(INDEX_DTYPE),
            copy_token.to(INDEX_DTYPE))  # fmt: skip


def route_tokens_reference(experts, top, *, num_experts, alignment, rows, weighted_rows):
    """The same layout built on the host, expert by expert, copy by copy."""
    T, k = experts.shape
    ids = experts.reshape(-1).tolist()
    scores = top.reshape(-1).tolist()
    dest, row_src, row_w, ends, at = [0] * len(ids), [-1] * rows, [0.0] * rows, [], 0
    for e in range(num_experts):
        copies = [c for c, x in enumerate(ids) if x == e]
        for i, c in enumerate(copies):
            dest[c] = at + i
            row_src[at + i] = c // k
            row_w[at + i] = scores[c] if weighted_rows else 1.0
        at += ceil_to(len(copies), alignment)
        ends.append(at)
    device = experts.device
    as_int = lambda v: torch.tensor(v, dtype=INDEX_DTYPE, device=device)
    return (as_int(dest), as_int(row_src), torch.tensor(row_w, dtype=torch.float32, device=device), as_int(ends),
            as_int([c // k for c in range(T * k)]))  # fmt: skip


# ---- backward -----------------------------------------------------------------------------------------------------


def router_grad(grad_top: torch.Tensor, scores: torch.Tensor, experts: torch.Tensor, *,
                score_func: str) -> tuple[torch.Tensor]:  # fmt: skip
    """(grad_logits (T, E) bf16,): grad_top (T*k,) fp32 scattered to the chosen experts' scores, then through the
    score function (fp32), rounded once."""
    T, E = scores.shape
    g = torch.zeros(T, E, dtype=torch.float32, device=scores.device)
    g.scatter_add_(1, experts.long(), grad_top.view(T, -1))
    if ScoreFunc(score_func) == ScoreFunc.SIGMOID:
        grad = g * scores * (1.0 - scores)
    else:
        grad = scores * (g - (g * scores).sum(1, keepdim=True))
    return (grad.to(torch.bfloat16),)


def router_grad_reference(grad_top, scores, experts, *, score_func):
    """Autograd of the score function on the fp32 logits that give ``scores``."""
    T = scores.shape[0]
    with torch.enable_grad():
        if ScoreFunc(score_func) == ScoreFunc.SIGMOID:
            z = torch.logit(scores.double()).requires_grad_()
            s = torch.sigmoid(z)
        else:
            z = scores.double().log().requires_grad_()
            s = torch.softmax(z, dim=1)
        picked = s.gather(1, experts.long())
        (g,) = vjp.grad(picked, z, grad_top.view(T, -1).double())  # autograd.grad, without importing sympy
    return (g.to(torch.bfloat16),)


def router_gate_grad(grad_logits: torch.Tensor, x: torch.Tensor, wr: torch.Tensor, *others: torch.Tensor):
    """(grad_x (T, K) bf16, grad_wr (E, K) bf16): the gate linear's backward, grad_x summed (fp32, one rounding)
    with ``others[0]``, then each further other path's token gradient added (a rounding each). grad_x is a stream of
    T x K with an E-long contraction (``gate_grad.token_grad``: 2.4 ms as ``torch.addmm`` at DeepSeek-V3's layer, 39%
    of the copy roof); grad_wr is ``torch.mm`` (our split-T kernel lost to it at all four layers measured on an H200:
    docs/perf-log.md 2026-11-29)."""
    total = token_grad(grad_logits, wr, others[0] if others else None)
    for o in others[1:]:
        total = torch.add(total, o)
    return total, torch.mm(grad_logits.t(), x)


def router_gate_grad_reference(grad_logits, x, wr, *others):
    total = grad_logits.double() @ wr.double()
    for o in others:
        total = total + o.double()
    return total.to(torch.bfloat16), (grad_logits.double().t() @ x.double()).to(torch.bfloat16)


# ---- costs --------------------------------------------------------------------------------------------------------


def router_gate_cost(T: int, K: int, E: int) -> Cost:
    return Cost(T * K * 2 + E * K * 2, T * E * 2, 2 * T * K * E, "bf16")


def router_topk_cost(T: int, E: int, top_k: int) -> Cost:
    """Read the logits (and a forced assignment), write the fp32 scores, the top-k scores and experts."""
    return Cost(T * E * 2 + T * top_k * 4, T * E * 4 + T * top_k * 8)


def route_tokens_cost(T: int, top_k: int, rows: int) -> Cost:
    """Read the experts and scores; write dest, copy_token and the padded rows' source and weight. torch's sort
    and scatters move more: this is the floor."""
    S = T * top_k
    return Cost(S * 8, S * 8 + rows * 8)


def router_grad_cost(T: int, E: int, top_k: int) -> Cost:
    return Cost(T * top_k * 8 + T * E * 4, T * E * 2)


def router_gate_grad_cost(T: int, K: int, E: int, others: int) -> Cost:
    """grad_x = grad_logits @ wr (+ others), grad_wr = grad_logits^T @ x."""
    return Cost(2 * T * E * 2 + E * K * 2 + T * K * 2 * (1 + others), T * K * 2 + E * K * 2, 4 * T * K * E, "bf16")
