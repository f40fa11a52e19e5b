"""Tune the MoE layer's fused stages (``mxkernels.moe.moe_fused``) against the chains they replace, on a CUDA GPU.

    python scripts/tune_layer_fused.py [--budget-s 240] [--samples 10] [--only gather,gather_w,swiglu,swiglu_bwd]
        [--shapes qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-120b,deepseek-v3] [--recipes fp8,fp8_alone,mxfp8]

At each shape's layer (``SHAPES``: the fine-grained models' routed rows of all their experts, top-k copies of each
token, balanced, padded as the layer pads them; DeepSeek-V3 and Llama 4 Scout as the coarse controls), for each
fused call (the gather, SwiGLU and SwiGLU's backward fused with the MXFP8 blocked quantizer and with the FP8 rowwise
quantizer with column amax; ``fp8_alone``: without the table, as a layer with bf16 weight gradients runs them, against
the plain rows quantizer's chain): the chain (the producer's kernel, then the quantizer, both at their defaults) is timed
first, then each candidate launch config of the fused call, whose outputs are first checked bit-identical to the
chain's. One line per (call, shape, config): median us, TB/s over the call's declared cost, % of the roof measured
first (the bf16 -> fp8 cast: a fused call writes less than it reads), and the ratio to the chain. Every number goes
to ``--out`` (default ``$OUT/tune_layer_fused.json``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback

import torch
from mxkernels.layouts.padding import padded_rows
from mxkernels.moe import moe_fused, moe_rows, swiglu
from mxkernels.quant import fp8_amax, fp8_rowwise, quantize_blocked
from mxkernels.quant.fp8_amax import AmaxRowsConfig
from mxkernels.quant.quantize import RowsConfig
from tuning import start

from mxbench.instruments.timing import time_fn

ALIGN = 32
# name: (K, N, experts, top_k, tokens), the presets' [layer] sections (mxbench/data/shapes); the coarse controls as
# the first tuning run laid them out: 131072 tokens, top-1 over 8 experts.
SHAPES = {
    "qwen3-30b-a3b": (2048, 768, 128, 8, 16384),
    "deepseek-v2-lite": (2048, 1408, 64, 6, 16384),
    "gpt-oss-120b": (2880, 2880, 128, 4, 32768),
    "deepseek-v3": (7168, 2048, 8, 1, 131072),
    "llama4-scout": (5120, 8192, 8, 1, 131072),
}
MX_CONFIGS = [None, RowsConfig((32, 256), 4), RowsConfig((8, 512), 2), RowsConfig((16, 256), 2),
              RowsConfig((4, 512), 1), RowsConfig((8, 256), 1), RowsConfig((4, 1024), 2)]  # fmt: skip
R = AmaxRowsConfig
# FP8 rowwise: the H100's picks (1/SM w32, 2/SM w8, 2/SM w8 one row a step), and for rows of 768-2880 elements
# more programs an SM: a program holds BLOCK_R rows (8192 elements by default) and nothing else is in flight while
# it reduces and stores. (Taller steps, 2-warp programs and register caps lost everywhere in the first sweep.)
FP8_CONFIGS = [None, R(1, 32), R(2, 8), R(2, 8, block_rows=1), R(4, 8), R(4, 4), R(8, 4), R(1, 16),
               # Many small programs, as the plain rows quantizer launches (one 4-row tile a program, ~90% of the
               # datasheet at 2048-wide rows): a tile of 1-2 rows keeps ~16 elements a thread, so registers allow
               # 8-16 programs an SM for the hardware to overlap; each folds its columns once per group it meets.
               R(16, 4, block_rows=1), R(16, 4, block_rows=2), R(16, 8, block_rows=2), R(32, 4, block_rows=1),
               R(8, 8, block_rows=2), R(32, 8, block_rows=1)]  # fmt: skip
# Without the table nothing is folded per program: as many small programs as registers allow (16 4-warp programs fill
# an SM's 2048 threads; more make later waves), the plain rows quantizer's 4-row tiles, and the wide rows' launch.
FP8_ALONE_CONFIGS = [None, R(16, 4, block_rows=1), R(64, 4, block_rows=1), R(16, 4, block_rows=2), R(64, 4, block_rows=2),
                     R(16, 8, block_rows=4), R(64, 8, block_rows=4), R(32, 2, block_rows=1), R(8, 8, block_rows=1),
                     R(2, 8)]  # fmt: skip
# MXFP8 over whole rows (moe_fused.WholeRowsConfig: rows a step x warps, walking a 128-row scale block or not): the
# SwiGLU backward in the halves lane order, the gather and SwiGLU forward in the plain one.
MX_WHOLE_CONFIGS = [*(moe_fused.WholeRowsConfig(r, w) for r, w in ((1, 4), (1, 8), (2, 4), (2, 8), (4, 8), (1, 2), (4, 4))),
                    *(moe_fused.WholeRowsConfig(r, w, walk=False) for r, w in ((1, 4), (1, 2)))]  # fmt: skip
CONFIGS = {"fp8": FP8_CONFIGS, "fp8_alone": FP8_ALONE_CONFIGS, "mxfp8": MX_CONFIGS}




def layout(K: int, E: int, top_k: int, tokens: int):
    """x (tokens, K) and the padded layer's row_src / row_w / slot ends: copy c is token c // top_k routed to expert
    c % E (top_k distinct experts a token, every expert tokens * top_k / E copies), grouped by expert in slots of
    ALIGN-rounded size, as route_tokens lays them out."""
    copies = tokens * top_k
    rows = padded_rows(copies, E, ALIGN)
    per = copies // E
    slot = -(-per // ALIGN) * ALIGN
    c = torch.arange(copies, device="cuda", dtype=torch.int64)
    order = torch.argsort(c % E, stable=True)
    src = torch.full((rows,), -1, dtype=torch.int32, device="cuda")
    dest = (torch.arange(copies, device="cuda") // per) * slot + torch.arange(copies, device="cuda") % per
    src[dest] = (order // top_k).to(torch.int32)
    w = torch.where(src >= 0, torch.rand(rows, device="cuda"), 0.0)
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * slot
    x = torch.randn(tokens, K, device="cuda", dtype=torch.bfloat16)
    return x, src, w, offs, rows, copies


RECIPES = ("fp8", "fp8_alone", "mxfp8")


def _recipe_cases(recipe: str, only: set[str], name: str, t: dict) -> list[tuple]:
    """One recipe's fused calls at one shape, over the tensors ``t`` (``_shape_tensors``)."""
    x, src, w, g, h1, h3 = (t[k] for k in ("x", "src", "w", "g", "h1", "h3"))
    rows, K, N = t["rows"], t["K"], t["N"]
    alone = recipe == "fp8_alone"  # no column amax table: no offs, the plain rows quantizer's chain
    offs, E = (None, 0) if alone else (t["offs"], t["E"])
    kernel = "fp8" if alone else recipe
    fn = lambda call: getattr(moe_fused, f"{call}_quantize_{kernel}")
    cost = lambda call: getattr(moe_fused, f"{call}_quantize_{kernel}_cost")

    def quant(made):
        if recipe == "mxfp8":
            return quantize_blocked.quantize_dim0_blocked(made, offs)
        return fp8_rowwise.quantize_fp8_rowwise(made) if alone else fp8_amax.quantize_fp8_rowwise_with_amax(made, offs)

    launches = CONFIGS[recipe]
    mx_whole = MX_WHOLE_CONFIGS if recipe == "mxfp8" else []
    out = []
    if "gather" in only:  # unweighted: the combine's backward when the scores go first (the layer's default)
        out.append((f"gather+{recipe}", name, lambda: (moe_rows.gather_weighted(x, src),), quant,
                    lambda c: fn("gather")(x, src, None, offs, config=c),
                    cost("gather")(rows, K, E, t["copies"], False, sources=t["tokens"]), launches + mx_whole))  # fmt: skip
    if "gather_w" in only:  # weighted: the permute when the scores go first
        out.append((f"gather_w+{recipe}", name, lambda: (moe_rows.gather_weighted(x, src, w),), quant,
                    lambda c: fn("gather")(x, src, w, offs, config=c),
                    cost("gather")(rows, K, E, t["copies"], True, sources=t["tokens"]), launches + mx_whole))  # fmt: skip
    if "swiglu" in only:
        out.append((f"swiglu+{recipe}", name, lambda: (swiglu.swiglu(h1, h3),), quant,
                    lambda c: fn("swiglu")(h1, h3, offs, config=c), cost("swiglu")(rows, N, E),
                    launches + mx_whole))  # fmt: skip
    if "swiglu_bwd" in only:  # MXFP8's backward takes its halves launches too
        out.append((f"swiglu_bwd+{recipe}", name, lambda: swiglu.swiglu_backward(g, h1, h3, packed=True), quant,
                    lambda c: fn("swiglu_backward")(g, h1, h3, offs, config=c), cost("swiglu_backward")(rows, N, E),
                    launches + mx_whole))  # fmt: skip
    return out


