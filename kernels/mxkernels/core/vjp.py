"""Vector-Jacobian products without torch's check of the supplied gradient, which imports sympy.

``torch.autograd.grad(y, xs, dy)`` and ``y.backward(dy)`` check that dy fits y through
``torch.fx.experimental.symbolic_shapes``: its first use imports sympy, some 0.5 s of CPU in every process that
calls one (each gloo worker of ``mxbench ep --check``: issue 31). The same products as the gradients of
``sum(y * dy)``: y's gradient is ``1 * dy``, dy bit for bit (a dy of another dtype rounded to y's, as torch does).
A dy of another shape goes to torch as before, for its error (``y * dy`` would broadcast it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def backward(y: torch.Tensor, dy: torch.Tensor) -> None:
    """``y.backward(dy)``."""
    if dy.shape != y.shape:
        y.backward(dy)
        return
    (y * dy).sum().backward()


def grad(y: torch.Tensor, inputs: Sequence[torch.Tensor] | torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``torch.autograd.grad(y, inputs, dy)``."""
    if dy.shape != y.shape:
        return torch.autograd.grad(y, inputs, dy)
    return torch.autograd.grad((y * dy).sum(), inputs)
