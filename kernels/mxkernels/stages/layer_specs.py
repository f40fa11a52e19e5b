"""The MoE layer's own stages as declarations: contract, oracle, comparison rule, mxkernels' implementation.

The layer (``layer.py``) is the router, the permutation into padded expert groups, two expert projections (the
single-GPU step's stages of ``stages.py``, bound to the layer's tensors under the roles ``gate``/``up`` and
``down``), SwiGLU, the weighted combine and optional shared experts, forward and backward. This table holds the
stages that are the layer's alone; like ``ep_stages.ep_specs()`` it is kept apart from ``stages.all_specs()``.

Recipe-independent stages are declared under ``bf16`` (their data is bf16 or fp32 whatever the GEMMs run in); the
fused stages under the recipe whose quantized operand they write. Each fused stage replaces a chain (the producer,
then the quantizer the next GEMM needs); its oracle is the chain's references and its tests hold it bit for bit
against the chain of mxkernels' kernels (``tests/test_layer.py``).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ..moe import router as moe_router, moe_rows, swiglu
from ..quant import fp8_amax, fp8_rowwise
from ..core.comparison import BitExact, MinSQNR
from ..core.names import Category, Pass, Recipe
from ..quant.quantize_blocked import quantize_dim0_blocked_reference
from ..reference.layer_stages import SCORED_STAGES, scored_oracle
from .step_specs import Port, StageSpec, _rows_until_last_offset

F, DI, DW = Pass.FORWARD, Pass.BACKWARD_INPUT, Pass.BACKWARD_WEIGHT
_NEAR_DB = 60.0  # one fp32 evaluation rounded once to bf16 in another order (an FMA, exp's last bit): rare 1-ulp flips
_GEMM_DB = 50.0  # bf16 output of fp32 sums taken in another order (as the step's bf16 GEMMs)
_ROW_DB = 40.0  # each token's row of a top-k sum on its own: its 1-ulp flips stay near 48 dB; a wrong weighting is ~10
_FUSED_DB = 30.0  # e4m3 data of a bf16 tensor whose rare 1-ulp flips can move a block's rounding


def _p(name: str, doc: str) -> Port:
    return Port(name, doc)


# ---- calls with the layer's contracts (the row and activation kernels take tensors, the stages env names) ------


def _permute(x, row_src, row_w, *, weighted):
    return (moe_rows.gather_weighted(x, row_src, row_w if weighted else None),)


def _permute_reference(x, row_src, row_w, *, weighted):
    return (moe_rows.gather_weighted_reference(x, row_src, row_w if weighted else None),)


def _combine(y, dest, top, *, weighted):
    return (moe_rows.combine_rows(y, dest, top.reshape(-1) if weighted else None, top.shape[1]),)


def _combine_reference(y, dest, top, *, weighted):
    return (moe_rows.combine_rows_reference(y, dest, top.reshape(-1) if weighted else None, top.shape[1]),)


def _score_grad(rows, dest, tokens, copy_token):
    return (moe_rows.row_dot(rows, dest, tokens, copy_token),)


def _score_grad_reference(rows, dest, tokens, copy_token):
    return (moe_rows.row_dot_reference(rows, dest, tokens, copy_token),)


def _swiglu(h):
    return (swiglu.swiglu(*swiglu.split_halves(h)),)


def _swiglu_reference(h):
    return (swiglu.swiglu_reference(*swiglu.split_halves(h)),)


def _swiglu_split(h1, h3):
    return (swiglu.swiglu(h1, h3),)


def _swiglu_split_reference(h1, h3):
    return (swiglu.swiglu_reference(h1, h3),)


def _swiglu_grad(g, h):
    return swiglu.swiglu_backward(g, *swiglu.split_halves(h), packed=True)


def _swiglu_grad_reference(g, h):
    return swiglu.swiglu_backward_reference(g, *swiglu.split_halves(h), packed=True)


def _swiglu_grad_split(g, h1, h3):
    return swiglu.swiglu_backward(g, h1, h3, packed=False)


def _swiglu_grad_split_reference(g, h1, h3):
    return swiglu.swiglu_backward_reference(g, h1, h3, packed=False)


def _add(a, b):
    return (torch.add(a, b),)


def _add_reference(a, b):
    return ((a.double() + b.double()).to(torch.bfloat16),)


def _mm_t(a, b):
    """a @ b[0]^T: the shared experts' weights are one-expert stacks (1, rows, cols), as a grouped GEMM takes them."""
    return (torch.mm(a, b[0].t()),)


def _mm_t_reference(a, b):
    return ((a.double() @ b[0].double().t()).to(torch.bfloat16),)


