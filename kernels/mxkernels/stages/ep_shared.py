"""The shared experts of the expert-parallel MoE layer: one dense SwiGLU FFN of hidden width N * shared on each
rank's own T tokens (replicated weights ws13 (1, 2Ns, K), ws2 (1, K, Ns); no all-to-all), beside the routed experts.

Its projections are the single-GPU layer's shared projections (``layer._projection`` under the roles
``shared_up`` / ``shared_down``: one-group grouped GEMMs over the T tokens, group end ``shared_offs``), in the
strategy's recipe when ``in_recipe`` (as ``mxbench layer --shared-in-recipe``), else in bf16; its SwiGLU the
layer's under the role ``shared``. The EP layer adds its output to the routed one (``add_shared``) and its input
gradient to the routed one (``shared.add_grads``) before the router's term.

``--overlap`` issues these stages on a second stream (``ep.overlap``): they depend on x and dy alone, so the forward
ones are issued just before the dispatch and run beside the dispatch, the experts and the combine; the backward
ones (input and weight gradients) just before the combine's gradient all-to-all. ``SIDE_ROLES`` names them.
"""

from __future__ import annotations

from ..core.cost import Cost
from ..core.names import Pass, Recipe
from ..core.runtime import InputError
from .layer import _projection, _renamed, _shared_swiglu
from .layer_specs import get_layer_spec
from .pipeline import Stage, bind_stage
from .step_specs import padding_alignment

SIDE_ROLES = ("shared_up.", "shared_down.", "shared.swiglu")
"""Prefixes of the stage names the shared experts' own work runs under (what ``--overlap`` puts on the side)."""


def side_stage_names(stages) -> frozenset[str]:
    """The stages of a list that are the shared experts' own work (not the adds that join it to the routed path)."""
    return frozenset(s.name for s in stages if s.name.startswith(SIDE_ROLES))


def shared_stages(recipe: Recipe, T: int, K: int, N: int, shared: int, in_recipe: bool, mode: str,
                  backend: str | None) -> dict[Pass, list[Stage]]:  # fmt: skip
    """Forward (x -> ys), backward input (dy -> grad_xs_shared) and backward weight (grad_ws13, grad_ws2) stages,
    in execution order."""
    recipe = recipe if in_recipe else Recipe.BF16
    align = padding_alignment(recipe)
    if T % align:
        raise InputError(f"shared experts run as one token group of T rows in {recipe}: T must be a multiple of "
                         f"{align}, got {T}")  # fmt: skip
    Ns = N * shared
    be = None if recipe == Recipe.BF16 else backend
    up = _projection(recipe, "shared_up", T, 2 * Ns, K, 1, {"a": "x", "w": "ws13", "offs": "shared_offs",
                     "out": "hs", "grad_out": "grad_hs", "grad_a": "grad_xs_shared", "grad_w": "grad_ws13"}, mode,
                     be, False)  # fmt: skip
    down = _projection(recipe, "shared_down", T, K, Ns, 1, {"a": "acts", "w": "ws2", "offs": "shared_offs",
                       "out": "ys", "grad_out": "dy", "grad_a": "grad_acts", "grad_w": "grad_ws2"}, mode, be,
                       False)  # fmt: skip
    F, DI, DW = Pass.FORWARD, Pass.BACKWARD_INPUT, Pass.BACKWARD_WEIGHT
    return {
        F: up[F] + [_shared_swiglu(Ns, T, F)] + down[F],
        DI: down[DI] + [_shared_swiglu(Ns, T, DI)] + up[DI],
        DW: up[DW] + down[DW],
    }


def add_shared(T: int, K: int) -> Stage:
    """y = y_routed + ys (bf16, one rounding)."""
    return bind_stage(get_layer_spec("bf16", "add_shared"), [(T, K), (T, K)], Cost(2 * T * K * 2, T * K * 2),
                      ("y_routed", "ys"), ("y",))  # fmt: skip


def add_shared_grads(T: int, K: int) -> Stage:
    """grad_x_shared = grad_x_routed + grad_xs_shared (the token gradients of both paths, before the router's)."""
    add = bind_stage(get_layer_spec("bf16", "add_grads"), [(T, K), (T, K)], Cost(2 * T * K * 2, T * K * 2),
                     ("grad_x_routed", "grad_xs_shared"), ("grad_x_shared",))  # fmt: skip
    return _renamed([add], "shared", {n: n for n in (*add.inputs, *add.outputs)})[0]
