"""A stored map run read back as its grid of speedups: every reader (the table, the figures) takes them from here.

A cell's speedup of a recipe is bf16's forward + backward time over the recipe's, each the median of its stored
samples (measured) or its model time (model), from the cell's ``fwd+bwd`` records: the layer's one-graph step at
the layer, the autograd function's forward + backward at the projection. A cell without both (an error row, or a
sweep stopped before it) has none.
"""

from __future__ import annotations

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
