"""Tune the MoE layer's fused stages (``mxkernels.moe.moe_fused``) against the chains they replace, on a CUDA GPU.

    python scripts/tune_layer_fused.py [--budget-s 240] [--samples 10] [--only gather,swiglu,swiglu_bwd]

At DeepSeek-V3 and Llama 4 Scout layer shapes (131072 routed rows of 8 experts, padded as the layer pads them; K
7168 / 5120, N 2048 / 8192), for each fused call (the gather, SwiGLU and SwiGLU's backward fused with the MXFP8
blocked quantizer and with the FP8 rowwise quantizer with column amax): the chain (the producer's kernel, then the
quantizer, both at their defaults) is timed first, then each candidate launch config of the fused call, whose
outputs are first checked bit-identical to the chain's. One line per (call, shape, config): median us, TB/s over
the call's declared cost, % of the copy roof measured first, and the ratio to the chain. Every number goes to
``$OUT/tune_layer_fused.json``.
"""

from __future__ import annotations

import time
import traceback

import torch
from mxkernels.quant import fp8_amax
from mxkernels.moe import moe_fused
from mxkernels.moe import moe_rows
from mxkernels.quant import quantize_blocked
from mxkernels.moe import swiglu
from mxkernels.quant.fp8_amax import AmaxRowsConfig
from mxkernels.layouts.padding import padded_rows
from mxkernels.quant.quantize import RowsConfig
from tuning import start

from mxbench.instruments.timing import time_fn

COPIES, E, ALIGN = 131072, 8, 32
SHAPES = {"deepseek-v3": (7168, 2048), "llama4-scout": (5120, 8192)}
MX_CONFIGS = [None, RowsConfig((32, 512), 8), RowsConfig((16, 512), 4), RowsConfig((32, 256), 4),
              RowsConfig((8, 512), 2), RowsConfig((64, 256), 8), RowsConfig((16, 1024), 8), RowsConfig((8, 1024), 4)]
FP8_CONFIGS = [None, AmaxRowsConfig(1, 8), AmaxRowsConfig(2, 8), AmaxRowsConfig(4, 4), AmaxRowsConfig(2, 16),
               AmaxRowsConfig(3, 8, max_registers=80), AmaxRowsConfig(1, 16), AmaxRowsConfig(2, 8, block_rows=1),
               AmaxRowsConfig(4, 8, max_registers=64), AmaxRowsConfig(1, 32)]  # fmt: skip


