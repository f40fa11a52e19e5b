"""The weight gradient's precision in expert parallelism, an option of its own (``Wgrad``, ``core.names``'s, which
the single-GPU layer shares): each strategy's default and the recipe it gives the weight-gradient GEMMs. The stages it selects are
``stages.ep_wgrad``'s; what each choice means is said there."""

from __future__ import annotations

from ..core.names import Recipe, Wgrad, parse_wgrad
from .strategy import EP_STRATEGIES, get_strategy

__all__ = ["DEFAULT_WGRAD", "Wgrad", "resolve_wgrad", "wgrad_recipe"]  # Wgrad itself lives in core.names (neutral)

DEFAULT_WGRAD = {name: Wgrad(s.default_wgrad) for name, s in EP_STRATEGIES.items()}


def resolve_wgrad(strategy: str, wgrad: Wgrad | str | None) -> Wgrad:
    """The wgrad precision a strategy runs with: ``wgrad`` when given, else the strategy's default."""
    if wgrad is None:
        return DEFAULT_WGRAD[strategy]
    return parse_wgrad(wgrad)


def wgrad_recipe(strategy: str, wgrad: Wgrad) -> Recipe:
    """The recipe of the weight-gradient GEMMs: bf16 for the bf16 strategy whatever ``wgrad`` says, else the
    strategy's GEMM recipe unless ``wgrad`` is bf16."""
    return Recipe.BF16 if wgrad == Wgrad.BF16 else get_strategy(strategy).recipe
