"""Per-stage oracles of the EP layer's four scored row movements, written from the layer's formulas (``ep_layer``'s
module doc), not from the kernels' options.

The stages ``sort_tokens``, ``unsort_combine``, ``sort_grad`` and ``unsort_grad`` run the layer's weighted gathers
with a ``weighted`` flag that the stage table sets from the layer's score placement. An oracle that read the same
flag would agree with a table that set it wrong (it did: every per-stage check passed with ``sort_grad``'s weighting
flipped). These oracles take the layer's ``score_before`` instead (bound when the stage list is built) and accept
the kernel's ``weighted`` without reading it. Per copy c = t*k + j of token t (s_c its score, in sorted order as
``row_w``, in copy order as ``top``):

| stage            | scores first (``score_before``)     | scores last                          |
|------------------|-------------------------------------|--------------------------------------|
| sort_tokens      | xs_c = bf16(s_c * x_t)              | xs_c = x_t                           |
| unsort_combine   | y_t = sum_j ys_c                    | y_t = sum_j s_c * ys_c               |
| sort_grad        | dys_c = dy_t                        | dys_c = bf16(s_c * dy_t)             |
| unsort_grad      | grad_x_t = sum_j s_c * grad_xs_c    | grad_x_t = sum_j grad_xs_c           |

Products in fp32, sums in fp32 in choice order, rounded once to bf16: the rounding the layer's tensors have. Plain
torch, none of the kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

_BF = torch.bfloat16


def _gather(src: torch.Tensor, index: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
    """Row index[i] of src, times scores[i] in fp32 and rounded once to bf16 where scores are given."""
    rows = src[index.long()]
    return rows if scores is None else (rows.float() * scores.float().unsqueeze(1)).to(_BF)


def _sum_copies(rows: torch.Tensor, top: torch.Tensor, scores: bool) -> torch.Tensor:
    """Each token's k copy rows (copy order), times their scores when ``scores``, summed in fp32 in choice order."""
    k = top.shape[1]
    copies = rows.float().view(-1, k, rows.shape[1])
    if scores:
        copies = copies * top.float().view(-1, k, 1)
    total = copies[:, 0]
    for j in range(1, k):
        total = total + copies[:, j]
    return total.to(_BF)


def sort_tokens_reference(x, token_of, row_w, *, score_before: bool, **kernel_options):
    """xs (T*k, K): each sorted copy's token row, scored when the scores come first."""
    return (_gather(x, token_of, row_w if score_before else None),)


def sort_grad_reference(dy, token_of, row_w, *, score_before: bool, **kernel_options):
    """dys (T*k, K): each sorted copy's output gradient row, scored when the scores come last."""
    return (_gather(dy, token_of, None if score_before else row_w),)


def unsort_combine_reference(ys, pos, top, *, score_before: bool, **kernel_options):
    """y (T, K): each token's k outputs (ys[pos[c]]) summed, scored when the scores come last."""
    return (_sum_copies(ys[pos.long()], top, scores=not score_before),)


def unsort_grad_reference(grad_xs, pos, top, *, score_before: bool, **kernel_options):
    """grad_x (T, K): each token's k copies' gradients (grad_xs[pos[c]]) summed, scored when the scores come first."""
    return (_sum_copies(grad_xs[pos.long()], top, scores=score_before),)


_ORACLES = {
    "sort_tokens": sort_tokens_reference,
    "unsort_combine": unsort_combine_reference,
    "sort_grad": sort_grad_reference,
    "unsort_grad": unsort_grad_reference,
}
SCORED_STAGES = frozenset(_ORACLES)
"""The EP layer stages whose oracle depends on where the scores go."""


def scored_oracle(stage: str, score_before: bool) -> Callable:
    """The oracle of ``stage`` (one of ``SCORED_STAGES``) for a layer whose scores go first (``score_before``) or
    last."""
    return functools.partial(_ORACLES[stage], score_before=score_before)