def _shape_tensors(name: str) -> dict:
    K, N, E, top_k, tokens = SHAPES[name]
    x, src, w, offs, rows, copies = layout(K, E, top_k, tokens)
    h = torch.randn(rows, 2 * N, device="cuda", dtype=torch.bfloat16)
    h1, h3 = swiglu.split_halves(h)
    return {"x": x, "src": src, "w": w, "offs": offs, "g": torch.randn(rows, N, device="cuda", dtype=torch.bfloat16),
            "h1": h1, "h3": h3, "rows": rows, "copies": copies, "tokens": tokens, "K": K, "N": N, "E": E}  # fmt: skip


def cases(only: set[str], shapes: list[str], recipes: list[str]):
    """(call, shape, chain producer, quantizer, fused call of a config, cost, candidate launches, rows the e4m3 data
    holds) per case; one shape's tensors alive at a time."""
    for name in shapes:
        t = _shape_tensors(name)
        grouped = int(t["offs"][-1])
        for recipe in recipes:
            for case in _recipe_cases(recipe, only, name, t):
                yield (*case, grouped)
        del t
        torch.cuda.empty_cache()


def _equal(a, b, rows: int) -> bool:
    """Every output equal; the e4m3 data (second) only in the rows of a group: rows past offs[-1] are unspecified."""
    bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t
    return all(torch.equal(bits(x)[:rows] if i == 1 else bits(x), bits(y)[:rows] if i == 1 else bits(y))
               for i, (x, y) in enumerate(zip(a, b, strict=True)))  # fmt: skip


