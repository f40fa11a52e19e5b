"""The MoE layer as one stage list: router, permute, expert projections, SwiGLU, combine, shared experts.

One token-choice MoE layer as torchtitan's MoE module computes it, forward and backward, every stage a declaration
(``layer_specs`` for the layer's own, ``stages`` for the expert projections' quantize / rearrange / GEMM stages):

forward   router_gate -> router_topk | router_forced -> route_tokens -> permute (into padded expert slots;
          scored here when ``score_before``) -> gate/up projection (one (E, 2N, K) GEMM, or two (E, N, K)) ->
          SwiGLU -> down projection -> combine (scored here otherwise) [-> shared experts, added]
backward  the mirror: combine_grad (+ its score gradient) -> down projection backward -> SwiGLU backward -> gate/up
          backward -> permute_grad (+ its score gradient) [-> shared experts] -> router_grad -> router_gate_grad

The tokens live padded from the permute to the combine: every expert's group starts at a multiple of the recipe's
alignment in a buffer of the host-known upper bound ``LayerShape.rows(recipe)``, so nothing reads group sizes on
the host (one CUDA graph captures the whole layer) and the projections need no pad or unpad stages of their own.
The router gate runs in bf16 whatever the recipe; the recipe sets every grouped GEMM, and the shared experts' GEMMs
too with ``shared_in_recipe`` (else they are dense bf16 products).

``fuse`` replaces four chains by fused stages (``layer_specs.FUSED_STAGES``): the permute writes the gate/up
projection's quantized operand, SwiGLU the down projection's, the combine's backward the down projection's
gradient operand and SwiGLU's backward the gate/up projection's. The projections then run with fused scales.

``wgrad`` (``core.names.Wgrad``, as expert parallelism's ``--wgrad``): ``recipe`` runs every weight gradient in the
recipe (its operands quantized again along the tokens: the k-groups quantizers ``quantize_a_t`` and
``quantize_grad_out_t``), ``bf16`` runs each as the bf16 recipe does, one ``torch._grouped_mm`` (2D x 2D) of the
bf16 output gradient and the bf16 activations the layer already holds (the permuted tokens ``xs``, SwiGLU's ``act``,
the gradients ``grad_h`` and ``grad_out``; the fused stages write them beside their quantized copies), while the
forward and the input gradients stay in the recipe. It saves no extra activation: the recipe's wgrad quantizers
read the same bf16 ``xs`` and ``act`` in the backward, so the autograd function keeps them either way (and with
``bf16`` no longer keeps FP8 rowwise's column amaxes of them). FP8 rowwise's fused stages then write no column
amax table either (``layer_specs.NO_AMAX``, the same names with that suffix): their quantizer is the plain rowwise
one, as in the chain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum


from ..moe import router as moe_router, moe_rows, swiglu
from ..quant import fp8_amax
from ..core.cost import Cost
from .layer_specs import FUSED_RECIPES, NO_AMAX, get_layer_spec, placed_spec
from ..moe.router import ScoreFunc
from ..core.names import Category, Pass, Recipe, Wgrad, parse_wgrad
from ..layouts.padding import padded_rows
from .pipeline import Stage, bind_stage, check_recipe, check_sizes, step_stages, with_impls
from ..core.runtime import InputError
from .step_specs import StageImpl, padding_alignment


class Routing(StrEnum):
    ROUTER = "router"  # the router's own top-k
    BALANCED = "balanced"  # forced: every expert the same number of copies (torchao's layer benchmark)
    SKEWED = "skewed"  # forced: seeded, router-like imbalance


@dataclass(frozen=True)
class LayerShape:
    """One MoE layer: T tokens of width K (the model dim), E experts of hidden width N, top_k experts a token.

    ``shared``: shared experts, one dense SwiGLU FFN of hidden width N * shared beside the routed ones (0: none).
    ``score_before``: the router's scores weight the tokens before the experts (torchtitan's default), else their
    outputs in the combine. ``fuse_up``: the gate and up projections as one (E, 2N, K) GEMM, else two.
    ``shared_in_recipe``: the shared experts' GEMMs in the recipe too (each a one-group grouped GEMM over the T
    tokens, as an FP8 training recipe converts every linear), else dense bf16 (torchao's layer benchmark converts
    the routed experts only).
    """

    T: int
    K: int
    N: int
    E: int
    top_k: int
    shared: int = 0
    score_func: ScoreFunc = ScoreFunc.SIGMOID
    score_before: bool = True
    routing: Routing = Routing.BALANCED
    fuse_up: bool = True
    shared_in_recipe: bool = False

    def __post_init__(self):
        check_sizes({"T": self.T, "K": self.K, "N": self.N}, ("experts", self.E))
        if not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.E:
            raise InputError(f"top-k must be between 1 and the {self.E} experts, got {self.top_k!r}")
        for name in ("K", "N"):
            if getattr(self, name) > 2**20:
                raise InputError(f"{name} must be at most 2**20, got {getattr(self, name)}")
        if self.T * self.top_k > 2**31 - 1:
            raise InputError(f"tokens x top-k must be below 2**31 (int32 row indices), got {self.T * self.top_k}")
        if not isinstance(self.shared, int) or self.shared < 0:
            raise InputError(f"shared experts must be a non-negative integer, got {self.shared!r}")
        object.__setattr__(self, "score_func", ScoreFunc(self.score_func))
        object.__setattr__(self, "routing", Routing(self.routing))

    @property
    def copies(self) -> int:
        return self.T * self.top_k

    def rows(self, recipe: str) -> int:
        """Rows of the padded expert buffer: enough for any routing (``padding.padded_rows``)."""
        return padded_rows(self.copies, self.E, padding_alignment(check_recipe(recipe)))

    @property
    def weights(self) -> tuple[str, ...]:
        """The layer's parameters by their env names."""
        experts = ("w13",) if self.fuse_up else ("w1", "w3")
        return ("wr", *experts, "w2", *(("ws13", "ws2") if self.shared else ()))


