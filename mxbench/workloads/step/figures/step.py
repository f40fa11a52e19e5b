"""Panels of a roofline run's step against M and at one M: net speedup, bandwidth efficiency of the data-movement
kernels, GEMM speedup, and the stacked per-pass breakdown."""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from mxkernels.core.names import MEMORY_CATEGORIES

from ....instruments.cards import DEFAULT_CARD
from ....instruments.hardware import HardwareSpec
from ....instruments.roofline import model_step_us
from ....views.frame import PASS_TITLES, efficiency
from ....views.panels import CATEGORY_COLORS, PASS_SHORT, RECIPE_COLORS, Context, legend, m_axis, title
from ....views.render import MODEL_MARK, peak_text
from ..tables import GEMM_SPEEDUP_COLUMNS, TableOptions, speedups


def draw_net_speedup(ax: Axes, ctx: Context) -> bool:
    """Net fwd+bwd speedup over bf16 vs M of every recipe: measured (if the run measured) and the roofline model
    over ``ctx.spec``. A card without MX tensor cores has no mxfp8 roof: its model line would sit at the fp8
    roof, which the MXFP8 step cannot reach there, so it is not drawn (``--project b200`` shows what a card with
    them would do)."""
    found = speedups(pd.concat([ctx.rows, ctx.twins]) if len(ctx.twins) else ctx.rows)
    drew = False
    unreachable = []
    for (recipe, fused), mine in found.groupby(["recipe", "fuse_scales"], sort=False):
        color = RECIPE_COLORS.get(recipe, "tab:blue")
        name = f"{recipe}, fused scales" if fused else recipe
        measured = mine[mine["measured"] & mine["net"].notna()].sort_values("M")
        if len(measured):
            ax.plot(measured["M"], measured["net"], "D-." if fused else "o-", color=color, label=f"{name} measured")
        if fused:  # one model line per recipe (the unfused step's), to keep the legend readable
            drew = drew or bool(len(measured))
            continue
        model = model_net_speedups(ctx.rows, ctx.spec, mine) if _reachable(ctx, recipe) else []
        if ctx.spec is not None and not _reachable(ctx, recipe):
            unreachable.append(recipe)
        if model:
            name = ctx.spec.name if ctx.spec else "spec"
            ax.plot(*zip(*model, strict=True), "s--", color=color, alpha=0.6,
                    label=f"{recipe} roofline model ({name}, {MODEL_MARK})")  # fmt: skip
        drew = drew or bool(len(measured) or model)
    if not drew:
        return False
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="bf16 (1x)")
    m_axis(ax, ctx.Ms)
    ax.set_ylabel("fwd+bwd speedup over bf16 (x)")
    title(ax, "Net speedup, forward + backward", ctx)
    # the legend's title says why a model line is missing: the legend finds a place clear of the data
    why = (
        f"no {', '.join(unreachable)} roofline model: {ctx.spec.name} has no MX tensor cores\n"
        f"(`mxbench plot --project {DEFAULT_CARD}` projects the run onto a {DEFAULT_CARD.upper()})"
        if unreachable
        else None
    )
    # Beside fused-scales twins the curves fill the panel: the legend goes below it.
    below = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.13), "ncol": 2} if len(ctx.twins) else {}
    legend(ax, title=why, title_fontsize=7, **below)
    return True


def model_net_speedups(rows: pd.DataFrame, spec: HardwareSpec | None, points: pd.DataFrame) -> list[tuple[int, float]]:
    """(M, model speedup of the bf16 step over the recipe's) at each point of ``points`` (a ``speedups`` frame):
    the stages' declared costs priced over ``spec``."""
    if spec is None:
        return []
    out = []
    for p in points.sort_values("M").itertuples():
        same = rows["M"] == p.M
        recipe = model_step_us(rows[same & (rows["recipe"] == p.recipe)].itertuples(), spec)
        bf16 = model_step_us(rows[same & (rows["recipe"] == "bf16")].itertuples(), spec)
        if recipe and bf16:
            out.append((int(p.M), bf16 / recipe))
    return out


def _reachable(ctx: Context, recipe: str) -> bool:
    """Whether the model of ``recipe`` over ``ctx.spec`` prices a roof the card has."""
    return ctx.spec is not None and not (recipe == "mxfp8" and ctx.spec.mxfp8_tflops is None)


def input_dims(shape: str) -> int:
    """Dimensions of a record's first input ("(M, K) @ ..." -> 2): 2 for a token matrix, 3 for expert weights."""
    first = shape.split("@")[0].strip()
    return first.count(",") + 1 if first.startswith("(") else 0