def _mm_t_add(a, b, c):
    return (torch.addmm(c, a, b[0].t()),)


def _mm_t_add_reference(a, b, c):
    return ((a.double() @ b[0].double().t() + c.double()).to(torch.bfloat16),)


def _shared_down_grad(dy, act, ws2):
    return torch.mm(dy, ws2[0]), torch.mm(dy.t(), act).unsqueeze(0)


def _shared_down_grad_reference(dy, act, ws2):
    d, a, w = dy.double(), act.double(), ws2[0].double()
    return (d @ w).to(torch.bfloat16), (d.t() @ a).to(torch.bfloat16).unsqueeze(0)


def _shared_up_grad(g, x, ws13, grad_x):
    return torch.addmm(grad_x, g, ws13[0]), torch.mm(g.t(), x).unsqueeze(0)


def _shared_up_grad_reference(g, x, ws13, grad_x):
    d = g.double()
    return (d @ ws13[0].double() + grad_x.double()).to(torch.bfloat16), (d.t() @ x.double()).to(torch.bfloat16).unsqueeze(0)


# ---- the fused stages' chains (references): the producer's reference, then the quantizer's ---------------------


def _quantized_reference(recipe: Recipe, x, offs, mode):
    if recipe == Recipe.MXFP8:
        return quantize_dim0_blocked_reference(x, offs, mode)
    if offs is None:  # the FP8 fused stages without the column amax table
        return fp8_rowwise.quantize_fp8_rowwise_reference(x)
    return fp8_amax.quantize_fp8_rowwise_with_amax_reference(x, offs)


def _fused_chain(recipe: Recipe, producer, grouped: bool = True):
    """The fused stage's oracle: ``producer``'s reference, then the quantizer's; ``grouped`` False: the stage takes
    no offs (its quantizer no groups)."""

    def chain(*args, mode="rceil", **params):
        *ins, offs = args if grouped else (*args, None)
        (bf16, *_) = producer(*ins, **params)
        return (bf16, *_quantized_reference(recipe, bf16, offs, mode))

    return chain


def _fused_impl(recipe: Recipe, kind: str, grouped: bool = True):
    """mxkernels' fused kernel of ``kind`` for ``recipe`` (``moe_fused``), in the stage's calling contract;
    ``grouped`` False: the stage takes no offs, the FP8 kernel writes no column amax table."""
    producer = {"permute": "gather", "combine_grad": "gather", "swiglu": "swiglu",
                "swiglu_grad": "swiglu_backward"}[kind]  # fmt: skip
    mx = recipe == Recipe.MXFP8

    def call(*args, mode="rceil", weighted=None):
        from ..moe import moe_fused

        fn = getattr(moe_fused, f"{producer}_quantize_{'mxfp8' if mx else 'fp8'}")
        scale_mode = (mode,) if mx else ()  # FP8 rowwise scales have no mode
        *args, offs = args if grouped else (*args, None)
        if producer == "gather":
            x, row_src, row_w = args
            return fn(x, row_src, row_w if weighted else None, offs, *scale_mode)
        *grad_act, h = args  # SwiGLU (h,) or its backward (grad_act, h)
        return fn(*grad_act, *swiglu.split_halves(h), offs, *scale_mode)

    return call


# ---- the declarations -----------------------------------------------------------------------------------------

_X = _p("x", "bf16 (T, K) tokens")
_ROW_SRC = _p("row_src", "int32 (rows,) token of each padded row, -1 for padding")
_ROW_W = _p("row_w", "fp32 (rows,) score of each padded row's copy, 0 for padding")
_DEST = _p("dest", "int32 (T*k,) padded row of each token copy")
_COPY_TOKEN = _p("copy_token", "int32 (T*k,) token of each copy")
_TOP = _p("top", "fp32 (T, k) each token's top-k scores")
_OFFS = _p("offs", "int32 (E,) slot ends of the padded expert groups")


def _spec(recipe, name, pass_, category, purpose, ins, outs, oracle, rule, impl, kernel, params=(),
          regions=None) -> StageSpec:  # fmt: skip
    return StageSpec(recipe, name, pass_, category, purpose, tuple(ins), tuple(outs), oracle, rule, impl, kernel,
                     tuple(params), regions or {})  # fmt: skip