def check_fuse(recipe: str, fuse: bool) -> None:
    if fuse and Recipe(recipe) not in FUSED_RECIPES:
        raise InputError(f"recipe {recipe} has no fused layer stages (they write quantized operands): "
                         f"{', '.join(FUSED_RECIPES)} do")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------------------------


def _renamed(stages: Sequence[Stage], role: str, boundary: Mapping[str, str]) -> list[Stage]:
    """A projection's step stages bound to the layer: stage names prefixed with the role, tensor names mapped
    through ``boundary`` (the projection's inputs and outputs), the projection's own intermediates prefixed."""

    def name(n):
        return None if n is None else boundary.get(n, f"{role}.{n}")

    return [replace(s, spec=replace(s.spec, name=f"{role}.{s.spec.name}", purpose=f"{role}: {s.spec.purpose}"),
                    inputs=tuple(map(name, s.inputs)), outputs=tuple(map(name, s.outputs)))
            for s in stages]  # fmt: skip


def _projection(recipe, role, M, N, K, E, names, mode, backend, fuse_scales,
                wgrad: Wgrad = Wgrad.RECIPE) -> dict[Pass, list[Stage]]:  # fmt: skip
    """The role's three passes: out (M, N) = a (M, K) @ w (E, N, K)^T per group; ``names`` maps the step's
    a, w, offs, out, grad_out, grad_a, grad_w to the layer's tensors. ``wgrad`` bf16: the backward-weight pass is
    the bf16 recipe's (one ``torch._grouped_mm`` of the bf16 grad_out and a, no quantizer), the others the recipe's."""
    passes = _passes(recipe, role, M, N, K, E, names, mode, backend, fuse_scales)
    if wgrad == Wgrad.BF16 and Recipe(recipe) != Recipe.BF16:
        passes[Pass.BACKWARD_WEIGHT] = _passes(Recipe.BF16, role, M, N, K, E, names, mode, None,
                                               False)[Pass.BACKWARD_WEIGHT]  # fmt: skip
    return passes


def _passes(recipe, role, M, N, K, E, names, mode, backend, fuse_scales) -> dict[Pass, list[Stage]]:
    stages = step_stages(recipe, M, N, K, E, mode=mode, backend=backend, fuse_scales=fuse_scales)
    if Recipe(recipe) == Recipe.BF16:
        stages = [replace(s, backend="bf16") if s.category == Category.GEMM else s for s in stages]
    stages = _renamed(stages, role, names)
    return {p: [s for s in stages if s.pass_name == p] for p in (Pass.FORWARD, Pass.BACKWARD_INPUT,
                                                                 Pass.BACKWARD_WEIGHT)}  # fmt: skip


