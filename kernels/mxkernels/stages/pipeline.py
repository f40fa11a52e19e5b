"""The three passes of a grouped-GEMM MoE layer as ordered stages: each a spec bound to shapes, a cost and tensors.

``out = a @ b_t`` per token group, with a (M, K) bf16 activations, b_t (G, K, N) expert weights (usually a
transposed view of w (G, N, K)), and offs int32 (G,) cumulative group ends. For each recipe the step is:

* forward           out (M, N)      = a @ w^T            (2D x 3D)
* backward_input    grad_a (M, K)   = grad_out @ w       (2D x 3D)
* backward_weight   grad_w (G, N, K) = grad_out^T @ a    (2D x 2D; groups split the contraction dim M)

A ``Stage`` is one kernel call of a pass: its ``StageSpec`` (what it computes, ``stages.py``), its input shapes,
its own ``Cost`` (declared by the kernel module that owns the call), the names of the tensors it reads and writes
in the step's environment, its contract parameters, and the implementation that runs it (mxkernels' unless the
caller passes ``impls``). The same stage lists serve three users: ``plan_step`` (costs only, no tensors: the
analytic model), ``build_step`` (each stage bound to real tensors so the harness can time it alone) and the
autograd functions of ``autograd.py``. So what is benchmarked is exactly what a training step runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import torch

from ..gemm import grouped_gemm
from ..gemm.backend import GemmCase
from ..layouts import scale_layout, padding
from ..quant import fp8_amax, fp8_rowwise, quantize, quantize_blocked
from ..core.cost import Cost
from ..core.format import BLOCK_SIZE, ScaleMode
from ..core.names import OURS, PASSES, Category, Pass, Recipe, format_shapes
from ..core.runtime import MAX_GROUPS, InputError
from .step_specs import StageImpl, StageSpec, get_spec, padding_alignment

RECIPES = tuple(Recipe)


@dataclass(frozen=True)
class Stage:
    """One kernel call of a pass: ``fn(*[env[name] for name in inputs], **params)`` returns the values of
    ``outputs`` (a tuple, in order; an output named None is discarded). ``run`` is set by ``build_step``: a
    zero-argument call of ``fn`` on pre-built tensors."""

    spec: StageSpec
    shapes: tuple[tuple[int, ...], ...]
    cost: Cost
    inputs: tuple[str, ...]
    outputs: tuple[str | None, ...]
    fn: Callable[..., tuple] = field(repr=False)
    params: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    impl: str = OURS
    kernel: str = ""
    backend: str | None = None
    run: Callable[[], object] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pass_name(self) -> Pass:
        return self.spec.pass_

    @property
    def weights_only(self) -> bool:
        """Whether the stage reads weights alone (``StageSpec.weights_only``): once per optimizer step."""
        return self.spec.weights_only

    @property
    def category(self) -> Category:
        return self.spec.category

    @property
    def purpose(self) -> str:
        return self.spec.purpose

    @property
    def recipe(self) -> Recipe:
        return self.spec.recipe

    @property
    def shape(self) -> str:
        """Display form of ``shapes``."""
        return format_shapes(self.shapes)

    def call(self, env: Mapping[str, torch.Tensor]) -> tuple:
        return self.fn(*[env[name] for name in self.inputs], **self.params)


def bind_stage(spec: StageSpec, shapes, cost, inputs, outputs, params=None, backend=None, config=None) -> Stage:
    """``spec`` as a stage of a step: its input shapes, its cost, the env names it reads and writes, its contract
    parameters and (GEMMs) its backend and launch configuration, run by mxkernels' implementation."""
    bound = {k: v for k, v in (("backend", backend), ("config", config)) if v is not None}
    fn = functools.partial(spec.impl, **bound) if bound else spec.impl
    return Stage(spec, tuple(tuple(s) for s in shapes), cost, tuple(inputs), tuple(outputs), fn,
                 MappingProxyType(dict(params or {})), OURS, spec.kernel, backend)  # fmt: skip


def _stage(recipe, name, shapes, cost, inputs, outputs, params=None, backend=None, config=None) -> Stage:
    return bind_stage(get_spec(recipe, name), shapes, cost, inputs, outputs, params, backend, config)


