"""A/B of the layer's forward + backward with the forward's weight stages on a second stream (``moe_layer``'s
``overlap_weights``, the default) against the same stages in order, on one GPU in one process, rounds interleaved
(in order, overlapped, overlapped, in order, ...) so that clock and thermal drift falls on both.

    python scripts/ab_layer_overlap.py [--only qwen3-30b-a3b,...] [--rounds 4] [--recipe fp8_rowwise]
        [--wgrad bf16] [--shared-experts N]

Per preset (``mxbench layer --preset`` with ``--fuse``, balanced routing): y and every gradient compared for the
same bits both ways first, then each side's median of its rounds' medians (``time_fn``: cold-L2 graph replays of
the whole forward + backward, as ``mxbench layer`` times its step) and overlapped / in order. JSON to ``--out``;
exit 1 if any output differs.
"""

from __future__ import annotations

import statistics
import sys

# tuning first: it makes mxkernels and mxbench importable from a checkout where they are not installed.
# isort: off
from tuning import start

import torch
from mxkernels.autograd.layer import layer_inputs, moe_layer
from mxkernels.stages.layer import layer_stages
from mxbench.instruments.timing import time_fn
from mxbench.workloads.layer.command import _shape

# isort: on


def _add_arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=4, help="in-order / overlapped pairs per preset")
    parser.add_argument("--recipe", default="fp8_rowwise")
    parser.add_argument("--wgrad", default="bf16", help="recipe or bf16 (the layer's --wgrad)")
    parser.add_argument("--shared-experts", type=int, default=None, help="the preset's unless given")


def _step(shape, stages, inputs, overlap: bool):
    x = inputs["x"].detach().clone().requires_grad_()
    weights = {n: inputs[n].detach().clone().requires_grad_() for n in shape.weights}

    def step():
        y = moe_layer(x, weights, shape, assign=inputs.get("assign"), shared_offs=inputs.get("shared_offs"),
                      stages=stages, overlap_weights=overlap)  # fmt: skip
        return (y, *torch.autograd.grad(y, [x, *weights.values()], inputs["dy"]))

    return step


def main() -> int:
    session = start("ab_layer_overlap", __doc__.splitlines()[0], "qwen3-30b-a3b,deepseek-v2-lite",
                    "layer presets, comma list", 1 << 14, 1 << 14, _add_arguments)  # fmt: skip
    args = session.args
    rows = []
    for preset in args.only.split(","):
        shape, _ = _shape(None, None, preset, None, None, None, args.shared_experts, None, False, False, "balanced",
                          False)  # fmt: skip
        stages = layer_stages(args.recipe, shape, fuse=True, wgrad=args.wgrad)
        inputs = layer_inputs(shape, device="cuda", seed=0)
        calls = {"in_order": _step(shape, stages, inputs, False), "overlapped": _step(shape, stages, inputs, True)}
        outs = {name: [t.clone() for t in call()] for name, call in calls.items()}
        same = all(torch.equal(a, b) for a, b in zip(outs["in_order"], outs["overlapped"], strict=True))
        del outs
        if not same:
            print(f"{preset}: the overlapped layer's outputs differ", flush=True)
        medians = {"in_order": [], "overlapped": []}
        for round_ in range(args.rounds):
            for name in ("in_order", "overlapped") if round_ % 2 == 0 else ("overlapped", "in_order"):
                medians[name].append(time_fn(calls[name], samples=args.samples).median_us)
        a, b = statistics.median(medians["in_order"]), statistics.median(medians["overlapped"])
        weights = [s.name for s in stages if s.pass_name == "forward" and s.weights_only]
        rows.append({"preset": preset, "recipe": args.recipe, "wgrad": args.wgrad, "shared_experts": shape.shared,
                     "same_bits": same, "in_order_us": a, "overlapped_us": b, "overlapped_over_in_order": b / a,
                     "in_order_rounds_us": medians["in_order"], "overlapped_rounds_us": medians["overlapped"],
                     "side_stages": weights})  # fmt: skip
        print(f"{preset:18s} in order {a:9.1f} us  overlapped {b:9.1f} us  ratio {b / a:.3f}  "
              f"(side: {', '.join(weights)}){'' if same else '  OUTPUTS DIFFER'}", flush=True)
        del calls, inputs
        torch.cuda.empty_cache()
    session.finish("ab_layer_overlap", rows, [], {"rounds": args.rounds})
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
