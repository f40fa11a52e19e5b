"""EP-degree scaling: stored EP runs of one layer at several world sizes, side by side (``table --kind ep-scaling``
and ``plot`` of several EP runs).

Each run stays what it was measured as: its rows are its own ``ep-summary`` rows (slowest rank's median, all-to-all
bytes both directions per rank, each roof named), prefixed by its EP degree and routing. Runs join only when they
time the same layer on the same card (K, N, local experts, tokens per rank, top-k); otherwise the degrees would not
be comparable and the runs are refused with what differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...instruments.roofline import achieved_tbps
from ...storage.results import Run
from ...views.render import Row, render
from .tables import A2A, STEP, ep_part, ep_peaks, in_step, summary_rows

SAME_LAYER = ("K", "N", "experts_per_rank", "tokens_per_rank", "top_k")
"""What two runs must share to sit on one EP-degree axis (besides the card)."""

ROUTING_STYLE = {"balanced": "-", "skewed": "--"}


def ordered(runs: Sequence[Run]) -> list[Run]:
    """The runs by EP degree then routing, after checking they are EP runs of one layer on one card."""
    from mxkernels.core.errors import InputError

    if not runs:
        raise InputError("EP-degree scaling needs at least one run of `mxbench ep`")
    for run in runs:
        if run.meta.get("kind") != "ep":
            raise InputError(f"EP-degree scaling reads runs of `mxbench ep`; the run of {run.card} is not one")
    first = runs[0]
    key = _layer_key(first)
    for run in runs[1:]:
        if run.card != first.card or _layer_key(run) != key:
            raise InputError(f"EP-degree scaling joins runs of one layer on one card: {_describe(first)} vs "
                             f"{_describe(run)}")  # fmt: skip
    seen: set[tuple[int, str]] = set()
    for run in runs:
        where = (_degree(run), _routing(run))
        if where in seen:
            raise InputError(f"two runs at EP degree {where[0]} with {where[1]} routing: keep one")
        seen.add(where)
    return sorted(runs, key=lambda r: (_degree(r), _routing(r)))


def scaling_rows(runs: Sequence[Run]) -> list[Row]:
    """Per run and strategy: its ``ep-summary`` row after its EP degree and routing."""
    return [{"EP degree": str(_degree(run)), "Routing": _routing(run), **row}
            for run in ordered(runs) for row in summary_rows(run)]  # fmt: skip


def scaling_table(runs: Sequence[Run], fmt: str = "markdown", *, columns: list[str] | None = None,
                  strategies: list[str] | None = None) -> str:  # fmt: skip
    """The rows after a header naming the card, the layer, each run's commit and date, and the roofs (except csv)."""
    runs = ordered(runs)
    rows = [r for r in scaling_rows(runs) if not strategies or r["Strategy"] in strategies]
    text = render(rows, fmt, columns)
    if fmt == "csv":
        return text
    prefix = "- " if fmt in ("markdown", "github") else ""
    lines = [f"EP-degree scaling on {runs[0].card}: {_describe(runs[0], card=False, part=False)}",
             ("Times: the slowest rank's median; all-to-all GB/s = bytes sent to + received from other ranks per "
              "rank (both directions); the share is of the strategy's stage sum")]  # fmt: skip
    for run in runs:
        peaks = ep_peaks(run)
        roofs = "; ".join(peaks[k].label for k in ("link", "measured_link") if k in peaks)
        lines.append(f"EP={_degree(run)} {_routing(run)}: NCCL {run.meta.get('nccl')}, commit "
                     f"{str(run.meta.get('git_commit'))[:12]}, {run.meta.get('date')}; {roofs}")  # fmt: skip
    return "".join(f"{prefix}{line}\n" for line in lines) + "\n" + text