def _gemm_stage(recipe, name, shapes, inputs, outputs, backend, kernel_shape) -> Stage:
    """A GEMM stage of ``kernel_shape`` = (case, M, N, K, G) in the kernel's terms, its cost counted from that shape,
    run by ``backend``; None: the backend and launch of its shape's class (``grouped_gemm.choose``), named in the
    stage's record."""
    case, M, N, K, G = kernel_shape
    config = None
    if backend is None:
        picked = grouped_gemm.choose(recipe, *kernel_shape)
        backend, config = picked.backend, picked.config
    cost = grouped_gemm.grouped_mm_cost(M, N, K, G, recipe, case)
    return _stage(recipe, name, shapes, cost, inputs, outputs, backend=backend, config=config)


@dataclass(frozen=True)
class _Names:
    """Tensor names the GEMM stages of a pass read and write: the padded buffers when the step pads."""

    a: str
    dy: str
    offs: str
    out: str
    grad_a: str
    rows: int  # rows of the (possibly padded) token dim the quantizers and GEMMs see


def _assemble(recipe: Recipe, M, N, K, G, pad, gemm_passes) -> list[Stage]:
    """Wrap a recipe's three passes (``gemm_passes(names) -> (forward, backward_input, backward_weight)`` stage
    lists) in the per-group padding of A and grad_out and the unpadding of the GEMM outputs when ``pad``."""
    align = padding_alignment(recipe)
    if pad:
        names = _Names("a_p", "dy_p", "offs_p", "out_p", "grad_a_p", padding.padded_rows(M, G, align))
    else:
        names = _Names("a", "grad_out", "offs", "out", "grad_a", M)
    fwd, dgrad, wgrad = gemm_passes(names)
    if not pad:
        return fwd + dgrad + wgrad
    Mp, bf16 = names.rows, 2

    def pad_stage(name, src, dst, cols):
        return _stage(recipe, name, ((M, cols),), padding.pad_cost(M, cols, G, align, bf16), (src, "offs"),
                      (dst, "offs_p"), {"alignment": align})  # fmt: skip

    def unpad_stage(name, src, dst, cols):
        return _stage(recipe, name, ((Mp, cols),), padding.unpad_cost(M, cols, G, align, bf16),
                      (src, "offs", "offs_p"), (dst,), {"num_tokens": M})  # fmt: skip

    return [
        pad_stage("pad_a", "a", "a_p", K),
        *fwd,
        unpad_stage("unpad_out", "out_p", "out", N),
        pad_stage("pad_grad_out", "grad_out", "dy_p", N),
        *dgrad,
        unpad_stage("unpad_grad_a", "grad_a_p", "grad_a", K),
        *wgrad,
    ]


