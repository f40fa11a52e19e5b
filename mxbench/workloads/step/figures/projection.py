"""The B200 projection figure: the step measured here beside its projection on the target card and the target's
peak model, per pass (stacked by category) and as net speedup over bf16 against M."""

from __future__ import annotations

from matplotlib.axes import Axes

from ....instruments.hardware import get_spec
from ....views.frame import PASS_TITLES
from ....views.panels import RECIPE_COLORS, Context, legend, m_axis, title
from ..projection import project, projected_speedups, source_label
from ..tables import speedups
from .step import model_net_speedups, pass_times, stack_bars

PROJECTION_SIZE = (13.0, 5.2)


def draw_projected_breakdown(ax: Axes, ctx: Context, target: str, M: int | None = None) -> bool:
    """Per pass at one M, three stacked bars: measured here, projected on ``target``, ``target``'s peak model."""
    proj = project(ctx.rows, target)
    recipe = ctx.recipe
    M = M if M is not None else (ctx.Ms[-1] if ctx.Ms else None)
    mine = proj[(proj["M"] == M) & (proj["recipe"] == recipe)]
    if mine.empty:
        return False
    bars = {
        f"{ctx.card} measured": pass_times(mine, "median_us"),
        f"{proj.attrs['target']} projected": pass_times(mine, "projected_us"),
        f"{proj.attrs['target']} peak model": pass_times(mine, "model_us"),
    }
    passes = list(bars[next(iter(bars))].index)
    width = 0.26
    for j, (name, times) in enumerate(bars.items()):
        x = [i + (j - 1) * width for i in range(len(passes))]
        stack_bars(ax, times, x, width * 0.92, label=j == 0, hatch=("", "//", "..")[j], edgecolor="white")
    ticks = [f"{PASS_TITLES[p]}\nmeasured | projected | model" for p in passes]
    ax.set_xticks(range(len(passes)), ticks, fontsize=8)
    ax.set_ylabel("time per call (us)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    title(ax, f"Time per pass at M={M}: {source_label(ctx.card)} onto {proj.attrs['target']}", ctx)
    legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=4)
    return True


def draw_projected_speedup(ax: Axes, ctx: Context, target: str) -> bool:
    """Net fwd+bwd speedup over bf16 vs M: measured here, projected on ``target``, ``target``'s peak model."""
    proj = project(ctx.rows, target)
    found = projected_speedups(proj)
    here = speedups(ctx.rows)
    if found.empty:
        return False
    name, spec = proj.attrs["target"], get_spec(target)
    for recipe, mine in found.groupby("recipe", sort=False):
        color = RECIPE_COLORS.get(recipe, "tab:blue")
        measured = here[(here["recipe"] == recipe) & here["net"].notna()].sort_values("M")
        if len(measured):
            ax.plot(measured["M"], measured["net"], "o-", color=color, label=f"{recipe} measured on {ctx.card}")
        pts = mine[mine["net"].notna()].sort_values("M")
        ax.plot(pts["M"], pts["net"], "D--", color=color, label=f"{recipe} on {name}, {source_label(ctx.card)}")
        model = model_net_speedups(ctx.rows, spec, mine)
        if model:
            ax.plot(*zip(*model, strict=True), "s:", color=color, alpha=0.6, label=f"{recipe} {name} peak model")
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="bf16 (1x)")
    m_axis(ax, ctx.Ms)
    ax.set_ylabel("fwd+bwd speedup over bf16 (x)")
    title(ax, f"Net speedup: {name} projected beside its peak model", ctx)
    legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2)
    return True