def _options(parser) -> None:
    parser.add_argument("--shapes", default="qwen3-30b-a3b,deepseek-v2-lite,gpt-oss-120b,deepseek-v3",
                        help=f"comma list of {', '.join(SHAPES)}")  # fmt: skip
    parser.add_argument("--recipes", default="fp8,mxfp8", help=f"comma list of {', '.join(RECIPES)}")
    parser.add_argument("--compile-jobs", type=int, default=1,
                        help="compile every launch first in this many processes (Triton's disk cache then serves "
                             "the timed run: ~2 s of compiling a launch, hundreds of launches)")  # fmt: skip
    parser.add_argument("--warm-part", default=None, help=argparse.SUPPRESS)


def _warm(args, shapes, recipes, only) -> None:
    """Run each launch of this process's part (``--warm-part i/j``: every j-th from the i-th) once, untimed: its
    compile lands in Triton's cache for the timed run."""
    i, j = (int(v) for v in args.warm_part.split("/"))
    k = 0
    for call, shape, _producer, _quant, fused, _cost, configs, _grouped in cases(only, shapes, recipes):
        for c in configs:
            if k % j == i:
                try:
                    fused(c)
                except Exception as e:  # noqa: BLE001 (the timed run reports it)
                    print(f"warm {call} {shape} {c}: {type(e).__name__}", file=sys.stderr)
            k += 1
    torch.cuda.synchronize()


