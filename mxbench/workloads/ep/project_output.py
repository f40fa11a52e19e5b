"""What ``mxbench ep-project`` prints and stores: the projection table, the validation table, the assumptions
(printed under every table and stored with the result), and the figure (predictions as lines, measurements as
points)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...views.render import Row, render
from .project import DEEPEP_SOURCE, LinkModel, Measured, Prediction
from .scaling import degree_axes

BASELINE = "bf16"


def assumptions(model: LinkModel, runs: Sequence[Measured]) -> list[str]:
    """Every assumption of the model behind a projection of ``runs`` (``project`` module doc), in words."""
    limit = (f"node-limited routing: each token to at most M = {model.max_nodes} nodes, sent once per destination "
             "node over the NIC and forwarded over NVLink there (DeepEP normal kernels); every token assumed to use "
             "min(M, nodes, top-k) nodes (an upper bound on inter-node bytes)"
             if model.max_nodes else "no node limit: every token copy crosses on its own (all_to_all_single, as "
             "`mxbench ep` measures it)")  # fmt: skip
    lines = [
        "Projection, not a measurement: every step at an EP degree other than a run's own is modelled.",
        f"Nodes of {model.gpus_per_node} GPUs; an EP degree above one node fills whole nodes.",
        ("Tokens per rank, experts per rank, top-k and the layer are those of the measured run (held), so with "
         "balanced routing every rank receives the copies it received in the run: compute stages keep their "
         "measured times (the slowest rank's median per stage)."),
        ("Skewed routing: the slowest rank sets the step; compute per rank is a line in the copies it receives "
         "(fitted over the run's ranks), evaluated at the run's seeded router over EP x local experts; all-to-all "
         "bytes times the busiest rank's imbalance (max of sent and received over the balanced figure). Top-k > 1: "
         "a rank's expected share taken as the sum of its experts' router shares (an approximation)."),
        limit,
        (f"All-to-all time = max over link classes of one-way bytes per rank / rate, + {model.latency_us:g} us per "
         "call; intra-node (NVLink) and inter-node (NIC) transfers overlap fully."),
        f"Intra-node rate {model.intra_gbps:.1f} GB/s one way per GPU: {model.intra_source}.",
        f"Inter-node rate {model.inter_gbps:.1f} GB/s one way per GPU: {model.inter_source}.",
        "The fwd+bwd step keeps its measured ratio to the sum of its stages.",
        ("Bytes of one routed copy per all-to-all: the run's bytes sent to other ranks over the copies that left "
         "their rank (so MXFP8 payloads carry their scales)."),
    ]  # fmt: skip
    lines += [f"Source run {m.label}: {describe(m)}" + "".join(f"; {n}" for n in m.notes) for m in runs]
    return lines


def describe(m: Measured) -> str:
    return (f"{m.card}, EP {m.ep} on {m.nodes} node(s), K={m.K} N={m.N}, {m.E} local experts x {m.T} tokens per "
            f"rank, top-k {m.top_k}, {m.groups} routing (seed {m.seed})")  # fmt: skip


def _speedups(preds: Sequence[Prediction]) -> dict[tuple, float]:
    base = {(p.label, p.ep): p.step_us for p in preds if p.strategy == BASELINE}
    return {(p.label, p.ep, p.strategy): base[p.label, p.ep] / p.step_us for p in preds if (p.label, p.ep) in base}


def projection_rows(preds: Sequence[Prediction], runs: Sequence[Measured]) -> list[Row]:
    by_label = {m.label: m for m in runs}
    speedup = _speedups(preds)
    return [{"Projected from": f"{p.label} (measured EP {by_label[p.label].ep}, {by_label[p.label].groups})",
             "EP": str(p.ep), "Nodes": str(p.nodes), "Strategy": p.strategy,
             "Step fwd+bwd (ms)": f"{p.step_us / 1e3:.2f}",
             "Speedup vs bf16": f"{speedup[p.label, p.ep, p.strategy]:.3f}x" if speedup else None,
             "All-to-alls (ms)": f"{p.a2a_us / 1e3:.2f}", "All-to-all share": f"{100 * p.share:.0f}%",
             "Intra-node MB per rank": f"{p.intra_bytes / 1e6:.0f}",
             "Inter-node MB per rank": f"{p.inter_bytes / 1e6:.0f}"} for p in preds]  # fmt: skip


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def validation_rows(preds: Sequence[Prediction], measured: Measured) -> list[Row]:
    """Predicted against measured, per strategy the two share."""
    got = {s.strategy: s for s in measured.strategies}
    rows = []
    for p in preds:
        s = got.get(p.strategy)
        if s is None:
            continue
        rows.append({"Strategy": p.strategy, "Routing": measured.groups, "EP": str(p.ep),
                     "Predicted step (ms)": f"{p.step_us / 1e3:.2f}", "Measured step (ms)": f"{s.step_us / 1e3:.2f}",
                     "Step error": f"{error_pct(p.step_us, s.step_us):+.1f}%",
                     "Predicted all-to-alls (ms)": f"{p.a2a_us / 1e3:.2f}",
                     "Measured all-to-alls (ms)": f"{s.a2a_us / 1e3:.2f}",
                     "All-to-all error": f"{error_pct(p.a2a_us, s.a2a_us):+.1f}%"})  # fmt: skip
    return rows


def text_output(rows: list[Row], notes: Sequence[str], fmt: str, title: str) -> str:
    """A table with its title above and the assumptions under it (csv: the rows alone)."""
    table = render(rows, fmt)
    if fmt == "csv":
        return table
    prefix = "- " if fmt in ("markdown", "github") else ""
    return f"{title}\n\n{table}\nAssumptions:\n" + "".join(f"{prefix}{n}\n" for n in notes)


def json_output(model: LinkModel, runs: Sequence[Measured], rows: list[Row], validation: list[Row] | None,
                notes: Sequence[str]) -> str:  # fmt: skip
    result: dict[str, Any] = {"kind": "ep-projection", "model": asdict(model), "assumptions": list(notes),
                              "sources": [describe(m) for m in runs], "rates_source": DEEPEP_SOURCE,
                              "rows": rows}  # fmt: skip
    if validation is not None:
        result["validation"] = validation
    return json.dumps(result, indent=1) + "\n"


def plot_projection(preds: Sequence[Prediction], measured: Sequence[Measured], path: str | Path) -> Path:
    """Step time and all-to-all share against EP degree: predictions as lines (one per run and strategy),
    the measured runs as points in the same colour."""
    # here, not at the top: a projection printed as a table needs no matplotlib (a second of import)
    from matplotlib.figure import Figure

    from ...views.panels import save

    fig = Figure(figsize=(13, 5.5), layout="constrained")
    step_ax, share_ax = fig.subplots(1, 2)
    strategies = list(dict.fromkeys(p.strategy for p in preds))
    colors = {s: f"C{i}" for i, s in enumerate(strategies)}
    styles = ["-", "--", ":", "-."]
    for i, label in enumerate(dict.fromkeys(p.label for p in preds)):
        for s in strategies:
            mine = sorted((p for p in preds if p.label == label and p.strategy == s), key=lambda p: p.ep)
            if not mine:
                continue
            style = {"color": colors[s], "linestyle": styles[i % len(styles)]}
            step_ax.plot([p.ep for p in mine], [p.step_us / 1e3 for p in mine], label=f"{s}: projected from {label}",
                         **style)  # fmt: skip
            share_ax.plot([p.ep for p in mine], [100 * p.share for p in mine], **style)
    for m in measured:
        for s in m.strategies:
            if s.strategy not in colors:
                continue
            share = s.a2a_us / (s.a2a_us + s.compute_us)
            step_ax.scatter([m.ep], [s.step_us / 1e3], color=colors[s.strategy], marker="o", zorder=3)
            share_ax.scatter([m.ep], [100 * share], color=colors[s.strategy], marker="o", zorder=3)
    step_ax.scatter([], [], color="gray", marker="o", label="measured (points)")
    degrees = sorted({p.ep for p in preds} | {m.ep for m in measured})
    degree_axes([(step_ax, "ms per fwd+bwd step", "Step time"),
                 (share_ax, "all-to-all share of the stage sum (%)", "Where the step goes")], degrees)  # fmt: skip
    step_ax.legend(fontsize=7)
    fig.suptitle(f"mxbench ep-project: lines projected, points measured\n{describe(measured[0])}", fontsize=10)
    return save(fig, path)
