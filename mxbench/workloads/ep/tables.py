"""Tables of a stored EP run (``table --kind ep`` and ``--kind ep-summary``), built from its Records only.

Every efficiency cell names its denominator in the header block:

* all-to-alls: bytes sent to plus received from the other ranks, over the time (both directions, per rank), against
  the card's datasheet NVLink figure (also both directions: 900 GB/s on H100/H200 SXM is 450 GB/s each way) and
  against the measured all-to-all ceiling stored for this card and world size (``mxbench ceilings`` under torchrun);
* data movement on one GPU (quantize, rearrange, pad, permute): bytes over time against HBM bandwidth;
* GEMMs: FLOPs over time against the compute peak of their precision.

Times are the slowest rank's median (a collective step waits for it); the spread column gives min / median / max of
the per-rank medians. Net speedup is the bf16 strategy's step time over each strategy's.
"""

from __future__ import annotations

from typing import Any

from ...instruments.hardware import Peak, get_spec, link_peak, nic_peak
from ...instruments.roofline import MEMORY_CATEGORIES, achieved_tbps, efficiency, held, peaks_for_run
from ...storage.results import Record, Run
from ...views.render import MISSING, Row, header_block, peak_text
from . import TABLE_KINDS
from .ceiling import alltoall_peak

A2A = "all_to_all"
STEP = "end_to_end"


def ep_peaks(run: Run) -> dict[str, Peak]:
    """The run's denominators: datasheet (HBM, compute, "link", "nic" for a run across nodes) and measured
    ("measured_link", and the HBM / GEMM ceilings under "measured_*" where the run stored them)."""
    peaks: dict[str, Peak] = {}
    if run.meta.get("hardware"):
        peaks.update(peaks_for_run(run, "datasheet"))
        spec = get_spec(run.meta["hardware"])
        crossed = (run.meta.get("nodes") or {}).get("nodes", 1) > 1  # the NIC is a denominator only then
        for key, peak in (("link", link_peak(spec)), ("nic", nic_peak(spec) if crossed else None)):
            if peak is not None:
                peaks[key] = peak
    if run.meta.get("ceilings"):
        peaks.update({f"measured_{k}": v for k, v in peaks_for_run(run, "measured").items()})
    if run.meta.get("alltoall_ceiling"):
        a2a = [(achieved_tbps(r.bytes, r.median_us), r) for r in run.records if r.category == A2A and r.ok and r.bytes]
        # the ceiling is one message size: the run's own all-to-alls may beat it
        peaks["measured_link"] = held(alltoall_peak(run.meta["alltoall_ceiling"]), a2a, "all-to-all")
    return peaks


def _pct(value: float, peak: Peak | None) -> str | None:
    return None if peak is None else f"{100.0 * value / peak.value:.1f}%"


def _spread(r: Record) -> str | None:
    s = r.telemetry.get("across_ranks") or {}
    if not s:
        return None
    return f"{s['min_us']:.1f} / {s['median_us']:.1f} / {s['max_us']:.1f}"


def _throughput(r: Record, peaks: dict[str, Peak]) -> dict[str, Any]:
    us = r.median_us
    if r.category == A2A:
        tbps = achieved_tbps(r.bytes, us)
        return {"Achieved": f"{tbps * 1e3:.0f} GB/s", "% datasheet": _pct(tbps, peaks.get("link")),
                "% measured": _pct(tbps, peaks.get("measured_link")), **_across_nodes(r, peaks)}  # fmt: skip
    measured = {k.removeprefix("measured_"): v for k, v in peaks.items() if k.startswith("measured_")}
    eff, eff_measured = efficiency(r, peaks), efficiency(r, measured) if measured else None
    if r.category in MEMORY_CATEGORIES:
        achieved = f"{achieved_tbps(r.bytes, us) * 1e3:.0f} GB/s"
    elif r.flops:
        achieved = f"{r.flops / us / 1e6:.0f} TFLOP/s"
    else:
        achieved = None
    return {"Achieved": achieved, "% datasheet": f"{eff[0]:.1f}%" if eff else None,
            "% measured": f"{eff_measured[0]:.1f}%" if eff_measured else None}  # fmt: skip