def _mxfp8_stages(M, N, K, G, mode, backend, pad, fuse_scales=False) -> list[Stage]:
    bf16, R = torch.bfloat16, Recipe.MXFP8
    Kb, Nb = K // BLOCK_SIZE, N // BLOCK_SIZE
    q2, q3 = quantize.quantize_2d_cost, quantize.quantize_3d_cost
    m_groups, k_groups = scale_layout.rearrange_m_groups_cost, scale_layout.rearrange_k_groups_cost
    blocked_3d = scale_layout.rearrange_3d_cost
    qb = quantize_blocked
    mm = grouped_gemm.grouped_mm_cost
    md = {"mode": mode}

    def scaled(pairs, gemm):
        """A pass: each (quantize stage, rearrange stage, fused stage) triple's first two, or with ``fuse_scales``
        the fused one, then the GEMM (quantizers first, rearranges after, as the unfused step always ran them)."""
        if fuse_scales:
            return [fused for _, _, fused in pairs] + [gemm]
        return [q for q, _, _ in pairs] + [r for _, r, _ in pairs] + [gemm]

    def passes(n: _Names):
        Mp, Mb, a, dy, offs = n.rows, n.rows // BLOCK_SIZE, n.a, n.dy, n.offs
        return scaled([
            (_stage(R, "quantize_a", [(Mp, K)], q2(Mp, K, bf16), (a,), ("a_q", "a_s"), md),
             _stage(R, "rearrange_a", [(Mp, Kb)], m_groups(Mp, Kb, G), ("a_s", offs), ("a_sb",)),
             _stage(R, "quantize_a_blocked", [(Mp, K)], qb.quantize_dim0_blocked_cost(Mp, K, G, bf16), (a, offs),
                    ("a_q", "a_sb"), md)),
            (_stage(R, "quantize_w", [(G, N, K)], q3(G, N, K, bf16), ("w",), ("w_q", "w_s"), md),
             _stage(R, "rearrange_w", [(G, N, Kb)], blocked_3d(G, N, Kb), ("w_s",), ("w_sb",)),
             _stage(R, "quantize_w_blocked", [(G, N, K)], qb.quantize_3d_blocked_cost(G, N, K, bf16, "K"), ("w",),
                    ("w_q", "w_sb"), md)),
        ], _stage(R, "gemm_fwd", [(Mp, K), (G, K, N)], mm(Mp, N, K, G, R, GemmCase.A2D_B3D),
                  ("a_q", "a_sb", "w_q", "w_sb", offs), (n.out,), backend=backend),
        ), scaled([
            (_stage(R, "quantize_grad_out", [(Mp, N)], q2(Mp, N, bf16), (dy,), ("dy_q", "dy_s"), md),
             _stage(R, "rearrange_grad_out", [(Mp, Nb)], m_groups(Mp, Nb, G), ("dy_s", offs), ("dy_sb",)),
             _stage(R, "quantize_grad_out_blocked", [(Mp, N)], qb.quantize_dim0_blocked_cost(Mp, N, G, bf16),
                    (dy, offs), ("dy_q", "dy_sb"), md)),
            (_stage(R, "quantize_w_t", [(G, N, K)], q3(G, N, K, bf16), ("w",), ("wt_q", "wt_s"), md),
             _stage(R, "rearrange_w_t", [(G, K, Nb)], blocked_3d(G, K, Nb), ("wt_s",), ("wt_sb",)),
             _stage(R, "quantize_w_t_blocked", [(G, N, K)], qb.quantize_3d_blocked_cost(G, N, K, bf16, "N"), ("w",),
                    ("wt_q", "wt_sb"), md)),
        ], _stage(R, "gemm_dgrad", [(Mp, N), (G, N, K)], mm(Mp, K, N, G, R, GemmCase.A2D_B3D),
                  ("dy_q", "dy_sb", "wt_q", "wt_sb", offs), (n.grad_a,), backend=backend),
        ), scaled([
            (_stage(R, "quantize_grad_out_t", [(Mp, N)], q2(Mp, N, bf16), (dy,), ("dyt_q", "dyt_s"), md),
             _stage(R, "rearrange_grad_out_t", [(N, Mb)], k_groups(N, Mp, G), ("dyt_s", offs), ("dyt_sb",)),
             _stage(R, "quantize_grad_out_t_blocked", [(Mp, N)], qb.quantize_dim1_blocked_cost(Mp, N, G, bf16),
                    (dy, offs), ("dyt_q", "dyt_sb"), md)),
            (_stage(R, "quantize_a_t", [(Mp, K)], q2(Mp, K, bf16), (a,), ("at_q", "at_s"), md),
             _stage(R, "rearrange_a_t", [(K, Mb)], k_groups(K, Mp, G), ("at_s", offs), ("at_sb",)),
             _stage(R, "quantize_a_t_blocked", [(Mp, K)], qb.quantize_dim1_blocked_cost(Mp, K, G, bf16), (a, offs),
                    ("at_q", "at_sb"), md)),
        ], _stage(R, "gemm_wgrad", [(N, Mp), (Mp, K)], mm(Mp, N, K, G, R, GemmCase.A2D_B2D),
                  ("dyt_q", "dyt_sb", "at_q", "at_sb", offs), ("grad_w",), backend=backend),
        )  # fmt: skip

    return _assemble(R, M, N, K, G, pad, passes)


