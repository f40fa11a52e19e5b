"""The vocabulary stages are described in: recipes, passes, categories, the end-to-end pseudo-stage, and the display
form of input shapes. Plain Python (no torch, no kernels), so the harness's tables and results can use it cheaply;
``stages`` declares the stages themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from .errors import InputError

OURS = "mxkernels"
"""The implementation name of this package's own kernels, in the harness's records and registry."""


class Recipe(StrEnum):
    """The precision a step runs its GEMMs in."""

    MXFP8 = "mxfp8"
    FP8_ROWWISE = "fp8_rowwise"
    BF16 = "bf16"


BASELINE = Recipe.BF16
"""The recipe every other recipe's speedup is measured against."""


class Wgrad(StrEnum):
    """The precision of the weight-gradient GEMMs, an option apart from the recipe (expert parallelism's
    ``ep.wgrad`` and the single-GPU layer's ``stages.layer``): the recipe's own GEMM on operands quantized along the
    tokens, or the bf16 grouped GEMM on the bf16 operands (no k-groups quantizers)."""

    RECIPE = "recipe"
    BF16 = "bf16"


def parse_wgrad(value: object) -> Wgrad:
    """``value`` as a ``Wgrad``; an ``InputError`` naming the choices otherwise."""
    try:
        return Wgrad(value)
    except ValueError:
        raise InputError(f"wgrad must be one of {', '.join(w.value for w in Wgrad)}; got {value!r}") from None


class Pass(StrEnum):
    FORWARD = "forward"
    BACKWARD_INPUT = "backward_input"
    BACKWARD_WEIGHT = "backward_weight"
    END_TO_END = "end_to_end"


PASSES = (Pass.FORWARD, Pass.BACKWARD_INPUT, Pass.BACKWARD_WEIGHT)
"""The passes of a step, in execution order (END_TO_END is the pseudo-pass of the whole step)."""


class Category(StrEnum):
    QUANTIZE = "quantize"
    REARRANGE = "rearrange"
    PAD = "pad"
    GEMM = "gemm"
    ALL_TO_ALL = "all_to_all"  # expert parallelism: rows exchanged between ranks (roof: the interconnect)
    PERMUTE = "permute"  # rows reordered into (or out of) expert groups (roof: memory bandwidth)
    ROUTING = "routing"  # the MoE layer's router after its gate GEMM: scores, top-k, the padded layout
    ACTIVATION = "activation"  # the experts' SwiGLU and its backward
    COMBINE = "combine"  # the weighted sum of each token's expert outputs, and its backward
    END_TO_END = "end_to_end"


MEMORY_CATEGORIES = (Category.QUANTIZE, Category.REARRANGE, Category.PAD, Category.PERMUTE, Category.ROUTING,
                     Category.ACTIVATION, Category.COMBINE)
"""Categories whose roof is memory bandwidth (they do no arithmetic worth counting)."""

END_TO_END_STAGE = "fwd+bwd"
"""Name of the end-to-end pseudo-stage: one forward + backward of a recipe's autograd function."""


def format_shapes(shapes: Sequence[Sequence[int]]) -> str:
    """Display form of a stage's input shapes: "(M, K)", or "(M, K) @ (G, K, N)" for a GEMM's two operands."""
    return " @ ".join("(" + ", ".join(str(d) for d in shape) + ")" for shape in shapes)


def end_to_end_kernel(recipe: str) -> str:
    return f"{recipe} autograd (forward + backward)"


def end_to_end_purpose(recipe: str) -> str:
    return f"One forward + backward of the {recipe} grouped GEMM autograd function"


# The stages that read the expert weights and nothing made from tokens: the weights' quantized copies (along K for
# the forward, along N for dgrad), their scale rearranges, and the fused-scale pair (the column amax it folds is
# the weights' own). A trainer accumulating gradients over microbatches computes their outputs once per optimizer
# step (``stages.step_specs`` marks each spec ``weights_only``; the harness amortizes them by these names without
# importing the specs, which import torch).
WEIGHT_ONLY_STAGES = frozenset({
    "quantize_w", "rearrange_w", "quantize_w_t", "rearrange_w_t", "quantize_w_blocked", "quantize_w_t_blocked",
    "quantize_w_amax", "quantize_w_t_from_amax",
})  # fmt: skip
