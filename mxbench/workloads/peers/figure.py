"""The peers figure: per stage of a peers run, one bar per implementation, its bandwidth against the HBM roof."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from mxkernels.core.errors import InputError

from ...instruments.hardware import HardwareSpec
from ...storage.outputs import IMAGE_SUFFIXES
from ...storage.results import Run
from ...views.panels import PASS_SHORT, Context, panel_figure, save, title

PEERS_SIZE = (13.0, 5.6)
IMPL_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink")


def draw_peers(ax: Axes, ctx: Context) -> bool:
    """Grouped bars: a group per stage (pass and stage, in stored order), a bar per implementation (its GB/s:
    the stage's declared bytes over its median time); an implementation that errored or could not run here gets
    no bar but a word in its place. The datasheet HBM roof (and the measured ceiling, if stored) across."""
    df = ctx.frame
    df = df[df["pass_name"].isin(PASS_SHORT)]
    if df.empty or not (df["run_kind"] == "peers").all():
        return False
    impls = list(dict.fromkeys(df["impl"]))
    stages = list(dict.fromkeys(zip(df["pass_name"], df["stage"], strict=True)))
    width = 0.8 / len(impls)
    for j, (impl, color) in enumerate(zip(impls, IMPL_COLORS * 4, strict=False)):
        mine = df[df["impl"] == impl].drop_duplicates(["pass_name", "stage"], keep="last")
        by_stage = {(r.pass_name, r.stage): r for r in mine.itertuples()}
        x = [i - 0.4 + width * (j + 0.5) for i in range(len(stages))]
        heights = [by_stage[s].gbps if s in by_stage and by_stage[s].ok else 0.0 for s in stages]
        ax.bar(x, heights, width * 0.95, color=color, label=impl)
        for xi, s in zip(x, stages, strict=True):
            r = by_stage.get(s)
            if r is not None and not r.ok:
                word = "skipped" if isinstance(r.skipped, str) else "error"
                ax.text(xi, 0, f" {word}", rotation=90, ha="center", va="bottom", fontsize=6, color="dimgray")
    for peak, style in ((ctx.peaks.get("bandwidth"), "-"), (ctx.measured_peaks.get("bandwidth"), "--")):
        if peak is not None:
            ax.axhline(peak.value * 1e3, color="black", ls=style, lw=1.0, label=f"HBM roof: {peak.label}")
    ax.set_xticks(range(len(stages)), [f"{PASS_SHORT[p]} {s}" for p, s in stages], rotation=35, ha="right",
                  fontsize=8)  # fmt: skip
    ax.set_xlim(-0.6, len(stages) - 0.4)
    ax.set_ylabel("bandwidth (GB/s: declared bytes / median time)")
    roofs = [p.value * 1e3 for p in (*ctx.peaks.values(), *ctx.measured_peaks.values()) if p.unit == "TB/s"]
    ax.set_ylim(0, max(ax.get_ylim()[1], *roofs) * 1.12)
    M = int(df["M"].iloc[0])
    title(ax, f"Data-movement kernels side by side at M={M}", ctx)
    ax.legend(fontsize=8, ncols=len(impls) + 2, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return True


def peers_figure(data: Run | pd.DataFrame) -> Figure:
    """A peers run: per stage, one bar per implementation, its GB/s against the HBM roof."""
    return panel_figure([draw_peers], Context.of(data), "peers", PEERS_SIZE)


def plot_peers(data: Run | pd.DataFrame, out: str | Path, spec: HardwareSpec | None = None,
               project: str | None = None) -> list[Path]:  # fmt: skip
    """The peers figure of a peers run: ``out`` itself where it names an image, else ``out/peers.png``."""
    out = Path(out)
    ctx = Context.of(data, spec)
    if project is not None:
        raise InputError("a peers run times data-movement kernels side by side: it has no step to project")
    return [save(peers_figure(ctx.frame), out if out.suffix.lower() in IMAGE_SUFFIXES else out / "peers.png")]