def _across_nodes(r: Record, peaks: dict[str, Peak]) -> dict[str, Any]:
    """An all-to-all that crossed nodes: its intra-node bytes against NVLink, its inter-node bytes against the NIC
    (both directions; ``topology``). Nothing for one that stayed on one node (the row's own columns say it all)."""
    split = r.telemetry.get("link_bytes") or {}
    inter = split.get("inter_node") or {}
    if not inter.get("sent", 0) + inter.get("received", 0):
        return {}
    row = {}
    for name, key, peak in (("Intra-node", "intra_node", "link"), ("Inter-node", "inter_node", "nic")):
        tbps = achieved_tbps(split[key]["sent"] + split[key]["received"], r.median_us)
        row[f"{name} GB/s"] = f"{tbps * 1e3:.0f}"
        row[f"{name} % datasheet"] = _pct(tbps, peaks.get(peak))
    return row


def _steps(run: Run) -> dict[str, Record]:
    return {r.point.recipe: r for r in run.records if r.category == STEP and r.ok}


def ep_rows(run: Run, *, strategy: str | None = None, peaks: dict[str, Peak] | None = None) -> list[Row]:
    """One row per stage (and per step) of each strategy, in execution order."""
    peaks = ep_peaks(run) if peaks is None else peaks
    base = _steps(run).get("bf16")
    rows = []
    for r in run.records:
        if strategy is not None and r.point.recipe != strategy:
            continue
        row: Row = {"Strategy": r.point.recipe, "Pass": r.pass_name, "Stage": r.stage, "Category": r.category,
                    "Shape": r.shape}  # fmt: skip
        if not r.ok:
            rows.append({**row, "Time (us)": f"error: {(r.error or 'no result').splitlines()[0][:100]}"})
            continue
        row.update({"Time (us)": f"{r.median_us:.1f}", "Ranks min / med / max (us)": _spread(r),
                    "Method": r.method, **_throughput(r, peaks)})  # fmt: skip
        if r.category == STEP:
            row["Speedup vs bf16"] = f"{base.median_us / r.median_us:.3f}x" if base else None
        rows.append(row)
    return rows


def summary_rows(run: Run, *, peaks: dict[str, Peak] | None = None) -> list[Row]:
    """Per strategy: the step, its net speedup over bf16, and its all-to-alls (time, share, rate vs both roofs)."""
    peaks = ep_peaks(run) if peaks is None else peaks
    steps, base = _steps(run), _steps(run).get("bf16")
    rows = []
    for strategy, step in steps.items():
        a2a = [r for r in in_step(run, strategy) if r.category == A2A]
        a2a_us = sum(r.median_us for r in a2a)
        tbps = achieved_tbps(sum(r.bytes for r in a2a), a2a_us) if a2a_us else None
        rows.append({
            "Strategy": strategy,
            "Step fwd+bwd (us)": f"{step.median_us:.1f}",
            "Speedup vs bf16": f"{base.median_us / step.median_us:.3f}x" if base else None,
            "All-to-alls (us)": f"{a2a_us:.1f}",
            "All-to-all share of stage sum": _share(run, strategy, a2a_us),
            "All-to-all GB/s (both dirs)": f"{tbps * 1e3:.0f}" if tbps else None,
            "% datasheet link": _pct(tbps, peaks.get("link")) if tbps else None,
            "% measured a2a ceiling": _pct(tbps, peaks.get("measured_link")) if tbps else None,
            **_overlap_cells(step),
        })  # fmt: skip
    return rows


def _overlap_cells(step: Record) -> dict:
    """A ``--overlap`` run's step with the shared experts in line and the overlap's gain (``measure._with_serial``);
    nothing for other runs."""
    info = step.telemetry.get("overlap")
    if not info:
        return {}
    return {"Step, shared experts in line (us)": f"{info['serial_us']:.1f}",
            "Overlap gain (us)": f"{info['gain_us']:.1f}"}  # fmt: skip