def _common() -> list[StageSpec]:
    B, R, G, A, C, P = Recipe.BF16, Category.ROUTING, Category.GEMM, Category.ACTIVATION, Category.COMBINE, Category.PERMUTE
    near, exact, gemm = MinSQNR(_NEAR_DB), BitExact(), MinSQNR(_GEMM_DB)
    summed = MinSQNR(_NEAR_DB, row_floor_db=_ROW_DB)  # a token's top-k sum: planted tokens must not hide the others
    scaled = BitExact(any_nan=True)  # a weighted gather: one fp32 product rounded once; NaN payloads are the hardware's
    h13 = _p("h", "bf16 (rows, 2N) gate | up projections")
    h1, h3 = _p("h1", "bf16 (rows, N) gate projection"), _p("h3", "bf16 (rows, N) up projection")
    act = _p("act", "bf16 (rows, N) silu(h1) * h3")
    g_act = _p("grad_act", "bf16 (rows, N)")
    return [
        _spec(B, "router_gate", F, G, "Router gate: logits = x @ wr^T (bf16)", (_X, _p("wr", "bf16 (E, K)")),
              (_p("logits", "bf16 (T, E)"),), moe_router.router_gate_reference, gemm, moe_router.router_gate, "torch.mm"),
        _spec(B, "router_topk", F, R, "Scores (fp32) and each token's top-k experts", (_p("logits", "bf16 (T, E)"),),
              (_p("scores", "fp32 (T, E)"), _TOP, _p("experts", "int32 (T, k)")), moe_router.router_topk_reference,
              exact, moe_router.router_topk, "sigmoid/softmax + torch.topk", ("top_k", "score_func")),
        _spec(B, "router_forced", F, R, "Scores (fp32); the experts forced (balanced or skewed benchmark routing)",
              (_p("logits", "bf16 (T, E)"), _p("assign", "int32 (T, k) forced experts")),
              (_p("scores", "fp32 (T, E)"), _TOP, _p("experts", "int32 (T, k)")), moe_router.router_forced_reference,
              exact, moe_router.router_forced, "sigmoid/softmax + gather", ("score_func",)),
        _spec(B, "route_tokens", F, R, "Token copies to padded expert slots (no host sync)",
              (_p("experts", "int32 (T, k)"), _TOP), (_DEST, _ROW_SRC, _ROW_W, _OFFS, _COPY_TOKEN),
              moe_router.route_tokens_reference, exact, moe_router.route_tokens, "argsort + scatter",
              ("num_experts", "alignment", "rows", "weighted_rows")),
        _spec(B, "permute", F, P, "Gather tokens into padded expert groups (scored when scores come first)",
              (_X, _ROW_SRC, _ROW_W), (_p("xs", "bf16 (rows, K); padding rows zero"),), _permute_reference, scaled,
              _permute, "gather_weighted", ("weighted",)),
        _spec(B, "swiglu", F, A, "SwiGLU of the fused gate/up output", (h13,), (act,), _swiglu_reference, near,
              _swiglu, "swiglu"),
        _spec(B, "swiglu_split", F, A, "SwiGLU of the gate and up outputs", (h1, h3), (act,), _swiglu_split_reference,
              near, _swiglu_split, "swiglu"),
        _spec(B, "combine", F, C, "Sum each token's top-k expert outputs (scored when scores come last)",
              (_p("out", "bf16 (rows, K) expert outputs"), _DEST, _TOP), (_p("y", "bf16 (T, K)"),),
              _combine_reference, summed, _combine, "combine_rows", ("weighted",)),
        _spec(B, "shared_up", F, G, "Shared experts: gate/up projection (dense bf16)", (_X, _p("ws13", "bf16 (1, 2Ns, K)")),
              (_p("hs", "bf16 (T, 2Ns)"),), _mm_t_reference, gemm, _mm_t, "torch.mm"),
        _spec(B, "shared_down", F, G, "Shared experts: down projection, added to the routed output",
              (_p("acts", "bf16 (T, Ns)"), _p("ws2", "bf16 (1, K, Ns)"), _p("y_routed", "bf16 (T, K)")),
              (_p("y", "bf16 (T, K)"),), _mm_t_add_reference, gemm, _mm_t_add, "torch.mm + add"),
        _spec(B, "add_shared", F, C, "Add the shared experts' output to the routed output",
              (_p("y_routed", "bf16 (T, K)"), _p("ys", "bf16 (T, K)")), (_p("y", "bf16 (T, K)"),), _add_reference,
              exact, _add, "torch.add"),
        _spec(B, "combine_grad", DI, C, "Gradient of the combine: dy into the padded expert slots",
              (_p("dy", "bf16 (T, K)"), _ROW_SRC, _ROW_W), (_p("grad_out", "bf16 (rows, K)"),), _permute_reference,
              scaled, _permute, "gather_weighted", ("weighted",)),
        _spec(B, "combine_score_grad", DI, C, "Gradient of the scores that weighted the combine",
              (_p("out", "bf16 (rows, K)"), _DEST, _p("dy", "bf16 (T, K)"), _COPY_TOKEN),
              (_p("grad_top", "fp32 (T*k,)"),), _score_grad_reference, near, _score_grad, "row_dot"),
        _spec(B, "swiglu_grad", DI, A, "SwiGLU backward (packed gate | up gradient)", (g_act, h13),
              (_p("grad_h", "bf16 (rows, 2N)"),), _swiglu_grad_reference, near, _swiglu_grad, "swiglu_backward"),
        _spec(B, "swiglu_grad_split", DI, A, "SwiGLU backward (gate and up gradients)", (g_act, h1, h3),
              (_p("grad_h1", "bf16 (rows, N)"), _p("grad_h3", "bf16 (rows, N)")), _swiglu_grad_split_reference, near,
              _swiglu_grad_split, "swiglu_backward"),
        _spec(B, "add_grads", DI, C, "Sum the gate and up projections' input gradients",
              (_p("a", "bf16 (rows, K)"), _p("b", "bf16 (rows, K)")), (_p("sum", "bf16 (rows, K)"),), _add_reference,
              exact, _add, "torch.add"),
        _spec(B, "permute_grad", DI, P, "Gradient of the permute: each token's top-k copies summed",
              (_p("grad_xs", "bf16 (rows, K)"), _DEST, _TOP), (_p("grad_x", "bf16 (T, K)"),), _combine_reference,
              summed, _combine, "combine_rows", ("weighted",)),
        _spec(B, "permute_score_grad", DI, P, "Gradient of the scores that weighted the permuted tokens",
              (_p("grad_xs", "bf16 (rows, K)"), _DEST, _X, _COPY_TOKEN), (_p("grad_top", "fp32 (T*k,)"),),
              _score_grad_reference, near, _score_grad, "row_dot"),
        _spec(B, "router_grad", DI, R, "Top-k scores' gradient through the score function to the logits",
              (_p("grad_top", "fp32 (T*k,)"), _p("scores", "fp32 (T, E)"), _p("experts", "int32 (T, k)")),
              (_p("grad_logits", "bf16 (T, E)"),), moe_router.router_grad_reference, MinSQNR(_GEMM_DB),
              moe_router.router_grad, "scatter + score backward", ("score_func",)),
        _spec(B, "router_gate_grad", DW, G, "Router gate backward; grad_x summed with the experts' paths",
              (_p("grad_logits", "bf16 (T, E)"), _X, _p("wr", "bf16 (E, K)"), _p("grad_x_in", "bf16 (T, K)")),
              (_p("grad_x", "bf16 (T, K)"), _p("grad_wr", "bf16 (E, K)")), moe_router.router_gate_grad_reference,
              gemm, moe_router.router_gate_grad, "Triton token_grad + torch.mm"),
        _spec(B, "shared_down_grad", DI, G, "Shared experts: down projection backward",
              (_p("dy", "bf16 (T, K)"), _p("acts", "bf16 (T, Ns)"), _p("ws2", "bf16 (1, K, Ns)")),
              (_p("grad_acts", "bf16 (T, Ns)"), _p("grad_ws2", "bf16 (1, K, Ns)")), _shared_down_grad_reference, gemm,
              _shared_down_grad, "torch.mm"),
        _spec(B, "shared_up_grad", DI, G, "Shared experts: gate/up backward; grad_x summed with the routed path",
              (_p("grad_hs", "bf16 (T, 2Ns)"), _X, _p("ws13", "bf16 (1, 2Ns, K)"), _p("grad_x_in", "bf16 (T, K)")),
              (_p("grad_x", "bf16 (T, K)"), _p("grad_ws13", "bf16 (1, 2Ns, K)")), _shared_up_grad_reference, gemm,
              _shared_up_grad, "torch.mm"),
    ]  # fmt: skip


