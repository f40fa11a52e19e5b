"""A stored map run read back as its grid of speedups: every reader (the table, the figures) takes them from here.

A cell's speedup of a recipe is bf16's forward + backward time over the recipe's, each the median of its stored
samples (measured) or its model time (model), from the cell's ``fwd+bwd`` records: the layer's one-graph step at
the layer, the autograd function's forward + backward at the projection. A cell without both (an error row, or a
sweep stopped before it) has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mxkernels.core.errors import InputError
from mxkernels.core.names import BASELINE, END_TO_END_STAGE

from ...storage.results import Run
from .grid import Cell, Grid, grid_of


@dataclass(frozen=True)
class CellSpeedup:
    """One recipe at one cell: the two forward + backward times (us) and their ratio, None where one is missing."""

    cell: Cell
    recipe: str
    bf16_us: float | None
    recipe_us: float | None

    @property
    def speedup(self) -> float | None:
        if self.bf16_us is None or self.recipe_us is None:
            return None
        return self.bf16_us / self.recipe_us


@dataclass(frozen=True)
class BreakEven:
    """Where a row of speedups first reaches 1.0x: ``at`` the token value (interpolated between the two cells it
    falls between, linearly in log2 of the tokens, since the grids step by factors), ``below`` when the row's first
    cell is already at or above 1.0x (the line lies below the grid), ``above`` when no cell reaches it (above the
    grid). A row with a missing cell before the crossing has none of the three (unknown)."""

    at: float | None = None
    below: bool = False
    above: bool = False


def crossing(values: tuple[int, ...], row: list[float | None]) -> BreakEven:
    """The ``BreakEven`` of one row of speedups over increasing token ``values``."""
    for i, s in enumerate(row):
        if s is None:
            return BreakEven()
        if s >= 1.0:
            if i == 0:
                return BreakEven(below=True)
            lo, hi, s_lo = values[i - 1], values[i], row[i - 1]
            t = (1.0 - s_lo) / (s - s_lo)
            return BreakEven(at=2 ** (math.log2(lo) + t * (math.log2(hi) - math.log2(lo))))
    return BreakEven(above=True)


@dataclass(frozen=True)
class MapView:
    """A map run's grid, the recipes it compared with bf16, and every cell's speedup of each (``at``)."""

    grid: Grid
    recipes: tuple[str, ...]
    measured: bool
    cells: dict[tuple[str, int, int], CellSpeedup]

    def at(self, recipe: str, G: int, value: int) -> CellSpeedup:
        return self.cells[(recipe, G, value)]

    def matrix(self, recipe: str) -> list[list[float | None]]:
        """The speedups of ``recipe``: one row per G (as the grid lists them), one column per token value."""
        g = self.grid
        return [[self.at(recipe, G, v).speedup for v in g.values] for G in g.experts]

    def break_even(self, recipe: str) -> list[BreakEven]:
        """Per G (as the grid lists them), where ``recipe`` reaches 1.0x along the token axis (``crossing``)."""
        return [crossing(self.grid.values, row) for row in self.matrix(recipe)]

    def bf16_matrix(self) -> list[list[float | None]]:
        g = self.grid
        recipe = self.recipes[0] if self.recipes else BASELINE
        return [[self.at(recipe, G, v).bf16_us for v in g.values] for G in g.experts]


def map_view(run: Run) -> MapView:
    """``run`` (a map run) as its grid of speedups."""
    grid = grid_of(run.meta)
    recipes = tuple(r for r in run.meta["map"].get("recipes", []) if r != BASELINE)
    steps: dict[tuple[str, int, int], float] = {}
    for r in run.records:
        if r.stage != END_TO_END_STAGE or not r.ok or r.point.fuse_scales:
            continue
        try:
            cell = grid.cell_of(r.point)
        except InputError:
            continue  # a record of no cell of the grid (none is written; a hand-edited file may hold one)
        steps.setdefault((r.point.recipe, cell.G, cell.value), r.median_us)
    if not recipes:
        raise InputError("the map run names no recipe besides bf16")
    cells = {
        (recipe, c.G, c.value): CellSpeedup(c, recipe, steps.get((BASELINE, c.G, c.value)),
                                            steps.get((recipe, c.G, c.value)))
        for recipe in recipes
        for c in grid.cells()
    }  # fmt: skip
    return MapView(grid, recipes, run.meta.get("measured") is not False, cells)
