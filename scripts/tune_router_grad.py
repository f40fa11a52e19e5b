"""The router's gate backward (stage ``router_gate_grad``) at the layers' shapes: its weight gradient as one library
GEMM (``torch.mm(grad_logits.t(), x)``, what the stage ran before) against ours split along the tokens
(``moe.gate_grad.gate_weight_grad``), the token gradient (``torch.addmm``) alone, and the whole stage, each in us and
as a share of the copy roof measured first (declared bytes: ``gate_weight_grad_cost``, ``router_gate_grad_cost``).

    python scripts/tune_router_grad.py --out $OUT/tune_router_grad.json     # ~20 s on an H200
"""

from __future__ import annotations

import sys

# tuning first: it makes mxkernels and mxbench importable from a checkout where they are not installed.
# isort: off
from tuning import start

import torch
from mxkernels.moe import gate_grad as GR
from mxkernels.moe import router
from mxbench.instruments.timing import time_fn

# isort: on

# model: (T tokens, E experts the router scores, K model width) of the layer presets (gpt-oss-120b: issue 32's layer).
LAYERS = {"deepseek-v3": (131072, 8, 7168), "llama4-scout": (131072, 8, 5120), "qwen3-30b-a3b": (16384, 128, 2048),
          "deepseek-v2-lite": (16384, 64, 2048), "gpt-oss-120b": (32768, 128, 2880)}  # fmt: skip


def _sqnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (10 * torch.log10(ref.pow(2).sum() / (x.double() - ref).pow(2).sum())).item()


def main() -> int:
    session = start("tune_router_grad", __doc__.splitlines()[0], "all", "layers, comma list, or all", 1 << 14, 1 << 14)
    only = list(LAYERS) if session.args.only == "all" else session.args.only.split(",")
    rows = []
    us = lambda fn: time_fn(fn, samples=session.args.samples, warmup=2, target_replay_ms=10.0).median_us
    print(f"copy roof {session.roof:.2f} TB/s")
    print("layer             mm us  ours us  speedup  ours TB/s (% roof)  addmm us  stage us (% roof)  SQNR ours / mm")
    for name in only:
        T, E, K = LAYERS[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        rand = lambda *shape, s=1.0: (torch.randn(*shape, device="cuda", generator=gen) * s).bfloat16()
        g, x, wr, other = rand(T, E, s=1e-3), rand(T, K), rand(E, K, s=0.02), rand(T, K, s=1e-3)
        ref = g.double().t() @ x.double()
        mm_us = us(lambda: torch.mm(g.t(), x))
        ours_us = us(lambda: GR.gate_weight_grad(g, x))
        addmm_us = us(lambda: torch.addmm(other, g, wr))
        stage_us = us(lambda: router.router_gate_grad(g, x, wr, other))
        ours_bytes = GR.gate_weight_grad_cost(T, K, E).bytes
        stage_bytes = router.router_gate_grad_cost(T, K, E, 1).bytes
        row = {"layer": name, "T": T, "E": E, "K": K, "mm_us": mm_us, "ours_us": ours_us, "addmm_us": addmm_us,
               "stage_us": stage_us, "ours_tbps": ours_bytes / ours_us / 1e6, "stage_tbps": stage_bytes / stage_us / 1e6,
               "sqnr_ours_db": _sqnr(GR.gate_weight_grad(g, x), ref), "sqnr_mm_db": _sqnr(torch.mm(g.t(), x), ref)}  # fmt: skip
        rows.append(row)
        pct = lambda tbps: 100 * tbps / session.roof
        print(f"{name:16s} {mm_us:7.1f} {ours_us:8.1f} {mm_us / ours_us:7.2f}x {row['ours_tbps']:6.2f} ({pct(row['ours_tbps']):3.0f}%)"
              f"       {addmm_us:8.1f} {stage_us:8.1f} ({pct(row['stage_tbps']):3.0f}%)    "
              f"{row['sqnr_ours_db']:.1f} / {row['sqnr_mm_db']:.1f} dB", flush=True)  # fmt: skip
        del g, x, wr, other, ref
        torch.cuda.empty_cache()
    session.finish("tune_router_grad", rows, [], {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