def draw_bandwidth(ax: Axes, ctx: Context, dims: int) -> bool:
    """% of the bandwidth peak vs M for the data-movement kernels whose input has ``dims`` dimensions."""
    peak = ctx.efficiency_peaks.get("bandwidth")
    rows = ctx.rows[(ctx.rows["recipe"] == ctx.recipe) & ctx.rows["category"].isin(MEMORY_CATEGORIES)]
    rows = rows[rows["shape"].map(input_dims) == dims]
    if peak is None or rows.empty:
        return False
    rows = rows.assign(eff=efficiency(rows, ctx.efficiency_peaks)[0]).dropna(subset=["eff"])
    markers = "os^vD<>p*hX"
    for i, ((pass_name, stage), pts) in enumerate(rows.groupby(["pass_name", "stage"], sort=False)):
        pts = pts.sort_values("M")
        ax.plot(pts["M"], pts["eff"], marker=markers[i % len(markers)], label=f"{PASS_SHORT[pass_name]} {stage}")
    m_axis(ax, ctx.Ms)
    ax.set_ylim(0, max(100.0, ax.get_ylim()[1]))
    ax.set_ylabel(f"bandwidth (% of {peak_text(peak)})")
    what = "activations (2D)" if dims == 2 else "expert weights (3D)"
    title(ax, f"Quantize / rearrange / pad kernels on {what}", ctx)
    legend(ax, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    return True


def draw_gemm_speedup(ax: Axes, ctx: Context) -> bool:
    """Per-pass GEMM speedup over the bf16 GEMM vs M."""
    if ctx.recipe is None:
        return False
    found = speedups(ctx.rows, TableOptions(recipe=ctx.recipe)).sort_values("M")
    drew = False
    for (pass_name, label), marker in zip(GEMM_SPEEDUP_COLUMNS.items(), "os^", strict=True):
        pts = found[found[f"gemm_{pass_name}"].notna()]
        if len(pts):
            ax.plot(pts["M"], pts[f"gemm_{pass_name}"], marker=marker, label=label)
            drew = True
    if not drew:
        return False
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="bf16 (1x)")
    m_axis(ax, ctx.Ms)
    ax.set_ylabel(f"GEMM speedup over bf16 (x), {ctx.recipe}")
    title(ax, "Grouped GEMM speedup over bf16", ctx)
    legend(ax)
    return True


def pass_times(rows: pd.DataFrame, time: str = "median_us") -> pd.DataFrame:
    """Time per pass (rows, in pass order) and category (columns) of a step's stages: the stacked bars."""
    rows = rows[rows["pass_name"].isin(PASS_SHORT)]
    table = rows.pivot_table(index="pass_name", columns="category", values=time, aggfunc="sum", fill_value=0.0)
    return table.reindex(index=[p for p in PASS_SHORT if p in table.index],
                         columns=[c for c in CATEGORY_COLORS if c in table.columns])  # fmt: skip


def stack_bars(ax: Axes, times: pd.DataFrame, x: list[float], width: float, label: bool = True, **kw) -> list[float]:
    """``times`` (pass x category) as stacked bars at ``x``, each total written above its bar; the totals."""
    bottoms = [0.0] * len(times)
    for category in times.columns:
        heights = list(times[category])
        if any(heights):
            ax.bar(x, heights, width, bottom=bottoms, color=CATEGORY_COLORS[category],
                   label=category if label else None, **kw)  # fmt: skip
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for xi, total in zip(x, bottoms, strict=True):
        # on a white ground: a bf16 mark drawn across the bar's top must not strike its total through
        ax.annotate(f"{total:.0f}", (xi, total), ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                    textcoords="offset points", zorder=5, bbox={"fc": "white", "ec": "none", "pad": 0.5})  # fmt: skip
    return bottoms


def draw_breakdown(ax: Axes, ctx: Context, M: int | None = None) -> bool:
    """Stacked time per pass (quantize, rearrange, pad, GEMM) at one M, the bf16 GEMM time marked on each bar."""
    M = M if M is not None else (ctx.Ms[-1] if ctx.Ms else None)
    at_M = ctx.rows[(ctx.rows["M"] == M) & ctx.rows["pass_name"].isin(PASS_SHORT)]
    mine = at_M[at_M["recipe"] == ctx.recipe]
    if mine.empty:
        return False
    times = pass_times(mine)
    passes = list(times.index)
    totals = stack_bars(ax, times, list(range(len(passes))), 0.6)
    bf16 = at_M[(at_M["recipe"] == "bf16") & (at_M["category"] == "gemm")].groupby("pass_name")["median_us"].last()
    for i, p in enumerate(passes):
        if p in bf16:
            ax.hlines(bf16[p], i - 0.4, i + 0.4, colors="black", linestyles="--", lw=1.5,
                      label="bf16 GEMM" if i == 0 else None)  # fmt: skip
    ax.set_xticks(range(len(passes)), [PASS_TITLES[p] for p in passes])
    ax.set_ylabel("time per call (us)")
    ax.set_ylim(0, max([*totals, *bf16]) * 1.12)
    title(ax, f"Time per pass at M={M}", ctx)
    # the legend goes under the axes: above the bars it would cover their totals
    legend(ax, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncols=5)
    return True
