"""Figures of a stored run (matplotlib, drawn off-screen: ``Figure`` + the Agg canvas, never pyplot).

Each figure is a panel drawn on one Axes by a ``_draw_*`` function, so the same panel goes to its own PNG or into
the combined sheet that ``plot_all`` writes for a single file name. Panels read only stored Records; titles name
the card (or the modelled spec), axes carry units, efficiency axes name their denominator.

A sweep can hold several shapes and power limits; every panel but the power one shows the first condition
(N, K, G, scale mode, group split, power limit) the run stored, and its subtitle says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator
from mxkernels.errors import InputError

from .hardware import HardwareSpec, Peak, datasheet_peaks
from .render import MODEL_MARK, card_label, peak_text
from .results import Point, Record, Run
from .roofline import (
    MEMORY_CATEGORIES,
    achieved_tflops,
    efficiency,
    gemm_peak,
    model_speedup,
    peaks_for_run,
    spec_for_run,
)
from .tables import ENERGY_KEY, GEMM_SPEEDUP_COLUMNS, PASS_TITLES, baseline_key, speedups

PASS_SHORT = {"forward": "fwd", "backward_input": "dA", "backward_weight": "dB"}
PASS_MARKERS = {"forward": "^", "backward_input": "v", "backward_weight": "s"}
RECIPE_COLORS = {"mxfp8": "tab:red", "fp8_rowwise": "tab:green", "bf16": "tab:gray"}
CATEGORY_COLORS = {"quantize": "tab:blue", "rearrange": "tab:orange", "pad": "tab:green", "gemm": "tab:red"}
IMAGE_SUFFIXES = (".png", ".svg", ".pdf")
_PANEL_SIZE = (6.4, 4.8)


def _condition(p: Point) -> tuple:
    """Everything about a point but M, its recipe and seed: what one curve vs M holds fixed."""
    return (p.N, p.K, p.G, p.mode, p.groups, p.power_limit_w)


@dataclass
class _Context:
    """What every panel reads: the run's records of one condition, the card label and the denominators.

    ``peaks``: datasheet roofs of ``spec``; ``measured_peaks``: the run's stored ceilings ({} if none);
    ``efficiency_peaks``: the denominator of efficiency axes, the measured ceilings when the run was made with
    ``--denominator measured`` and stored them, else the datasheet.
    """

    run: Run
    spec: HardwareSpec | None
    peaks: dict[str, Peak]
    measured_peaks: dict[str, Peak]
    efficiency_peaks: dict[str, Peak]
    records: list[Record] = field(default_factory=list)

    @classmethod
    def of(cls, run: Run, spec: HardwareSpec | None = None) -> _Context:
        """``spec`` (default: the run's) prices the model and gives the datasheet roofs."""
        if spec is None and run.meta.get("hardware"):
            spec = spec_for_run(run)
        peaks = datasheet_peaks(spec) if spec is not None else {}
        measured = peaks_for_run(run, "measured") if run.meta.get("ceilings") else {}
        chosen = measured if measured and run.meta.get("denominator") == "measured" else peaks
        ok = [r for r in run.records if r.ok]
        first = _condition(ok[0].point) if ok else None
        return cls(run, spec, peaks, measured, chosen, [r for r in ok if _condition(r.point) == first])

    @property
    def condition(self) -> tuple | None:
        return _condition(self.records[0].point) if self.records else None

    @property
    def recipe(self) -> str | None:
        """The recipe the panels show: the first one stored that is not the bf16 baseline."""
        return next((r.point.recipe for r in self.records if r.point.recipe != "bf16"), None)

    @property
    def Ms(self) -> list[int]:
        return sorted({r.point.M for r in self.records})

    def subtitle(self, limit: bool = True) -> str:
        """Card, shape and recipe of the panels (and their power limit, when ``limit`` and one was set)."""
        if not self.records:
            return card_label(self.run)
        p = self.records[0].point
        watts = f", {p.power_limit_w:g} W" if limit and p.power_limit_w is not None else ""
        return f"{card_label(self.run)}: N={p.N}, K={p.K}, G={p.G}, {self.recipe or 'bf16'}/{p.mode}{watts}"


def _title(ax: Axes, text: str, ctx: _Context, limit: bool = True) -> None:
    ax.set_title(f"{text}\n{ctx.subtitle(limit)}", fontsize=10)


def _m_label(M: int) -> str:
    return f"{M // 1024}K" if M % 1024 == 0 else str(M)


def _m_axis(ax: Axes, Ms: list[int]) -> None:
    """Log2 M axis ticked at the measured M values only."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(Ms))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([_m_label(m) for m in Ms])
    ax.set_xlabel("M (tokens)")


def _legend(ax: Axes, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**{"fontsize": 8, **kw})


# ------------------------------------------------------------------------------------------------- panels


def _draw_net_speedup(ax: Axes, ctx: _Context) -> bool:
    """Net fwd+bwd speedup over bf16 vs M of every recipe: measured (if the run measured) and the roofline model
    over ``ctx.spec``."""
    found = [s for s in speedups(ctx.run) if _condition(s.point) == ctx.condition]
    drew = False
    for recipe in dict.fromkeys(s.point.recipe for s in found):
        mine = [s for s in found if s.point.recipe == recipe]
        color = RECIPE_COLORS.get(recipe, "tab:blue")
        measured = sorted((s.point.M, s.net) for s in mine if s.net and s.measured)
        if measured:
            ax.plot(*zip(*measured, strict=True), "o-", color=color, label=f"{recipe} measured")
        model = _model_net_speedups(ctx, [s.point for s in mine])
        if model:
            name = ctx.spec.name if ctx.spec else "spec"
            ax.plot(*zip(*model, strict=True), "s--", color=color, alpha=0.6,
                    label=f"{recipe} roofline model ({name}, {MODEL_MARK})")  # fmt: skip
        drew = drew or bool(measured or model)
    if not drew:
        return False
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="bf16 (1x)")
    _m_axis(ax, ctx.Ms)
    ax.set_ylabel("fwd+bwd speedup over bf16 (x)")
    _title(ax, "Net speedup, forward + backward", ctx)
    _legend(ax)
    return True


def _model_net_speedups(ctx: _Context, points: list[Point]) -> list[tuple[int, float]]:
    """The model's speedup at each point, from the stages' stored costs priced over ``ctx.spec``."""
    if ctx.spec is None:
        return []
    stages = [r for r in ctx.records if r.category != "end_to_end"]
    out = []
    for p in sorted(points, key=lambda p: p.M):
        recipe = [r for r in stages if r.point == p]
        bf16 = [r for r in stages if r.point.recipe == "bf16" and baseline_key(r.point) == baseline_key(p)]
        if recipe and bf16:
            out.append((p.M, model_speedup(bf16, recipe, ctx.spec)))
    return out


def _input_dims(r: Record) -> int:
    """Dimensions of a record's first input: 2 for a token matrix, 3 for expert weights."""
    return len(r.shapes[0]) if r.shapes else 0


def _draw_bandwidth(ax: Axes, ctx: _Context, dims: int) -> bool:
    """% of the bandwidth peak vs M for the data-movement kernels whose input has ``dims`` dimensions."""
    peak = ctx.efficiency_peaks.get("bandwidth")
    rows = [
        r
        for r in ctx.records
        if r.point.recipe == ctx.recipe and r.category in MEMORY_CATEGORIES and _input_dims(r) == dims
    ]
    if peak is None or not rows:
        return False
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in rows:
        eff = efficiency(r, ctx.efficiency_peaks)
        if eff:
            series.setdefault((r.pass_name, r.stage), []).append((r.point.M, eff[0]))
    markers = "os^vD<>p*hX"
    for i, ((pass_name, stage), pts) in enumerate(series.items()):
        ax.plot(
            *zip(*sorted(pts), strict=True), marker=markers[i % len(markers)], label=f"{PASS_SHORT[pass_name]} {stage}"
        )
    _m_axis(ax, ctx.Ms)
    ax.set_ylim(0, max(100.0, ax.get_ylim()[1]))
    ax.set_ylabel(f"bandwidth (% of {peak_text(peak)})")
    what = "activations (2D)" if dims == 2 else "expert weights (3D)"
    _title(ax, f"Quantize / rearrange / pad kernels on {what}", ctx)
    _legend(ax, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    return True


def _draw_gemm_speedup(ax: Axes, ctx: _Context) -> bool:
    """Per-pass GEMM speedup over the bf16 GEMM vs M."""
    found = [s for s in speedups(ctx.run, recipe=ctx.recipe) if _condition(s.point) == ctx.condition]
    drew = False
    for (pass_name, label), marker in zip(GEMM_SPEEDUP_COLUMNS.items(), "os^", strict=True):
        pts = sorted((s.point.M, s.gemm[pass_name]) for s in found if s.gemm[pass_name])
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=label)
            drew = True
    if not drew:
        return False
    ax.axhline(1.0, color="black", lw=0.8, ls=":", label="bf16 (1x)")
    _m_axis(ax, ctx.Ms)
    ax.set_ylabel(f"GEMM speedup over bf16 (x), {ctx.recipe}")
    _title(ax, "Grouped GEMM speedup over bf16", ctx)
    _legend(ax)
    return True


def _draw_breakdown(ax: Axes, ctx: _Context, M: int | None = None) -> bool:
    """Stacked time per pass (quantize, rearrange, pad, GEMM) at one M, the bf16 GEMM time marked on each bar."""
    M = M if M is not None else (ctx.Ms[-1] if ctx.Ms else None)
    at_M = [r for r in ctx.records if r.point.M == M and r.pass_name in PASS_SHORT]
    mine = [r for r in at_M if r.point.recipe == ctx.recipe]
    if not mine:
        return False
    passes = [p for p in PASS_SHORT if any(r.pass_name == p for r in mine)]
    bottoms = [0.0] * len(passes)
    for category, color in CATEGORY_COLORS.items():
        heights = [sum(r.median_us for r in mine if r.pass_name == p and r.category == category) for p in passes]
        if any(heights):
            ax.bar(range(len(passes)), heights, 0.6, bottom=bottoms, color=color, label=category)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for i, total in enumerate(bottoms):
        ax.annotate(
            f"{total:.0f}", (i, total), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points"
        )
    bf16 = {r.pass_name: r.median_us for r in at_M if r.point.recipe == "bf16" and r.category == "gemm"}
    for i, p in enumerate(passes):
        if p in bf16:
            ax.hlines(bf16[p], i - 0.4, i + 0.4, colors="black", linestyles="--", lw=1.5,
                      label="bf16 GEMM" if i == 0 else None)  # fmt: skip
    ax.set_xticks(range(len(passes)), [PASS_TITLES[p] for p in passes])
    ax.set_ylabel("time per call (us)")
    ax.set_ylim(0, max([*bottoms, *bf16.values()]) * 1.15)
    _title(ax, f"Time per pass at M={M}", ctx)
    _legend(ax, loc="upper left")
    return True


def _plain_log_ticks(axis) -> None:
    """Ticks of a log axis at 1, 2, 5 x 10^k with plain numbers ("200", "5000"), minor ticks unlabelled."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


ROOF_COLORS = ("tab:purple", "tab:olive", "tab:cyan")


def _draw_roofs(ax: Axes, peaks: dict[str, Peak], x: tuple[float, float], style: str, ridges: bool) -> None:
    """The HBM roof from ``x[0]`` up to the highest compute roof, then one flat roof per distinct compute peak
    (precisions sharing a value, e.g. fp8 and mxfp8 on Blackwell, share one line) from its ridge point on."""
    mem = peaks.get("bandwidth")
    if mem is None:
        return
    roofs: dict[float, list[str]] = {}
    for name, p in peaks.items():
        if p.unit == "TFLOP/s":
            roofs.setdefault(p.value, []).append(name)
    top = max(roofs, default=mem.value * x[1])
    ax.plot([x[0], top / mem.value], [mem.value * x[0], top], style, color="black", lw=1.2,
            label=f"HBM: {peak_text(mem)}")  # fmt: skip
    for (value, names), color in zip(sorted(roofs.items()), ROOF_COLORS, strict=False):
        ridge = value / mem.value
        label = f"{', '.join(names)}: {peak_text(peaks[names[-1]])}"
        ax.plot([ridge, x[1]], [value, value], style, color=color, lw=1.2, label=label)
        if ridges:
            ax.plot([ridge], [value], "o", color=color, ms=4)
            ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, value), xytext=(-5, 4), textcoords="offset points",
                        ha="right", fontsize=7, color=color)  # fmt: skip


def _draw_roofline(ax: Axes, ctx: _Context, M: int | None = None) -> bool:
    """Log-log roofline: HBM roofs (datasheet solid, measured dashed), a compute roof per precision with its ridge
    point, and every kernel that computes (the GEMMs of each recipe) as a labelled point at one M."""
    bw = ctx.peaks.get("bandwidth")
    M = M if M is not None else (ctx.Ms[-1] if ctx.Ms else None)
    kernels = [r for r in ctx.records if r.point.M == M and r.flops and r.bytes and r.pass_name in PASS_SHORT]
    if bw is None or not kernels:
        return False
    xs = [r.flops / r.bytes for r in kernels]
    ridges = [p.value / bw.value for p in ctx.peaks.values() if p.unit == "TFLOP/s"]
    x = (min(*xs, *ridges) / 20, max(*xs, *ridges) * 4)
    _draw_roofs(ax, ctx.peaks, x, "-", ridges=True)
    _draw_roofs(ax, ctx.measured_peaks, x, "--", ridges=False)
    # GEMMs of one shape sit close together: marker shape names the pass, colour the recipe, and the legend
    # labels each point, so no text is drawn over a crowded cluster
    for r, xi in zip(kernels, xs, strict=True):
        label = f"{r.point.recipe} {PASS_SHORT[r.pass_name]} GEMM ({GEMM_SPEEDUP_COLUMNS[r.pass_name].split()[-1]})"
        ax.plot([xi], [achieved_tflops(r.flops, r.median_us)], PASS_MARKERS[r.pass_name], ls="none", ms=7,
                color=RECIPE_COLORS.get(r.point.recipe, "tab:blue"), mec="black", mew=0.6, alpha=0.85, label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        _plain_log_ticks(axis)
    ax.set_xlim(*x)
    ax.set_ylim(bw.value * x[0], max(ax.get_ylim()[1], max(ridges, default=0) * bw.value * 2))
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_ylabel("achieved (TFLOP/s)")
    ax.text(0.02, 0.98, "quantize / rearrange / pad do no FLOPs:\nsee the bandwidth panels", transform=ax.transAxes,
            va="top", fontsize=7, color="dimgray")  # fmt: skip
    _title(ax, f"Roofline, GEMMs at M={M}", ctx)
    _legend(ax, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7)  # below: points fill the plot
    return True


def _power_series(ctx: _Context, metric: str) -> tuple[int | None, dict[str, list[tuple[float, float]]]]:
    """The largest M and, per category of the recipe's step at that M, ``metric`` ("time" us, "efficiency" %,
    "energy" mJ) of all its stages together for each power limit mxbench set."""
    if not ctx.records:
        return None, {}
    shape = _condition(ctx.records[0].point)[:-1]
    run_records = [
        r
        for r in ctx.run.records
        if r.ok and r.point.recipe == ctx.recipe and r.point.power_limit_w and _condition(r.point)[:-1] == shape
    ]
    if not run_records:
        return None, {}
    M = max(r.point.M for r in run_records)
    series: dict[str, list[tuple[float, float]]] = {}
    for limit in sorted({r.point.power_limit_w for r in run_records}):
        at = [r for r in run_records if r.point.M == M and r.point.power_limit_w == limit and r.pass_name in PASS_SHORT]
        for category in CATEGORY_COLORS:
            rs = [r for r in at if r.category == category]
            value = _power_metric(rs, metric, ctx.efficiency_peaks) if rs else None
            if value is not None:
                series.setdefault(category, []).append((limit, value))
    return M, series


def _power_metric(rs: list[Record], metric: str, peaks: dict[str, Peak]) -> float | None:
    """Time (us), efficiency (%) or energy (mJ) of records taken together, as one step of back-to-back calls."""
    total_us = sum(r.median_us for r in rs)
    if metric == "time":
        return total_us
    if metric == "energy":
        energies = [r.telemetry.get(ENERGY_KEY) for r in rs]
        return 1e3 * sum(energies) if all(e is not None for e in energies) else None
    first = rs[0]
    combined = Record(first.point, first.pass_name, "all", "all", first.category,
                      bytes_read=sum(r.bytes_read for r in rs), bytes_written=sum(r.bytes_written for r in rs),
                      flops=sum(r.flops for r in rs), precision=first.precision, samples_us=[total_us])  # fmt: skip
    eff = efficiency(combined, peaks)
    return eff[0] if eff else None


POWER_METRICS = {
    "time": "time (us per step: one call of each stage)",
    "efficiency": "efficiency (% of peak)\n{peaks}",
    "energy": "energy (mJ per step: one call of each stage)",
}


def _draw_power(ax: Axes, ctx: _Context, metric: str) -> bool:
    M, series = _power_series(ctx, metric)
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
    _title(ax, f"Power limit sweep at M={M}: {metric}", ctx, limit=False)
    _legend(ax)
    return True


# ------------------------------------------------------------------------------------------------- figures

Panel = Callable[[Axes, _Context], bool]
PANELS: dict[str, Panel] = {
    "net_speedup": _draw_net_speedup,
    "bandwidth_2d": partial(_draw_bandwidth, dims=2),
    "bandwidth_3d": partial(_draw_bandwidth, dims=3),
    "gemm_speedup": _draw_gemm_speedup,
    "breakdown": _draw_breakdown,
    "roofline": _draw_roofline,
    **{f"power_{m}": partial(_draw_power, metric=m) for m in POWER_METRICS},
}


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _single(draw: Panel, name: str, run: Run, path: str | Path, spec: HardwareSpec | None = None) -> Path:
    fig = Figure(figsize=_PANEL_SIZE, layout="constrained")
    if not draw(fig.subplots(), _Context.of(run, spec)):
        raise InputError(f"run of {card_label(run)} holds nothing to draw for the {name} figure")
    return _save(fig, path)


def plot_net_speedup(run: Run, path: str | Path, spec: HardwareSpec | None = None) -> Path:
    """Net fwd+bwd speedup over bf16 vs M, measured and modelled over ``spec`` (default: the run's spec)."""
    return _single(_draw_net_speedup, "net speedup", run, path, spec)


def plot_bandwidth(run: Run, path: str | Path, dims: int = 2) -> Path:
    """% of the datasheet bandwidth peak vs M of the 2D (activation) or 3D (weight) data-movement kernels."""
    if dims not in (2, 3):
        raise InputError(f"dims must be 2 or 3, got {dims!r}")
    return _single(PANELS[f"bandwidth_{dims}d"], f"{dims}D bandwidth", run, path)


def plot_gemm_speedup(run: Run, path: str | Path) -> Path:
    """GEMM speedup over bf16 vs M: forward and dA (2D x 3D), dB (2D x 2D)."""
    return _single(_draw_gemm_speedup, "GEMM speedup", run, path)


def plot_breakdown(run: Run, path: str | Path, M: int | None = None) -> Path:
    """Stacked per-pass time (quantize, rearrange, pad, GEMM) at ``M`` (default the largest) with bf16 GEMMs marked."""
    return _single(lambda ax, ctx: _draw_breakdown(ax, ctx, M), "breakdown", run, path)


def plot_roofline(run: Run, path: str | Path, M: int | None = None) -> Path:
    """Log-log roofline of the GEMMs at ``M`` against datasheet (and measured, if stored) roofs."""
    return _single(lambda ax, ctx: _draw_roofline(ax, ctx, M), "roofline", run, path)


def plot_power(run: Run, path: str | Path) -> Path:
    """Time, efficiency and energy per step vs power limit, one figure with three panels."""
    fig = Figure(figsize=(_PANEL_SIZE[0] * 3, _PANEL_SIZE[1]), layout="constrained")
    ctx = _Context.of(run)
    if not all(_draw_power(ax, ctx, m) for ax, m in zip(fig.subplots(1, 3), POWER_METRICS, strict=True)):
        raise InputError(f"run of {card_label(run)} holds fewer than two power limits set by mxbench")
    return _save(fig, path)


def plot_all(run: Run, out: str | Path, spec: HardwareSpec | None = None) -> list[Path]:
    """Every figure the run has data for.

    ``out`` ending in .png/.svg/.pdf: one sheet with every panel in a grid. Otherwise a folder: one file per
    figure (``<name>.png``). Returns the paths written.
    """
    out = Path(out)
    ctx = _Context.of(run, spec)
    if out.suffix.lower() in IMAGE_SUFFIXES:
        return [_sheet(ctx, out)]
    written = []
    for name, panel in PANELS.items():
        fig = Figure(figsize=_PANEL_SIZE, layout="constrained")
        if panel(fig.subplots(), ctx):
            written.append(_save(fig, out / f"{name}.png"))
    return written


def _sheet(ctx: _Context, path: Path) -> Path:
    """All panels that have data on one figure, three per row."""
    names = [n for n, panel in PANELS.items() if panel(Figure().subplots(), ctx)]
    if not names:
        raise InputError(f"run of {card_label(ctx.run)} holds nothing to draw")
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig = Figure(figsize=(_PANEL_SIZE[0] * cols, _PANEL_SIZE[1] * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        PANELS[name](ax, ctx)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(f"mxbench: {ctx.subtitle()}", fontsize=12)
    return _save(fig, path)
