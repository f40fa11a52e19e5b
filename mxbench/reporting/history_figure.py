"""The history figure: each stage's median over commits with its IQR band, a panel per category, a marker where
the stage changed since its previous commit (``reporting.history``)."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from mxkernels.core.errors import InputError

from ..views.panels import CATEGORY_COLORS, PASS_SHORT
from .history import History, match_key, trends

SHAPE = ["M", "N", "K", "G", "groups", "power_limit_w"]
MARKS = {"SLOWER": ("^", "tab:red"), "FASTER": ("v", "tab:green"), "BROKEN": ("X", "black")}


def _shape_shown(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of one shape: the one measured at the most steps (then the largest M); a history of several
    shapes is narrowed with --M / --recipe first."""
    steps = t.groupby(SHAPE, dropna=False)["step"].nunique().rename("steps").reset_index()
    best = steps.sort_values(["steps", "M"], ascending=False).iloc[0]
    keep = pd.Series(True, index=t.index)
    for c in SHAPE:
        keep &= (t[c] == best[c]) | (t[c].isna() & pd.isna(best[c]))
    return t[keep]


def _categories(h: History) -> dict[tuple[str, str], str]:
    return {(r.pass_name, r.stage): r.category for s in h.steps for r in s.run.records}


def history_figure(h: History, **filters) -> Figure:
    """Median per step of every stage of one shape, with its 25-75% band, one panel per category."""
    t = trends(h, **filters)
    if t.empty:
        raise InputError("the history holds no timed stage to draw")
    t = _shape_shown(t)
    # a trend needs two commits: stages measured at one commit only are left out when others span several
    series = ["recipe", "impl", "pass_name", "stage"]
    spans = t.groupby(series)["step"].transform("nunique")
    left_out = int((spans < 2).groupby([t[c] for c in series]).any().sum()) if (spans > 1).any() else 0
    t = t[spans > 1] if (spans > 1).any() else t
    category = _categories(h)
    t = t.assign(category=[category.get(k, "other") for k in zip(t["pass_name"], t["stage"], strict=True)])
    panels = [c for c in (*CATEGORY_COLORS, "end_to_end") if c in set(t["category"])]
    cols = min(3, len(panels))
    fig = Figure(figsize=(5.6 * cols, 5.6 * -(-len(panels) // cols)), layout="constrained")
    axes = fig.subplots(-(-len(panels) // cols), cols, squeeze=False).ravel()
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    labels = [s.label for s in h.steps]
    marks = [h.verdicts(i) for i in range(len(h.steps))]
    for ax, name in zip(axes, panels, strict=False):
        for _, series in t[t["category"] == name].groupby(["recipe", "impl", "pass_name", "stage"], sort=False):
            series = series.sort_values("step")
            first = series.iloc[0]
            where = PASS_SHORT.get(first["pass_name"])  # the end-to-end pseudo-stage names itself
            label = f"{first['recipe']} {where} {first['stage']}" if where else f"{first['recipe']} {first['stage']}"
            label += "" if first["impl"] == "mxkernels" else f" [{first['impl']}]"
            (line,) = ax.plot(series["step"], series["median"], "o-", ms=4, label=label)
            ax.fill_between(series["step"], series["q25"], series["q75"], color=line.get_color(), alpha=0.2)
            key = match_key(first)
            for r in series.itertuples():
                mark = marks[r.step].get(key)
                if mark is not None:
                    marker, color = MARKS[mark[0]]
                    ax.plot([r.step], [r.median], marker, ms=11, mfc="none", mec=color, mew=2)
        ax.set_yscale("log")
        for formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # plain microseconds, not 6 x 10^3
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_ylabel("median time per call (us); band: 25-75%")
        ax.set_title(name, fontsize=10)
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=1)
    s = t.iloc[0]
    limit = "" if pd.isna(s["power_limit_w"]) else f", {s['power_limit_w']:g} W"
    lines = [
        f"History of {h.card} by {h.by} commit: M={s['M']}, N={s['N']}, K={s['K']}, G={s['G']}, "
        + f"{s['groups']} groups{limit}",
        "open triangle: SLOWER (red) / FASTER (green) than the stage's previous commit (mxbench compare's statistics)",
    ]
    if left_out:
        lines.append(f"{left_out} stages measured at one commit only are not drawn")
    fig.suptitle("\n".join(lines), fontsize=10)
    return fig
