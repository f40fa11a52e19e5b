"""What every figure reads: the frame of one run, the condition its panels show, the card, the spec and the
denominators; the axis helpers the panels share; and a figure of panels, and its file.

Panels are drawn on one Axes by ``draw_*`` functions that take a ``Context`` and return whether they drew
anything, so the same panel goes to its own PNG or into a combined sheet. Titles name the card (or the modelled
spec), the shape, the recipe (its scale mode only where it has one: mxfp8) and the token-group split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator
from mxkernels.core.errors import InputError

from ..instruments.hardware import HardwareSpec, Peak, datasheet_peaks, get_spec
from ..instruments.roofline import peaks_for_run
from ..storage.results import Run, load_run
from .frame import frame_of

PASS_SHORT = {"forward": "fwd", "backward_input": "dA", "backward_weight": "dB"}
PASS_MARKERS = {"forward": "^", "backward_input": "v", "backward_weight": "s"}
RECIPE_COLORS = {"mxfp8": "tab:red", "fp8_rowwise": "tab:green", "bf16": "tab:gray"}
CATEGORY_COLORS = {"quantize": "tab:blue", "rearrange": "tab:orange", "pad": "tab:green", "gemm": "tab:red"}
PANEL_SIZE = (6.4, 4.8)
CONDITION = ["N", "K", "G", "groups", "power_limit_w", "fuse_scales"]
"""What one curve vs M holds fixed (the scale mode is the recipe's own: the bf16 baseline has none). The panels draw
the first condition stored; the net-speedup panel adds its fused-scales twins (``Context.twins``) as curves of their
own."""
SCALED_RECIPES = ("mxfp8",)
"""Recipes whose label names their scale mode."""


def recipe_label(recipe: str, mode: str | None) -> str:
    return f"{recipe}/{mode}" if recipe in SCALED_RECIPES and mode else recipe


def run_meta(df: pd.DataFrame) -> dict:
    """The metadata of the one run ``df`` holds: from ``df.attrs["runs"]`` (set by ``mxbench.load``), else read
    again from its file, else what the columns say."""
    files = list(dict.fromkeys(df["file"])) if len(df) else [None]
    if len(files) > 1:
        raise InputError(f"a figure draws one run; this frame holds {len(files)} files: pick one (df[df.file == ...])")
    meta = df.attrs.get("runs", {}).get(files[0])
    if meta is None and files[0] is not None and Path(files[0]).exists():
        meta = load_run(files[0]).meta
    if meta is None:  # a frame without its run: the card and spec its rows name
        first = df.iloc[0] if len(df) else {}
        meta = {"card": first.get("card"), "hardware": first.get("hardware"), "measured": bool(df["measured"].all())}
    return meta


@dataclass
class Context:
    """``frame``: every row of the run; ``rows``: its rows with a time, of the first condition it stored; ``twins``:
    those of the same condition but with fused scales, where the first condition has none (``--fuse-scales``).

    ``peaks``: datasheet roofs of ``spec``; ``measured_peaks``: the run's stored ceilings ({} if none);
    ``efficiency_peaks``: the denominator of efficiency axes, the measured ceilings when the run was made with
    ``--denominator measured`` and stored them, else the datasheet.
    """

    frame: pd.DataFrame
    rows: pd.DataFrame
    card: str
    spec: HardwareSpec | None
    peaks: dict[str, Peak]
    measured_peaks: dict[str, Peak]
    efficiency_peaks: dict[str, Peak]
    twins: pd.DataFrame

    @classmethod
    def of(cls, data: Run | pd.DataFrame, spec: HardwareSpec | None = None) -> Context:
        """``data``: a Run or the frame of one run; ``spec`` (default: the run's) prices the model and gives the
        datasheet roofs."""
        df = frame_of(data) if isinstance(data, Run) else data
        meta = data.meta if isinstance(data, Run) else run_meta(df)
        run = Run(meta=meta)
        if spec is None and meta.get("hardware"):
            spec = get_spec(meta["hardware"])
        peaks = datasheet_peaks(spec) if spec is not None else {}
        measured = peaks_for_run(run, "measured") if meta.get("ceilings") else {}
        chosen = measured if measured and meta.get("denominator") == "measured" else peaks
        ok = df[df["ok"]]
        twins = ok.iloc[:0]
        if len(ok):
            first = ok.iloc[0]
            same = pd.Series(True, index=ok.index)
            for c in CONDITION:
                if c != "fuse_scales":
                    same &= (ok[c] == first[c]) | (ok[c].isna() & pd.isna(first[c]))
            fused = ok["fuse_scales"].astype(bool)
            twins = ok[same & fused] if not first["fuse_scales"] else twins
            ok = ok[same & (fused == bool(first["fuse_scales"]))]
        card = df["card"].iloc[0] if len(df) else str(meta.get("card", "unknown"))
        return cls(df, ok, card, spec, peaks, measured, chosen, twins)

    @property
    def recipe(self) -> str | None:
        """The recipe the panels show: the first one stored that is not the bf16 baseline."""
        return next((r for r in self.rows["recipe"] if r != "bf16"), None)

    @property
    def Ms(self) -> list[int]:
        return sorted(int(m) for m in self.rows["M"].unique())

    def point_text(self, limit: bool = True) -> str:
        """Shape, recipe and group split of the panels (and their power limit, when ``limit`` and one was set)."""
        p = self.rows.iloc[0]
        recipe = self.recipe or "bf16"
        mode = next(iter(self.rows.loc[self.rows["recipe"] == recipe, "mode"]), None)
        watts = f", {p['power_limit_w']:g} W" if limit and pd.notna(p["power_limit_w"]) else ""
        return f"N={p['N']}, K={p['K']}, G={p['G']}, {recipe_label(recipe, mode)}, {p['groups']} groups{watts}"

    def subtitle(self, limit: bool = True) -> str:
        return f"{self.card}: {self.point_text(limit)}" if len(self.rows) else self.card


def title(ax: Axes, text: str, ctx: Context, limit: bool = True) -> None:
    ax.set_title(f"{text}\n{ctx.subtitle(limit)}", fontsize=10)


def m_label(M: int) -> str:
    return f"{M // 1024}K" if M % 1024 == 0 else str(M)


def m_axis(ax: Axes, Ms: list[int]) -> None:
    """Log2 M axis ticked at the measured M values only."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(Ms))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([m_label(m) for m in Ms])
    ax.set_xlabel("M (tokens)")


def legend(ax: Axes, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**{"fontsize": 8, **kw})


def _compact(v: float) -> str:
    """10 -> "10", 1000 -> "1K", 20000 -> "20K": tick labels short enough not to collide on a log axis."""
    return f"{v / 1000:g}K" if v >= 1000 else f"{v:g}"


def plain_log_ticks(axis, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """Ticks of a log axis at ``subs`` x 10^k with short plain numbers ("200", "5K"), minor ticks unlabelled."""
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _compact(v)))
    axis.set_minor_formatter(NullFormatter())


def panel_figure(panels: Sequence[Callable[[Axes, Context], bool]], ctx: Context, what: str,
                 size: tuple[float, float] = PANEL_SIZE) -> Figure:  # fmt: skip
    """A figure of ``panels`` side by side; bad input when one has nothing to draw."""
    fig = Figure(figsize=(size[0] * len(panels), size[1]) if len(panels) > 1 else size, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False).ravel()
    drew = [panel(ax, ctx) for panel, ax in zip(panels, axes, strict=True)]  # every panel draws, then judge
    if not all(drew):
        raise InputError(f"run of {ctx.card} holds nothing to draw for the {what} figure")
    return fig


def save(fig: Figure, path: str | Path, option: str = "--out") -> Path:
    """Write ``fig`` to ``path`` (.png, .svg or .pdf) through the one write path (``storage.writing``): atomic, marked
    as mxbench's (``storage.marks``), replacing only a figure mxbench wrote unless --force allowed it."""
    import io

    from ..storage.marks import Output, figure_metadata
    from ..storage.writing import write_output

    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".").lower() or "png", dpi=120, metadata=figure_metadata())
    return write_output(path, buffer.getvalue(), Output.FIGURE, option)