def _absorb(passes: dict[Pass, list[Stage]], pass_: Pass, prefix: str) -> tuple[str, ...]:
    """Drop the quantizer of ``pass_`` whose step name starts with ``prefix`` (its work is done by a fused stage)
    and return the tensor names it wrote (its operand, which the fused stage writes instead, is its first)."""
    for i, s in enumerate(passes[pass_]):
        base = s.name.split(".", 1)[1]
        if base.startswith(prefix) and s.category == Category.QUANTIZE:
            del passes[pass_][i]
            return s.outputs
    raise AssertionError(f"no quantizer {prefix}* in {[s.name for s in passes[pass_]]}")


class _Builder:
    """The layer's stages; the scored row movements get the oracle of the layer's score placement
    (``layer_specs.placed_spec``), written apart from the ``weighted`` flag their kernels are given."""

    def __init__(self, score_before: bool):
        self.stages: list[Stage] = []
        self.score_before = score_before

    def add(self, name, shapes, cost, inputs, outputs, params=None, recipe=Recipe.BF16) -> None:
        spec = placed_spec(get_layer_spec(recipe, name), self.score_before)
        self.stages.append(bind_stage(spec, shapes, cost, inputs, outputs, params))


def layer_stages(
    recipe: str,
    shape: LayerShape,
    *,
    mode: str = "rceil",
    backend: str | None = None,
    fuse: bool = False,
    impls: Mapping[str, StageImpl] | None = None,
    wgrad: Wgrad | str = Wgrad.RECIPE,
) -> list[Stage]:
    """Every stage of the layer's forward and backward, in execution order (module doc).

    The environment starts with x (T, K), the weights (``shape.weights``), ``assign`` (T, top_k) int32 when the
    routing is forced, and, for the backward, dy (T, K); it ends with y and grad_x plus grad_<weight> for each.
    ``wgrad``: the weight-gradient GEMMs' precision (module doc).
    """
    recipe = check_recipe(recipe)
    wgrad = parse_wgrad(wgrad)
    check_fuse(recipe, fuse)
    s = shape
    if fuse and not s.fuse_up:
        raise InputError("the fused SwiGLU stages read and write the fused gate/up layout (E, 2N, K): fuse needs the "
                         "gate and up projections as one GEMM")  # fmt: skip
    if fuse and recipe == Recipe.FP8_ROWWISE and max(s.K, 2 * s.N) > fp8_amax.MAX_COLS:
        raise InputError(f"--fuse with fp8_rowwise holds rows of up to {fp8_amax.MAX_COLS} elements whole; "
                         f"K={s.K}, 2N={2 * s.N}")  # fmt: skip
    b = _Builder(s.score_before)
    T, K, N, E, k, S = s.T, s.K, s.N, s.E, s.top_k, s.copies
    rows, align = s.rows(recipe), padding_alignment(recipe)
    fwd, bwd = Pass.FORWARD, Pass.BACKWARD_INPUT

    # Router and the layout of the copies.
    b.add("router_gate", [(T, K), (E, K)], moe_router.router_gate_cost(T, K, E), ("x", "wr"), ("logits",))
    topk_cost = moe_router.router_topk_cost(T, E, k)
    if s.routing == Routing.ROUTER:
        b.add("router_topk", [(T, E)], topk_cost, ("logits",), ("scores", "top", "experts"),
              {"top_k": k, "score_func": s.score_func.value})  # fmt: skip
    else:
        b.add("router_forced", [(T, E), (T, k)], topk_cost, ("logits", "assign"), ("scores", "top", "experts"),
              {"score_func": s.score_func.value})  # fmt: skip
    b.add("route_tokens", [(T, k)], moe_router.route_tokens_cost(T, k, rows), ("experts", "top"),
          ("dest", "row_src", "row_w", "offs", "copy_token"),
          {"num_experts": E, "alignment": align, "rows": rows, "weighted_rows": True})  # fmt: skip

    # The expert projections, bound to the layer's tensors.
    fuse_scales = fuse and recipe != Recipe.BF16
    proj = lambda role, n, kk, names: _projection(recipe, role, rows, n, kk, E, names, mode, backend, fuse_scales,
                                                  wgrad)  # fmt: skip
    if s.fuse_up:
        ups = [proj("up", 2 * N, K, {"a": "xs", "w": "w13", "offs": "offs", "out": "h", "grad_out": "grad_h",
                                      "grad_a": "grad_xs", "grad_w": "grad_w13"})]  # fmt: skip
    else:
        ups = [proj(role, N, K, {"a": "xs", "w": f"w{i}", "offs": "offs", "out": f"h{i}", "grad_out": f"grad_h{i}",
                                 "grad_a": f"grad_xs{i}", "grad_w": f"grad_w{i}"})
               for role, i in (("gate", 1), ("up", 3))]  # fmt: skip
    down = proj("down", K, N, {"a": "act", "w": "w2", "offs": "offs", "out": "out", "grad_out": "grad_out",
                               "grad_a": "grad_act", "grad_w": "grad_w2"})  # fmt: skip
    quantized = {}
    # FP8 rowwise's fused stages fold the column amax table only for the recipe's weight gradients to read.
    table = not (recipe == Recipe.FP8_ROWWISE and wgrad == Wgrad.BF16)
    fused = _FusedNames(recipe, table, E)
    if fuse:
        quantized["xs"] = _absorb(ups[0], fwd, "quantize_a")
        for extra in ups[1:]:  # the second projection reads the first one's quantized tokens
            _alias(extra, _absorb(extra, fwd, "quantize_a"), quantized["xs"])
        quantized["act"] = _absorb(down, fwd, "quantize_a")
        quantized["grad_out"] = _absorb(down, bwd, "quantize_grad_out")
        quantized["grad_h"] = _absorb(ups[0], bwd, "quantize_grad_out")

    # Forward.
    perm_w = {"weighted": s.score_before}
    # Every gather of token rows reads each of the T rows once from DRAM; its other top_k - 1 copies are re-reads
    # (``Cost.bytes_reread``, which L2 may serve), not DRAM bytes.
    gather_cost = lambda weighted: moe_rows.gather_weighted_cost(rows, K, S, weighted, sources=T)
    fused_gather_cost = lambda weighted: _fused_cost(recipe, "gather", rows, K, fused.groups, S, weighted, sources=T)
    score_grad_cost = moe_rows.row_dot_cost(S, K, b_sources=T)  # a copy's own row, and its token's row
    perm_cost = gather_cost(s.score_before)
    if fuse:
        b.add(fused.name("permute_quantize"), [(T, K), (rows,)], fused_gather_cost(s.score_before),
              ("x", "row_src", "row_w", *fused.offs), ("xs", *fused.outputs(quantized["xs"])),
              {**perm_w, **_mode(recipe, mode)}, recipe)  # fmt: skip
    else:
        b.add("permute", [(T, K), (rows,)], perm_cost, ("x", "row_src", "row_w"), ("xs",), perm_w)
    for up in ups:
        b.stages += up[fwd]
    h_in = ("h",) if s.fuse_up else ("h1", "h3")
    act_cost = swiglu.swiglu_cost(rows, N)
    if fuse:
        b.add(fused.name("swiglu_quantize"), [(rows, 2 * N)], _fused_cost(recipe, "swiglu", rows, N, fused.groups),
              ("h", *fused.offs), ("act", *fused.outputs(quantized["act"])), _mode(recipe, mode), recipe)  # fmt: skip
    else:
        b.add("swiglu" if s.fuse_up else "swiglu_split", [(rows, 2 * N)], act_cost, h_in, ("act",))
    b.stages += down[fwd]
    comb_w = {"weighted": not s.score_before}
    y_routed = "y_routed" if s.shared else "y"
    b.add("combine", [(rows, K), (S,)], moe_rows.combine_rows_cost(T, K, k, not s.score_before), ("out", "dest", "top"),
          (y_routed,), comb_w)  # fmt: skip
    shared = _shared_projections(recipe, s, mode, backend, fuse_scales, wgrad) if s.shared else None
    if shared is not None:
        b.stages += shared[0][fwd]
        b.stages.append(_shared_swiglu(N * s.shared, T, fwd))
        b.stages += shared[1][fwd]
        b.add("add_shared", [(T, K), (T, K)], Cost(2 * T * K * 2, T * K * 2), ("y_routed", "ys"), ("y",))
    elif s.shared:
        Ns = N * s.shared
        b.add("shared_up", [(T, K), (2 * Ns, K)], _dense_cost(T, 2 * Ns, K), ("x", "ws13"), ("hs",))
        b.stages.append(_shared_swiglu(Ns, T, fwd))
        b.add("shared_down", [(T, Ns), (K, Ns)], _dense_cost(T, K, Ns) + Cost(2 * T * K * 2, 0), ("acts", "ws2", "y_routed"),
              ("y",))  # fmt: skip

    # Backward: combine, down projection, SwiGLU, gate/up projection, permute, shared experts, router.
    if fuse:
        b.add(fused.name("combine_grad_quantize"), [(T, K), (rows,)], fused_gather_cost(not s.score_before),
              ("dy", "row_src", "row_w", *fused.offs), ("grad_out", *fused.outputs(quantized["grad_out"])),
              {**comb_w, **_mode(recipe, mode)}, recipe)  # fmt: skip
    else:
        b.add("combine_grad", [(T, K), (rows,)], gather_cost(not s.score_before),
              ("dy", "row_src", "row_w"), ("grad_out",), comb_w)  # fmt: skip
    if not s.score_before:
        b.add("combine_score_grad", [(rows, K), (T, K)], score_grad_cost, ("out", "dest", "dy", "copy_token"),
              ("grad_top",))  # fmt: skip
    b.stages += down[bwd]
    grad_cost = swiglu.swiglu_backward_cost(rows, N)
    if fuse:
        b.add(fused.name("swiglu_grad_quantize"), [(rows, N), (rows, 2 * N)],
              _fused_cost(recipe, "swiglu_backward", rows, N, fused.groups), ("grad_act", "h", *fused.offs),
              ("grad_h", *fused.outputs(quantized["grad_h"])), _mode(recipe, mode), recipe)  # fmt: skip
    elif s.fuse_up:
        b.add("swiglu_grad", [(rows, N), (rows, 2 * N)], grad_cost, ("grad_act", "h"), ("grad_h",))
    else:
        b.add("swiglu_grad_split", [(rows, N), (rows, 2 * N)], grad_cost, ("grad_act", "h1", "h3"),
              ("grad_h1", "grad_h3"))  # fmt: skip
    for up in ups:
        b.stages += up[bwd]
    if not s.fuse_up:
        b.add("add_grads", [(rows, K), (rows, K)], Cost(2 * rows * K * 2, rows * K * 2), ("grad_xs1", "grad_xs3"),
              ("grad_xs",))  # fmt: skip
    b.add("permute_grad", [(rows, K), (S,)], moe_rows.combine_rows_cost(T, K, k, s.score_before),
          ("grad_xs", "dest", "top"), ("grad_x_routed",), perm_w)  # fmt: skip
    if s.score_before:
        b.add("permute_score_grad", [(rows, K), (T, K)], score_grad_cost, ("grad_xs", "dest", "x", "copy_token"),
              ("grad_top",))  # fmt: skip
    grad_x_in = "grad_x_routed"
    if shared is not None:
        b.stages += shared[1][bwd]
        b.stages.append(_shared_swiglu(N * s.shared, T, bwd))
        b.stages += shared[0][bwd]
        add = bind_stage(get_layer_spec("bf16", "add_grads"), [(T, K), (T, K)], Cost(2 * T * K * 2, T * K * 2),
                         ("grad_x_routed", "grad_xs_shared"), ("grad_x_shared",))  # fmt: skip
        b.stages += _renamed([add], "shared", {n: n for n in (*add.inputs, *add.outputs)})
        grad_x_in = "grad_x_shared"
    elif s.shared:
        Ns = N * s.shared
        b.add("shared_down_grad", [(T, K), (T, Ns)], _dense_cost(T, Ns, K) + _dense_cost(K, Ns, T), ("dy", "acts", "ws2"),
              ("grad_acts", "grad_ws2"))  # fmt: skip
        b.stages.append(_shared_swiglu(Ns, T, bwd))
        b.add("shared_up_grad", [(T, 2 * Ns), (T, K)], _dense_cost(T, K, 2 * Ns) + _dense_cost(2 * Ns, K, T)
              + Cost(T * K * 2, 0), ("grad_hs", "x", "ws13", "grad_x_routed"), ("grad_x_shared", "grad_ws13"))
        grad_x_in = "grad_x_shared"
    b.add("router_grad", [(T, k), (T, E)], moe_router.router_grad_cost(T, E, k), ("grad_top", "scores", "experts"),
          ("grad_logits",), {"score_func": s.score_func.value})  # fmt: skip
    for up in ups:
        b.stages += up[Pass.BACKWARD_WEIGHT]
    b.stages += down[Pass.BACKWARD_WEIGHT]
    if shared is not None:
        b.stages += shared[0][Pass.BACKWARD_WEIGHT] + shared[1][Pass.BACKWARD_WEIGHT]
    b.add("router_gate_grad", [(T, E), (T, K)], moe_router.router_gate_grad_cost(T, K, E, 1),
          ("grad_logits", "x", "wr", grad_x_in), ("grad_x", "grad_wr"))  # fmt: skip
    names = [st.name for st in b.stages]
    assert len(names) == len(set(names)), f"stage names repeat: {names}"
    return with_impls(b.stages, impls)