def _fp8_rowwise_stages(M, N, K, G, backend, pad, fuse_scales=False) -> list[Stage]:
    bf16, R = torch.bfloat16, Recipe.FP8_ROWWISE
    rows, rows_3d, k_groups = (fp8_rowwise.quantize_fp8_rowwise_cost, fp8_rowwise.quantize_fp8_rowwise_3d_cost,
                               fp8_rowwise.quantize_fp8_rowwise_k_groups_cost)  # fmt: skip
    with_amax, from_amax = fp8_amax.with_amax_cost, fp8_amax.from_amax_cost
    if fuse_scales and max(K, N) > fp8_amax.MAX_COLS:
        raise InputError(f"fuse_scales for FP8 rowwise holds rows of up to {fp8_amax.MAX_COLS} elements whole; "
                         f"K={K}, N={N}")  # fmt: skip

    def pick(unfused: Stage, fused: Stage) -> Stage:
        """``fused`` with ``fuse_scales``: the first quantizer of a tensor also folds the column amaxes, the second
        scales from them (one read instead of two)."""
        return fused if fuse_scales else unfused

    def passes(n: _Names):
        Mp, a, dy, offs = n.rows, n.a, n.dy, n.offs
        return [
            pick(_stage(R, "quantize_a", [(Mp, K)], rows(Mp, K, bf16), (a,), ("a_q", "a_s")),
                 _stage(R, "quantize_a_amax", [(Mp, K)], with_amax(Mp, K, G, bf16), (a, offs),
                        ("a_q", "a_s", "a_amax"))),
            pick(_stage(R, "quantize_w", [(G, N, K)], rows_3d(G, N, K, bf16, "K"), ("w",), ("w_q", "w_s")),
                 _stage(R, "quantize_w_amax", [(G, N, K)], with_amax(G * N, K, G, bf16), ("w",),
                        ("w_q", "w_s", "w_amax"))),
            _gemm_stage(R, "gemm_fwd", [(Mp, K), (G, K, N)], ("a_q", "a_s", "w_q", "w_s", offs), (n.out,), backend,
                        (GemmCase.A2D_B3D, Mp, N, K, G)),
        ], [
            pick(_stage(R, "quantize_grad_out", [(Mp, N)], rows(Mp, N, bf16), (dy,), ("dy_q", "dy_s")),
                 _stage(R, "quantize_grad_out_amax", [(Mp, N)], with_amax(Mp, N, G, bf16), (dy, offs),
                        ("dy_q", "dy_s", "dy_amax"))),
            pick(_stage(R, "quantize_w_t", [(G, N, K)], rows_3d(G, N, K, bf16, "N"), ("w",), ("wt_q", "wt_s")),
                 _stage(R, "quantize_w_t_from_amax", [(G, N, K)], from_amax(G * N, K, G, bf16), ("w", "w_amax"),
                        ("wt_q", "wt_s"))),
            _gemm_stage(R, "gemm_dgrad", [(Mp, N), (G, N, K)], ("dy_q", "dy_s", "wt_q", "wt_s", offs), (n.grad_a,),
                        backend, (GemmCase.A2D_B3D, Mp, K, N, G)),
        ], [
            pick(_stage(R, "quantize_grad_out_t", [(Mp, N)], k_groups(Mp, N, G, bf16), (dy, offs), ("dyt_q", "dyt_s")),
                 _stage(R, "quantize_grad_out_t_from_amax", [(Mp, N)], from_amax(Mp, N, G, bf16),
                        (dy, "dy_amax", offs), ("dyt_q", "dyt_s"))),
            pick(_stage(R, "quantize_a_t", [(Mp, K)], k_groups(Mp, K, G, bf16), (a, offs), ("at_q", "at_s")),
                 _stage(R, "quantize_a_t_from_amax", [(Mp, K)], from_amax(Mp, K, G, bf16), (a, "a_amax", offs),
                        ("at_q", "at_s"))),
            _gemm_stage(R, "gemm_wgrad", [(N, Mp), (Mp, K)], ("dyt_q", "dyt_s", "at_q", "at_s", offs), ("grad_w",),
                        backend, (GemmCase.A2D_B2D, Mp, N, K, G)),
        ]  # fmt: skip

    return _assemble(R, M, N, K, G, pad, passes)


def _bf16_stages(M, N, K, G, pad) -> list[Stage]:
    R, mm = Recipe.BF16, grouped_gemm.grouped_mm_cost

    def passes(n: _Names):
        Mp = n.rows
        return [
            _stage(R, "gemm_fwd", [(Mp, K), (G, K, N)], mm(Mp, N, K, G, R, GemmCase.A2D_B3D), (n.a, "w", n.offs),
                   (n.out,), backend=None),
        ], [
            _stage(R, "gemm_dgrad", [(Mp, N), (G, N, K)], mm(Mp, K, N, G, R, GemmCase.A2D_B3D), (n.dy, "w", n.offs),
                   (n.grad_a,)),
        ], [
            _stage(R, "gemm_wgrad", [(N, Mp), (Mp, K)], mm(Mp, N, K, G, R, GemmCase.A2D_B2D), (n.dy, n.a, n.offs),
                   ("grad_w",)),
        ]  # fmt: skip

    stages = _assemble(R, M, N, K, G, pad, passes)
    # torch._grouped_mm is this recipe's only GEMM and has no backend choice: name it in the records.
    return [replace(s, backend="bf16") if s.category == Category.GEMM else s for s in stages]


