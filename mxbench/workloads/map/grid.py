"""The map's grid: a model's K and N at every (experts on the GPU, tokens) cell, at the layer or the expert projection.

Typed at the seams: the scope and the token axis are Enums, a grid is a frozen dataclass of tuples, and every cell
is a ``Cell``. ``check_grid`` refuses a bad grid before any work (an ``InputError``, exit 2 with one line): empty
axes, zero or negative values, more experts than the kernels' groups (or, at the layer, fewer than top-k), a K or N
that is not a multiple of 32, a cell past the token or memory limits, more cells than ``MAX_CELLS``.

A cell's tokens: at the layer, ``tokens`` is the layer's T (each token routed to top-k experts: T * top-k routed
rows, spread evenly over the G experts by the forced balanced assignment); asked per expert, T is the smallest
number of tokens giving each expert at least that many rows (ceil(value * G / top-k)). At the projection, the
grouped GEMMs' M = G * tokens per expert (or the total asked), split evenly over the G groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mxkernels.core.errors import InputError
from mxkernels.core.names import BASELINE, Wgrad, parse_wgrad
from mxkernels.core.runtime import MAX_GROUPS

from ...plan.points import MAX_TOKENS, check_fits, check_shape, check_step_fits
from ...storage.results import Point
from .axes import Scope, TokenAxis

MAX_CELLS = 64
"""The most cells a map takes: a layer cell is a whole `mxbench layer` run per recipe, so a larger grid is most
likely a typo (and hours of GPU time); split it into several maps."""


@dataclass(frozen=True)
class LayerModel:
    """The layer a cell runs, but for its experts and tokens: top-k, shared experts, router score function."""

    top_k: int = 1
    shared: int = 0
    score_func: str = "sigmoid"


@dataclass(frozen=True)
class Cell:
    """One cell: ``G`` experts, ``value`` on the token axis as asked; ``tokens`` the layer's T (the projection's
    M), ``rows`` the rows the experts' GEMMs take together (T * top-k; the projection's M)."""

    G: int
    value: int
    tokens: int
    rows: int

    @property
    def tokens_per_expert(self) -> float:
        return self.rows / self.G

    def as_dict(self) -> dict[str, int]:
        return {"G": self.G, "value": self.value, "tokens": self.tokens, "rows": self.rows}


@dataclass(frozen=True)
class Grid:
    """The map asked for: ``experts`` (G) x ``values`` (``axis``) at ``scope`` for K, N (and the layer's ``model``)."""

    K: int
    N: int
    experts: tuple[int, ...]
    values: tuple[int, ...]
    scope: Scope = Scope.LAYER
    axis: TokenAxis = TokenAxis.PER_EXPERT
    model: LayerModel = LayerModel()
    label: str = ""
    wgrad: Wgrad = Wgrad.RECIPE  # the quantized recipes' weight-gradient precision (the layer's ``--wgrad``)

    def __post_init__(self):
        object.__setattr__(self, "scope", Scope(self.scope))
        object.__setattr__(self, "wgrad", parse_wgrad(self.wgrad))
        object.__setattr__(self, "axis", TokenAxis(self.axis))
        object.__setattr__(self, "experts", tuple(self.experts))
        object.__setattr__(self, "values", tuple(self.values))

    @property
    def top_k(self) -> int:
        """Experts per token: the layer's; the projection has no router (each row is one expert's)."""
        return self.model.top_k if self.scope is Scope.LAYER else 1

    def cell(self, G: int, value: int) -> Cell:
        k = self.top_k
        if self.axis is TokenAxis.PER_EXPERT:
            tokens = math.ceil(value * G / k)
        else:
            tokens = value
        return Cell(G, value, tokens, tokens * k)

    def cells(self) -> tuple[Cell, ...]:
        """Every cell, G outermost (the order the sweep measures them in)."""
        return tuple(self.cell(G, v) for G in self.experts for v in self.values)

    def layer_shape(self, cell: Cell):
        """The cell's ``LayerShape``: the forced balanced routing (the map asks how size alone moves the line)."""
        from mxkernels.stages.layer import LayerShape

        m = self.model
        return LayerShape(cell.tokens, self.K, self.N, cell.G, m.top_k, m.shared, m.score_func)

    def points(self, cell: Cell, recipes: Sequence[str], *, mode: str = "rceil", seed: int = 0) -> list[Point]:
        """The cell's points, bf16 first (the baseline), then each recipe: a point's M is the cell's rows and its G
        the cell's experts, so every record names its cell (``cell_of``)."""
        return [Point(cell.rows, self.N, self.K, cell.G, r, mode, "balanced", seed,
                      wgrad=Wgrad.RECIPE.value if r == BASELINE else self.wgrad.value)
                for r in dict.fromkeys((BASELINE, *recipes))]  # fmt: skip

    def recipe_label(self, recipe: str) -> str:
        """A recipe as the map's titles name it: with a bf16 weight gradient said (bf16's own is bf16 anyway)."""
        return recipe if self.wgrad == Wgrad.RECIPE or recipe == BASELINE else f"{recipe} ({self.wgrad} wgrad)"

    def all_points(self, recipes: Sequence[str], *, mode: str = "rceil", seed: int = 0) -> list[Point]:
        return [p for c in self.cells() for p in self.points(c, recipes, mode=mode, seed=seed)]

    def cell_of(self, point: Point) -> Cell:
        """The cell a point (or a record's point) belongs to; ``InputError`` for a point of no cell."""
        for c in self.cells():
            if (c.rows, c.G) == (point.M, point.G):
                return c
        raise InputError(f"point {point.label()} is in no cell of this map")

    def as_meta(self) -> dict:
        """What a run stores of its grid (``meta["map"]``, the schema's ``map``): read back by ``grid_of``."""
        return {"label": self.label or f"{self.K}x{self.N}", "scope": self.scope.value, "axis": self.axis.value,
                "K": self.K, "N": self.N, "experts": list(self.experts), "values": list(self.values),
                "top_k": self.model.top_k, "shared_experts": self.model.shared, "score_func": self.model.score_func,
                "routing": "balanced", "cells": [c.as_dict() for c in self.cells()],
                **({} if self.wgrad == Wgrad.RECIPE else {"wgrad": self.wgrad.value})}  # fmt: skip


def grid_of(meta: dict) -> Grid:
    """The grid a map run was made of (its ``meta["map"]``)."""
    m = meta.get("map")
    if not isinstance(m, dict):
        raise InputError("not a map run: its metadata has no map")
    model = LayerModel(m.get("top_k", 1), m.get("shared_experts", 0), m.get("score_func", "sigmoid"))
    return Grid(m["K"], m["N"], tuple(m["experts"]), tuple(m["values"]), m["scope"], m["axis"], model,
                m.get("label", ""), m.get("wgrad", Wgrad.RECIPE))  # fmt: skip


def check_grid(grid: Grid) -> None:
    """The whole grid checked before any work: bad input raises ``InputError`` naming the option and the value."""
    check_shape(grid.N, grid.K, 1)
    if grid.wgrad != Wgrad.RECIPE and grid.scope is not Scope.LAYER:
        raise InputError(f"--wgrad {grid.wgrad} is the layer's option: the projection's step runs its recipe's "
                         "weight gradient (--scope layer)")  # fmt: skip
    for option, values in (("--experts", grid.experts), (f"--{grid.axis.value.replace('_', '-')}", grid.values)):
        if not values:
            raise InputError(f"{option} must list one or more values, got none")
        bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad:
            raise InputError(f"{option} values must be positive integers, got {bad[0]!r}")
    if max(grid.experts) > MAX_GROUPS:
        raise InputError(f"--experts values must be at most {MAX_GROUPS} (the kernels' groups), got "
                         f"{max(grid.experts)}")  # fmt: skip
    k = grid.top_k
    if min(grid.experts) < k:
        raise InputError(f"--experts values must be at least the layer's top-k ({k}: each token's experts are "
                         f"distinct), got {min(grid.experts)}")  # fmt: skip
    count = len(grid.experts) * len(grid.values)
    if count > MAX_CELLS:
        raise InputError(f"the grid has {len(grid.experts)} x {len(grid.values)} = {count} cells, more than the "
                         f"{MAX_CELLS} a map takes: split it into several maps")  # fmt: skip
    for cell in grid.cells():
        if cell.rows > MAX_TOKENS:
            raise InputError(f"the cell G={cell.G}, {grid.axis.title} {cell.value} routes {cell.rows} rows, past "
                             f"{MAX_TOKENS} (group ends are int32)")  # fmt: skip
        _check_memory(grid, cell)


def _check_memory(grid: Grid, cell: Cell) -> None:
    """A cell's bf16 tensors within the largest card (the layer's bound is ``mxbench layer``'s)."""
    K, N, G = grid.K, grid.N, cell.G
    if grid.scope is Scope.PROJECTION:
        check_step_fits(cell.rows, N, K, G)
        return
    T, k = cell.tokens, grid.top_k
    where = f"G={G}, {grid.axis.title} {cell.value}"
    nbytes = 2 * (T * K + 3 * G * N * K + T * k * (K + N))
    check_fits(nbytes, f"the layer's bf16 tokens, weights and routed rows at {where}")
