"""The three passes of a grouped-GEMM MoE layer as ordered stages, and the autograd function that runs them.

``out = a @ b_t`` per token group, with a (M, K) bf16 activations, b_t (G, K, N) expert weights (usually a
transposed view of w (G, N, K)), and offs int32 (G,) cumulative group ends. For each recipe the step is:

* forward           out (M, N)      = a @ w^T            (2D x 3D)
* backward_input    grad_a (M, K)   = grad_out @ w       (2D x 3D)
* backward_weight   grad_w (G, N, K) = grad_out^T @ a    (2D x 2D; groups split the contraction dim M)

A ``Stage`` is one kernel call of a pass: its name, category, input shape, its own ``Cost`` (declared by the kernel
module that owns the call), and a function over named tensors. The same stage lists serve three users:
``plan_step`` (costs only, no tensors: the analytic model), ``build_step`` (each stage bound to real tensors so the
harness can time it alone) and ``StagedGroupedMM`` (the autograd function a model runs). So what is benchmarked is
exactly what a training step runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from . import fp8_rowwise, grouped_gemm, layouts, padding, quantize
from .cost import Cost
from .format import BLOCK_SIZE, ScaleMode
from .runtime import MAX_GROUPS

PASSES = ("forward", "backward_input", "backward_weight")
RECIPES = grouped_gemm.RECIPES
# Token-group alignment each recipe's backward-weight GEMM needs: an MX block must not straddle two experts; FP8
# rowwise and bf16 need 16-byte-aligned contraction groups (TMA).
ALIGNMENT = {"mxfp8": 32, "fp8_rowwise": 16, "bf16": 16}


@dataclass
class Stage:
    """One kernel call of a pass.

    ``fn(*[env[name] for name in inputs])`` returns the values of ``outputs`` (a tuple, in order; an output named
    None is discarded). ``run`` is set by ``build_step``: a zero-argument call of ``fn`` on pre-built tensors.
    """

    pass_name: str
    name: str
    kernel: str
    category: str  # "quantize" | "rearrange" | "pad" | "gemm"
    purpose: str
    shape: str
    cost: Cost
    backend: str | None = None
    inputs: tuple[str, ...] = ()
    outputs: tuple[str | None, ...] = ()
    fn: Callable[..., tuple] | None = field(default=None, repr=False)
    run: Callable[[], object] | None = field(default=None, repr=False)


def _shape(*dims: int) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


@dataclass(frozen=True)
class _Names:
    """Tensor names the GEMM stages of a pass read and write: the padded buffers when the step pads."""

    a: str
    dy: str
    offs: str
    out: str
    grad_a: str
    rows: int  # rows of the (possibly padded) token dim the quantizers and GEMMs see


def _pad_stage(pass_name, src, dst, rows, cols, G, align, what) -> Stage:
    return Stage(
        pass_name, f"pad_{src}", "pad_token_groups", "pad", f"Pad {what} token groups to multiples of {align}",
        _shape(rows, cols), padding.pad_cost(rows, cols, G, align, 2),
        inputs=(src, "offs"), outputs=(dst, "offs_p"),
        fn=lambda x, offs: padding.pad_token_groups(x, offs, alignment=align),
    )  # fmt: skip


def _unpad_stage(pass_name, src, dst, rows, cols, padded_rows, G, align, what) -> Stage:
    return Stage(
        pass_name, f"unpad_{dst}", "unpad_token_groups", "pad", f"Unpad {what}",
        _shape(padded_rows, cols), padding.unpad_cost(rows, cols, G, align, 2),
        inputs=(src, "offs", "offs_p"), outputs=(dst,),
        fn=lambda x, offs, offs_p: (padding.unpad_token_groups(x, offs, offs_p, rows),),
    )  # fmt: skip


def _assemble(recipe, M, N, K, G, pad, gemm_passes) -> list[Stage]:
    """Wrap a recipe's three passes (``gemm_passes(names) -> (forward, backward_input, backward_weight)`` stage
    lists) in the per-group padding of A and grad_out and the unpadding of the GEMM outputs when ``pad``."""
    align = ALIGNMENT[recipe]
    if pad:
        names = _Names("a_p", "dy_p", "offs_p", "out_p", "grad_a_p", padding.padded_rows(M, G, align))
    else:
        names = _Names("a", "grad_out", "offs", "out", "grad_a", M)
    fwd, dgrad, wgrad = gemm_passes(names)
    if not pad:
        return fwd + dgrad + wgrad
    Mp = names.rows
    return [
        _pad_stage("forward", "a", "a_p", M, K, G, align, "A"),
        *fwd,
        _unpad_stage("forward", "out_p", "out", M, N, Mp, G, align, "the output"),
        _pad_stage("backward_input", "grad_out", "dy_p", M, N, G, align, "grad_out"),
        *dgrad,
        _unpad_stage("backward_input", "grad_a_p", "grad_a", M, K, Mp, G, align, "grad_a"),
        *wgrad,
    ]


def _mxfp8_stages(M, N, K, G, mode, backend, pad) -> list[Stage]:
    bf16 = torch.bfloat16
    q0 = lambda x: quantize.quantize_dim0(x, mode)  # noqa: E731
    q1 = lambda x: quantize.quantize_dim1(x, mode)  # noqa: E731
    mm = lambda aq, asb, bq, bsb, o: (grouped_gemm.mxfp8_scaled_grouped_mm(aq, asb, bq, bsb, o, backend=backend),)  # noqa: E731
    m_groups = lambda s, o: (layouts.rearrange_m_groups(s, o),)  # noqa: E731
    k_groups = lambda s, o: (layouts.rearrange_k_groups(s, o),)  # noqa: E731
    blocked_3d = lambda s: (layouts.rearrange_3d(s),)  # noqa: E731
    Kb, Nb = K // BLOCK_SIZE, N // BLOCK_SIZE
    S = Stage
    fwd, dgrad, wgrad = PASSES

    def passes(n: _Names):
        Mp, Mb, a, dy, offs = n.rows, n.rows // BLOCK_SIZE, n.a, n.dy, n.offs
        return [
            S(fwd, "quantize_a", "quantize_dim0", "quantize", "Quantize A (activations) along K", _shape(Mp, K),
              quantize.quantize_2d_cost(Mp, K, bf16), inputs=(a,), outputs=("a_q", "a_s"), fn=q0),
            S(fwd, "quantize_w", "quantize_3d(along=K)", "quantize", "Quantize B (weights) along K",
              _shape(G, N, K), quantize.quantize_3d_cost(G, N, K, bf16), inputs=("w",), outputs=("w_q", "w_s"),
              fn=lambda w: quantize.quantize_3d(w, along="K", mode=mode)),
            S(fwd, "rearrange_a", "rearrange_m_groups", "rearrange", "Convert A scales to blocked layout",
              _shape(Mp, Kb), layouts.rearrange_m_groups_cost(Mp, Kb, G), inputs=("a_s", offs), outputs=("a_sb",),
              fn=m_groups),
            S(fwd, "rearrange_w", "rearrange_3d", "rearrange", "Convert B scales to blocked layout",
              _shape(G, N, Kb), layouts.rearrange_3d_cost(G, N, Kb), inputs=("w_s",), outputs=("w_sb",),
              fn=blocked_3d),
            S(fwd, "gemm", "mxfp8_grouped_mm", "gemm", "2D x 3D scaled grouped GEMM",
              f"{_shape(Mp, K)} @ {_shape(G, K, N)}", grouped_gemm.grouped_mm_cost(Mp, N, K, G, "mxfp8", "2d3d"),
              backend, inputs=("a_q", "a_sb", "w_q", "w_sb", offs), outputs=(n.out,), fn=mm),
        ], [
            S(dgrad, "quantize_grad_out", "quantize_dim0", "quantize", "Quantize grad_out along N", _shape(Mp, N),
              quantize.quantize_2d_cost(Mp, N, bf16), inputs=(dy,), outputs=("dy_q", "dy_s"), fn=q0),
            S(dgrad, "quantize_w_t", "quantize_3d(along=N)", "quantize", "Quantize B (weights) along N",
              _shape(G, N, K), quantize.quantize_3d_cost(G, N, K, bf16), inputs=("w",), outputs=("wt_q", "wt_s"),
              fn=lambda w: quantize.quantize_3d(w, along="N", mode=mode)),
            S(dgrad, "rearrange_grad_out", "rearrange_m_groups", "rearrange",
              "Convert grad_out scales to blocked layout", _shape(Mp, Nb), layouts.rearrange_m_groups_cost(Mp, Nb, G),
              inputs=("dy_s", offs), outputs=("dy_sb",), fn=m_groups),
            S(dgrad, "rearrange_w_t", "rearrange_3d", "rearrange", "Convert B scales to blocked layout",
              _shape(G, K, Nb), layouts.rearrange_3d_cost(G, K, Nb), inputs=("wt_s",), outputs=("wt_sb",),
              fn=blocked_3d),
            S(dgrad, "gemm", "mxfp8_grouped_mm", "gemm", "2D x 3D scaled grouped GEMM",
              f"{_shape(Mp, N)} @ {_shape(G, N, K)}", grouped_gemm.grouped_mm_cost(Mp, K, N, G, "mxfp8", "2d3d"),
              backend, inputs=("dy_q", "dy_sb", "wt_q", "wt_sb", offs), outputs=(n.grad_a,), fn=mm),
        ], [
            S(wgrad, "quantize_grad_out_t", "quantize_dim1", "quantize",
              "Quantize grad_out along M (output transposed)", _shape(Mp, N), quantize.quantize_2d_cost(Mp, N, bf16),
              inputs=(dy,), outputs=("dyt_q", "dyt_s"), fn=q1),
            S(wgrad, "quantize_a_t", "quantize_dim1", "quantize", "Quantize A along M (output transposed)",
              _shape(Mp, K), quantize.quantize_2d_cost(Mp, K, bf16), inputs=(a,), outputs=("at_q", "at_s"), fn=q1),
            S(wgrad, "rearrange_grad_out_t", "rearrange_k_groups", "rearrange",
              "Convert grad_out_t scales to blocked layout", _shape(N, Mb),
              layouts.rearrange_k_groups_cost(N, Mp, G), inputs=("dyt_s", offs), outputs=("dyt_sb",), fn=k_groups),
            S(wgrad, "rearrange_a_t", "rearrange_k_groups", "rearrange", "Convert A_t scales to blocked layout",
              _shape(K, Mb), layouts.rearrange_k_groups_cost(K, Mp, G), inputs=("at_s", offs),
              outputs=("at_sb",), fn=k_groups),
            S(wgrad, "gemm", "mxfp8_grouped_mm", "gemm", "2D x 2D scaled grouped GEMM",
              f"{_shape(N, Mp)} @ {_shape(Mp, K)}", grouped_gemm.grouped_mm_cost(Mp, N, K, G, "mxfp8", "2d2d"),
              backend, inputs=("dyt_q", "dyt_sb", "at_q", "at_sb", offs), outputs=("grad_w",), fn=mm),
        ]  # fmt: skip

    return _assemble("mxfp8", M, N, K, G, pad, passes)


def _fp8_rowwise_stages(M, N, K, G, backend, pad) -> list[Stage]:
    bf16 = torch.bfloat16
    rowwise = lambda x: fp8_rowwise.quantize_fp8_rowwise(x)  # noqa: E731
    k_groups = lambda x, o: fp8_rowwise.quantize_fp8_rowwise_k_groups(x, o)  # noqa: E731
    mm = lambda aq, a_s, bq, b_s, o: (grouped_gemm.fp8_rowwise_scaled_grouped_mm(aq, a_s, bq, b_s, o, backend=backend),)  # noqa: E731
    S = Stage
    fwd, dgrad, wgrad = PASSES
    kernel, cost_3d = "quantize_fp8_rowwise", fp8_rowwise.quantize_fp8_rowwise_3d_cost

    def passes(n: _Names):
        Mp, a, dy, offs = n.rows, n.a, n.dy, n.offs
        return [
            S(fwd, "quantize_a", kernel, "quantize", "Quantize A rowwise along K", _shape(Mp, K),
              fp8_rowwise.quantize_fp8_rowwise_cost(Mp, K, bf16), inputs=(a,), outputs=("a_q", "a_s"), fn=rowwise),
            S(fwd, "quantize_w", f"{kernel}_3d(along=K)", "quantize", "Quantize B rowwise along K",
              _shape(G, N, K), cost_3d(G, N, K, bf16, "K"), inputs=("w",), outputs=("w_q", "w_s"),
              fn=lambda w: fp8_rowwise.quantize_fp8_rowwise_3d(w, along="K")),
            S(fwd, "gemm", "fp8_rowwise_grouped_mm", "gemm", "2D x 3D FP8 rowwise grouped GEMM",
              f"{_shape(Mp, K)} @ {_shape(G, K, N)}",
              grouped_gemm.grouped_mm_cost(Mp, N, K, G, "fp8_rowwise", "2d3d"), backend,
              inputs=("a_q", "a_s", "w_q", "w_s", offs), outputs=(n.out,), fn=mm),
        ], [
            S(dgrad, "quantize_grad_out", kernel, "quantize", "Quantize grad_out rowwise along N", _shape(Mp, N),
              fp8_rowwise.quantize_fp8_rowwise_cost(Mp, N, bf16), inputs=(dy,), outputs=("dy_q", "dy_s"),
              fn=rowwise),
            S(dgrad, "quantize_w_t", f"{kernel}_3d(along=N)", "quantize", "Quantize B rowwise along N",
              _shape(G, N, K), cost_3d(G, N, K, bf16, "N"), inputs=("w",), outputs=("wt_q", "wt_s"),
              fn=lambda w: fp8_rowwise.quantize_fp8_rowwise_3d(w, along="N")),
            S(dgrad, "gemm", "fp8_rowwise_grouped_mm", "gemm", "2D x 3D FP8 rowwise grouped GEMM",
              f"{_shape(Mp, N)} @ {_shape(G, N, K)}",
              grouped_gemm.grouped_mm_cost(Mp, K, N, G, "fp8_rowwise", "2d3d"), backend,
              inputs=("dy_q", "dy_s", "wt_q", "wt_s", offs), outputs=(n.grad_a,), fn=mm),
        ], [
            S(wgrad, "quantize_grad_out_t", f"{kernel}_k_groups", "quantize",
              "Quantize grad_out per group along M (output transposed)", _shape(Mp, N),
              fp8_rowwise.quantize_fp8_rowwise_k_groups_cost(Mp, N, G, bf16), inputs=(dy, offs),
              outputs=("dyt_q", "dyt_s"), fn=k_groups),
            S(wgrad, "quantize_a_t", f"{kernel}_k_groups", "quantize",
              "Quantize A per group along M (output transposed)", _shape(Mp, K),
              fp8_rowwise.quantize_fp8_rowwise_k_groups_cost(Mp, K, G, bf16), inputs=(a, offs),
              outputs=("at_q", "at_s"), fn=k_groups),
            S(wgrad, "gemm", "fp8_rowwise_grouped_mm", "gemm", "2D x 2D FP8 rowwise grouped GEMM",
              f"{_shape(N, Mp)} @ {_shape(Mp, K)}",
              grouped_gemm.grouped_mm_cost(Mp, N, K, G, "fp8_rowwise", "2d2d"), backend,
              inputs=("dyt_q", "dyt_s", "at_q", "at_s", offs), outputs=("grad_w",), fn=mm),
        ]  # fmt: skip

    return _assemble("fp8_rowwise", M, N, K, G, pad, passes)


def _bf16_stages(M, N, K, G, pad) -> list[Stage]:
    fwd, dgrad, wgrad = PASSES

    def mm(x, y, o):
        return (grouped_gemm.grouped_mm(x, y, o, recipe="bf16").out,)

    def passes(n: _Names):
        Mp = n.rows
        return [
            Stage(fwd, "gemm", "torch._grouped_mm", "gemm", "2D x 3D bf16 grouped GEMM",
                  f"{_shape(Mp, K)} @ {_shape(G, K, N)}", grouped_gemm.grouped_mm_cost(Mp, N, K, G, "bf16", "2d3d"),
                  "bf16", inputs=(n.a, "w", n.offs), outputs=(n.out,),
                  fn=lambda x, w, o: mm(x, w.transpose(-2, -1), o)),
        ], [
            Stage(dgrad, "gemm", "torch._grouped_mm", "gemm", "2D x 3D bf16 grouped GEMM",
                  f"{_shape(Mp, N)} @ {_shape(G, N, K)}", grouped_gemm.grouped_mm_cost(Mp, K, N, G, "bf16", "2d3d"),
                  "bf16", inputs=(n.dy, "w", n.offs), outputs=(n.grad_a,), fn=mm),
        ], [
            Stage(wgrad, "gemm", "torch._grouped_mm", "gemm", "2D x 2D bf16 grouped GEMM",
                  f"{_shape(N, Mp)} @ {_shape(Mp, K)}", grouped_gemm.grouped_mm_cost(Mp, N, K, G, "bf16", "2d2d"),
                  "bf16", inputs=(n.dy, n.a, n.offs), outputs=("grad_w",), fn=lambda y, x, o: mm(y.t(), x, o)),
        ]  # fmt: skip

    return _assemble("bf16", M, N, K, G, pad, passes)


def _check_problem(recipe: str, M: int, N: int, K: int, G: int) -> None:
    grouped_gemm.check_recipe(recipe)
    for name, value in (("M", M), ("N", N), ("K", K)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    for name, value in (("N", N), ("K", K)):
        if value % BLOCK_SIZE:
            raise ValueError(f"{name} must be a multiple of {BLOCK_SIZE}, got {value}")
    if not 1 <= G <= MAX_GROUPS:
        raise ValueError(f"G must be between 1 and {MAX_GROUPS}, got {G}")


def step_stages(
    recipe: str, M: int, N: int, K: int, G: int, *, mode="rceil", backend: str | None = None, pad: bool = False
) -> list[Stage]:
    """Every stage of forward, backward_input and backward_weight, in execution order.

    ``pad``: the token groups are not all multiples of the recipe's alignment, so A and grad_out are padded per
    group first (into a buffer sized by the upper bound, no host sync) and the GEMM outputs unpadded.
    """
    _check_problem(recipe, M, N, K, G)
    mode = ScaleMode.parse(mode).value
    if recipe == "mxfp8":
        return _mxfp8_stages(M, N, K, G, mode, backend or grouped_gemm.default_backend("mxfp8"), pad)
    if recipe == "fp8_rowwise":
        return _fp8_rowwise_stages(M, N, K, G, backend or grouped_gemm.default_backend("fp8_rowwise"), pad)
    return _bf16_stages(M, N, K, G, pad)


def needs_padding(recipe: str, group_sizes: Sequence[int]) -> bool:
    return any(s % ALIGNMENT[grouped_gemm.check_recipe(recipe)] for s in group_sizes)


def plan_step(
    recipe: str, M: int, N: int, K: int, G: int, group_sizes: Sequence[int], *, mode="rceil", backend=None
) -> list[Stage]:
    """The stages of one training step for these shapes and group sizes: names, shapes and costs, no tensors."""
    _check_problem(recipe, M, N, K, G)
    if len(group_sizes) != G or sum(group_sizes) != M or min(group_sizes) < 0:
        raise ValueError(f"group_sizes must be {G} non-negative sizes summing to M={M}")
    return step_stages(recipe, M, N, K, G, mode=mode, backend=backend, pad=needs_padding(recipe, group_sizes))


def make_inputs(M, N, K, G, group_sizes, *, device="cuda", seed=0) -> dict[str, torch.Tensor]:
    """Random bf16 a (M, K), w (G, N, K), grad_out (M, N) and int32 offs, scaled like a real layer's tensors."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=torch.bfloat16)

    offs = torch.tensor(list(_cumsum(group_sizes)), dtype=torch.int32, device=device)
    return {"a": randn(M, K), "w": randn(G, N, K, scale=K**-0.5), "grad_out": randn(M, N, scale=1e-2), "offs": offs}


