"""The MoE layer with autograd, its inputs, and its accuracy against an fp32 run of an independent plain-torch layer.

Use::

    shape = LayerShape(T=4096, K=2048, N=768, E=8, top_k=2)
    inputs = layer_inputs(shape, device="cuda")                     # x, the weights, assign, dy (seeded)
    y = moe_layer(inputs["x"], weights_of(inputs, shape), shape, "mxfp8", assign=inputs.get("assign"))
    y.backward(inputs["dy"])

``moe_layer`` runs the forward stages of ``layer.layer_stages`` in its forward and the backward stages in its
backward, so a model runs exactly what the harness times. ``moe_layer_reference`` is the same layer written
independently (a loop over experts with masks, no sort, no padding, torch autograd), the oracle of the layer's tests
and, in fp32, the yardstick of ``layer_sqnr``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from .projection import run_saved_stages, save_for_stages
from ..core import vjp
from ..stages.layer import LayerShape, Routing, layer_stages
from ..moe.router import ScoreFunc
from ..core.names import Recipe
from ..stages.pipeline import Stage, run_stages, split_passes
from ..core.runtime import InputError

OUTLIER_FRACTION = 0.01  # channels of x scaled up, as activations of trained models have a few outlier channels
OUTLIER_SCALE = 20.0
SKEW_ALPHA = 1.2  # Zipf exponent of the skewed assignment's expert popularity


# ---- inputs ---------------------------------------------------------------------------------------------------


def balanced_assignment(T: int, top_k: int, E: int, device="cpu") -> torch.Tensor:
    """Copy c = t * top_k + j goes to expert c % E: every expert the same share, distinct experts per token
    (torchtitan's forced load balance)."""
    return (torch.arange(T * top_k, device=device) % E).view(T, top_k).to(torch.int32)


def skewed_assignment(T: int, top_k: int, E: int, seed: int, device="cpu") -> torch.Tensor:
    """Each token's top_k distinct experts drawn without replacement from Zipf(``SKEW_ALPHA``) popularity over a
    seeded permutation of the experts: a few hot experts, a long cold tail, as routers give early in training."""
    gen = torch.Generator().manual_seed(seed)
    popularity = torch.arange(1, E + 1, dtype=torch.float64) ** -SKEW_ALPHA
    popularity = popularity[torch.randperm(E, generator=gen)]
    picks = torch.multinomial(popularity.expand(T, E), top_k, replacement=False, generator=gen)
    return picks.to(torch.int32).to(device)


def layer_inputs(shape: LayerShape, *, device="cpu", seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded bf16 x (T, K) with outlier channels, the weights (``shape.weights``) scaled like an initialised
    layer's, dy (T, K), and ``assign`` for forced routing."""
    s = shape
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *size, scale=1.0: torch.randn(*size, generator=gen) * scale
    x = randn(s.T, s.K)
    outliers = torch.randperm(s.K, generator=gen)[: max(1, int(s.K * OUTLIER_FRACTION))]
    x[:, outliers] *= OUTLIER_SCALE
    t = {"x": x, "wr": randn(s.E, s.K, scale=s.K**-0.5), "w2": randn(s.E, s.K, s.N, scale=s.N**-0.5),
         "dy": randn(s.T, s.K, scale=1e-2)}  # fmt: skip
    w1, w3 = randn(s.E, s.N, s.K, scale=s.K**-0.5), randn(s.E, s.N, s.K, scale=s.K**-0.5)
    t.update({"w13": torch.cat([w1, w3], dim=1)} if s.fuse_up else {"w1": w1, "w3": w3})
    if s.shared:
        Ns = s.N * s.shared
        t.update(ws13=randn(1, 2 * Ns, s.K, scale=s.K**-0.5), ws2=randn(1, s.K, Ns, scale=Ns**-0.5))
    out = {name: v.to(device=device, dtype=torch.bfloat16) for name, v in t.items()}
    if s.routing == Routing.BALANCED:
        out["assign"] = balanced_assignment(s.T, s.top_k, s.E, device)
    elif s.routing == Routing.SKEWED:
        out["assign"] = skewed_assignment(s.T, s.top_k, s.E, seed, device)
    if s.shared:  # the shared experts as a one-group grouped GEMM (``shared_in_recipe``): its group end
        out["shared_offs"] = torch.tensor([s.T], dtype=torch.int32, device=device)
    return out


def weights_of(inputs: Mapping[str, torch.Tensor], shape: LayerShape) -> dict[str, torch.Tensor]:
    return {name: inputs[name] for name in shape.weights}


# ---- the layer with autograd ------------------------------------------------------------------------------------



class _StagedLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, forward, backward, names, extra, x, *weights):
        env = run_stages(forward, {"x": x, **dict(zip(names, weights, strict=True)), **extra})
        save_for_stages(ctx, env, backward, "dy")
        ctx.names = names
        return env["y"]

    @staticmethod
    def backward(ctx, dy):
        env = run_saved_stages(ctx, dy)
        return (None, None, None, None, env["grad_x"], *(env[f"grad_{n}"] for n in ctx.names))


def moe_layer(x: torch.Tensor, weights: Mapping[str, torch.Tensor], shape: LayerShape, recipe: str = "bf16", *,
              assign: torch.Tensor | None = None, shared_offs: torch.Tensor | None = None, mode: str = "rceil",
              backend: str | None = None, fuse: bool = False, impls=None,
              stages: Sequence[Stage] | None = None) -> torch.Tensor:  # fmt: skip
    """y (T, K) bf16 of the layer (module doc), differentiable in x and every weight. ``assign`` (T, top_k) int32:
    the forced experts when ``shape.routing`` forces them; ``shared_offs`` int32 [T]: the one group of the shared
    experts when they run in the recipe (``layer_inputs`` makes both). ``stages``: the stage list, when built."""
    if tuple(x.shape) != (shape.T, shape.K):
        raise InputError(f"x must be ({shape.T}, {shape.K}) for this layer, got {tuple(x.shape)}")
    missing = [n for n in shape.weights if n not in weights]
    if missing:
        raise InputError(f"weights lack {', '.join(missing)}")
    if (assign is None) != (shape.routing == Routing.ROUTER):
        raise InputError(f"routing {shape.routing} {'needs' if assign is None else 'takes no'} assign")
    if stages is None:
        stages = layer_stages(recipe, shape, mode=mode, backend=backend, fuse=fuse, impls=impls)
    if shape.shared_in_recipe and Recipe(recipe) != Recipe.BF16 and shared_offs is None:
        raise InputError("shared experts in the recipe need shared_offs (int32 [T])")
    forward, backward = split_passes(stages)
    names = shape.weights
    extra = {k: v for k, v in (("assign", assign), ("shared_offs", shared_offs)) if v is not None}
    return _StagedLayer.apply(forward, backward, names, extra, x, *(weights[n] for n in names))


# ---- the independent reference and the accuracy of a recipe ---------------------------------------------------


def moe_layer_reference(x: torch.Tensor, weights: Mapping[str, torch.Tensor], shape: LayerShape,
                        assign: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """The layer in the dtype of its inputs by plain torch ops and autograd: expert by expert through masks."""
    s = shape
    logits = x @ weights["wr"].t()
    z = logits.float()
    scores = torch.sigmoid(z) if s.score_func == ScoreFunc.SIGMOID else torch.softmax(z, dim=1)
    if assign is None:
        top, experts = torch.topk(scores, s.top_k, dim=1)
    else:
        experts = assign.long()
        top = scores.gather(1, experts)
    top = top.to(x.dtype)
    if s.fuse_up:
        w1, w3 = weights["w13"][:, : s.N], weights["w13"][:, s.N :]
    else:
        w1, w3 = weights["w1"], weights["w3"]
    tokens, outs = [], []
    for e in range(s.E):
        token, choice = (experts == e).nonzero(as_tuple=True)
        score = top[token, choice].unsqueeze(1)
        h = x[token] * score if s.score_before else x[token]
        out = (torch.nn.functional.silu(h @ w1[e].t()) * (h @ w3[e].t())) @ weights["w2"][e].t()
        tokens.append(token)
        outs.append(out if s.score_before else out * score)
    y = torch.zeros_like(x).index_add(0, torch.cat(tokens), torch.cat(outs))  # one sum: no copy of y per expert
    if s.shared:
        hs = x @ weights["ws13"][0].t()
        Ns = hs.shape[1] // 2
        y = y + (torch.nn.functional.silu(hs[:, :Ns]) * hs[:, Ns:]) @ weights["ws2"][0].t()
    return y


SQNR_OUTPUTS = ("y", "grad_x", "grad_w1", "grad_w3", "grad_w2", "grad_wr")


def _gradients(y, x, weights, dy, shape) -> dict[str, torch.Tensor]:
    names = list(weights)
    grads = vjp.grad(y, [x, *(weights[n] for n in names)], dy)  # torch.autograd.grad, without importing sympy
    out = {"y": y.detach(), "grad_x": grads[0]}
    for n, g in zip(names, grads[1:], strict=True):
        if n == "w13":
            out["grad_w1"], out["grad_w3"] = g[:, : shape.N], g[:, shape.N :]
        else:
            out[f"grad_{n}"] = g
    return out


def layer_outputs(recipe: str | None, inputs: Mapping[str, torch.Tensor], shape: LayerShape, **kw) -> dict:
    """y and every gradient of one forward + backward on ``inputs``: of the staged layer in ``recipe``, or (recipe
    None) of the fp32 reference."""
    dtype = torch.bfloat16 if recipe else torch.float32
    x = inputs["x"].to(dtype).detach().requires_grad_()
    weights = {n: inputs[n].to(dtype).detach().requires_grad_() for n in shape.weights}
    assign = inputs.get("assign")
    with torch.enable_grad():
        if recipe is None:
            y = moe_layer_reference(x, weights, shape, assign)
        else:
            y = moe_layer(x, weights, shape, recipe, assign=assign, shared_offs=inputs.get("shared_offs"), **kw)
        return _gradients(y, x, weights, inputs["dy"].to(dtype), shape)


def layer_sqnr(got: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """SQNR (dB) of the layer output and each gradient (``SQNR_OUTPUTS``, shared experts' too) against the
    reference's: 10 log10(sum ref^2 / sum (got - ref)^2), summed in fp64 over row chunks (a layer's tensors are GBs)."""
    return {name: _sqnr(got[name], reference[name]) for name in reference if name in got}


def _sqnr(got: torch.Tensor, ref: torch.Tensor, chunk: int = 4096) -> float:
    if got.shape != ref.shape:
        raise InputError(f"shapes differ: {tuple(got.shape)} vs {tuple(ref.shape)}")
    g, r = got.reshape(got.shape[0], -1), ref.reshape(ref.shape[0], -1)
    signal = noise = 0.0
    for i in range(0, g.shape[0], chunk):
        rc, gc = r[i : i + chunk].double(), g[i : i + chunk].double()
        signal += float(rc.square().sum())
        noise += float((gc - rc).square().sum())
    if noise == 0.0:
        return float("inf")
    return 10.0 * math.log10(signal / noise) if signal > 0 else float("-inf")
