"""The single-process reference of the EP layer with shared experts: ``ep_layer.ep_moe_layer_reference`` for the
routed path, plus each rank's shared experts on its own tokens, plain torch (products exact, sums in fp64, rounded to
bf16 where the layer's tensors are bf16).

Per rank, with tokens x (T, K), output gradient dy (T, K), replicated weights ws13 (1, 2Ns, K), ws2 (1, K, Ns), and
F / D / Wg the projection reference's forward, dgrad and wgrad in the shared experts' precision (the strategy's GEMM
recipe, its own wgrad, when ``in_recipe``; else bf16):
forward   hs = F(x, ws13);  acts = SwiGLU(hs);  ys = F(acts, ws2);  y = y_routed + ys
backward  grad_acts = D(dy, ws2);  grad_hs = SwiGLU'(grad_acts, hs);  grad_xs = D(grad_hs, ws13), added to the routed
          copies' sum before the router's term;  grad_ws13 = Wg(grad_hs, x), grad_ws2 = Wg(dy, acts), each rank's
          rounded to bf16 and summed over the ranks (like grad_wr).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ep import dgrad_reference, forward_reference, wgrad_reference
from .ep_layer import _swiglu, _swiglu_grad, ep_moe_layer_reference

_BF = torch.bfloat16


def shared_expert_reference(x, dy, ws13, ws2, precision: str, mode: str = "rceil") -> dict[str, torch.Tensor]:
    """ys, grad_xs (T, K), grad_ws13, grad_ws2 of one rank's shared experts, bf16 (module doc). ``precision``: a
    non-a2a strategy name (bf16, mxfp8, fp8_rowwise)."""
    from ..core.names import Wgrad

    w13, w2 = ws13[0].cpu(), ws2[0].cpu()
    x, dy = x.cpu(), dy.cpu()
    hs = forward_reference(x, w13, precision, mode).to(_BF)
    acts = _swiglu(hs)
    ys = forward_reference(acts, w2, precision, mode).to(_BF)
    grad_hs = _swiglu_grad(dgrad_reference(dy, w2, precision, mode).to(_BF), hs)
    grad_xs = dgrad_reference(grad_hs, w13, precision, mode).to(_BF)
    grad_ws13 = wgrad_reference(grad_hs, x, precision, Wgrad.RECIPE, mode).to(_BF)
    grad_ws2 = wgrad_reference(dy, acts, precision, Wgrad.RECIPE, mode).to(_BF)
    return {"ys": ys, "grad_xs": grad_xs, "grad_ws13": grad_ws13.unsqueeze(0), "grad_ws2": grad_ws2.unsqueeze(0)}


def ep_moe_layer_shared_reference(xs: Sequence[torch.Tensor], assigns: Sequence[torch.Tensor], weights: dict,
                                  dys: Sequence[torch.Tensor], strategy: str, *, in_recipe: bool, **kw) -> dict:  # fmt: skip
    """``ep_moe_layer_reference``'s outputs with the shared experts' (module doc): y and grad_x by rank, grad_wr,
    grad_w13, grad_w2, and grad_ws13, grad_ws2 summed over the ranks. ``weights`` holds ws13 and ws2 too."""
    from ..ep.strategy import get_strategy

    precision = get_strategy(strategy).recipe.value if in_recipe else "bf16"  # never an all-to-all's payload
    mode = kw.get("mode", "rceil")
    shared = [shared_expert_reference(x, dy, weights["ws13"], weights["ws2"], precision, mode)
              for x, dy in zip(xs, dys, strict=True)]  # fmt: skip
    routed = {n: w for n, w in weights.items() if n in ("wr", "w13", "w2")}
    out = ep_moe_layer_reference(xs, assigns, routed, dys, strategy, extra_grad_x=[s["grad_xs"] for s in shared],
                                 **kw)  # fmt: skip
    out["y"] = [(y.double() + s["ys"].double()).to(_BF) for y, s in zip(out["y"], shared, strict=True)]
    for name in ("grad_ws13", "grad_ws2"):
        out[name] = torch.stack([s[name].double() for s in shared]).sum(0).to(_BF)
    return out
