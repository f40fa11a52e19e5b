"""The single-process reference of the expert-parallel MoE layer: every rank's tokens in one process, plain torch.

No distributed calls and none of the EP or layer kernels: the oracle ``mxbench ep --layer --check`` holds the
distributed layer (``ep_layer``) against. The experts' math is ``ep_reference``'s (the projection's emulated MXFP8
forward, dgrad and wgrad, exact products summed in fp64); this module adds the router, the scores, SwiGLU and the
sums over each token's copies, rounding to bf16 exactly where the layer's tensors are bf16, so a correct layer
differs from it only in summation order. Each global expert's copies are taken in the order the layer hands them to
its GEMMs (source rank, then copy order): the MXFP8 weight gradient's 32-token blocks depend on it.

Per rank r, token t, choice j (copy c = t*k + j, expert g = assign[t, j], score s = scores[t, g]):
forward   xs_c = s * x_t if score_before else x_t;  h_c = xs_c W13_g^T;  act_c = silu(h1_c) * h3_c;
          out_c = act_c W2_g^T;  y_t = sum_j (s * out_c if scores come after else out_c)
backward  g_c = s * dy_t (scores after) else dy_t;  grad_act_c = g_c W2_g;  grad_h = SwiGLU backward;
          grad_xs_c = grad_h_c W13_g;  grad_x_t = sum_j (s * grad_xs_c if score_before else grad_xs_c)
          + grad_logits_t Wr;  the score's gradient dot(grad_xs_c, x_t) (before) or dot(dy_t, out_c) (after),
          through the score function to the logits; grad_Wr = sum over ranks of grad_logits^T x.
Weight gradients: ``ep_reference.wgrad_reference`` of (g, act) for W2 and (grad_h, xs) for W13 (under mxfp8_a2a
g and xs as they crossed their all-to-alls: MXFP8, dequantized).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .ep import dgrad_reference, forward_reference, wgrad_reference

_BF = torch.bfloat16


def _scores(logits: torch.Tensor, score_func: str) -> torch.Tensor:
    z = logits.double()
    return torch.sigmoid(z) if score_func == "sigmoid" else torch.softmax(z, dim=1)


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    a, b = h.double().chunk(2, dim=1)
    return (a * torch.sigmoid(a) * b).to(_BF)


def _swiglu_grad(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    a, b = h.double().chunk(2, dim=1)
    s, gd = torch.sigmoid(a), g.double()
    return torch.cat([(gd * b * s * (1 + a * (1 - s))).to(_BF), (gd * a * s).to(_BF)], dim=1)


def ep_moe_layer_reference(
    xs: Sequence[torch.Tensor],
    assigns: Sequence[torch.Tensor],
    weights: dict[str, torch.Tensor],
    dys: Sequence[torch.Tensor],
    strategy: str,
    *,
    score_func: str = "sigmoid",
    score_before: bool = True,
    mode: str = "rceil",
    wgrad=None,
    extra_grad_x: Sequence[torch.Tensor] | None = None,
) -> dict[str, list[torch.Tensor] | torch.Tensor]:
    """y, grad_x (lists by rank), grad_wr (summed over the ranks), grad_w13 and grad_w2 (all W*E experts), bf16.

    xs[r] (T, K), assigns[r] (T, k) global experts, dys[r] (T, K) of rank r; weights: wr (W*E, K), w13 (W*E, 2N, K)
    and w2 (W*E, K, N), every rank's experts in rank order. See the module doc. ``extra_grad_x[r]``: token
    gradients of another path of rank r (its shared experts', ``ep_shared``), added to the routed copies' sum
    (rounded to bf16) before the router's term."""
    wr, w13, w2 = (weights[n].cpu() for n in ("wr", "w13", "w2"))
    k = assigns[0].shape[1]
    xs, dys = [x.cpu() for x in xs], [d.cpu() for d in dys]
    logits = [(x.double() @ wr.double().T).to(_BF) for x in xs]
    scores = [_scores(lg, score_func).float() for lg in logits]
    flat = [a.cpu().long().reshape(-1) for a in assigns]
    top = [s.gather(1, a.cpu().long()).reshape(-1) for s, a in zip(scores, assigns, strict=True)]  # fp32 (T*k,)
    T, K = xs[0].shape
    out = [torch.zeros(T * k, K, dtype=_BF) for _ in xs]
    grad_copies = [torch.zeros(T * k, K, dtype=_BF) for _ in xs]
    grad_top = [torch.zeros(T * k, dtype=torch.float64) for _ in xs]
    grad_w13, grad_w2 = torch.zeros(w13.shape, dtype=_BF), torch.zeros(w2.shape, dtype=_BF)
    for g in range(w13.shape[0]):
        members = [(r, torch.nonzero(f == g).flatten()) for r, f in enumerate(flat)]
        if not any(len(c) for _, c in members):
            continue
        score = torch.cat([top[r][c] for r, c in members]).unsqueeze(1)
        x = torch.cat([xs[r][c // k] for r, c in members])
        dy = torch.cat([dys[r][c // k] for r, c in members])
        a = (x.float() * score).to(_BF) if score_before else x
        h = forward_reference(a, w13[g], strategy, mode).to(_BF)
        act = _swiglu(h)
        o = forward_reference(act, w2[g], strategy, mode).to(_BF)
        grad_o = dy if score_before else (dy.float() * score).to(_BF)
        grad_h = _swiglu_grad(dgrad_reference(grad_o, w2[g], strategy, mode).to(_BF), h)
        grad_a = dgrad_reference(grad_h, w13[g], strategy, mode).to(_BF)
        # mxfp8_a2a: the tokens crossed the dispatch in MXFP8, the output gradient the combine's gradient
        grad_w13[g] = wgrad_reference(grad_h, a, strategy, wgrad, mode, crossed=(False, True)).to(_BF)
        grad_w2[g] = wgrad_reference(grad_o, act, strategy, wgrad, mode, crossed=(True, False)).to(_BF)
        dot = (grad_a.double() * x.double()).sum(1) if score_before else (dy.double() * o.double()).sum(1)
        start = 0
        for r, c in members:
            out[r][c], grad_copies[r][c], grad_top[r][c] = (v[start : start + len(c)] for v in (o, grad_a, dot))
            start += len(c)
    result = {"y": [], "grad_x": [], "grad_wr": torch.zeros(wr.shape, dtype=torch.float64), "grad_w13": grad_w13,
              "grad_w2": grad_w2}  # fmt: skip
    for r, x in enumerate(xs):
        weight = top[r].unsqueeze(1)
        y_w = out[r].float() * weight if not score_before else out[r].float()
        gx_w = grad_copies[r].float() * weight if score_before else grad_copies[r].float()
        result["y"].append(_sum_copies(y_w, k))
        routed = _sum_copies(gx_w, k)
        if extra_grad_x is not None:
            routed = (routed.double() + extra_grad_x[r].cpu().double()).to(_BF)
        grad_logits = _score_backward(grad_top[r].view(T, k), scores[r].double(), assigns[r].cpu().long(), score_func)
        result["grad_x"].append((grad_logits.double() @ wr.double() + routed.double()).to(_BF))
        result["grad_wr"] += (grad_logits.double().T @ x.double()).to(_BF).double()
    result["grad_wr"] = result["grad_wr"].to(_BF)
    return result


def _sum_copies(copies: torch.Tensor, k: int) -> torch.Tensor:
    """Each token's k copies (fp32) summed in choice order, rounded once to bf16."""
    c = copies.view(-1, k, copies.shape[1])
    total = c[:, 0]
    for j in range(1, k):
        total = total + c[:, j]
    return total.to(_BF)


def _score_backward(grad_top, scores, experts, score_func: str) -> torch.Tensor:
    """grad_logits (T, G) bf16 from the chosen scores' gradients (fp64 by hand: no autograd)."""
    g = torch.zeros_like(scores).scatter_add_(1, experts, grad_top)
    if score_func == "sigmoid":
        return (g * scores * (1 - scores)).to(_BF)
    return (scores * (g - (g * scores).sum(1, keepdim=True))).to(_BF)
