"""The whole MoE layer expert-parallel: one rank's stage list, forward and backward, in the EP strategies.

W ranks, E local experts each (global expert g on rank g // E as its local expert g % E), T tokens per rank routed
to top_k distinct global experts (forced: ``assign``, so the split sizes are known on the host before the step, as
the projection's EP needs: data-dependent routing would need a host sync inside the step). Per rank:

forward   router_gate -> router_forced -> sort_scores (the copies' scores in sorted order) -> sort_tokens (copies
          sorted by global expert; scored here when ``score_before``) -> dispatch all-to-all -> permute
          [source rank][local expert] -> [local expert][source] -> (pad) -> up.* (one (E, 2N, K) gate/up GEMM) ->
          SwiGLU -> down.* -> (unpad) -> unpermute -> combine all-to-all -> unsort_combine (each token's top_k
          copies summed; scored here otherwise)
backward  sort_grad (dy to the sorted copies; scored when scores come after) [+ combine_score_grad] ->
          combine_grad all-to-all -> permute_grad -> (pad) -> down dgrad -> swiglu_grad -> up dgrad -> (unpad) ->
          unpermute_grad -> dispatch_grad all-to-all -> unsort_grad (the copies' gradients summed per token) [+
          permute_score_grad] -> router_grad; then the weight gradients (up, down) and router_gate_grad (grad_x and
          the router's weight gradient, this rank's tokens' share).

Every stage is a declaration already made elsewhere: the all-to-alls, permutes and MXFP8 pads of ``ep_stages``, the
layer's router / SwiGLU / weighted row stages of ``layer_specs`` (the token sorts and the combine are the layer's
weighted gathers, named for their place here: ``ep_layer_specs``), and the projections of ``pipeline.step_stages``
bound to the layer under the roles ``up`` and ``down`` (``layer._projection``). Strategies as the projection's:

* ``bf16``, ``mxfp8``: bf16 all-to-alls; the recipe's step on the permuted rows (quantize right before each GEMM);
* ``mxfp8_a2a``: the sorted (scored) copies are quantized 1x32 along K before the dispatch (``quantize_xs``);
  e4m3 data and e8m0 scales travel and feed the gate/up GEMM. In the backward the combine's gradient is quantized
  before its all-to-all (``quantize_dys``) and feeds the down projection's dgrad GEMM.
* ``fp8_rowwise``, ``fp8_rowwise_a2a``: the same two with the FP8 rowwise recipe (one fp32 scale a row; the scales
  travel beside the rows as 4 bytes each and feed the GEMMs as they arrive: no rearrangement).

The weight gradient's precision is the ``ep_wgrad.Wgrad`` option; under mxfp8_a2a the up projection's tokens and
the down projection's output gradient exist as MXFP8 rows only and are dequantized first (``dequantize_a``,
``dequantize_grad_out``), then quantized 32x1 along the tokens for an MXFP8 wgrad.

Shared experts (``EPLayerShape.shared``, ``ep_shared``): their forward is issued just before the dispatch and added
to the routed output at the end (``add_shared``); their backward just before the combine's gradient all-to-all, their
input gradient added to the routed one before the router's term (``shared.add_grads``). ``ep.overlap`` runs them on
a second stream.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from ..layouts import padding
from ..moe import router as moe_router, moe_rows, swiglu
from ..quant import fp8_rowwise, quantize
from ..core.comparison import BitExact
from ..core.cost import Cost
from .ep_stages import EPShape, _Builder, check_layer, dequantize_cost, ep_specs
from ..ep.strategy import get_strategy, row_widths
from ..ep.wgrad import Wgrad, resolve_wgrad, wgrad_recipe
from .ep_shared import add_shared, add_shared_grads, shared_stages
from .layer import _absorb, _projection
from .layer_specs import get_layer_spec, layer_specs
from ..moe.router import ScoreFunc
from ..core.names import Category, Pass, Recipe
from .pipeline import Stage, bind_stage, needs_padding, with_impls
from ..core.runtime import InputError
from .step_specs import Port, StageImpl, StageSpec, get_spec, padding_alignment
from ..moe.token_permute import gather_rows, gather_rows_cost, gather_rows_reference
from ..reference.layer_stages import EP_NAMES, scored_oracle


@dataclass(frozen=True)
class EPLayerShape:
    """One rank's layer: the EP sizes and routing (``ep``; its N is the experts' hidden width) and the router's
    options: ``score_func`` and whether the scores weight the tokens before the experts (torchtitan's default)."""

    ep: EPShape
    score_func: ScoreFunc = ScoreFunc.SIGMOID
    score_before: bool = True
    shared: int = 0  # shared experts (``ep_shared``): one dense SwiGLU FFN of hidden width N * shared
    shared_in_recipe: bool = False  # their GEMMs in the strategy's recipe, else bf16

    def __post_init__(self):
        object.__setattr__(self, "score_func", ScoreFunc(self.score_func))
        if not isinstance(self.shared, int) or isinstance(self.shared, bool) or self.shared < 0:
            raise InputError(f"shared experts must be a non-negative integer, got {self.shared!r}")

    @property
    def experts(self) -> int:
        """Global experts (the router's width)."""
        return self.ep.world * self.ep.E

    @property
    def weights(self) -> tuple[str, ...]:
        return ("wr", "w13", "w2", *(("ws13", "ws2") if self.shared else ()))


# ---- the layer's own declarations -------------------------------------------------------------------------------


def _sort_scores(top, order):
    return (gather_rows(top.reshape(-1, 1), order).view(-1),)


def _sort_scores_reference(top, order):
    return (gather_rows_reference(top.reshape(-1, 1), order).view(-1),)


@functools.cache
def ep_layer_specs() -> dict[tuple[Recipe, str], StageSpec]:
    """The EP layer's stage specs that neither ``ep_specs`` nor ``layer_specs`` holds under these names: the
    scores in sorted order, and the layer's weighted gathers named for their place around the all-to-alls."""
    B = Recipe.BF16
    sort_scores = StageSpec(
        B, "sort_scores", Pass.FORWARD, Category.ROUTING, "The copies' scores in the order sorted by global expert",
        (Port("top", "fp32 (T, k) each token's scores"), Port("order", "int32 (T*k,) copies sorted by expert")),
        (Port("row_w", "fp32 (T*k,) score of each sorted copy"),), _sort_scores_reference, BitExact(), _sort_scores,
        "gather_rows",
    )  # fmt: skip
    purposes = {  # of the layer's specs under their EP names (``reference.layer_stages.EP_NAMES``)
        "sort_tokens": "Sort token copies by global expert (scored here when scores come first)",
        "unsort_combine": "Each token's top-k outputs back from sorted order, summed (scored when last)",
        "sort_grad": "grad_out to the sorted copies (scored when scores come last)",
        "unsort_grad": "Each token's top-k copies' gradients, summed (scored when scores first)",
    }
    specs = [sort_scores] + [replace(get_layer_spec(B, layer), name=name, purpose=purposes[name])
                             for name, layer in EP_NAMES.items()]  # fmt: skip
    for recipe, how in ((Recipe.MXFP8, "1x32"), (Recipe.FP8_ROWWISE, "rowwise")):
        for name, step, what in (
            ("quantize_xs", "quantize_a", "sorted token copies"),
            ("quantize_dys", "quantize_grad_out", "sorted output gradient copies"),
        ):
            specs.append(replace(get_spec(recipe, step), name=name,
                                 purpose=f"Quantize the {what} {how} along K before their all-to-all"))  # fmt: skip
    return {s.key: s for s in specs}


def get_ep_layer_spec(recipe: str, name: str) -> StageSpec:
    """The spec of a stage the EP layer runs: its own, else the EP step's (its all-to-alls and permutes share names
    with the single-GPU layer's combine and permute stages), else the layer's, else the single-GPU step's."""
    key = (Recipe(recipe), name)
    return ep_layer_specs().get(key) or ep_specs().get(key) or layer_specs().get(key) or get_spec(recipe, name)


class _LayerBuilder(_Builder):
    """The EP step's builder with the layer's specs; the scored row movements get the oracle of the layer's score
    placement (``reference.layer_stages``), written apart from the ``weighted`` flag their kernels are given."""

    def __init__(self, *args, score_before: bool):
        super().__init__(*args)
        self.score_before = score_before

    def add(self, recipe, name, shapes, cost, inputs, outputs, params=None, backend=None) -> None:
        spec = get_ep_layer_spec(recipe, name)
        if name in EP_NAMES:
            spec = replace(spec, oracle=scored_oracle(name, self.score_before))
        self.stages.append(bind_stage(spec, shapes, cost, inputs, outputs, params, backend))


# ---- the stage list ---------------------------------------------------------------------------------------------


def ep_layer_stages(
    strategy: str,
    shape: EPLayerShape,
    *,
    group=None,
    mode: str = "rceil",
    backend: str | None = None,
    wgrad: Wgrad | None = None,
    impls: Mapping[str, StageImpl] | None = None,
) -> list[Stage]:
    """Every stage of one rank's EP layer step, in execution order (module doc).

    The environment starts with x (T, K), wr (W*E, K), w13 (E, 2N, K), w2 (E, K, N) bf16, assign (T, k) int32
    global experts, the routing tensors ``token_of``, ``order``, ``pos``, ``counts`` (``ep.RoutingPlan``) and
    ``copy_token`` (int32 (T*k,): c // k), and, for the backward, dy (T, K); it ends with y, grad_x, grad_wr,
    grad_w13 and grad_w2. With shared experts it starts with ws13 (1, 2N*shared, K), ws2 (1, K, N*shared) and
    ``shared_offs`` ([T]) too and ends with grad_ws13 and grad_ws2 too (``ep_shared``).
    """
    decl = get_strategy(strategy)
    s, L = shape.ep, shape
    check_layer(s.T, s.K, s.N, s.E, s.top_k, s.world)
    if s.R == 0:
        raise InputError(f"rank {s.rank} receives no token copies with this routing: use more tokens per rank")
    wgrad = resolve_wgrad(strategy, wgrad)
    recipe = decl.recipe
    if recipe != Recipe.BF16 and backend is None:
        from ..gemm.grouped_gemm import default_backend

        backend = default_backend(recipe)
    b = _LayerBuilder(s, group, mode, backend, score_before=L.score_before)
    a2a = decl.quantized_a2a
    rows = _Rows(recipe, s)
    payload = decl.payload  # what the dispatch and the combine's gradient carry
    proj = lambda role, n, k, names: _projection(recipe, role, rows.Rp, n, k, s.E, names, mode, backend, False)
    up = proj("up", 2 * s.N, s.K, {"a": rows.a, "w": "w13", "offs": rows.offs, "out": "h", "grad_out": "grad_h",
                                   "grad_a": rows.grad_a})  # fmt: skip
    down = proj("down", s.K, s.N, {"a": "act", "w": "w2", "offs": rows.offs, "out": rows.out,
                                   "grad_out": rows.grad_out, "grad_a": "grad_act"})  # fmt: skip
    # What the dispatch and the combine's gradient deliver to the projections: under *_a2a the quantized rows that
    # are their quantized operands (so their quantizers go), else the bf16 rows they read
    xq = _absorb(up, Pass.FORWARD, "quantize_a") if a2a else (rows.a,)
    dyq = _absorb(down, Pass.BACKWARD_INPUT, "quantize_grad_out") if a2a else (rows.grad_out,)
    shared = shared_stages(recipe, s.T, s.K, s.N, L.shared, L.shared_in_recipe, mode, backend) if L.shared else None
    _router_forward(b, L)
    _dispatch(b, L, payload, rows, xq, mode, shared)
    b.stages += up[Pass.FORWARD]
    b.add(Recipe.BF16, "swiglu", [(rows.Rp, 2 * s.N)], swiglu.swiglu_cost(rows.Rp, s.N), ("h",), ("act",))
    b.stages += down[Pass.FORWARD]
    _combine(b, L, rows)
    if shared:
        b.stages.append(add_shared(s.T, s.K))
    _combine_backward(b, L, payload, rows, dyq, mode, shared)
    b.stages += down[Pass.BACKWARD_INPUT]
    b.add(Recipe.BF16, "swiglu_grad", [(rows.Rp, s.N), (rows.Rp, 2 * s.N)], swiglu.swiglu_backward_cost(rows.Rp, s.N),
          ("grad_act", "h"), ("grad_h",))  # fmt: skip
    b.stages += up[Pass.BACKWARD_INPUT]
    _dispatch_backward(b, L, rows)
    _weight_gradients(b, L, strategy, wgrad, rows, xq, dyq)
    names = [st.name for st in b.stages]
    assert len(names) == len(set(names)), f"stage names repeat in {strategy}: {names}"
    return with_impls(b.stages, impls)


@dataclass(frozen=True)
class _Rows:
    """The names and rows of the expert-major tensors: padded (``_p``, ``offs_p``, Rp rows) where the recipe's
    alignment needs it, else the permuted ones themselves."""

    recipe: Recipe
    s: EPShape

    @property
    def pad(self) -> bool:
        return needs_padding(self.recipe, self.s.group_sizes)

    @property
    def Rp(self) -> int:
        return padding.padded_rows(self.s.R, self.s.E, padding_alignment(self.recipe)) if self.pad else self.s.R

    def _p(self, name: str) -> str:
        return f"{name}_p" if self.pad else name

    @property
    def offs(self) -> str:
        return self._p("offs")

    @property
    def a(self) -> str:
        return self._p("a")

    @property
    def out(self) -> str:
        return self._p("out")

    @property
    def grad_out(self) -> str:
        return self._p("grad_out")

    @property
    def grad_a(self) -> str:
        return self._p("grad_a")


def _router_forward(b: _LayerBuilder, L: EPLayerShape) -> None:
    s, B, G = L.ep, Recipe.BF16, L.experts
    b.add(B, "router_gate", [(s.T, s.K), (G, s.K)], moe_router.router_gate_cost(s.T, s.K, G), ("x", "wr"), ("logits",))
    b.add(B, "router_forced", [(s.T, G), (s.T, s.top_k)], moe_router.router_topk_cost(s.T, G, s.top_k),
          ("logits", "assign"), ("scores", "top", "experts"), {"score_func": L.score_func.value})  # fmt: skip
    b.add(B, "sort_scores", [(s.T, s.top_k), (s.S,)], gather_rows_cost(s.S, 1, 4), ("top", "order"), ("row_w",))


def _quantize(b: _LayerBuilder, payload: Recipe, name: str, rows: int, width: int, src: str,
              mode: str) -> tuple[str, str]:  # fmt: skip
    out, bf16 = (f"{src}_q", f"{src}_s"), torch.bfloat16
    if payload == Recipe.MXFP8:
        b.add(payload, name, [(rows, width)], quantize.quantize_2d_cost(rows, width, bf16), (src,), out, {"mode": mode})
    else:
        b.add(payload, name, [(rows, width)], fp8_rowwise.quantize_fp8_rowwise_cost(rows, width, bf16), (src,), out)
    return out


def _to_experts(b: _LayerBuilder, payload: Recipe, rows: _Rows, names: tuple[str, ...], src: tuple[str, ...],
                dst: tuple[str, ...], width: int) -> None:  # fmt: skip
    """all-to-all ``names[0]`` -> permute ``names[1]`` -> pad ``names[2]`` of ``src`` rows into ``dst`` (the
    projection's operand: bf16 rows, or MXFP8 data and scales), padded where needed."""
    s, q = b.s, payload != Recipe.BF16
    a2a, permute, pad = names
    recv = tuple(f"{n}_r" for n in src)
    b.a2a(payload, a2a, width, src, recv, forward=True)
    permuted = tuple(f"{n}_perm" for n in src) if rows.pad else dst
    b.permute(payload, permute, width, recv, (*permuted, "offs"))
    if not rows.pad:
        return
    align, E = padding_alignment(rows.recipe), s.E
    if q:
        widths = row_widths(payload, width)
        cost = sum((padding.pad_cost(s.R, w, E, align, e) for w, e in widths), Cost(0, 0))
        suffix = "mx" if payload == Recipe.MXFP8 else "fp8"
        b.add(payload, f"{pad}_{suffix}", [(s.R, w) for w, _ in widths], cost, (*permuted, "offs"), (*dst, "offs_p"),
              {"alignment": align})  # fmt: skip
    else:
        b.add(rows.recipe, pad, [(s.R, width)], padding.pad_cost(s.R, width, E, align, 2), (*permuted, "offs"),
              (*dst, "offs_p"), {"alignment": align})  # fmt: skip


def _token_gather_cost(s: EPShape, weighted: bool) -> Cost:
    """A gather of the T token rows (x, or dy) into the S sorted copies: each token row read from DRAM once, its
    other top_k - 1 reads ``Cost.bytes_reread`` (as the single-GPU layer's permute, ``layer``)."""
    return moe_rows.gather_weighted_cost(s.S, s.K, s.S, weighted, sources=s.T)


def _score_grad_cost(s: EPShape) -> Cost:
    """The score gradient: per copy its own row, and its token's row (x or dy), each of the T read once."""
    return moe_rows.row_dot_cost(s.S, s.K, b_sources=s.T)


def _dispatch(b: _LayerBuilder, L: EPLayerShape, payload: Recipe, rows: _Rows, xq, mode: str, shared) -> None:
    s, B = L.ep, Recipe.BF16
    b.add(B, "sort_tokens", [(s.T, s.K), (s.S,)], _token_gather_cost(s, L.score_before), ("x", "token_of", "row_w"),
          ("xs",), {"weighted": L.score_before})  # fmt: skip
    src = _quantize(b, payload, "quantize_xs", s.S, s.K, "xs", mode) if payload != Recipe.BF16 else ("xs",)
    if shared:  # issued here, just before the dispatch, so that on a side stream they run beside it
        b.stages += shared[Pass.FORWARD]
    _to_experts(b, payload, rows, ("dispatch", "permute", "pad_a"), src, xq, s.K)


def _from_experts(b: _LayerBuilder, L: EPLayerShape, rows: _Rows, names: tuple[str, str, str, str],
                  tensors: tuple[str, str, str], weighted: bool) -> None:
    """Rows of the experts' rank back to their tokens: (unpad) -> unpermute -> all-to-all -> unsort into the token
    order, summing each token's top_k copies (weighted by the scores when ``weighted``). ``names``: the unpad,
    unpermute, all-to-all and unsort stages; ``tensors``: the expert-side rows, what the all-to-all returns, the
    tokens' result."""
    s, B = L.ep, Recipe.BF16
    unpad, unpermute, a2a, unsort = names
    src, received, dst = tensors
    if rows.pad:
        align = padding_alignment(rows.recipe)
        b.add(rows.recipe, unpad, [(rows.Rp, s.K)], padding.unpad_cost(s.R, s.K, s.E, align, 2),
              (f"{src}_p", "offs", "offs_p"), (src,), {"num_tokens": s.R})  # fmt: skip
    b.permute(B, unpermute, s.K, (src,), (f"{src}r",))
    b.a2a(B, a2a, s.K, (f"{src}r",), (received,), forward=False)
    b.add(B, unsort, [(s.S, s.K), (s.S,)], moe_rows.combine_rows_cost(s.T, s.K, s.top_k, weighted),
          (received, "pos", "top"), (dst,), {"weighted": weighted})  # fmt: skip


def _combine(b: _LayerBuilder, L: EPLayerShape, rows: _Rows) -> None:
    # "ys" here are the combined copies (``_from_experts``); the shared experts' output is "ys" of ``ep_shared``
    received, y = ("ys_r", "y_routed") if L.shared else ("ys", "y")
    _from_experts(b, L, rows, ("unpad_out", "unpermute", "combine", "unsort_combine"), ("out", received, y),
                  not L.score_before)  # fmt: skip


def _combine_backward(b: _LayerBuilder, L: EPLayerShape, payload: Recipe, rows: _Rows, dyq, mode: str,
                      shared) -> None:  # fmt: skip
    s, B = L.ep, Recipe.BF16
    b.add(B, "sort_grad", [(s.T, s.K), (s.S,)], _token_gather_cost(s, not L.score_before), ("dy", "token_of", "row_w"),
          ("dys",), {"weighted": not L.score_before})  # fmt: skip
    if not L.score_before:
        b.add(B, "combine_score_grad", [(s.S, s.K), (s.T, s.K)], _score_grad_cost(s),
              ("ys_r" if L.shared else "ys", "pos", "dy", "copy_token"), ("grad_top",))  # fmt: skip
    src = _quantize(b, payload, "quantize_dys", s.S, s.K, "dys", mode) if payload != Recipe.BF16 else ("dys",)
    if shared:  # issued just before the combine's gradient all-to-all (module doc of ``ep_shared``)
        b.stages += shared[Pass.BACKWARD_INPUT] + shared[Pass.BACKWARD_WEIGHT]
    _to_experts(b, payload, rows, ("combine_grad", "permute_grad", "pad_grad_out"), src, dyq, s.K)


def _dispatch_backward(b: _LayerBuilder, L: EPLayerShape, rows: _Rows) -> None:
    s, B = L.ep, Recipe.BF16
    _from_experts(b, L, rows, ("unpad_grad_a", "unpermute_grad", "dispatch_grad", "unsort_grad"),
                  ("grad_a", "grad_xs", "grad_x_routed"), L.score_before)  # fmt: skip
    if L.score_before:
        b.add(B, "permute_score_grad", [(s.S, s.K), (s.T, s.K)], _score_grad_cost(s),
              ("grad_xs", "pos", "x", "copy_token"), ("grad_top",))  # fmt: skip
    G = L.experts
    b.add(B, "router_grad", [(s.T, s.top_k), (s.T, G)], moe_router.router_grad_cost(s.T, G, s.top_k),
          ("grad_top", "scores", "experts"), ("grad_logits",), {"score_func": L.score_func.value})  # fmt: skip


def _weight_gradients(b: _LayerBuilder, L: EPLayerShape, strategy: str, wgrad: Wgrad, rows: _Rows, xq, dyq) -> None:
    """The projections' weight gradients in the wgrad precision, then the router's (with grad_x)."""
    s, B = L.ep, Recipe.BF16
    xs, grad_out = rows.a, rows.grad_out
    payload = get_strategy(strategy).payload
    if payload == Recipe.MXFP8:  # the rows that crossed in MXFP8 exist here only so: dequantize them (exactly)
        xs, grad_out = "a_bf", "grad_out_bf"
        for name, (q, sc), dst in (("dequantize_a", xq, xs), ("dequantize_grad_out", dyq, grad_out)):
            blocked = f"{sc.rsplit('_', 1)[0]}_sb"  # the projection's rearranged scales of that operand
            b.add(Recipe.MXFP8, name, [(rows.Rp, s.K)], dequantize_cost(rows.Rp, s.K, s.E), (q, blocked, rows.offs),
                  (dst,))  # fmt: skip
    elif payload == Recipe.FP8_ROWWISE:  # FP8 rowwise rows: q * scale, rounded to bf16 (``ep_stages``)
        xs, grad_out = "a_bf", "grad_out_bf"
        for name, (q, sc), dst in (("dequantize_a", xq, xs), ("dequantize_grad_out", dyq, grad_out)):
            b.add(payload, name, [(rows.Rp, s.K)], Cost(rows.Rp * (s.K + 4), 2 * rows.Rp * s.K), (q, sc), (dst,))
    w = wgrad_recipe(strategy, wgrad)
    for role, n, k, names in (
        ("up", 2 * s.N, s.K, {"a": xs, "grad_out": "grad_h", "grad_w": "grad_w13"}),
        ("down", s.K, s.N, {"a": "act", "grad_out": grad_out, "grad_w": "grad_w2"}),
    ):
        names = {**names, "offs": rows.offs}
        b.stages += _projection(w, role, rows.Rp, n, k, s.E, names, b.mode, b.backend, False)[Pass.BACKWARD_WEIGHT]
    G, grad_x_in = L.experts, "grad_x_routed"
    if L.shared:
        b.stages.append(add_shared_grads(s.T, s.K))
        grad_x_in = "grad_x_shared"
    b.add(B, "router_gate_grad", [(s.T, G), (s.T, s.K)], moe_router.router_gate_grad_cost(s.T, s.K, G, 1),
          ("grad_logits", "x", "wr", grad_x_in), ("grad_x", "grad_wr"))  # fmt: skip
