"""Figures of stored runs (matplotlib, drawn off-screen: ``Figure`` + the Agg canvas, never pyplot).

Each ``*_figure`` function takes a ``Run`` or the frame of one run (``mxbench.load``, filtered to one file) and
returns a matplotlib ``Figure`` a notebook can show and adjust; ``plot_step`` writes every figure a run of the
step has data for, and the ``plot_*`` functions write one. The panels live in ``figures/`` by family; they read
only stored records, titles name the card (or the modelled spec), axes carry units, efficiency axes name their
denominator.

A sweep can hold several shapes and power limits; every panel but the power one shows the first condition
(N, K, G, group split, power limit) the run stored, and its subtitle says which.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from mxkernels.core.errors import InputError

from ...instruments.cards import DEFAULT_CARD
from ...instruments.hardware import HardwareSpec
from ...storage.outputs import IMAGE_SUFFIXES
from ...storage.results import Run
from ...views.panels import PANEL_SIZE, Context, panel_figure, save
from .figures.power import POWER_METRICS, draw_power
from .figures.projection import PROJECTION_SIZE, draw_projected_breakdown, draw_projected_speedup
from .figures.roofline import ROOFLINE_SIZE, draw_roofline
from .figures.step import draw_bandwidth, draw_breakdown, draw_gemm_speedup, draw_net_speedup

Data = Run | pd.DataFrame
Panel = Callable[[Axes, Context], bool]
PANELS: dict[str, Panel] = {
    "net_speedup": draw_net_speedup,
    "bandwidth_2d": partial(draw_bandwidth, dims=2),
    "bandwidth_3d": partial(draw_bandwidth, dims=3),
    "gemm_speedup": draw_gemm_speedup,
    "breakdown": draw_breakdown,
    "roofline": draw_roofline,
    **{f"power_{m}": partial(draw_power, metric=m) for m in POWER_METRICS},
}
"""The figures of a roofline run, in the order ``plot_all`` writes them."""
SIZES = {"roofline": ROOFLINE_SIZE}


def net_speedup_figure(data: Data, spec: HardwareSpec | None = None) -> Figure:
    """Net fwd+bwd speedup over bf16 vs M, measured and modelled over ``spec`` (default: the run's spec)."""
    return panel_figure([draw_net_speedup], Context.of(data, spec), "net speedup")


def bandwidth_figure(data: Data, dims: int = 2) -> Figure:
    """% of the bandwidth peak vs M of the 2D (activation) or 3D (weight) data-movement kernels."""
    if dims not in (2, 3):
        raise InputError(f"dims must be 2 or 3, got {dims!r}")
    return panel_figure([PANELS[f"bandwidth_{dims}d"]], Context.of(data), f"{dims}D bandwidth")


def gemm_speedup_figure(data: Data) -> Figure:
    """GEMM speedup over bf16 vs M: forward and dA (2D x 3D), dB (2D x 2D)."""
    return panel_figure([draw_gemm_speedup], Context.of(data), "GEMM speedup")


def breakdown_figure(data: Data, M: int | None = None) -> Figure:
    """Stacked per-pass time (quantize, rearrange, pad, GEMM) at ``M`` (default the largest), bf16 GEMMs marked."""
    return panel_figure([partial(draw_breakdown, M=M)], Context.of(data), "breakdown")


def roofline_figure(data: Data, M: int | None = None) -> Figure:
    """Log-log roofline of the GEMMs at ``M`` against datasheet (and measured, if stored) roofs."""
    return panel_figure([partial(draw_roofline, M=M)], Context.of(data), "roofline", ROOFLINE_SIZE)


def power_figure(data: Data) -> Figure:
    """Time, efficiency and energy per step vs power limit, three panels."""
    ctx = Context.of(data)
    panels = [partial(draw_power, metric=m) for m in POWER_METRICS]
    try:
        return panel_figure(panels, ctx, "power")
    except InputError:
        raise InputError(f"run of {ctx.card} holds fewer than two power limits set by mxbench") from None


def projection_figure(data: Data, target: str = DEFAULT_CARD, M: int | None = None) -> Figure:
    """The run's step beside its projection on ``target`` (each kernel at the efficiency it reached here) and
    ``target``'s peak model: per pass at ``M`` (default the largest) and net speedup vs M."""
    panels = [partial(draw_projected_breakdown, target=target, M=M), partial(draw_projected_speedup, target=target)]
    return panel_figure(panels, Context.of(data), f"{target} projection", (PROJECTION_SIZE[0] / 2, PROJECTION_SIZE[1]))


# ------------------------------------------------------------------------------------------------- files


def plot_net_speedup(run: Data, path: str | Path, spec: HardwareSpec | None = None) -> Path:
    return save(net_speedup_figure(run, spec), path)


def plot_bandwidth(run: Data, path: str | Path, dims: int = 2) -> Path:
    return save(bandwidth_figure(run, dims), path)


def plot_gemm_speedup(run: Data, path: str | Path) -> Path:
    return save(gemm_speedup_figure(run), path)


def plot_breakdown(run: Data, path: str | Path, M: int | None = None) -> Path:
    return save(breakdown_figure(run, M), path)


def plot_roofline(run: Data, path: str | Path, M: int | None = None) -> Path:
    return save(roofline_figure(run, M), path)


def plot_power(run: Data, path: str | Path) -> Path:
    return save(power_figure(run), path)


def _figures(ctx: Context, project: str | None) -> dict[str, Figure]:
    """Every figure of the run by file name: each panel that has data (and the projection onto ``project``)."""
    figures = {}
    for name, panel in PANELS.items():
        fig = Figure(figsize=SIZES.get(name, PANEL_SIZE), layout="constrained")
        if panel(fig.subplots(), ctx):
            figures[name] = fig
    if project is not None:
        figures[f"projection_{project}"] = projection_figure(ctx.frame, project)
    return figures


def plot_step(data: Data, out: str | Path, spec: HardwareSpec | None = None, project: str | None = None) -> list[Path]:
    """Every figure a run of the step has data for; with ``project`` (a spec key, e.g. "b200") the projection onto
    it too.

    ``out`` ending in .png/.svg/.pdf: one sheet with every panel in a grid. Otherwise a folder: one file per
    figure (``<name>.png``). Returns the paths written.
    """
    out = Path(out)
    ctx = Context.of(data, spec)
    if out.suffix.lower() in IMAGE_SUFFIXES:
        return [_sheet(ctx, out, project)]
    written = [save(fig, out / f"{name}.png") for name, fig in _figures(ctx, project).items()]
    if not written:
        raise InputError(f"run of {ctx.card} holds nothing to draw")
    return written


def _sheet(ctx: Context, path: Path, project: str | None) -> Path:
    """All panels that have data on one figure, three per row. Each panel is drawn once, on an axes of its own;
    those that had nothing to draw are removed and the rest placed in the grid their number makes."""
    fig = Figure(layout="constrained")
    axes = []
    for panel in PANELS.values():
        ax = fig.add_subplot()
        if panel(ax, ctx):
            axes.append(ax)
        else:
            ax.remove()
    if project is not None:  # drawn whatever the run holds, as before
        for panel in (draw_projected_breakdown, draw_projected_speedup):
            axes.append(ax := fig.add_subplot())
            panel(ax, ctx, target=project)
    if not axes:
        raise InputError(f"run of {ctx.card} holds nothing to draw")
    cols = min(3, len(axes))
    rows = -(-len(axes) // cols)
    grid = fig.add_gridspec(rows, cols)
    for i, ax in enumerate(axes):
        ax.set_subplotspec(grid[i // cols, i % cols])
    fig.set_size_inches(PANEL_SIZE[0] * cols, PANEL_SIZE[1] * rows)
    fig.suptitle(f"mxbench: {ctx.subtitle()}", fontsize=12)
    return save(fig, path)
