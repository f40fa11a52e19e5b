"""The roofline panel: HBM and compute roofs (datasheet solid, measured dashed) and every GEMM of one M."""

from __future__ import annotations

import math

from matplotlib.axes import Axes

from ....instruments.hardware import Peak
from ....views.panels import PASS_MARKERS, PASS_SHORT, RECIPE_COLORS, Context, plain_log_ticks, title
from ..tables import GEMM_SPEEDUP_COLUMNS

ROOF_COLORS = ("tab:purple", "tab:olive", "tab:cyan")
ROOFLINE_SIZE = (7.2, 5.6)


def draw_roofs(ax: Axes, peaks: dict[str, Peak], x: tuple[float, float], style: str, ridges: bool) -> list:
    """The HBM roof from ``x[0]`` up to the highest compute roof, then one flat roof per distinct compute peak
    (precisions sharing a value, e.g. fp8 and mxfp8 on Blackwell, share one line) from its ridge point on.
    Returns the drawn lines (their labels name each roof)."""
    mem = peaks.get("bandwidth")
    if mem is None:
        return []
    roofs: dict[float, list[str]] = {}
    for name, p in peaks.items():
        if p.unit == "TFLOP/s":
            roofs.setdefault(p.value, []).append(name)
    top = max(roofs, default=mem.value * x[1])
    lines = ax.plot([x[0], top / mem.value], [mem.value * x[0], top], style, color="black", lw=1.2,
                    label=f"HBM: {mem.label}")  # fmt: skip
    for (value, names), color in zip(sorted(roofs.items()), ROOF_COLORS, strict=False):
        ridge = value / mem.value
        label = f"{', '.join(names)}: {peaks[names[-1]].label}"
        lines += ax.plot([ridge, x[1]], [value, value], style, color=color, lw=1.2, label=label)
        if ridges:
            ax.plot([ridge], [value], "o", color=color, ms=4)
            # below the roof, right of the slope: the one corner no legend or point uses
            ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, value), xytext=(5, -4), textcoords="offset points",
                        ha="left", va="top", fontsize=7, color=color)  # fmt: skip
    return lines


def draw_roofline(ax: Axes, ctx: Context, M: int | None = None) -> bool:
    """Log-log roofline: HBM roofs (datasheet solid, measured dashed), a compute roof per precision with its ridge
    point, and every kernel that computes (the GEMMs of each recipe) as a labelled point at one M."""
    bw = ctx.peaks.get("bandwidth")
    M = M if M is not None else (ctx.Ms[-1] if ctx.Ms else None)
    rows = ctx.rows
    kernels = rows[(rows["M"] == M) & (rows["flops"] > 0) & (rows["bytes"] > 0) & rows["pass_name"].isin(PASS_SHORT)]
    if bw is None or kernels.empty:
        return False
    xs = list(kernels["flop_per_byte"])
    ridges = [p.value / bw.value for p in ctx.peaks.values() if p.unit == "TFLOP/s"]
    x = (min(*xs, *ridges) / 20, max(*xs, *ridges) * 4)
    roofs = draw_roofs(ax, ctx.peaks, x, "-", ridges=True) + draw_roofs(ax, ctx.measured_peaks, x, "--", ridges=False)
    # GEMMs of one shape sit close together: marker shape names the pass, colour the recipe, and the legend
    # labels each point, so no text is drawn over a crowded cluster
    points = []
    for r in kernels.itertuples():
        label = f"{r.recipe} {PASS_SHORT[r.pass_name]} GEMM ({GEMM_SPEEDUP_COLUMNS[r.pass_name].split()[-1]})"
        points += ax.plot([r.flop_per_byte], [r.tflops], PASS_MARKERS[r.pass_name], ls="none", ms=7,
                          color=RECIPE_COLORS.get(r.recipe, "tab:blue"), mec="black", mew=0.6, alpha=0.85,
                          label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    # 1-2-5 ticks over more than three decades crowd their labels together: decades only there
    plain_log_ticks(ax.xaxis, (1.0,) if math.log10(x[1] / x[0]) > 3 else (1.0, 2.0, 5.0))
    plain_log_ticks(ax.yaxis)
    ax.set_xlim(*x)
    ax.set_ylim(bw.value * x[0], max(ax.get_ylim()[1], max(ridges, default=0) * bw.value * 2))
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)\n"
                  "quantize / rearrange / pad do no FLOPs: see the bandwidth figures", fontsize=9)  # fmt: skip
    ax.set_ylabel("achieved (TFLOP/s)")
    title(ax, f"Roofline, GEMMs at M={M}", ctx)
    # both legends inside the axes, where a roofline is empty: the points' above the HBM slope (upper left),
    # the roofs' under the flat roofs (lower right), so nothing is clipped at the canvas edge
    roof_legend = ax.legend(handles=roofs, loc="lower right", fontsize=6.5, framealpha=0.9, title="roofs",
                            title_fontsize=7)  # fmt: skip
    ax.add_artist(roof_legend)
    ax.legend(handles=points, loc="upper left", fontsize=7, framealpha=0.9)
    return True