def in_step(run: Run, strategy: str) -> list[Record]:
    """The strategy's measured stages that the step runs (not the routing calls, not the step itself)."""
    return [r for r in run.records if r.point.recipe == strategy and r.ok and r.category != STEP
            and not r.telemetry.get("note")]  # fmt: skip


def _share(run: Run, strategy: str, a2a_us: float) -> str | None:
    total = sum(r.median_us for r in in_step(run, strategy))
    return f"{100.0 * a2a_us / total:.0f}%" if total else None


def ep_part(run: Run) -> str:
    """What the run put on the ranks, in words: runs stored before ``--layer`` existed are projection runs."""
    layer = run.meta.get("layer") or {}
    if layer.get("part", "projection") == "projection":
        return "expert projection"
    scores = "before" if layer.get("score_before", True) else "after"
    n = int(layer.get("shared_experts") or 0)
    shared = "no shared experts" if not n else (
        f"{n} shared expert(s) in {'the recipe' if layer.get('shared_in_recipe') else 'bf16'}"
        + (", overlapped on a second stream" if layer.get("overlap") else ", in line"))  # fmt: skip
    return f"whole MoE layer ({layer.get('score_func')} scores {scores} the experts, {shared})"


def ep_header(run: Run, peaks: dict[str, Peak], fmt: str) -> str:
    m = run.meta
    layer, routing = m.get("layer", {}), m.get("routing", {})
    wgrad = ", ".join(f"{s} {w}" for s, w in (layer.get("wgrad") or {}).items())
    part = "" if layer.get("part", "projection") == "projection" else f"{ep_part(run)}: "  # projection runs as before
    lines = [
        (
            f"{part}EP degree {m.get('world_size')} ({m.get('backend')}, NCCL {m.get('nccl') or MISSING}), "
            f"{layer.get('experts_per_rank')} local experts, {layer.get('tokens_per_rank')} tokens per rank, "
            f"top-k {layer.get('top_k')}, K={layer.get('K')}, N={layer.get('N')}, {routing.get('groups')} routing "
            f"(seed {routing.get('seed')})" + (f"; wgrad precision: {wgrad}" if wgrad else "")
        ),
        (
            "Times: the slowest rank's median; all-to-all GB/s = bytes sent to + received from other ranks per rank "
            "(both directions, as the NVLink datasheet figure)"
        ),
    ]
    if (m.get("nodes") or {}).get("nodes", 1) > 1:
        from .topology import Topology, describe

        lines.append(describe(Topology.from_meta(m)))
    denominators = {k: v for k, v in peaks.items() if k in ("link", "nic", "measured_link")}
    text = header_block(run, {k: v for k, v in peaks.items() if k not in denominators}, fmt)
    prefix = "- " if fmt in ("markdown", "github") else ""
    extra = [*lines, *(f"{k}: {peak_text(p)}" for k, p in denominators.items())]
    return text + "".join(f"{prefix}{line}\n" for line in extra)


def ep_table(run: Run, kind: str = "ep", fmt: str = "markdown", *, columns: list[str] | None = None,
             strategies: list[str] | None = None) -> str:  # fmt: skip
    """``table --kind ep`` (per stage) or ``--kind ep-summary`` (per strategy) of a stored EP run, after its header
    (except in csv). ``strategies``: only these (``--recipe``)."""
    from mxkernels.core.runtime import InputError

    from ...views.render import render

    if kind not in TABLE_KINDS:
        raise InputError(f"kind must be one of {', '.join(TABLE_KINDS)}, got {kind!r}")
    if run.meta.get("kind") != "ep":
        raise InputError(f"--kind {kind} needs a run of `mxbench ep`; this run of {run.card} is not one")
    peaks = ep_peaks(run)
    if kind == "ep-summary":
        rows = summary_rows(run, peaks=peaks)
    else:
        rows = ep_rows(run, peaks=peaks)
    if strategies:
        rows = [r for r in rows if r["Strategy"] in strategies]
    text = render(rows, fmt, columns)
    return text if fmt == "csv" else ep_header(run, peaks, fmt) + "\n" + text
