"""Per-stage oracles of the MoE layer's scored row movements, single-GPU (``stages.layer``) and expert-parallel
(``stages.ep_layer``), written from the layer's formulas, not from the kernels' options.

Which row movement applies the router's scores is a property of the layer's stage contract (its ``score_before``:
the scores weight the tokens before the experts, else the experts' outputs), not of a kernel option. The stages run
the weighted gathers with a ``weighted`` flag that the stage table sets from the layer's score placement; an oracle
that read the same flag would agree with a table that set it wrong (they did: every per-stage check passed with a
stage's weighting flipped, in both layers). These oracles take ``score_before`` instead (bound when the stage list
is built) and accept the kernel's ``weighted`` without reading it.

The single-GPU layer gathers each padded row r from token ``index[r]`` (``row_src``; -1: a padding row, all zeros)
with its copy's score ``w[r]`` (``row_w``); the EP layer gathers each sorted copy from its token (``token_of``) with
the score in sorted order (``row_w``). The sums take copy c = t*k + j of token t from row ``index[c]`` (``dest``,
``pos``), scored by ``s_c`` (``top``, copy order):

| single-GPU stage | EP stage       | scores first (``score_before``)          | scores last                           |
|------------------|----------------|------------------------------------------|---------------------------------------|
| permute          | sort_tokens    | xs_r = bf16(w_r * x[index_r])            | xs_r = x[index_r]                     |
| combine          | unsort_combine | y_t = sum_j out[index_c]                 | y_t = sum_j s_c * out[index_c]        |
| combine_grad     | sort_grad      | dys_r = dy[index_r]                      | dys_r = bf16(w_r * dy[index_r])       |
| permute_grad     | unsort_grad    | grad_x_t = sum_j s_c * grad_xs[index_c]  | grad_x_t = sum_j grad_xs[index_c]     |

Products in fp32, sums in fp32 in choice order, rounded once to bf16: the rounding the layer's tensors have. Plain
torch, none of the kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

_BF = torch.bfloat16


def _gather(src: torch.Tensor, index: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
    """Row index[i] of src (zeros where index[i] is -1), times scores[i] in fp32 and rounded once to bf16 where
    scores are given."""
    rows = src[index.clamp(min=0).long()]
    if scores is not None:
        rows = (rows.float() * scores.float().unsqueeze(1)).to(_BF)
    return torch.where((index >= 0).unsqueeze(1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


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


def permute_reference(x, index, row_w, *, score_before: bool, **kernel_options):
    """Each gathered row's token row, scored when the scores come first."""
    return (_gather(x, index, row_w if score_before else None),)


def combine_grad_reference(dy, index, row_w, *, score_before: bool, **kernel_options):
    """Each gathered row's output gradient row, scored when the scores come last."""
    return (_gather(dy, index, None if score_before else row_w),)


def combine_reference(out, index, top, *, score_before: bool, **kernel_options):
    """y (T, K): each token's k outputs (out[index[c]]) summed, scored when the scores come last."""
    return (_sum_copies(out[index.long()], top, scores=not score_before),)


def permute_grad_reference(grad_xs, index, top, *, score_before: bool, **kernel_options):
    """grad_x (T, K): each token's k copies' gradients (grad_xs[index[c]]) summed, scored when the scores come first."""
    return (_sum_copies(grad_xs[index.long()], top, scores=score_before),)


_ORACLES = {
    "permute": permute_reference,
    "combine": combine_reference,
    "combine_grad": combine_grad_reference,
    "permute_grad": permute_grad_reference,
}
SCORED_STAGES = frozenset(_ORACLES)
"""The single-GPU layer's stages whose oracle depends on where the scores go."""
EP_NAMES = {"sort_tokens": "permute", "unsort_combine": "combine", "sort_grad": "combine_grad",
            "unsort_grad": "permute_grad"}  # fmt: skip
"""The EP layer's names of the same four (its own ``permute``, ``combine``, ... are the all-to-all's movements)."""


def scored_oracle(stage: str, score_before: bool) -> Callable:
    """The oracle of ``stage`` (one of ``SCORED_STAGES``, or its EP name in ``EP_NAMES``) for a layer whose scores
    go first (``score_before``) or last."""
    return functools.partial(_ORACLES[EP_NAMES.get(stage, stage)], score_before=score_before)
