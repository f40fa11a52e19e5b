"""The expert-parallel strategies, declared in one place: each one's GEMM recipe, what its token all-to-alls carry,
and its weight gradient's default precision. ``stages.ep_stages`` and ``stages.ep_layer`` build their stage lists
from these declarations, ``ep.wgrad`` reads the defaults, the harness lists and refuses strategies by them.

| strategy          | GEMMs        | dispatch (and the combine's gradient) | combine (and the dispatch's gradient) |
|-------------------|--------------|---------------------------------------|---------------------------------------|
| ``bf16``          | bf16         | bf16                                  | bf16                                  |
| ``mxfp8``         | MXFP8        | bf16                                  | bf16                                  |
| ``mxfp8_a2a``     | MXFP8        | MXFP8 (e4m3 + e8m0 scale per 32)      | bf16                                  |
| ``fp8_rowwise``   | FP8 rowwise  | bf16                                  | bf16                                  |
| ``fp8_rowwise_a2a`` | FP8 rowwise | FP8 rowwise (e4m3 + one fp32 scale a row) | bf16 (DeepEP's choice)            |

Bytes a token row of width D costs on the wire: bf16 2D, MXFP8 D + D/32, FP8 rowwise D + 4.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.format import BLOCK_SIZE
from ..core.names import Recipe
from ..core.runtime import InputError


@dataclass(frozen=True)
class EPStrategy:
    """``recipe``: the GEMMs' recipe. ``payload``: what the dispatch and the combine's gradient carry (bf16 rows, or
    the recipe's quantized rows with their scales, quantized once before the all-to-all and consumed by the GEMM).
    ``default_wgrad``: ``ep.wgrad.Wgrad``'s value when none is given."""

    name: str
    recipe: Recipe
    payload: Recipe
    default_wgrad: str

    @property
    def quantized_a2a(self) -> bool:
        return self.payload != Recipe.BF16

    @property
    def needs_fp8(self) -> bool:
        """Whether its GEMMs need FP8 tensor cores (compute capability 8.9 or later). The MXFP8 strategies run
        everywhere (emulated where the card has no MX tensor cores), as they always have."""
        return self.recipe == Recipe.FP8_ROWWISE


_DECLARED = (
    EPStrategy("bf16", Recipe.BF16, Recipe.BF16, "recipe"),
    EPStrategy("mxfp8", Recipe.MXFP8, Recipe.BF16, "recipe"),
    # torchao's EP benchmark: a bf16 wgrad on the exactly dequantized rows
    EPStrategy("mxfp8_a2a", Recipe.MXFP8, Recipe.MXFP8, "bf16"),
    EPStrategy("fp8_rowwise", Recipe.FP8_ROWWISE, Recipe.BF16, "recipe"),
    # the recipe's FP8 wgrad, so that fp8_rowwise and fp8_rowwise_a2a differ in the all-to-all precision alone
    EPStrategy("fp8_rowwise_a2a", Recipe.FP8_ROWWISE, Recipe.FP8_ROWWISE, "recipe"),
)
EP_STRATEGIES = {s.name: s for s in _DECLARED}
STRATEGIES = tuple(EP_STRATEGIES)
BASELINE = "bf16"

FP8_MIN_CAPABILITY = (8, 9)
"""The first compute capability with FP8 tensor cores (Ada, Hopper and later)."""


def get_strategy(name: str) -> EPStrategy:
    try:
        return EP_STRATEGIES[name]
    except KeyError:
        raise InputError(f"strategy must be one of {', '.join(STRATEGIES)}; got {name!r}") from None


def row_widths(payload: Recipe, width: int) -> list[tuple[int, int]]:
    """(columns, bytes per element) of each tensor of a row payload of ``width`` values."""
    if payload == Recipe.MXFP8:
        return [(width, 1), (width // BLOCK_SIZE, 1)]
    if payload == Recipe.FP8_ROWWISE:
        return [(width, 1), (1, 4)]
    return [(width, 2)]


def check_fp8_capability(strategies, capability: tuple[int, int] | None) -> None:
    """Refuse an FP8 strategy on a card without FP8 (``capability``: the GPU's, None on a CPU: gloo runs the
    kernels under the Triton interpreter and the GEMMs emulated, so every strategy runs there)."""
    if capability is None or tuple(capability) >= FP8_MIN_CAPABILITY:
        return
    fp8 = [s for s in strategies if get_strategy(s).needs_fp8]
    if fp8:
        raise InputError(f"strategy {', '.join(fp8)} needs FP8 tensor cores (compute capability "
                         f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} or later); this GPU is "
                         f"{capability[0]}.{capability[1]}")  # fmt: skip