def _fused(recipe: Recipe, column_amax: bool = True) -> list[StageSpec]:
    """The fused stages of a recipe: each writes a bf16 tensor and the quantized operand the next GEMM reads.
    FP8 rowwise's write the (E, D) column amax table for the weight gradient's quantizer too; without
    ``column_amax`` (``NO_AMAX``: a layer whose weight gradients run in bf16 reads none) they take no offs and write
    the rowwise quantizer's outputs alone, every row."""
    grouped = recipe == Recipe.MXFP8 or column_amax
    if recipe == Recipe.MXFP8:
        quantized = lambda n: (_p(f"{n}_q", "e4m3 (rows, D)"), _p(f"{n}_sb", "e8m0 M-groups blocked scales"))
        params = ("mode",)
    else:
        table = (lambda n: (_p(f"{n}_amax", "fp32 (E, D) column amax per group"),)) if grouped else (lambda n: ())
        quantized = lambda n: (_p(f"{n}_q", "e4m3 (rows, D)"), _p(f"{n}_s", "fp32 (rows,) row scales"), *table(n))
        params = ()
    rule = MinSQNR(_FUSED_DB)
    h13 = _p("h", "bf16 (rows, 2N) gate | up projections")
    offs = (_OFFS,) if grouped else ()
    # the quantized rows past offs[-1] (in no group) are left unwritten, as the chain's quantizer leaves them
    unwritten = lambda n: {f"{n}_q": _rows_until_last_offset} if grouped else {}
    k = "moe_fused"
    suffix = "" if grouped else NO_AMAX
    rows = lambda name, what: (_p(name, what), _ROW_SRC, _ROW_W, *offs)
    chain = lambda producer: _fused_chain(recipe, producer, grouped)
    impl = lambda kind: _fused_impl(recipe, kind, grouped)
    return [
        _spec(recipe, f"permute_quantize{suffix}", F, Category.PERMUTE, "Permute + pad + quantize in one pass",
              rows("x", "bf16 (T, K)"), (_p("xs", "bf16 (rows, K)"), *quantized("xs")), chain(_permute_reference),
              rule, impl("permute"), f"{k}.gather_quantize", (*params, "weighted"), unwritten("xs")),
        _spec(recipe, f"swiglu_quantize{suffix}", F, Category.ACTIVATION, "SwiGLU writing the down projection's operand",
              (h13, *offs), (_p("act", "bf16 (rows, N)"), *quantized("act")), chain(_swiglu_reference), rule,
              impl("swiglu"), f"{k}.swiglu_quantize", params, unwritten("act")),
        _spec(recipe, f"combine_grad_quantize{suffix}", DI, Category.COMBINE, "Combine gradient into slots + quantize",
              rows("dy", "bf16 (T, K)"), (_p("grad_out", "bf16 (rows, K)"), *quantized("grad_out")),
              chain(_permute_reference), rule, impl("combine_grad"), f"{k}.gather_quantize", (*params, "weighted"),
              unwritten("grad_out")),
        _spec(recipe, f"swiglu_grad_quantize{suffix}", DI, Category.ACTIVATION, "SwiGLU backward writing the up "
              "projection's gradient operand", (_p("grad_act", "bf16 (rows, N)"), h13, *offs),
              (_p("grad_h", "bf16 (rows, 2N)"), *quantized("grad_h")), chain(_swiglu_grad_reference), rule,
              impl("swiglu_grad"), f"{k}.swiglu_backward_quantize", params, unwritten("grad_h")),
    ]  # fmt: skip


