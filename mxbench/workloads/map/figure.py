"""A map run's figures: one heatmap per recipe, G on the vertical axis and the token axis across, each cell's speedup
over bf16 written in it, the 1.0x line drawn as a contour, and the title saying measured (the card) or model (the
spec). The values drawn also go into the PNG's metadata (``METADATA_KEY``, JSON), so a figure can be read back
without reading its pixels."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from mxkernels.core.errors import InputError

from ...storage.outputs import IMAGE_SUFFIXES
from ...storage.results import Run
from ...views.render import card_label
from .axes import Scope
from .speedups import MapView, map_view
from .tables import speedup_text

METADATA_KEY = "mxbench-map"
"""The PNG text chunk holding what a heatmap draws: recipe, axes and the speedups (null where a cell has none)."""
BREAK_EVEN = 1.0


def map_figure(view: MapView, recipe: str, card: str) -> Figure:
    """The heatmap of ``recipe`` (module doc). Rows are the grid's G in its order, columns its token values."""
    g = view.grid
    values = np.array([[np.nan if x is None else x for x in row] for row in view.matrix(recipe)], dtype=float)
    finite = values[np.isfinite(values)]
    lo = min(float(finite.min()), 0.9) if finite.size else 0.9
    hi = max(float(finite.max()), 1.1) if finite.size else 1.1
    fig = Figure(figsize=(max(5.5, 1.6 + 1.1 * len(g.values)), 2.0 + 0.8 * len(g.experts)), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(values), cmap="RdYlGn", norm=TwoSlopeNorm(BREAK_EVEN, lo, hi),
                      origin="lower", aspect="auto")  # fmt: skip
    for i, row in enumerate(values):
        for j, x in enumerate(row):
            ax.text(j, i, "—" if math.isnan(x) else speedup_text(float(x)), ha="center", va="center", fontsize=9)
    crosses = bool(finite.size) and finite.min() < BREAK_EVEN < finite.max()
    if crosses:
        ax.contour(*_contour_grid(values), levels=[BREAK_EVEN], colors="black", linewidths=2)
    ax.set_xticks(range(len(g.values)), [str(v) for v in g.values])
    ax.set_yticks(range(len(g.experts)), [str(G) for G in g.experts])
    ax.set_xlabel(g.axis.title)
    ax.set_ylabel("experts on the GPU (G)")
    kind = f"{card}, measured" if view.measured else card  # a model's card label says it is one
    top = f", top-{g.model.top_k}" if g.scope is Scope.LAYER else ""
    ax.set_title(f"{g.recipe_label(recipe)} fwd+bwd speedup over bf16\n{g.label} {g.scope.value} (K={g.K}, N={g.N}{top})\n"
                 f"{kind}; {_line_text(finite, crosses)}", fontsize=9)  # fmt: skip
    fig.colorbar(image, ax=ax, label="speedup over bf16 (x)")
    return fig


def _contour_grid(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ma.MaskedArray]:
    """x, y and z of the 1.0x contour over the cell centres; an axis of one cell is drawn as two rows (columns) of
    the same values at its edges, so a one-row map still gets its line where it crosses 1.0x."""
    x, y, z = np.arange(values.shape[1], dtype=float), np.arange(values.shape[0], dtype=float), values
    if z.shape[0] == 1:
        y, z = np.array([-0.5, 0.5]), np.vstack([z, z])
    if z.shape[1] == 1:
        x, z = np.array([-0.5, 0.5]), np.hstack([z, z])
    return x, y, np.ma.masked_invalid(z)


def _line_text(finite: np.ndarray, crosses: bool) -> str:
    if crosses:
        return "black line: 1.0x"
    if not finite.size:
        return "no cell measured"
    return "every cell " + ("at or below" if finite.max() <= BREAK_EVEN else "at or above") + " 1.0x"


def figure_data(view: MapView, recipe: str) -> dict:
    """What ``map_figure`` draws, as stored beside it."""
    g = view.grid
    return {"recipe": recipe, "scope": g.scope.value, "axis": g.axis.value, "experts": list(g.experts),
            "values": list(g.values), "speedup": view.matrix(recipe), "measured": view.measured,
            **({} if g.wgrad == "recipe" else {"wgrad": g.wgrad.value})}  # fmt: skip


def plot_map(run: Run, out: str | Path, project: str | None = None) -> list[Path]:
    """One heatmap per recipe: ``out`` a folder (``map-<label>-<recipe>.png`` in it), or an image name that each
    recipe's file takes with ``-<recipe>`` added to its stem."""
    if project is not None:
        raise InputError("a map run has no projection: `mxbench map --hardware SPEC` models another card")
    view = map_view(run)
    out = Path(out)
    paths = []
    for recipe in view.recipes:
        if out.suffix.lower() in IMAGE_SUFFIXES:
            path = out.with_name(f"{out.stem}-{recipe}{out.suffix}")
        else:
            path = out / f"map-{view.grid.label}-{recipe}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig = map_figure(view, recipe, card_label(run))
        metadata = {METADATA_KEY: json.dumps(figure_data(view, recipe))} if path.suffix.lower() == ".png" else None
        fig.savefig(path, dpi=120, metadata=metadata)
        paths.append(path)
    return paths
