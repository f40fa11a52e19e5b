"""A/A spread of the regression gate on this GPU: how far the same code's timings move between runs, per stage
category; the evidence behind the gate's default bands and floor (``mxbench.gate.rules``, docs/perf-log.md).

One baseline (``mxbench roofline``, by default the points of ``make baseline``), then ``mxbench regress`` against it
``--repeats`` times with the same code: every stage's ratio new/base and its bootstrap 95% CI (3 interleaved rounds
pooled, as CI runs it). Per category it reports the largest and 95th-percentile CI excursion from 1 (the band must
be wider for an A/A run to stay SAME), the largest |ratio - 1|, the largest absolute change of the median in
microseconds and the shortest median (against the floor), and the verdicts the current defaults gave (any SLOWER
here is a false alarm).

Writes under ``--out``: the baseline, each regress report (JSON), ``aa-spread.json`` and ``aa-spread.md`` (the
table for the perf log). Needs a GPU (exit 2 without one).

    python scripts/measure_aa_spread.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np


def mxbench(args: list[str], log: Path) -> int:
    done = subprocess.run([sys.executable, "-m", "mxbench", *args], capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    print(f"rc={done.returncode} mxbench {' '.join(args)}", flush=True)
    return done.returncode


def spread(reports: list[Path]) -> dict[str, dict]:
    """Per category: the A/A statistics of every matched stage of every report."""
    by_category: dict[str, list[dict]] = {}
    for report in reports:
        for s in json.loads(report.read_text())["stages"]:
            if s["ci95"] is not None:
                by_category.setdefault(s["category"], []).append(s)
    table = {}
    for category, stages in sorted(by_category.items()):
        excursion = np.array([max(abs(s["ci95"][0] - 1), abs(s["ci95"][1] - 1)) for s in stages])
        table[category] = {
            "stages": len(stages),
            "max_ci_excursion_pct": 100 * float(excursion.max()),
            "p95_ci_excursion_pct": 100 * float(np.percentile(excursion, 95)),
            "max_abs_ratio_change_pct": 100 * max(abs(s["ratio"] - 1) for s in stages),
            "max_abs_change_us": max(abs(s["new_median_us"] - s["base_median_us"]) for s in stages),
            "min_median_us": min(s["base_median_us"] for s in stages),
            "verdicts": {v: sum(s["verdict"] == v for s in stages) for v in sorted({s["verdict"] for s in stages})},
        }
    return table


def markdown(table: dict[str, dict], command: str) -> str:
    lines = [f"A/A spread ({command}); excursion = max(|CI bound - 1|) of ratio new/base", "",
             "| category | stages | max CI excursion | p95 CI excursion | max abs ratio change | max abs change (us) "
             "| shortest median (us) | verdicts at the defaults |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c, t in table.items():
        verdicts = ", ".join(f"{n} {v}" for v, n in t["verdicts"].items())
        lines.append(f"| {c} | {t['stages']} | {t['max_ci_excursion_pct']:.2f}% | {t['p95_ci_excursion_pct']:.2f}% "
                     f"| {t['max_abs_ratio_change_pct']:.2f}% | {t['max_abs_change_us']:.2f} | "
                     f"{t['min_median_us']:.1f} | {verdicts} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    # the points `make baseline` / `make regress` measure, so the spread is the CI gate's own; fits one 10-minute call
    parser.add_argument("--M", default="16384,32768", help="Tokens of the baseline (comma list).")
    parser.add_argument("--preset", default="deepseek-v3")
    parser.add_argument("--recipe", default="mxfp8")
    parser.add_argument("--repeats", type=int, default=1, help="regress runs against the one baseline.")
    o = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: A/A spread is measured on a GPU")
        return 2
    o.out.mkdir(parents=True, exist_ok=True)
    base = o.out / "aa-baseline.json"
    if mxbench(["roofline", "--preset", o.preset, "--M", o.M, "--recipe", o.recipe, "--out", str(base)],
               o.out / "baseline.log"):  # fmt: skip
        return 1
    reports = []
    for i in range(o.repeats):
        report = o.out / f"aa-regress-{i}.json"
        mxbench(["regress", "--baseline", str(base), "--format", "json"], report)  # exit 1 here is a false alarm
        reports.append(report)
    table = spread(reports)
    command = f"roofline --preset {o.preset} --M {o.M} --recipe {o.recipe}, then regress x{o.repeats}"
    (o.out / "aa-spread.json").write_text(json.dumps({"command": command, "by_category": table}, indent=1))
    (o.out / "aa-spread.md").write_text(markdown(table, command))
    print(markdown(table, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