def check_recipe(recipe: object) -> Recipe:
    try:
        return Recipe(recipe)
    except ValueError:
        raise InputError(f"recipe must be one of {', '.join(RECIPES)}; got {recipe!r}") from None


def check_sizes(sizes: Mapping[str, object], groups: tuple[str, object], blocked: Sequence[str] = ("K", "N")) -> None:
    """The sizes every workload's problem shares, named as its user knows them: each of ``sizes`` a positive int,
    those named in ``blocked`` (the MX-blocked widths) multiples of ``BLOCK_SIZE``, and ``groups`` = (name, expert
    count) between 1 and ``MAX_GROUPS``."""
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    for name in blocked:
        if sizes[name] % BLOCK_SIZE:
            raise InputError(f"{name} must be a multiple of {BLOCK_SIZE}, got {sizes[name]}")
    name, count = groups
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_GROUPS:
        raise InputError(f"{name} must be between 1 and {MAX_GROUPS}, got {count!r}")


def _check_problem(recipe: str, M: int, N: int, K: int, G: int) -> Recipe:
    recipe = check_recipe(recipe)
    check_sizes({"M": M, "N": N, "K": K}, ("G", G))
    return recipe


def with_impls(stages: Sequence[Stage], impls: Mapping[str, StageImpl] | None) -> list[Stage]:
    """``stages`` with the stages named in ``impls`` run by that implementation (its ``fn``, under its ``name``
    and ``kernel``) instead of mxkernels'. Every name must be one of the stages."""
    if not impls:
        return list(stages)
    names = {s.name for s in stages}
    unknown = sorted(set(impls) - names)
    if unknown:
        raise InputError(f"no stage {', '.join(unknown)} in this step; its stages: {', '.join(s.name for s in stages)}")
    return [
        replace(s, fn=impls[s.name].fn, impl=impls[s.name].name, kernel=impls[s.name].kernel, backend=None)
        if s.name in impls else s
        for s in stages
    ]  # fmt: skip


def step_stages(
    recipe: str,
    M: int,
    N: int,
    K: int,
    G: int,
    *,
    mode="rceil",
    backend: str | None = None,
    pad: bool = False,
    impls: Mapping[str, StageImpl] | None = None,
    fuse_scales: bool = False,
) -> list[Stage]:
    """Every stage of forward, backward_input and backward_weight, in execution order.

    ``pad``: the token groups are not all multiples of the recipe's alignment, so A and grad_out are padded per
    group first (into a buffer sized by the upper bound, no host sync) and the GEMM outputs unpadded.
    ``impls``: stage name -> implementation to run instead of mxkernels' (see ``with_impls``).
    ``fuse_scales``: MXFP8 quantizes with the fused-scale quantizers (``quantize_*_blocked``), which write the
    blocked scales the GEMMs read, instead of quantize then rearrange: six stages fewer. FP8 rowwise quantizes each
    tensor's first copy with ``fp8_amax``'s quantizers that also fold the column amaxes its second (transposed)
    copy is scaled by, and the second from them: one read of the tensor fewer each. No effect on bf16.
    """
    recipe = _check_problem(recipe, M, N, K, G)
    mode = ScaleMode.parse(mode).value
    if not isinstance(fuse_scales, bool):
        raise InputError(f"fuse_scales must be a bool, got {fuse_scales!r}")
    if recipe == Recipe.MXFP8:
        stages = _mxfp8_stages(M, N, K, G, mode, backend or grouped_gemm.default_backend("mxfp8"), pad, fuse_scales)
    elif recipe == Recipe.FP8_ROWWISE:
        stages = _fp8_rowwise_stages(M, N, K, G, backend, pad, fuse_scales)  # None: each GEMM's shape class
    else:
        stages = _bf16_stages(M, N, K, G, pad)
    return with_impls(stages, impls)