def _shared_projections(recipe: Recipe, s: LayerShape, mode: str, backend, fuse_scales: bool, wgrad: Wgrad):
    """The shared experts' gate/up and down projections in the recipe (``shared_in_recipe``): one-group grouped
    GEMMs over the T tokens, group end ``shared_offs``. None where they stay dense bf16."""
    if not s.shared_in_recipe or recipe == Recipe.BF16:
        return None
    align = padding_alignment(recipe)
    if s.T % align:
        raise InputError(f"shared experts in {recipe} run as one token group of T rows: T must be a multiple of "
                         f"{align}, got {s.T}")  # fmt: skip
    Ns = s.N * s.shared
    up = _projection(recipe, "shared_up", s.T, 2 * Ns, s.K, 1, {"a": "x", "w": "ws13", "offs": "shared_offs",
                     "out": "hs", "grad_out": "grad_hs", "grad_a": "grad_xs_shared", "grad_w": "grad_ws13"}, mode,
                     backend, fuse_scales, wgrad)  # fmt: skip
    down = _projection(recipe, "shared_down", s.T, s.K, Ns, 1, {"a": "acts", "w": "ws2", "offs": "shared_offs",
                       "out": "ys", "grad_out": "dy", "grad_a": "grad_acts", "grad_w": "grad_ws2"}, mode, backend,
                       fuse_scales, wgrad)  # fmt: skip
    return up, down


