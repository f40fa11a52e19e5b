"""The records of a map run: every cell measured by the measurement its scope already has, nothing timed here.

At the layer, each cell's points go to the layer workload's ``LayerTimer`` bound to that cell's ``LayerShape`` (every
stage timed alone, the layer's forward + backward as one CUDA graph, its SQNR); at the projection, to the step's
``StageTimer`` (every stage of the training step, then its forward + backward). The loop is the one every workload
runs (``measuring.loop.measure_points``): progress on stderr, the run saved after each point, Ctrl-C keeping the
points measured (the run marked partial). Without a GPU, the model: each cell priced by the layer's or the step's
own model (``model_layer_run``, ``model_run``) over a hardware spec, its records gathered into one run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ...measuring.loop import measure_points
from ...measuring.metadata import common_metadata, run_metadata
from ...measuring.stages import StageTimer, SweepOptions
from ...storage.results import Point, Run
from .axes import Scope
from .grid import Grid, grid_of


def map_meta(grid: Grid, recipes: Sequence[str]) -> dict:
    return {"kind": "map", "map": {**grid.as_meta(), "recipes": list(recipes)}}


def _layer_timer(options: SweepOptions, ins, shape):
    from ..layer.measure import LayerTimer

    return LayerTimer(options, ins, shape)


class CellTimer:
    """Hands each point to the timer of its cell's scope: at the layer a ``LayerTimer`` of the cell's shape (kept
    while the points of one cell follow each other: its fp32 reference is computed once a cell); at the projection
    the step's ``StageTimer``. ``layer_timer(options, ins, shape)`` makes the layer's (a test passes a stand-in)."""

    def __init__(self, grid: Grid, options: SweepOptions, ins, layer_timer: Callable = _layer_timer):
        self.grid, self.options, self.ins, self.layer_timer = grid, options, ins, layer_timer
        self._step = StageTimer(options, ins)
        self._layer, self._shape = None, None

    def measure(self, point: Point) -> list:
        if self.grid.scope is Scope.PROJECTION:
            return self._step.measure(point)
        shape = self.grid.layer_shape(self.grid.cell_of(point))
        if shape != self._shape:
            self._layer, self._shape = None, None  # the last cell's reference outputs go before the next allocates
            self.ins.release()
            self._layer, self._shape = self.layer_timer(self.options, self.ins, shape), shape
        return self._layer.measure(point)


def run_map(grid: Grid, points: Sequence[Point], recipes: Sequence[str], options: SweepOptions, ins, *,
            progress: bool = True, layer_timer: Callable = _layer_timer) -> Run:  # fmt: skip
    """Measure ``points`` (cells' points, ``Grid.points``) into one run saved to ``options.out`` after each."""
    meta_points = [replace(p, groups="balanced") for p in points]
    run = Run(meta={**run_metadata(meta_points, options, ins), **map_meta(grid, recipes)})
    if grid.scope is Scope.LAYER:  # the layer's token groups come from its router, not the projection's split
        for key in ("group_sizes", "group_sizes_method"):
            run.meta.pop(key, None)
    return measure_points(run, points, CellTimer(grid, options, ins, layer_timer), ins, options.out, progress)


def remeasure(baseline: Run, options: SweepOptions, instruments):
    """``regress``'s measurement of a map baseline's points: its grid (``grid_of`` its metadata), each point by its
    cell's timer; refused (as Ctrl-C) when stopped part-way, since a verdict on part of a round would mislead."""
    grid = grid_of(baseline.meta)
    recipes = baseline.meta["map"].get("recipes", [])

    def measure(points: list[Point]) -> Run:
        run = run_map(grid, points, recipes, options, instruments)
        if run.meta.get("interrupted"):
            raise KeyboardInterrupt
        return run

    return measure


def model_map_run(grid: Grid, recipes: Sequence[str], *, spec, hardware: str, command: str, mode: str = "rceil",
                  seed: int = 0) -> Run:  # fmt: skip
    """The analytic model of every cell, by the scope's own model: the layer's (``model_layer_run``) or the step's
    (``model_run``); the records of all cells in one run marked "model, not measured"."""
    from ...instruments.roofline import MODEL_ASSUMPTION

    points = grid.all_points(recipes, mode=mode, seed=seed)
    run = Run(meta={**common_metadata(points, command), "hardware": hardware, "measured": False,
                    "label": "model, not measured", "model": MODEL_ASSUMPTION, **map_meta(grid, recipes)})  # fmt: skip
    if grid.scope is Scope.PROJECTION:
        from ..step.sweep import model_run

        run.records = model_run(points, spec=spec, hardware=hardware, command=command).records
        return run
    from ..layer.measure import model_layer_run

    for key in ("group_sizes", "group_sizes_method"):
        run.meta.pop(key, None)
    for cell in grid.cells():
        cell_points = grid.points(cell, recipes, mode=mode, seed=seed)
        shape = grid.layer_shape(cell)
        run.records += model_layer_run(shape, cell_points, spec=spec, hardware=hardware, command=command).records
    return run