def layout(K: int):
    """x (T, K), the padded layer's row_src / row_w (balanced top-1 routing) and slot ends, as route_tokens makes."""
    rows = padded_rows(COPIES, E, ALIGN)
    per = COPIES // E
    slot = -(-per // ALIGN) * ALIGN
    src = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    for e in range(E):
        src[e * slot : e * slot + per] = torch.arange(e, COPIES, E, device="cuda", dtype=torch.int32)
    w = torch.where(src >= 0, torch.rand(rows, device="cuda"), 0.0)
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * slot
    x = torch.randn(COPIES, K, device="cuda", dtype=torch.bfloat16)
    return x, src, w, offs, rows


def cases(only: set[str]):
    for name, (K, N) in SHAPES.items():
        x, src, w, offs, rows = layout(K)
        h = torch.randn(rows, 2 * N, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(rows, N, device="cuda", dtype=torch.bfloat16)
        h1, h3 = swiglu.split_halves(h)
        for recipe in ("mxfp8", "fp8"):
            quant = ((lambda t: quantize_blocked.quantize_dim0_blocked(t, offs)) if recipe == "mxfp8"
                     else (lambda t: fp8_amax.quantize_fp8_rowwise_with_amax(t, offs)))  # fmt: skip
            mx = recipe == "mxfp8"
            if "gather" in only:
                yield (f"gather+{recipe}", name, lambda: (moe_rows.gather_weighted(x, src, w),),
                       quant, (lambda c: moe_fused.gather_quantize_mxfp8(x, src, w, offs, config=c)) if mx
                       else (lambda c: moe_fused.gather_quantize_fp8(x, src, w, offs, config=c)),
                       (moe_fused.gather_quantize_mxfp8_cost if mx else moe_fused.gather_quantize_fp8_cost)(
                           rows, K, E, COPIES, True))  # fmt: skip
            if "swiglu" in only:
                yield (f"swiglu+{recipe}", name, lambda: (swiglu.swiglu(h1, h3),), quant,
                       (lambda c: moe_fused.swiglu_quantize_mxfp8(h1, h3, offs, config=c)) if mx
                       else (lambda c: moe_fused.swiglu_quantize_fp8(h1, h3, offs, config=c)),
                       (moe_fused.swiglu_quantize_mxfp8_cost if mx else moe_fused.swiglu_quantize_fp8_cost)(rows, N, E))
            if "swiglu_bwd" in only:
                yield (f"swiglu_bwd+{recipe}", name, lambda: swiglu.swiglu_backward(g, h1, h3, packed=True), quant,
                       (lambda c: moe_fused.swiglu_backward_quantize_mxfp8(g, h1, h3, offs, config=c)) if mx
                       else (lambda c: moe_fused.swiglu_backward_quantize_fp8(g, h1, h3, offs, config=c)),
                       (moe_fused.swiglu_backward_quantize_mxfp8_cost if mx
                        else moe_fused.swiglu_backward_quantize_fp8_cost)(rows, N, E))  # fmt: skip


def _equal(a, b, rows: int) -> bool:
    """Every output equal; the e4m3 data (second) only in the rows of a group: rows past offs[-1] are unspecified."""
    bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t
    return all(torch.equal(bits(x)[:rows] if i == 1 else bits(x), bits(y)[:rows] if i == 1 else bits(y))
               for i, (x, y) in enumerate(zip(a, b, strict=True)))  # fmt: skip


def main() -> None:
    s = start("tune_layer_fused", __doc__.splitlines()[0], "gather,swiglu,swiglu_bwd", "fused calls, comma list",
              COPIES, 7168)  # fmt: skip
    only = set(s.args.only.split(","))
    rows, skipped = [], []
    print(f"copy roof {s.roof:.3f} TB/s")
    for call, shape, producer, quant, fused, cost in cases(only):
        made = producer()[0]
        expected = (made, *quant(made))
        chain_us = (time_fn(producer, samples=s.args.samples).median_us
                    + time_fn(lambda t=made: quant(t), samples=s.args.samples).median_us)  # fmt: skip
        print(f"{call:22} {shape:13} chain {chain_us:9.1f} us")
        configs = MX_CONFIGS if call.endswith("mxfp8") else FP8_CONFIGS
        for c in configs:
            if time.monotonic() - s.t0 > s.args.budget_s:
                skipped.append((call, shape, str(c)))
                continue
            try:
                got = fused(c)
                ok = _equal(got, expected, COPIES // E * E)
                us = time_fn(lambda c=c: fused(c), samples=s.args.samples).median_us
                tbps = cost.bytes / us / 1e6
                rows.append({"call": call, "shape": shape, "config": str(c), "us": us, "tbps": tbps, "bit_exact": ok,
                             "chain_us": chain_us})  # fmt: skip
                print(f"  {str(c):78} {us:9.1f} us {tbps:5.2f} TB/s {100 * tbps / s.roof:5.1f}% "
                      f"x{chain_us / us:4.2f} of chain {'' if ok else 'NOT BIT-EXACT'}", flush=True)  # fmt: skip
            except Exception as e:
                print(f"  {str(c):78} failed: {type(e).__name__}: {str(e)[:120]}")
                traceback.print_exc(limit=1)
        del expected, made
        torch.cuda.empty_cache()
    best = {}
    for r in rows:
        key = f"{r['call']} {r['shape']}"
        if r["bit_exact"] and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    for key, r in best.items():
        print(f"best {key:36} {r['config']:78} {r['us']:9.1f} us (chain {r['chain_us']:.1f})")
    s.finish("tune_layer_fused", rows, skipped, {"best": best})


if __name__ == "__main__":
    main()
