"""The figure of a stored EP run: where each strategy's step goes, and how fast its all-to-alls run.

Left: one stacked bar per strategy, the sum of its stages' times by category (all-to-all, permute, quantize,
rearrange, GEMM, pad/unpad, and for the whole layer routing, activation and combine), each stage at its slowest rank's median, with the measured fwd+bwd step marked beside
(the step runs the same stages back to back, so the two differ by launch gaps and by what one stage timed alone
does not see). Right: the achieved all-to-all rate of each all-to-all stage (both directions, per rank) beside the
datasheet NVLink roof and the measured all-to-all ceiling. Drawn off-screen (Figure + Agg), read from Records only.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ...instruments.roofline import achieved_tbps
from ...storage.results import Run
from ...views.panels import save
from .tables import A2A, STEP, ep_part, ep_peaks, in_step

CATEGORIES = {"all_to_all": ("all-to-all", "tab:purple"), "permute": ("permute", "tab:brown"),
              "quantize": ("quantize", "tab:blue"), "rearrange": ("rearrange", "tab:orange"),
              "gemm": ("GEMM", "tab:red"), "pad": ("pad / unpad", "tab:green"), "routing": ("routing", "tab:gray"),
              "activation": ("SwiGLU", "tab:olive"), "combine": ("combine (weighted sums)", "tab:cyan")}  # fmt: skip


def plot_ep(run: Run, path: str | Path) -> Path:
    """Write the figure (module doc) to ``path`` (.png, .svg or .pdf). Raises ValueError when nothing was timed."""
    strategies = [r.point.recipe for r in run.records if r.category == STEP and r.ok]
    if not strategies:
        raise ValueError(f"run of {run.card} holds no measured EP step to draw")
    fig = Figure(figsize=(13, 6), layout="constrained")
    left, right = fig.subplots(1, 2)
    _draw_breakdown(left, run, strategies)
    _draw_alltoall(right, run, strategies)
    m = run.meta
    layer = m.get("layer", {})
    fig.suptitle(f"mxbench ep: {run.card}, EP={m.get('world_size')}, K={layer.get('K')} N={layer.get('N')}, "
                 f"{layer.get('experts_per_rank')} experts x {layer.get('tokens_per_rank')} tokens per rank, "
                 f"top-k {layer.get('top_k')}, {m.get('routing', {}).get('groups')} routing\n{ep_part(run)}",
                 fontsize=11)  # fmt: skip
    return save(fig, path)


def _draw_breakdown(ax, run: Run, strategies: list[str]) -> None:
    bottoms = [0.0] * len(strategies)
    for category, (label, color) in CATEGORIES.items():
        ms = [sum(r.median_us for r in in_step(run, s) if r.category == category) / 1e3 for s in strategies]
        if any(ms):
            ax.bar(strategies, ms, bottom=bottoms, color=color, label=label, width=0.5)
            bottoms = [b + v for b, v in zip(bottoms, ms, strict=True)]
    steps = {r.point.recipe: r.median_us / 1e3 for r in run.records if r.category == STEP and r.ok}
    ax.scatter([s for s in strategies], [steps[s] for s in strategies], marker="D", color="black", zorder=3,
               label="fwd+bwd step (measured)")  # fmt: skip
    ax.set_ylabel("ms per step (stages at their slowest rank)")
    ax.set_title("Where the step goes", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)


def _draw_alltoall(ax, run: Run, strategies: list[str]) -> None:
    peaks = ep_peaks(run)
    stages = list(dict.fromkeys(r.stage for s in strategies for r in in_step(run, s) if r.category == A2A))
    width = 0.8 / max(len(strategies), 1)
    for i, s in enumerate(strategies):
        rates = {r.stage: achieved_tbps(r.bytes, r.median_us) * 1e3 for r in in_step(run, s) if r.category == A2A}
        xs = [j + i * width for j in range(len(stages))]
        ax.bar(xs, [rates.get(st, 0.0) for st in stages], width=width, label=s)
    for key, style in (("link", "--"), ("measured_link", ":")):
        if key in peaks:
            ax.axhline(peaks[key].value * 1e3, color="black", linestyle=style, linewidth=1, label=peaks[key].label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(stages))], stages)
    ax.set_ylabel("GB/s per rank, sent + received (both directions)")
    ax.set_title("All-to-all rate against the interconnect roofs", fontsize=10)
    # below the axes: the roofs' labels are long, and inside they would cover the bars
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=1, frameon=False)
