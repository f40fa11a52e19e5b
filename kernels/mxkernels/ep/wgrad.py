"""The weight gradient's precision in expert parallelism, an option of its own (``Wgrad``): its values, each
strategy's default and the recipe it gives the weight-gradient GEMMs. The stages it selects are
``stages.ep_wgrad``'s; what each choice means is said there."""

from __future__ import annotations

from enum import StrEnum

from ..core.names import Recipe
from ..core.runtime import InputError
from .strategy import EP_STRATEGIES, get_strategy


class Wgrad(StrEnum):
    RECIPE = "recipe"
    BF16 = "bf16"


DEFAULT_WGRAD = {name: Wgrad(s.default_wgrad) for name, s in EP_STRATEGIES.items()}


def resolve_wgrad(strategy: str, wgrad: Wgrad | str | None) -> Wgrad:
    """The wgrad precision a strategy runs with: ``wgrad`` when given, else the strategy's default."""
    if wgrad is None:
        return DEFAULT_WGRAD[strategy]
    try:
        return Wgrad(wgrad)
    except ValueError:
        raise InputError(f"wgrad must be one of {', '.join(w.value for w in Wgrad)}; got {wgrad!r}") from None


def wgrad_recipe(strategy: str, wgrad: Wgrad) -> Recipe:
    """The recipe of the weight-gradient GEMMs: bf16 for the bf16 strategy whatever ``wgrad`` says, else the
    strategy's GEMM recipe unless ``wgrad`` is bf16."""
    return Recipe.BF16 if wgrad == Wgrad.BF16 else get_strategy(strategy).recipe