def needs_padding(recipe: str, group_sizes: Sequence[int]) -> bool:
    return any(s % padding_alignment(check_recipe(recipe)) for s in group_sizes)


def plan_step(
    recipe: str,
    M: int,
    N: int,
    K: int,
    G: int,
    group_sizes: Sequence[int],
    *,
    mode="rceil",
    backend=None,
    impls=None,
    fuse_scales: bool = False,
) -> list[Stage]:
    """The stages of one training step for these shapes and group sizes: names, shapes and costs, no tensors.
    ``fuse_scales``: see ``step_stages``."""
    _check_problem(recipe, M, N, K, G)
    if len(group_sizes) != G or sum(group_sizes) != M or min(group_sizes) < 0:
        raise InputError(f"group_sizes must be {G} non-negative sizes summing to M={M}")
    return step_stages(recipe, M, N, K, G, mode=mode, backend=backend, pad=needs_padding(recipe, group_sizes),
                       impls=impls, fuse_scales=fuse_scales)  # fmt: skip


def group_ends(group_sizes: Sequence[int], device="cpu") -> torch.Tensor:
    """int32 (G,) cumulative group ends of ``group_sizes``."""
    return torch.tensor(list(_cumsum(group_sizes)), dtype=torch.int32, device=device)


def make_inputs(M, N, K, G, group_sizes, *, device="cuda", seed=0) -> dict[str, torch.Tensor]:
    """Random bf16 a (M, K), w (G, N, K), grad_out (M, N) and int32 offs, scaled like a real layer's tensors."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=torch.bfloat16)

    offs = group_ends(group_sizes, device)
    return {"a": randn(M, K), "w": randn(G, N, K, scale=K**-0.5), "grad_out": randn(M, N, scale=1e-2), "offs": offs}


def _cumsum(sizes):
    total = 0
    for s in sizes:
        total += s
        yield total


def split_passes(stages: Sequence[Stage]) -> tuple[list[Stage], list[Stage]]:
    """(forward stages, backward stages) of a step, each in execution order: what an autograd function runs in its
    forward and its backward (the EP projection's and the MoE layer's)."""
    forward = [s for s in stages if s.pass_name == Pass.FORWARD]
    return forward, [s for s in stages if s.pass_name != Pass.FORWARD]


def run_stages(stages: Sequence[Stage], env: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run ``stages`` in order on the named tensors in ``env`` (updated in place and returned)."""
    for stage in stages:
        values = stage.call(env)
        for name, value in zip(stage.outputs, values, strict=True):
            if name is not None:
                env[name] = value
    return env


def build_step(
    recipe, M, N, K, G, group_sizes, *, mode="rceil", backend=None, device="cuda", seed=0, impls=None, fuse_scales=False
) -> list[Stage]:
    """``plan_step`` with every stage bound to tensors on ``device``: ``stage.run()`` calls its kernel alone.

    The inputs of each stage are the outputs of one eager run of the whole step, so every stage sees real data.
    """
    stages = plan_step(recipe, M, N, K, G, group_sizes, mode=mode, backend=backend, impls=impls,
                       fuse_scales=fuse_scales)  # fmt: skip
    env = run_stages(stages, make_inputs(M, N, K, G, group_sizes, device=device, seed=seed))
    return [replace(s, run=_bind(s, env)) for s in stages]


@dataclass(frozen=True)
class BoundCall:
    """A stage's call on fixed tensors, ``fn(*args, **params)``; ``args`` are its input buffers (a harness writes
    other values into them between timed calls, to see that the outputs follow the inputs)."""

    fn: Callable[..., tuple]
    args: tuple
    params: Mapping[str, object]

    def __call__(self) -> tuple:
        return self.fn(*self.args, **self.params)


def _bind(stage: Stage, env: dict[str, torch.Tensor]) -> BoundCall:
    return BoundCall(stage.fn, tuple(env[name] for name in stage.inputs), MappingProxyType(dict(stage.params)))


__all__ = [
    "OURS", "PASSES", "RECIPES", "BoundCall", "Stage", "bind_stage", "build_step", "check_recipe", "group_ends", "make_inputs",
    "needs_padding", "plan_step", "run_stages", "split_passes", "step_stages", "with_impls",
]  # fmt: skip
