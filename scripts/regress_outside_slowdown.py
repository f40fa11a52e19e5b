"""Does ``mxbench regress`` catch a 10% slowdown of an outside team's kernel? (issue 22's "Done when", on a GPU)

1. Builds the outside package (``tests/outside``: its git repo, installed as pip would into a site folder) and puts
   it on PYTHONPATH: its ``outside-timed`` quantize_a registers through the entry point.
2. ``mxbench roofline --impl quantize_a=outside-timed``: the baseline, which records the implementation by its
   registered name, distribution, version and commit.
3. ``mxbench regress --baseline`` twice: unchanged (expected exit 0), then with ``OUTSIDE_SLOWDOWN=0.10`` (the
   kernel quantizes another tenth of its rows: expected exit 1, quantize_a [outside-timed] SLOWER). regress must
   re-measure outside-timed, not mxkernels' quantizer, because the baseline recorded it.

Writes under ``--out``: the baseline, both regress reports (JSON) and ``summary.json`` (each command's exit code and
quantize_a's verdict and ratio). Exit 0 when both verdicts are as expected. Without a GPU it stops after checking
the implementation on the CPU (``mxbench check``), exit 2.

    python scripts/regress_outside_slowdown.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "outside"))
from site_builder import build  # noqa: E402

SHAPE = ["--K", "7168", "--N", "2048", "--G", "8"]


def mxbench(args: list[str], env: dict, log: Path) -> int:
    """Run ``mxbench args``: its stdout to ``log`` (a JSON report stays parseable), its stderr (progress lines,
    notes) beside it in ``log``.stderr."""
    done = subprocess.run([sys.executable, "-m", "mxbench", *args], env=env, capture_output=True, text=True)
    log.write_text(done.stdout)
    log.with_name(log.name + ".stderr").write_text(done.stderr)
    print(f"rc={done.returncode} mxbench {' '.join(args)}", flush=True)
    return done.returncode


def quantize_a_verdict(report: Path) -> dict:
    """The verdict of quantize_a [outside-timed] in a regress JSON report (None where there is none)."""
    try:
        stages = json.loads(report.read_text())["stages"]
    except (OSError, ValueError, KeyError):
        return {"verdict": None}
    found = [s for s in stages if s["stage"] == "quantize_a" and s["point"]["recipe"] == "mxfp8"]
    return {k: found[0][k] for k in ("verdict", "ratio", "ci95", "reason")} if found else {"verdict": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--slowdown", default="0.10", help="Fraction of extra rows the slowed kernel quantizes.")
    parser.add_argument("--rounds", default="3")
    parser.add_argument("--M", default="65536", help="Tokens of the baseline's one point (DeepSeek-V3's K, N, G).")
    o = parser.parse_args()
    o.out.mkdir(parents=True, exist_ok=True)
    site = build(o.out / "outside")["good"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    summary: dict = {"check": mxbench(["check", "--name", "outside-timed", "--stage", "quantize_a", "--K", "256",
                                       "--N", "128"], env, o.out / "check.log")}  # fmt: skip
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: checked on the CPU only; the timing steps need a GPU")
        (o.out / "summary.json").write_text(json.dumps(summary, indent=1))
        return 2
    base = o.out / "outside-baseline.json"
    summary["baseline"] = mxbench(["roofline", *SHAPE, "--M", o.M, "--impl", "quantize_a=outside-timed", "--out", str(base)], env,
                                  o.out / "baseline.log")  # fmt: skip
    for name, slowdown in (("unchanged", "0"), ("slowed", o.slowdown)):
        report = o.out / f"regress-{name}.json"
        rc = mxbench(["regress", "--baseline", str(base), "--rounds", o.rounds, "--format", "json"],
                     {**env, "OUTSIDE_SLOWDOWN": slowdown}, report)  # fmt: skip
        summary[name] = {"rc": rc, "slowdown": float(slowdown), "quantize_a": quantize_a_verdict(report)}
    summary["baseline_implementations"] = json.loads(base.read_text())["meta"].get("implementations", {})
    (o.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    ok = summary["unchanged"]["rc"] == 0 and summary["slowed"]["rc"] == 1
    return 0 if ok and summary["slowed"]["quantize_a"]["verdict"] == "SLOWER" else 1


if __name__ == "__main__":
    sys.exit(main())