# The FP8 fused stages without the column amax table are these names with this suffix.
NO_AMAX = "_no_amax"
FUSED_STAGES = ("permute_quantize", "swiglu_quantize", "combine_grad_quantize", "swiglu_grad_quantize")
FUSED_RECIPES = (Recipe.MXFP8, Recipe.FP8_ROWWISE)
# fused: (its producer, whether it takes offs)
_FUSED_GATHERS = {f"{n}{suffix}": (p, not suffix) for n, p in (("permute_quantize", "permute"),
                  ("combine_grad_quantize", "combine_grad")) for suffix in ("", NO_AMAX)}  # fmt: skip


def placed_spec(spec: StageSpec, score_before: bool) -> StageSpec:
    """``spec`` as a layer whose scores go first (``score_before``) or last runs it: a scored row movement (or a
    fused stage whose producer is one) gets the oracle of that placement (``reference.layer_stages``), which never
    reads the ``weighted`` flag its kernel is given; any other spec is returned as it is. The table's own oracles
    follow that flag: they are the kernels' contracts, not the layer's."""
    producer, grouped = _FUSED_GATHERS.get(spec.name, (spec.name, True))
    if producer not in SCORED_STAGES:
        return spec
    oracle = scored_oracle(producer, score_before)
    return replace(spec, oracle=oracle if producer == spec.name else _fused_chain(spec.recipe, oracle, grouped))


@functools.cache
def layer_specs() -> dict[tuple[Recipe, str], StageSpec]:
    """Every stage spec of the layer's own by (recipe, name)."""
    fused = (*_fused(Recipe.MXFP8), *_fused(Recipe.FP8_ROWWISE), *_fused(Recipe.FP8_ROWWISE, column_amax=False))
    return {s.key: s for s in (*_common(), *fused)}


def get_layer_spec(recipe: str, name: str) -> StageSpec:
    return layer_specs()[(Recipe(recipe), name)]
