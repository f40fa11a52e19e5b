"""Power-limit panels: time, efficiency and energy of the recipe's step per category against the limit set."""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes

from ....instruments.hardware import Peak
from ....instruments.roofline import gemm_peak
from ....views.frame import ENERGY_KEY, efficiency
from ....views.panels import CATEGORY_COLORS, CONDITION, PASS_SHORT, Context, legend, title
from ....views.render import peak_text

POWER_METRICS = {
    "time": "time (us per step: one call of each stage)",
    "efficiency": "efficiency (% of peak)\n{peaks}",
    "energy": "energy (mJ per step: one call of each stage)",
}


def power_series(ctx: Context, metric: str) -> tuple[int | None, dict[str, list[tuple[float, float]]]]:
    """The largest M and, per category of the recipe's step at that M, ``metric`` ("time" us, "efficiency" %,
    "energy" mJ) of all its stages together for each power limit mxbench set."""
    if ctx.rows.empty:
        return None, {}
    first = ctx.rows.iloc[0]
    df = ctx.frame
    rows = df[df["ok"] & (df["recipe"] == ctx.recipe) & df["power_limit_w"].notna() & (df["power_limit_w"] > 0)]
    for c in (c for c in CONDITION if c != "power_limit_w"):  # the same shape and group split, any limit
        rows = rows[rows[c] == first[c]]
    if rows.empty:
        return None, {}
    M = int(rows["M"].max())
    at = rows[(rows["M"] == M) & rows["pass_name"].isin(PASS_SHORT)]
    series: dict[str, list[tuple[float, float]]] = {}
    for (limit, category), rs in at.groupby(["power_limit_w", "category"]):
        value = power_metric(rs, metric, ctx.efficiency_peaks)
        if value is not None and category in CATEGORY_COLORS:
            series.setdefault(category, []).append((float(limit), value))
    return M, {c: series[c] for c in CATEGORY_COLORS if c in series}


def power_metric(rs: pd.DataFrame, metric: str, peaks: dict[str, Peak]) -> float | None:
    """Time (us), efficiency (%) or energy (mJ) of rows taken together, as one step of back-to-back calls."""
    total_us = float(rs["median_us"].sum())
    if metric == "time":
        return total_us
    if metric == "energy":
        energies = rs[ENERGY_KEY]
        return 1e3 * float(energies.sum()) if energies.notna().all() else None
    combined = rs.iloc[:1].assign(bytes=rs["bytes"].sum(), flops=rs["flops"].sum(), median_us=total_us, ok=True)
    pct = efficiency(combined, peaks)[0].iloc[0]
    return None if pd.isna(pct) else float(pct)


def draw_power(ax: Axes, ctx: Context, metric: str) -> bool:
    M, series = power_series(ctx, metric)
    if len({x for pts in series.values() for x, _ in pts}) < 2:
        return False
    for category, pts in series.items():
        ax.plot(*zip(*pts, strict=True), "o-", color=CATEGORY_COLORS[category], label=category)
    gemm = gemm_peak(ctx.efficiency_peaks, ctx.recipe)
    bw = ctx.efficiency_peaks.get("bandwidth")
    denominators = "\n".join(
        f"{what}: {peak_text(p)}" for what, p in (("data movement", bw), ("gemm", gemm)) if p is not None
    )
    ax.set_ylabel(POWER_METRICS[metric].format(peaks=denominators or "no peak"), fontsize=8)
    ax.set_xlabel("power limit (W)")
    if metric == "efficiency":
        ax.set_ylim(0, max(100.0, ax.get_ylim()[1]))
    title(ax, f"Power limit sweep at M={M}: {metric}", ctx, limit=False)
    legend(ax)
    return True
