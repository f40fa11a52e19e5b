"""The router's gate backward (stage ``router_gate_grad``) at the layers' shapes: the token gradient as
``torch.addmm`` (what the stage ran before) against ours (``moe.gate_grad.token_grad``, a few launches), the weight
gradient (``torch.mm``), and the whole stage old (addmm + mm) against new (``router.router_gate_grad``), in us and
as a share of the copy roof measured first (declared bytes: ``token_grad_cost``, ``router_gate_grad_cost``); ours
against addmm in bits (share of equal elements) and both against an fp64 oracle (SQNR).

    python scripts/tune_router_grad.py --out $OUT/tune_router_grad.json     # ~30 s on an H200
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
# The default launch first, then neighbours: narrower column slices (wr's slice at E = 128 is 32 KiB), twice the
# programs (more row blocks in flight an SM: Triton issues no async copies here, SM90 cross-compile), taller rows.
CONFIGS = {"default": GR.DEFAULT_CONFIG, "k64": GR.TokenGradConfig(block_k=64),
           "x2": GR.TokenGradConfig(programs_per_sm=2),
           "t128w8": GR.TokenGradConfig(block_t=128, num_warps=8)}  # fmt: skip


def _sqnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (10 * torch.log10(ref.pow(2).sum() / (x.double() - ref).pow(2).sum())).item()


def main() -> int:
    session = start("tune_router_grad", __doc__.splitlines()[0], "all", "layers, comma list, or all", 1 << 14, 1 << 14)
    only = list(LAYERS) if session.args.only == "all" else session.args.only.split(",")
    rows = []
    us = lambda fn: time_fn(fn, samples=session.args.samples, warmup=2, target_replay_ms=10.0).median_us
    pct = lambda nbytes, t: 100 * nbytes / t / 1e6 / session.roof
    print(f"copy roof {session.roof:.2f} TB/s")
    print("layer            addmm us (% roof)  " + "  ".join(f"{n:>8s}" for n in CONFIGS)
          + "  best (% roof)  mm us  stage old -> new us (% roof)  bits = addmm  SQNR ours / addmm")  # fmt: skip
    for name in only:
        T, E, K = LAYERS[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        rand = lambda *shape, s=1.0: (torch.randn(*shape, device="cuda", generator=gen) * s).bfloat16()
        g, x, wr, other = rand(T, E, s=1e-3), rand(T, K), rand(E, K, s=0.02), rand(T, K, s=1e-5)
        ref = g.double() @ wr.double() + other.double()
        addmm_us = us(lambda: torch.addmm(other, g, wr))
        ours = {n: us(lambda c=c: GR.token_grad(g, wr, other, config=c)) for n, c in CONFIGS.items()}
        best = min(ours, key=ours.get)
        mm_us = us(lambda: torch.mm(g.t(), x))
        old_us = us(lambda: (torch.addmm(other, g, wr), torch.mm(g.t(), x)))
        new_us = us(lambda: router.router_gate_grad(g, x, wr, other))
        tok_bytes = GR.token_grad_cost(T, K, E, add=True).bytes
        stage_bytes = router.router_gate_grad_cost(T, K, E, 1).bytes
        mine, theirs = GR.token_grad(g, wr, other), torch.addmm(other, g, wr)
        row = {"layer": name, "T": T, "E": E, "K": K, "addmm_us": addmm_us, "token_grad_us": ours, "best": best,
               "mm_us": mm_us, "stage_old_us": old_us, "stage_new_us": new_us,
               "token_grad_pct_roof": pct(tok_bytes, ours["default"]), "addmm_pct_roof": pct(tok_bytes, addmm_us),
               "stage_new_pct_roof": pct(stage_bytes, new_us),
               "bits_equal_addmm": (mine == theirs).double().mean().item(),
               "sqnr_ours_db": _sqnr(mine, ref), "sqnr_addmm_db": _sqnr(theirs, ref)}  # fmt: skip
        rows.append(row)
        print(f"{name:16s} {addmm_us:8.1f} ({row['addmm_pct_roof']:3.0f}%)  "
              + "  ".join(f"{t:8.1f}" for t in ours.values())
              + f"  {best:>6s} ({pct(tok_bytes, ours[best]):3.0f}%) {mm_us:6.1f}  {old_us:8.1f} -> {new_us:8.1f} "
              f"({row['stage_new_pct_roof']:3.0f}%)    {row['bits_equal_addmm']:6.4f}    "
              f"{row['sqnr_ours_db']:.1f} / {row['sqnr_addmm_db']:.1f} dB", flush=True)  # fmt: skip
        del g, x, wr, other, ref, mine, theirs
        torch.cuda.empty_cache()
    session.finish("tune_router_grad", rows, [], {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
