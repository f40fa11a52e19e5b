"""The layer's time by category: one stacked bar per recipe point (stages measured alone, summed by category),
with the one-graph forward + backward marked beside each bar."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from mxkernels.core.errors import InputError
from mxkernels.core.names import END_TO_END_STAGE

from ...instruments.cards import DEFAULT_CARD
from ...storage.outputs import IMAGE_SUFFIXES
from ...storage.results import Run
from ...views.panels import save
from ...views.render import card_label

GROUPS = {"routing": "routing", "permute": "permute/pad", "pad": "permute/pad", "quantize": "quantize",
          "rearrange": "quantize", "gemm": "GEMM", "activation": "activation", "combine": "combine"}  # fmt: skip
COLORS = {"routing": "tab:purple", "permute/pad": "tab:green", "quantize": "tab:blue", "GEMM": "tab:red",
          "activation": "tab:orange", "combine": "tab:brown"}  # fmt: skip


def layer_figure(run: Run):
    """A Figure: per point, the stage times by category (stacked, ms) and the one-graph time (a black tick)."""
    bars: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    steps: dict[str, float] = {}
    for r in run.records:
        label = r.point.recipe_label().replace(" (", "\n(") + ("\nfused" if r.point.fuse_scales else "")
        if not r.ok:
            continue
        if r.stage == END_TO_END_STAGE:
            steps[label] = r.median_us / 1e3
        else:
            bars[label][GROUPS.get(r.category, r.category)] += r.median_us / 1e3
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(bars), 4.5))
    labels = list(bars)
    for group, color in COLORS.items():
        bottoms = [sum(v for g, v in bars[x].items() if list(COLORS).index(g) < list(COLORS).index(group))
                   if group in COLORS else 0 for x in labels]  # fmt: skip
        ax.bar(labels, [bars[x].get(group, 0.0) for x in labels], bottom=bottoms, color=color, label=group)
    ax.scatter([x for x in labels if x in steps], [steps[x] for x in labels if x in steps], marker="_", s=900,
               color="black", label="fwd+bwd, one graph", zorder=3)  # fmt: skip
    meta = run.meta.get("layer", {})
    kind = "model, not measured" if run.meta.get("measured") is False else "measured"
    ax.set_title(f"MoE layer {meta.get('label', '')} (T={meta.get('tokens')}, E={meta.get('experts')}, "
                 f"top-{meta.get('top_k')}): {card_label(run)}, {kind}", fontsize=9)  # fmt: skip
    ax.set_ylabel("time (ms), stages summed by category")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def plot_layer(run: Run, out: str | Path, project: str | None = None) -> list[Path]:
    """The layer's figure: ``out`` itself where it names an image, else ``out/layer.png``."""
    out = Path(out)
    if project is not None:
        raise InputError("a layer run's projection is a table: "
                         f"`mxbench table RUN --kind layer --project {DEFAULT_CARD}`")
    return [save(layer_figure(run), out if out.suffix.lower() in IMAGE_SUFFIXES else out / "layer.png")]