def _cumsum(sizes):
    total = 0
    for s in sizes:
        total += s
        yield total


def run_stages(stages: Sequence[Stage], env: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Run ``stages`` in order on the named tensors in ``env`` (updated in place and returned)."""
    for stage in stages:
        values = stage.fn(*[env[name] for name in stage.inputs])
        for name, value in zip(stage.outputs, values, strict=True):
            if name is not None:
                env[name] = value
    return env


def build_step(recipe, M, N, K, G, group_sizes, *, mode="rceil", backend=None, device="cuda", seed=0) -> list[Stage]:
    """``plan_step`` with every stage bound to tensors on ``device``: ``stage.run()`` calls its kernel alone.

    The inputs of each stage are the outputs of one eager run of the whole step, so every stage sees real data.
    """
    stages = plan_step(recipe, M, N, K, G, group_sizes, mode=mode, backend=backend)
    env = run_stages(stages, make_inputs(M, N, K, G, group_sizes, device=device, seed=seed))
    return [replace(s, run=_bind(s, env)) for s in stages]


def _bind(stage: Stage, env: dict[str, torch.Tensor]) -> Callable[[], object]:
    args = [env[name] for name in stage.inputs]
    return lambda: stage.fn(*args)


class StagedGroupedMM(torch.autograd.Function):
    """Forward runs the ``forward`` stages; backward runs ``backward_input`` then ``backward_weight``."""

    @staticmethod
    def forward(ctx, a, b_t, offs, recipe, mode, backend, pad):
        G, K, N = b_t.shape
        stages = step_stages(recipe, a.shape[0], N, K, G, mode=mode, backend=backend, pad=pad)
        by_pass = {p: [s for s in stages if s.pass_name == p] for p in PASSES}
        # w (G, N, K) with K contiguous: free when b_t is the usual transposed view of contiguous weights.
        w = b_t.transpose(-2, -1).contiguous()
        env = run_stages(by_pass["forward"], {"a": a, "w": w, "offs": offs})
        backward = by_pass["backward_input"] + by_pass["backward_weight"]
        produced = {o for s in backward for o in s.outputs} | {"grad_out"}
        ctx.keys = sorted({i for s in backward for i in s.inputs} - produced)
        ctx.save_for_backward(*[env[k] for k in ctx.keys])
        ctx.backward_stages = backward
        return env["out"]

    @staticmethod
    def backward(ctx, grad_out):
        env = dict(zip(ctx.keys, ctx.saved_tensors, strict=True))
        env["grad_out"] = grad_out.contiguous()
        run_stages(ctx.backward_stages, env)
        return env["grad_a"], env["grad_w"].transpose(-2, -1), None, None, None, None, None


def _staged(recipe: str, a, b_t, offs, *, mode="rceil", backend=None, pad: bool = True) -> torch.Tensor:
    if a.dim() != 2 or b_t.dim() != 3 or a.shape[1] != b_t.shape[1]:
        raise ValueError(f"a (M, K) and b_t (G, K, N) must agree on K; got {tuple(a.shape)} and {tuple(b_t.shape)}")
    if offs.dim() != 1 or offs.shape[0] != b_t.shape[0]:
        raise ValueError(f"offs must hold one group end per expert ({b_t.shape[0]}), got shape {tuple(offs.shape)}")
    return StagedGroupedMM.apply(a, b_t, offs, recipe, mode, backend, pad)


def mxfp8_grouped_mm(a, b_t, offs, mode="rceil", *, backend=None, pad: bool = True) -> torch.Tensor:
    """Drop-in for ``torch._grouped_mm(a, b_t, offs=offs)`` that runs the forward and both backward GEMMs in MXFP8.

    a (M, K) bf16 row-major; b_t (G, K, N) bf16, ideally a transposed view of contiguous weights (G, N, K);
    offs int32 (G,) cumulative group ends. Returns (M, N) bf16. ``pad=True`` (default) pads the token groups to
    multiples of 32 itself, which any router's group sizes need; pass ``pad=False`` only when every group is
    already a multiple of 32 (saves two copies per pass).
    """
    return _staged("mxfp8", a, b_t, offs, mode=mode, backend=backend, pad=pad)


def fp8_rowwise_grouped_mm(a, b_t, offs, *, pad: bool = True) -> torch.Tensor:
    """The FP8 rowwise sibling of ``mxfp8_grouped_mm`` (groups padded to multiples of 16)."""
    return _staged("fp8_rowwise", a, b_t, offs, pad=pad)


def bf16_grouped_mm(a, b_t, offs, *, pad: bool = True) -> torch.Tensor:
    """The bf16 baseline through the same stage machinery (``torch._grouped_mm`` for every GEMM)."""
    return _staged("bf16", a, b_t, offs, pad=pad)


_AUTOGRAD = {"mxfp8": mxfp8_grouped_mm, "fp8_rowwise": fp8_rowwise_grouped_mm, "bf16": bf16_grouped_mm}


def end_to_end(
    recipe, M, N, K, G, group_sizes, *, mode="rceil", backend=None, device="cuda", seed=0
) -> Callable[[], object]:
    """A zero-argument call running one forward + backward of the recipe's autograd function on fixed inputs."""
    grouped_gemm.check_recipe(recipe)
    t = make_inputs(M, N, K, G, group_sizes, device=device, seed=seed)
    a = t["a"].requires_grad_()
    b_t = t["w"].transpose(-2, -1).requires_grad_()
    pad = needs_padding(recipe, group_sizes)
    kwargs = {"mode": mode, "backend": backend} if recipe == "mxfp8" else {}
    op = _AUTOGRAD[recipe]

    def step():
        out = op(a, b_t, t["offs"], pad=pad, **kwargs)
        return torch.autograd.grad(out, (a, b_t), t["grad_out"])

    return step