def _compile_first(jobs: int) -> None:
    """The same command in ``jobs`` processes, each warming its part; a part that fails or hangs costs its launches
    a compile in the timed run, nothing more."""
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    procs = [subprocess.Popen([*argv, "--warm-part", f"{i}/{jobs}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(jobs)]  # fmt: skip
    t0 = time.monotonic()
    for p in procs:
        try:
            p.wait(timeout=max(1.0, 240 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
    print(f"compiled in {jobs} processes: {time.monotonic() - t0:.0f} s", flush=True)


def main() -> None:
    s = start("tune_layer_fused", __doc__.splitlines()[0], "gather,gather_w,swiglu,swiglu_bwd", "fused calls, comma list",
              131072, 2048, _options, roof_dtype=torch.float8_e4m3fn)  # fmt: skip
    only = set(s.args.only.split(","))
    shapes = s.args.shapes.split(",")
    recipes = s.args.recipes.split(",")
    if unknown := [n for n in shapes if n not in SHAPES] + [r for r in recipes if r not in RECIPES]:
        raise SystemExit(f"unknown shapes or recipes: {unknown}")
    if s.args.warm_part:
        return _warm(s.args, shapes, recipes, only)
    if s.args.compile_jobs > 1:
        _compile_first(s.args.compile_jobs)
    rows, skipped = [], []
    print(f"cast roof (bf16 -> e4m3) {s.roof:.3f} TB/s")
    for call, shape, producer, quant, fused, cost, configs, grouped in cases(only, shapes, recipes):
        if time.monotonic() - s.t0 > s.args.budget_s:
            skipped.append((call, shape, "all"))
            continue
        made = producer()[0]
        expected = (made, *quant(made))
        chain_us = (time_fn(producer, samples=s.args.samples).median_us
                    + time_fn(lambda t=made, q=quant: q(t), samples=s.args.samples).median_us)  # fmt: skip
        print(f"{call:22} {shape:17} chain {chain_us:9.1f} us ({cost.bytes / 1e6:.0f} MB fused)", flush=True)
        for c in configs:
            if time.monotonic() - s.t0 > s.args.budget_s:
                skipped.append((call, shape, str(c)))
                continue
            try:
                got = fused(c)
                ok = _equal(got, expected, grouped)
                del got
                us = time_fn(lambda c=c, f=fused: f(c), samples=s.args.samples).median_us
                tbps = cost.bytes / us / 1e6
                rows.append({"call": call, "shape": shape, "config": str(c), "us": us, "tbps": tbps, "bit_exact": ok,
                             "chain_us": chain_us, "default": c is None})  # fmt: skip
                print(f"  {c!s:78} {us:9.1f} us {tbps:5.2f} TB/s {100 * tbps / s.roof:5.1f}% "
                      f"x{chain_us / us:4.2f} of chain {'' if ok else 'NOT BIT-EXACT'}", flush=True)  # fmt: skip
            except Exception as e:  # noqa: BLE001 (a failing launch is printed and skipped)
                print(f"  {c!s:78} failed: {type(e).__name__}: {str(e)[:120]}")
                traceback.print_exc(limit=1)
        del expected, made
        torch.cuda.empty_cache()
    best = {}
    for r in rows:
        key = f"{r['call']} {r['shape']}"
        if r["bit_exact"] and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    for key, r in best.items():
        print(f"best {key:40} {r['config']:78} {r['us']:9.1f} us (chain {r['chain_us']:.1f})")
    s.finish("tune_layer_fused", rows, skipped, {"best": best})


if __name__ == "__main__":
    main()
