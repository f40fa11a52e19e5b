"""Tables of a stored layer run, from its Records only.

``--kind layer``: the seed's form, one row per recipe (and fused twin; the Recipe column names a bf16 weight
gradient, ``--wgrad bf16``): Model | total_M | N | K | bf16 (ms) | recipe (ms) | speedup (with ``--microbatches N``: the amortized step and speedup beside, ``amortize``), then the stage sum beside the one-graph time and the SQNR (dB) of the output and every gradient
against the fp32 run; the seed's own B200 rows follow, labelled as the seed's. With a projection, each recipe's
stages carried to the target card (``projection.project``) give its projected layer time and speedup.
``--kind layer-stages``: every stage of every point with its category, time and efficiency against a named peak.
"""

from __future__ import annotations

from collections import defaultdict

from mxkernels.core.names import END_TO_END_STAGE, Recipe

from ...instruments.roofline import efficiency, peaks_for_run
from ...storage.results import Record, Run
from ...views.render import Row, header_block, render
from . import SEED_ROWS, SEED_SOURCE
from .amortize import amortized_us

SQNR_COLUMNS = ("y", "grad_x", "grad_w1", "grad_w3", "grad_w2", "grad_wr")


def _key(r: Record) -> tuple[str, bool]:
    return r.point.recipe, r.point.fuse_scales


def _by_point(run: Run) -> dict[tuple[str, bool], list[Record]]:
    out: dict[tuple[str, bool], list[Record]] = defaultdict(list)
    for r in run.records:
        out[_key(r)].append(r)
    return out


def _ms(us: float | None) -> str | None:
    return None if us is None else f"{us / 1e3:.3f}"


def _step_us(records: list[Record]) -> float | None:
    step = next((r for r in records if r.stage == END_TO_END_STAGE and r.ok), None)
    return None if step is None else step.median_us


def _stage_sum(records: list[Record]) -> float | None:
    stages = [r for r in records if r.stage != END_TO_END_STAGE]
    if not stages or not all(r.ok for r in stages):
        return None
    return sum(r.median_us for r in stages)


def layer_rows(run: Run, project: str | None = None) -> list[Row]:
    """One row per recipe point (module doc); ``project``: the projected times instead of the measured ones."""
    meta = run.meta.get("layer", {})
    groups = _by_point(run)
    times = _projected(run, project) if project else {k: _step_us(v) for k, v in groups.items()}
    base = times.get((Recipe.BF16.value, False))
    # Gradient accumulation (``--microbatches``): the step with the weight-only stages once per N, beside it. bf16
    # has none, so its amortized step is its step.
    microbatches = int(meta.get("microbatches", 1))
    rows = []
    for (recipe, fused), records in groups.items():
        if recipe == Recipe.BF16:
            continue
        p = records[0].point
        us, step = times.get((recipe, fused)), next((r for r in records if r.stage == END_TO_END_STAGE), None)
        row: Row = {"Model": meta.get("label"), "total_M": p.M, "N": p.N, "K": p.K, "Recipe": p.recipe_label(),
                    "Fused": fused, "bf16 (ms)": _ms(base), "recipe (ms)": _ms(us),
                    "speedup": f"{base / us:.3f}x" if base and us else None}  # fmt: skip
        if microbatches > 1 and not project:  # the weight-only stages' times are the measured ones
            in_order = step.telemetry.get("in_order_step_us") if step is not None else None
            amortized = amortized_us(us, records, microbatches, in_order)
            row["microbatches"] = microbatches
            row["amortized bf16 (ms)"], row["amortized recipe (ms)"] = _ms(base), _ms(amortized)
            row["amortized speedup"] = f"{base / amortized:.3f}x" if base and amortized else None
        if not project and run.meta.get("measured") is not False:  # a model has no graph time nor accuracy
            total = _stage_sum(records)
            row["stage sum (ms)"] = _ms(total)
            row["graph / sum"] = f"{us / total:.3f}" if us and total else None
            sqnr = (step.telemetry.get("sqnr_db") if step else None) or {}
            for name in SQNR_COLUMNS:
                value = sqnr.get(name) if isinstance(sqnr, dict) else None
                row[f"SQNR {name} (dB)"] = None if value is None else f"{value:.1f}"
        if step is not None and step.error:
            row["error"] = step.error
        rows.append(row)
    return rows


def seed_rows() -> list[Row]:
    return [{"Model": f"{model} (seed: B200, torchao)", "total_M": m, "N": n, "K": k, "Recipe": "mxfp8",
             "bf16 (ms)": f"{b:.3f}", "recipe (ms)": f"{x:.3f}", "speedup": f"{s:.3f}x"}
            for model, m, n, k, b, x, s in SEED_ROWS]  # fmt: skip


def _projected(run: Run, target: str) -> dict[tuple[str, bool], float]:
    """Each point's layer time on ``target``: the sum of its stages' projected times; none for a point where a
    stage was not measured (a partial sum would flatter it)."""
    from ..step.projection import project

    df = project(run, target)
    whole = {k for k, records in _by_point(run).items()
             if all(r.ok for r in records if r.stage != END_TO_END_STAGE)}  # fmt: skip
    sums = df.groupby(["recipe", "fuse_scales"])["projected_us"].sum()
    return {(r, bool(f)): float(us) for (r, f), us in sums.items() if (r, bool(f)) in whole}


def stage_rows(run: Run, peaks: dict | None) -> list[Row]:
    rows = []
    for (_, fused), records in _by_point(run).items():
        for r in records:
            eff = efficiency(r, peaks or {})
            rows.append({"Recipe": r.point.recipe_label(), "Fused": fused, "Pass": r.pass_name, "Stage": r.stage,
                         "Category": r.category, "Kernel": r.kernel, "Time (us)": None if r.median_us is None
                         else f"{r.median_us:.1f}", "Efficiency": None if eff is None
                         else f"{eff[0]:.1f}% of {eff[1].label}", "error": r.failure})  # fmt: skip
    return rows


def layer_table(run: Run, fmt: str = "markdown", *, kind: str = "layer", denominator: str | None = "datasheet",
                project: str | None = None, header: bool = True, columns=None) -> str:  # fmt: skip
    peaks = peaks_for_run(run, denominator) if denominator and run.meta.get("hardware") else {}
    if kind == "layer-stages":
        text = render(stage_rows(run, peaks), fmt, columns)
    else:
        rows = layer_rows(run, project)
        if project and columns and rows:  # a projection has times alone: the asked columns it holds
            columns = [c for c in columns if c in rows[0]]
        title = f"projected to {project} from this run's efficiencies" if project else None
        seed = not project and (columns is None or "speedup" in columns)  # the seed's rows are speeds alone
        text = render(rows + (seed_rows() if seed else []), fmt, columns)
        if title:
            text = f"{title}\n{text}"
        elif seed and fmt in ("markdown", "github", "plain"):
            text += f"\nseed rows: {SEED_SOURCE}\n"
    return (header_block(run, peaks, fmt) + "\n" if header else "") + text
