"""A/B of the FP8 rowwise GEMM as shipped against an older version of the warp-specialized ``gemm/fp8_ws.py``, on one
GPU in one process, rounds interleaved (old, new, new, old, ...) so that clock and thermal drift falls on both.

    git show REV:kernels/mxkernels/gemm/fp8_ws.py > /tmp/fp8_ws_old.py
    python scripts/ab_fp8_gemm.py --old-file /tmp/fp8_ws_old.py [--only qwen3-layer-down,...] [--rounds 4]

The old file is loaded as a sibling module of the package (``mxkernels.gemm._ab_old``), so its relative imports
resolve. Its ``run_fp8_rowwise`` (its default launch) and the shipped dispatch (``backend=None``: the shape class's
backend and launch, what a layer runs) take the same operands (``tune_fp8_gemm``'s shapes and operands; ``--passes``,
fwd and dgrad by default) and must give the same bytes before any timing. Per shape and pass: each side's median of
its rounds' medians (``time_fn``, cold L2) and new / old. JSON to ``--out``; exit 1 if any bytes differ.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys

# tuning first: it makes mxkernels and mxbench importable from a checkout where they are not installed.
# isort: off
from tuning import start

import torch
from mxkernels.gemm import grouped_gemm as GG
from tune_fp8_gemm import MODELS, _operands
from mxbench.instruments.timing import time_fn

# isort: on


def _load_old(path: str):
    spec = importlib.util.spec_from_file_location("mxkernels.gemm._ab_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _add_arguments(parser) -> None:
    parser.add_argument("--old-file", required=True, help="an older gemm/fp8_ws.py (git show REV:path > FILE)")
    parser.add_argument("--rounds", type=int, default=4, help="old/new pairs per shape and pass")
    parser.add_argument("--passes", default="fwd,dgrad", help="comma list of fwd, dgrad, wgrad")


def main() -> int:
    session = start("ab_fp8_gemm", __doc__.splitlines()[0], "qwen3-layer-down,qwen3-layer-up,v2-lite-layer-up",
                    "models of tune_fp8_gemm, comma list", 1 << 14, 1 << 14, _add_arguments)  # fmt: skip
    args = session.args
    old_ws = _load_old(args.old_file)
    rows, skipped = [], []
    for model in args.only.split(","):
        K, N, G, M = MODELS[model]
        for pass_ in args.passes.split(","):
            (a_q, sa, b_q, sb), offs = _operands(pass_, K, N, [M // G] * G, seed=0)
            ops = (a_q, sa, b_q, sb, offs)
            calls = {"old": lambda o=ops: old_ws.run_fp8_rowwise(*o, torch.bfloat16),
                     "new": lambda o=ops: GG.fp8_rowwise_scaled_grouped_mm(*o, out_dtype=torch.bfloat16)}  # fmt: skip
            same = torch.equal(calls["old"]().view(torch.int16), calls["new"]().view(torch.int16))
            if not same:
                print(f"{model} {pass_}: old and new outputs differ", flush=True)
            medians = {"old": [], "new": []}
            for round_ in range(args.rounds):  # ABBA: each version goes first in every other round
                for name in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
                    medians[name].append(time_fn(calls[name], samples=args.samples).median_us)
            old, new = statistics.median(medians["old"]), statistics.median(medians["new"])
            flops = 2 * M * N * K
            rows.append({"model": model, "pass": pass_, "M": M, "N": N, "K": K, "G": G, "same_bytes": same,
                         "old_us": old, "new_us": new, "new_over_old": new / old, "old_rounds_us": medians["old"],
                         "new_rounds_us": medians["new"], "new_tflops": flops / new / 1e6})  # fmt: skip
            print(f"{model:18s} {pass_:5s} old {old:8.1f} us  new {new:8.1f} us  new/old {new / old:.3f}  "
                  f"({flops / new / 1e6:.0f} TFLOP/s){'' if same else '  BYTES DIFFER'}", flush=True)
    session.finish("ab_fp8_gemm", rows, skipped, {"old_file": args.old_file, "rounds": args.rounds})
    return 0 if all(r["same_bytes"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
