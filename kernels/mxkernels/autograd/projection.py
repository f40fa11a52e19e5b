"""Drop-ins for ``torch._grouped_mm(a, b_t, offs=offs)`` with autograd, built from the pipeline's stage lists.

``StagedGroupedMM`` runs the forward stages in its forward and the backward_input then backward_weight stages in
its backward, so a model runs exactly the kernels the harness times. ``impls`` (stage name -> implementation with
the stage's calling contract, see ``stages.py``) runs another implementation of any stage in the whole step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..core.names import PASSES, Pass
from ..stages.pipeline import check_recipe, make_inputs, needs_padding, run_stages, step_stages
from ..core.runtime import InputError
from ..stages.step_specs import StageImpl


def save_for_stages(ctx, env: Mapping[str, torch.Tensor], backward_stages, grad_name: str) -> None:
    """Keep on ``ctx`` what ``backward_stages`` read and do not make themselves (``grad_name``, the incoming
    gradient, arrives with the backward), and the stages."""
    produced = {o for s in backward_stages for o in s.outputs} | {grad_name}
    ctx.keys = sorted({i for s in backward_stages for i in s.inputs} - produced)
    ctx.save_for_backward(*[env[k] for k in ctx.keys])
    ctx.backward_stages, ctx.grad_name = backward_stages, grad_name


def run_saved_stages(ctx, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """The backward stages kept by ``save_for_stages`` run on the saved tensors and ``grad``; their environment."""
    env = dict(zip(ctx.keys, ctx.saved_tensors, strict=True))
    env[ctx.grad_name] = grad.contiguous()
    return run_stages(ctx.backward_stages, env)


class StagedGroupedMM(torch.autograd.Function):
    """Forward runs the ``forward`` stages; backward runs ``backward_input`` then ``backward_weight``."""

    @staticmethod
    def forward(ctx, a, b_t, offs, recipe, mode, backend, pad, impls, fuse_scales):
        G, K, N = b_t.shape
        stages = step_stages(recipe, a.shape[0], N, K, G, mode=mode, backend=backend, pad=pad, impls=impls,
                             fuse_scales=fuse_scales)  # fmt: skip
        by_pass = {p: [s for s in stages if s.pass_name == p] for p in PASSES}
        # w (G, N, K) with K contiguous: free when b_t is the usual transposed view of contiguous weights.
        w = b_t.transpose(-2, -1).contiguous()
        env = run_stages(by_pass[Pass.FORWARD], {"a": a, "w": w, "offs": offs})
        save_for_stages(ctx, env, by_pass[Pass.BACKWARD_INPUT] + by_pass[Pass.BACKWARD_WEIGHT], "grad_out")
        return env["out"]

    @staticmethod
    def backward(ctx, grad_out):
        env = run_saved_stages(ctx, grad_out)
        return env["grad_a"], env["grad_w"].transpose(-2, -1), None, None, None, None, None, None, None


def _staged(
    recipe: str, a, b_t, offs, *, mode="rceil", backend=None, pad: bool = True, impls=None, fuse_scales: bool = False
) -> torch.Tensor:
    if a.dim() != 2 or b_t.dim() != 3 or a.shape[1] != b_t.shape[1]:
        raise InputError(f"a (M, K) and b_t (G, K, N) must agree on K; got {tuple(a.shape)} and {tuple(b_t.shape)}")
    if offs.dim() != 1 or offs.shape[0] != b_t.shape[0]:
        raise InputError(f"offs must hold one group end per expert ({b_t.shape[0]}), got shape {tuple(offs.shape)}")
    return StagedGroupedMM.apply(a, b_t, offs, recipe, mode, backend, pad, impls, fuse_scales)


def mxfp8_grouped_mm(
    a,
    b_t,
    offs,
    mode="rceil",
    *,
    backend=None,
    pad: bool = True,
    impls: Mapping[str, StageImpl] | None = None,
    fuse_scales: bool = False,
) -> torch.Tensor:
    """Drop-in for ``torch._grouped_mm(a, b_t, offs=offs)`` that runs the forward and both backward GEMMs in MXFP8.

    a (M, K) bf16 row-major; b_t (G, K, N) bf16, ideally a transposed view of contiguous weights (G, N, K);
    offs int32 (G,) cumulative group ends. Returns (M, N) bf16. ``pad=True`` (default) pads the token groups to
    multiples of 32 itself, which any router's group sizes need; pass ``pad=False`` only when every group is
    already a multiple of 32 (saves two copies per pass). ``fuse_scales=True`` quantizes with the fused-scale
    quantizers, which write the GEMMs' blocked scales themselves (no rearrange stages; see ``pipeline.step_stages``).
    """
    return _staged("mxfp8", a, b_t, offs, mode=mode, backend=backend, pad=pad, impls=impls, fuse_scales=fuse_scales)


def fp8_rowwise_grouped_mm(
    a, b_t, offs, *, backend=None, pad: bool = True, impls=None, fuse_scales: bool = False
) -> torch.Tensor:
    """The FP8 rowwise sibling of ``mxfp8_grouped_mm`` (groups padded to multiples of 16). ``backend``: the GEMMs'
    (``grouped_gemm.BACKENDS["fp8_rowwise"]``; None: the device's default). ``fuse_scales=True``: the forward
    quantizers of A and w and the backward one of grad_out also fold the column amaxes that the transposed copies are
    scaled by (A's and w's, 4 * G * K bytes each, kept on the autograd context), so each transposed copy reads its
    tensor once (``fp8_amax``)."""
    return _staged("fp8_rowwise", a, b_t, offs, backend=backend, pad=pad, impls=impls, fuse_scales=fuse_scales)


def bf16_grouped_mm(a, b_t, offs, *, pad: bool = True, impls=None) -> torch.Tensor:
    """The bf16 baseline through the same stage machinery (``torch._grouped_mm`` for every GEMM)."""
    return _staged("bf16", a, b_t, offs, pad=pad, impls=impls)


_AUTOGRAD = {"mxfp8": mxfp8_grouped_mm, "fp8_rowwise": fp8_rowwise_grouped_mm, "bf16": bf16_grouped_mm}


def end_to_end(
    recipe, M, N, K, G, group_sizes, *, mode="rceil", backend=None, device="cuda", seed=0, impls=None, fuse_scales=False
) -> Callable[[], object]:
    """A zero-argument call running one forward + backward of the recipe's autograd function on fixed inputs.
    ``fuse_scales``: MXFP8 and FP8 rowwise with their fused-scale quantizers (ignored by bf16)."""
    recipe = check_recipe(recipe)
    t = make_inputs(M, N, K, G, group_sizes, device=device, seed=seed)
    a = t["a"].requires_grad_()
    b_t = t["w"].transpose(-2, -1).requires_grad_()
    pad = needs_padding(recipe, group_sizes)
    kwargs = {
        "mxfp8": {"mode": mode, "backend": backend, "fuse_scales": fuse_scales},
        "fp8_rowwise": {"backend": backend, "fuse_scales": fuse_scales},
    }.get(recipe, {})
    op = _AUTOGRAD[recipe]

    def step():
        out = op(a, b_t, t["offs"], pad=pad, impls=impls, **kwargs)
        return torch.autograd.grad(out, (a, b_t), t["grad_out"])

    return step