def _alias(passes: dict[Pass, list[Stage]], old: Sequence[str], new: Sequence[str]) -> None:
    """Every stage of ``passes`` reads ``new`` where it read ``old``."""
    mapping = dict(zip(old, new, strict=True))
    for p, stages in passes.items():
        passes[p] = [replace(st, inputs=tuple(mapping.get(i, i) for i in st.inputs)) for st in stages]


@dataclass(frozen=True)
class _FusedNames:
    """How the layer binds a recipe's fused stages: FP8 rowwise's with the column amax ``table`` (the recipe's
    weight gradients read it) or without (``layer_specs.NO_AMAX``: no offs read, no table written)."""

    recipe: Recipe
    table: bool
    experts: int

    def name(self, base: str) -> str:
        return base if self.table else base + NO_AMAX

    @property
    def offs(self) -> tuple[str, ...]:
        return ("offs",) if self.table else ()

    @property
    def groups(self) -> int:
        """The groups of the table the stage's cost counts (0: none)."""
        return self.experts if self.table else 0

    def outputs(self, absorbed: Sequence[str]) -> tuple[str, ...]:
        """The quantized outputs of the stage, from those of the quantizer it absorbs: (data, blocked scales),
        (data, scales, amax) or (data, scales)."""
        return tuple(absorbed[: 2 if self.recipe == Recipe.MXFP8 or not self.table else 3])


