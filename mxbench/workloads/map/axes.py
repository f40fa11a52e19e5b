"""The map's typed axes, importing nothing heavy (the command line builds its options from them before any kernel is
imported): what a cell measures (``Scope``) and what its token axis counts (``TokenAxis``)."""

from __future__ import annotations

from enum import StrEnum


class Scope(StrEnum):
    """What each cell measures: the whole MoE layer (``mxbench layer``'s measurement) or the expert projection alone
    (the grouped GEMMs with their quantizers: ``mxbench roofline``'s)."""

    LAYER = "layer"
    PROJECTION = "projection"


class TokenAxis(StrEnum):
    """What the second axis counts: tokens per expert (rows each expert's GEMM gets) or the total."""

    PER_EXPERT = "tokens_per_expert"
    TOTAL = "tokens"

    @property
    def title(self) -> str:
        return "tokens per expert" if self is TokenAxis.PER_EXPERT else "tokens"
