"""The single-GPU layer's expert weight gradients under ``Wgrad.BF16``, written apart from its stages.

With a bf16 weight gradient the forward and the input gradients run in the recipe (FP8), so the layer's output
gradient at each projection, DY, is the FP8 layer's own; the weight gradient is then exactly DY^T X per expert, X
the projection's bf16 input (as ``reference.ep_fp8.wgrad_fp8(bf16=True)`` takes it in expert parallelism):

| weight         | DY (the FP8 layer's)        | X (rebuilt here from the layer's inputs)                           |
|----------------|-----------------------------|--------------------------------------------------------------------|
| w13 / w1, w3   | grad_h / grad_h1, grad_h3   | the permuted tokens: x[row_src] (x row_w, one fp32 product rounded to bf16, when the scores come first) |
| w2             | dy[row_src] (x row_w when the scores come last) | silu(h1) * h3 of the FP8 forward's h, rounded to bf16 |
| ws13, ws2      | grad_hs, dy                 | x, silu(hs1) * hs3 (shared experts in the recipe: one group)       |

Each product is summed in fp64 per expert group (``offs``) and rounded once to bf16. X is rebuilt from x, dy and the routing, not read from
the layer's ``xs``, ``act`` or ``grad_out``, so a weight gradient bound to another tensor (the unpermuted tokens,
a quantized-then-dequantized copy) differs from it; DY is read from the layer (it is what its FP8 backward made).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..moe import moe_rows, swiglu


def grouped_wgrad(grad_out: torch.Tensor, a: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """(E, N, K) fp64: per group e of rows [offs[e-1], offs[e]), grad_out[rows]^T @ a[rows]; zeros for an empty one."""
    ends = [int(e) for e in offs.tolist()]
    out = torch.zeros(len(ends), grad_out.shape[1], a.shape[1], dtype=torch.float64, device=a.device)
    start = 0
    for e, end in enumerate(ends):
        out[e] = grad_out[start:end].double().t() @ a[start:end].double()
        start = end
    return out


def layer_wgrad_bf16(env: Mapping[str, torch.Tensor], *, fuse_up: bool, score_before: bool,
                     shared_in_recipe: bool = False) -> dict[str, torch.Tensor]:  # fmt: skip
    """The expected gradient of each expert weight (``grad_<weight>``, module table: summed in fp64, rounded once to
    bf16, the dtype the layer's weight gradients take) from a layer run's
    environment: its inputs (x, dy), its routing (row_src, row_w, offs), the FP8 forward's h (h1, h3) and the FP8
    backward's output gradients of the projections (grad_h / grad_h1, grad_h3)."""
    x, dy, row_src, row_w, offs = env["x"], env["dy"], env["row_src"], env["row_w"], env["offs"]
    xs = moe_rows.gather_weighted_reference(x, row_src, row_w if score_before else None)
    grad_out = moe_rows.gather_weighted_reference(dy, row_src, None if score_before else row_w)
    if fuse_up:
        act = swiglu.swiglu_reference(*swiglu.split_halves(env["h"]))
        out = {"grad_w13": grouped_wgrad(env["grad_h"], xs, offs)}
    else:
        act = swiglu.swiglu_reference(env["h1"], env["h3"])
        out = {f"grad_w{i}": grouped_wgrad(env[f"grad_h{i}"], xs, offs) for i in (1, 3)}
    out["grad_w2"] = grouped_wgrad(grad_out, act, offs)
    if shared_in_recipe:
        acts = swiglu.swiglu_reference(*swiglu.split_halves(env["hs"]))
        out["grad_ws13"] = grouped_wgrad(env["grad_hs"], x, env["shared_offs"])
        out["grad_ws2"] = grouped_wgrad(dy, acts, env["shared_offs"])
    return {name: g.to(torch.bfloat16) for name, g in out.items()}
