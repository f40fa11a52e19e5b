"""The FP8 (or MXFP8) step with several GEMM backends, in one invocation against one bf16 baseline.

    python scripts/step_backends.py --preset deepseek-v3 --M 131072 --recipe fp8_rowwise \\
        --backends native,triton_ws --fuse-scales --samples 10 --out-dir $OUT/results

Each bf16 point is measured once; each recipe point once per backend (``mxbench.workloads.step.backends``). Writes
``<out-dir>/roofline-<preset>-<recipe>-<backend>.json`` per backend, the same bf16 records in each, and prints the
fwd+bwd of each backend over bf16 and over the first backend. ``mxbench table A B --kind speedup`` renders them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "kernels")]

# isort: off
import torch
from mxkernels.core.names import END_TO_END_STAGE

from mxbench.clikit.common import detected_spec
from mxbench.instruments.kit import Instruments
from mxbench.measuring.stages import SweepOptions
from mxbench.plan.points import plan_points
from mxbench.plan.presets import get_preset
from mxbench.workloads.step.backends import compare_backends, save_backends

# isort: on


def _e2e(run, recipe: str) -> dict:
    """(M, fused scales) -> median fwd+bwd (us) of ``recipe``'s points."""
    return {(r.point.M, r.point.fuse_scales): r.median_us for r in run.records
            if r.stage == END_TO_END_STAGE and r.point.recipe == recipe and r.median_us}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", required=True)
    p.add_argument("--M", type=int, nargs="+", default=[131072])
    p.add_argument("--recipe", default="fp8_rowwise")
    p.add_argument("--backends", default="native,triton_ws", help="comma list, two or more")
    p.add_argument("--fuse-scales", action="store_true")
    p.add_argument("--fused-only", action="store_true",
                   help="with --fuse-scales, only the fused-scales points beside bf16 (one device call fits them)")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--denominator", default="measured")
    p.add_argument("--out-dir", type=Path, required=True)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_backends.py times on a CUDA GPU")
    backends = [b for b in a.backends.split(",") if b]
    shape = get_preset(a.preset)
    points = plan_points(a.M, shape.N, shape.K, shape.G, [a.recipe], fuse_scales=a.fuse_scales)
    if a.fused_only:
        points = [p for p in points if p.fuse_scales]  # compare_backends adds the bf16 baselines
    # The card's own spec, as `roofline` and `peers` take it (SweepOptions' default prices the B200 model).
    options = SweepOptions(samples=a.samples, denominator=a.denominator, command=" ".join(sys.argv),
                           hardware=detected_spec())
    runs = compare_backends(points, backends, options=options, instruments=Instruments.real())
    for path in save_backends(runs, a.out_dir, f"roofline-{a.preset}-{a.recipe}"):
        print(f"results: {path}")
    first = backends[0]
    bf16 = _e2e(runs[first], "bf16")
    for backend, run in runs.items():
        for (M, fused), us in sorted(_e2e(run, a.recipe).items()):
            base, ref = bf16.get((M, False)), _e2e(runs[first], a.recipe).get((M, fused))
            print(f"M={M} fused={fused} {backend}: {us:.1f} us, {base / us:.3f}x bf16 ({base:.1f} us), "
                  f"{ref / us:.3f}x {first}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
