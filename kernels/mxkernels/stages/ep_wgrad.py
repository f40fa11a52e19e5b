"""The weight-gradient stages of each choice of ``ep.wgrad.Wgrad``, the EP weight gradient's precision.

``mxfp8`` and ``mxfp8_a2a`` once differed in two things: where the tokens are quantized (after or before the
all-to-alls) and the weight gradient (MXFP8 in one, a bf16 GEMM of the dequantized rows in the other). With the
wgrad precision chosen apart, mxfp8 and mxfp8_a2a at the same ``Wgrad`` differ in the all-to-all precision alone:

* ``Wgrad.RECIPE``: the strategy's recipe. For MXFP8 both operands are quantized in 32x1 blocks along the tokens
  (``quantize_*_t``). Under mxfp8_a2a an operand that crossed the all-to-all exists on the expert's rank only as
  MXFP8 rows (1x32 along its width), so it is dequantized (exactly, to bf16) and then quantized 32x1 along the
  tokens: a second quantization of already quantized values, which is what this choice measures.
* ``Wgrad.BF16``: a bf16 grouped GEMM of the rows as the rank holds them: the bf16 rows for bf16 / mxfp8, the
  exactly dequantized MXFP8 rows for mxfp8_a2a (torchao's EP benchmark runs this).

``DEFAULT_WGRAD`` keeps each strategy's earlier behaviour; runs record the resolved choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..core.names import Category, Pass, Recipe
from .pipeline import Stage, step_stages


def rebind(stages: Sequence[Stage], names: Mapping[str, str]) -> list[Stage]:
    """``stages`` reading and writing ``names[t]`` for each tensor t named there (others unchanged)."""
    name = lambda n: None if n is None else names.get(n, n)
    return [replace(s, inputs=tuple(map(name, s.inputs)), outputs=tuple(map(name, s.outputs))) for s in stages]


def wgrad_stages(recipe: Recipe, M: int, N: int, K: int, E: int, *, mode: str, backend: str | None) -> list[Stage]:
    """The step's backward-weight stages of ``recipe`` on M rows (already padded where the recipe needs it):
    grad_w (E, N, K) from grad_out (M, N), a (M, K) and offs, as ``pipeline.step_stages`` declares them."""
    stages = step_stages(recipe, M, N, K, E, mode=mode, backend=None if recipe == Recipe.BF16 else backend)
    out = [s for s in stages if s.pass_name == Pass.BACKWARD_WEIGHT]
    if recipe == Recipe.BF16:  # torch._grouped_mm has no backend choice: name it in the records, as pipeline does
        out = [replace(s, backend="bf16") if s.category == Category.GEMM else s for s in out]
    return out