def _mode(recipe: Recipe, mode: str) -> dict:
    return {"mode": mode} if recipe == Recipe.MXFP8 else {}


def _fused_cost(recipe: Recipe, producer: str, *args, **kwargs) -> Cost:
    """The cost ``moe_fused`` declares for its fused call of ``producer`` in ``recipe``."""
    from ..moe import moe_fused

    suffix = "mxfp8" if recipe == Recipe.MXFP8 else "fp8"
    return getattr(moe_fused, f"{producer}_quantize_{suffix}_cost")(*args, **kwargs)


def _dense_cost(M: int, N: int, K: int) -> Cost:
    """A bf16 (M, K) @ (K, N) product: operands read, output written."""
    return Cost((M * K + K * N) * 2, M * N * 2, 2 * M * N * K, "bf16")


def _shared_swiglu(Ns: int, T: int, pass_: Pass) -> Stage:
    """The shared experts' SwiGLU (forward or backward), the routed one's spec under the role ``shared``."""
    if pass_ == Pass.FORWARD:
        st = bind_stage(get_layer_spec("bf16", "swiglu"), [(T, 2 * Ns)], swiglu.swiglu_cost(T, Ns), ("hs",), ("acts",))
    else:
        st = bind_stage(get_layer_spec("bf16", "swiglu_grad"), [(T, Ns), (T, 2 * Ns)], swiglu.swiglu_backward_cost(T, Ns),
                        ("grad_acts", "hs"), ("grad_hs",))  # fmt: skip
    return _renamed([st], "shared", {n: n for n in (*st.inputs, *st.outputs)})[0]