def plot_scaling(runs: Sequence[Run], path: str | Path) -> Path:
    """Three panels against EP degree, one line per strategy (solid balanced, dashed skewed routing): the measured
    fwd+bwd step, the all-to-alls' share of the stage sum, and their rate beside the datasheet link roof and each
    degree's measured all-to-all ceiling."""
    # here, not at the top: the scaling table and the EP projection's tables need no matplotlib (a second of import)
    from matplotlib.figure import Figure

    from ...views.panels import save

    runs = ordered(runs)
    fig = Figure(figsize=(16, 5.5), layout="constrained")
    step_ax, share_ax, rate_ax = fig.subplots(1, 3)
    strategies = list(dict.fromkeys(r.point.recipe for run in runs for r in run.records if r.category == STEP))
    colors = {s: f"C{i}" for i, s in enumerate(strategies)}
    for routing in dict.fromkeys(_routing(run) for run in runs):
        mine = [run for run in runs if _routing(run) == routing]
        for s in strategies:
            points = [(_degree(run), *_strategy_point(run, s)) for run in mine]
            points = [p for p in points if p[1] is not None]
            if not points:
                continue
            xs = [p[0] for p in points]
            style = {"color": colors[s], "linestyle": ROUTING_STYLE.get(routing, ":"), "marker": "o"}
            step_ax.plot(xs, [p[1] / 1e3 for p in points], label=f"{s}, {routing}", **style)
            share_ax.plot(xs, [100.0 * p[2] for p in points], **style)
            rate_ax.plot(xs, [p[3] * 1e3 for p in points], **style)
    _draw_roofs(rate_ax, runs)
    degrees = sorted({_degree(run) for run in runs})
    degree_axes(
        [
            (step_ax, "ms per fwd+bwd step (measured)", "Step time"),
            (share_ax, "all-to-all share of the stage sum (%)", "Where the step goes"),
            (rate_ax, "all-to-all GB/s per rank, both directions", "All-to-all rate against the interconnect roofs"),
        ],
        degrees,
    )
    step_ax.legend(fontsize=8)
    rate_ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    fig.suptitle(f"mxbench ep, EP-degree scaling: {runs[0].card}, {_describe(runs[0], card=False, part=False)}", fontsize=11)
    return save(fig, path)


def degree_axes(panels, degrees: Sequence[int]) -> None:
    """Each (axes, y label, title) against EP degree on a log-2 axis ticked at ``degrees``, y from 0."""
    for ax, label, title in panels:
        ax.set_xscale("log", base=2)
        ax.set_xticks(degrees, [str(d) for d in degrees])
        ax.set_xlabel("EP degree (GPUs)")
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)


def _strategy_point(run: Run, strategy: str) -> tuple[float | None, float, float]:
    """(step us, all-to-all share of the stage sum, all-to-all TB/s) of one strategy in one run."""
    step = next((r for r in run.records if r.category == STEP and r.ok and r.point.recipe == strategy), None)
    stages = in_step(run, strategy)
    a2a = [r for r in stages if r.category == A2A]
    a2a_us, total_us = sum(r.median_us for r in a2a), sum(r.median_us for r in stages)
    rate = achieved_tbps(sum(r.bytes for r in a2a), a2a_us) if a2a_us else 0.0
    return (step.median_us if step else None, a2a_us / total_us if total_us else 0.0, rate)


def _draw_roofs(ax, runs: list[Run]) -> None:
    peaks = [(_degree(run), ep_peaks(run)) for run in runs]
    link = next((p["link"] for _, p in peaks if "link" in p), None)
    if link is not None:
        ax.axhline(link.value * 1e3, color="black", linestyle="--", linewidth=1, label=link.label)
    measured = [(degree, p["measured_link"].value * 1e3) for degree, p in peaks if "measured_link" in p]
    if measured:
        ax.scatter([d for d, _ in measured], [v for _, v in measured], marker="x", color="black", zorder=3,
                   label="measured all-to-all ceiling at that EP degree")  # fmt: skip


def _degree(run: Run) -> int:
    return int(run.meta.get("world_size") or 1)


def _routing(run: Run) -> str:
    return str((run.meta.get("routing") or {}).get("groups"))


def _layer_key(run: Run) -> tuple:
    layer = run.meta.get("layer") or {}
    return (ep_part(run), *(layer.get(k) for k in SAME_LAYER))  # a layer run never joins a projection run


def _describe(run: Run, *, card: bool = True, part: bool = True) -> str:
    """The run's layer in words; ``part``: name the projection too (a layer run is always named so)."""
    layer = run.meta.get("layer") or {}
    named = part or layer.get("part", "projection") != "projection"
    text = (f"{ep_part(run) + ', ' if named else ''}K={layer.get('K')} N={layer.get('N')}, "
            f"{layer.get('experts_per_rank')} local experts x "
            f"{layer.get('tokens_per_rank')} tokens per rank, top-k {layer.get('top_k')}")  # fmt: skip
    return f"{run.card}, {text}" if card else text
