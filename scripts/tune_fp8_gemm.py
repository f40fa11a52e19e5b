"""Our FP8 rowwise grouped GEMMs ("triton_ws", ``gemm_fp8_ws``; "triton", ``gemm_fp8_rowwise``) against torch's
``_scaled_grouped_mm`` ("native").

    python scripts/tune_fp8_gemm.py --out $OUT/tune_fp8_gemm.json      # ~2 minutes on an H100
    python scripts/tune_fp8_gemm.py --quick --out $OUT/q.json          # the shipped dispatch vs torch's and bf16
    python scripts/tune_fp8_gemm.py --table RUN.json [RUN.json ...]    # markdown: our shipped default (and best) vs torch's
    python scripts/tune_fp8_gemm.py --only-deepgemm --out $OUT/tune_fp8_gemm-deepgemm.json  # the DeepGEMM peer
    python scripts/tune_fp8_gemm.py --only-deepgemm --deepgemm-passes wgrad --out $OUT/...     # its wgrad kernel

For each model (DeepSeek-V3: K 7168, N 2048; Llama 4 Scout: K 5120, N 8192; G = 8 balanced groups, M = 131072
tokens) and each GEMM of the FP8 rowwise step -- fwd (M, K) x (G, N, K), dgrad (M, N) x (G, K, N), wgrad (N, M) x
(K, M) -> (G, N, K) -- it times "native" (the denominator of every ratio; with and without its fast accumulation), a
dense ``torch._scaled_mm`` of the same FLOPs (rowwise scales), and each candidate of ours (``CANDIDATES``: backend
"triton" with an ``Fp8Config``, "triton_ws" with a ``WsConfig``; ``--quick``: the shipped dispatch, ``backend=None``,
whose shape class picks the kernel (``gemm/shape_classes.py``), beside bf16 ``_grouped_mm`` and the two kernels the
classes choose between, with a summary table last). Each candidate is first checked against "emulated" on a small ragged case with an empty group (SQNR
in dB), then at the full size against "native" (SQNR in dB; inf: torch's outputs bit for bit): under
``MIN_SQNR_DB``, an empty group's output not all zeros, or an exception, it is reported and skipped. Every time is
``mxbench.instruments.timing.time_fn`` (cold-L2 CUDA-graph replays after warm-up calls).

``--deepgemm`` adds, and ``--only-deepgemm`` times alone (beside torch's kernel and the dense ``_scaled_mm``, the
ratios' denominators), DeepGEMM's grouped FP8 GEMM (backend "deepgemm", fwd and dgrad: ``scripts/peers/deepgemm.py``)
in its own recipe -- 1x128 activation and 128x128 weight scales, which the table marks -- first checked against that
recipe's reference; ``--deepgemm-passes wgrad`` its k-grouped wgrad GEMM (1x128 scales on both operands, so marked).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback

# tuning first: it makes mxkernels and mxbench importable from a checkout where they are not installed.
# isort: off
from tuning import start

import torch
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.fp8_triton import Fp8Config
from mxkernels.gemm import fp8_ws as WS
from mxkernels.gemm.ws_config import WsConfig
from mxkernels.gemm import shape_classes as SC
from mxkernels.gemm.backend import GemmCase, arch_of
from mxbench.instruments.timing import time_fn
from tune_gemm import sqnr_db
from peers import deepgemm as DG

# isort: on

# model: (K, N, G, M): the expert projection's widths, experts on the GPU and tokens routed to them (balanced). The
# fine-grained ones (#32): 128 experts of 1024 rows (gpt-oss-120b) and of 512 rows (Qwen3-30B-A3B).
# qwen3-tiny-groups: Qwen3's widths at 128 rows an expert (where 64-row tiles waste fewest rows; ws measured 3% ahead
# over fwd + dgrad on an H200, so no class of its own: gemm/shape_classes.py).
MODELS = {"deepseek-v3": (7168, 2048, 8, 131072), "llama4-scout": (5120, 8192, 8, 131072),
          "gpt-oss-120b": (2880, 2880, 128, 131072), "qwen3-30b-a3b": (2048, 768, 128, 65536),
          "qwen3-tiny-groups": (2048, 768, 128, 16384),
          # The layer's projections at its rows (one microbatch: 16384 tokens x top-8 = 1024 rows an expert; 98304
          # rows at V2-Lite's top-6): gate/up (N = 2 x the intermediate) and down (K = the intermediate).
          "qwen3-layer-up": (2048, 1536, 128, 131072), "qwen3-layer-down": (768, 2048, 128, 131072),
          "v2-lite-layer-up": (2048, 2816, 64, 98304), "v2-lite-layer-down": (1408, 2048, 64, 98304)}  # fmt: skip
MIN_SQNR_DB = 30.0
_T = (128, 256, 128)  # the tile that won the first sweep (docs/perf-log.md)
_PRECISE = [  # promotion every 128 elements, as torch's kernel: tiles whose registers leave room for two programs
    Fp8Config(64, 128, 128, num_warps=4, num_stages=4, programs_per_sm=2),
    Fp8Config(64, 128, 128, num_warps=4, num_stages=3, programs_per_sm=2),
    Fp8Config(64, 256, 128, num_warps=4, num_stages=3, programs_per_sm=1),
    Fp8Config(128, 128, 128, num_warps=8, num_stages=3, programs_per_sm=2, maxnreg=128),
    Fp8Config(128, 128, 128, num_warps=8, num_stages=4),
    Fp8Config(256, 128, 128, num_warps=8, num_stages=3),
]
_FAST = [  # the tensor core's own accumulator throughout (torch's use_fast_accum)
    Fp8Config(128, 256, 128, num_warps=8, num_stages=3, promote=None),
    Fp8Config(128, 256, 128, num_warps=8, num_stages=4, promote=None),
]
_WS = [  # the warp-specialized Gluon kernel (torch's sums): ring depth, tile order, tile width, stores
    WsConfig(),
    WsConfig(num_stages=4),
    WsConfig(group_m=16),
    WsConfig(num_stages=4, group_m=16),
    WsConfig(block_n=128, num_stages=4),
    WsConfig(block_n=128, num_stages=4, tma_store=False),
    WsConfig(block_n=128, num_stages=6),
    WsConfig(block_n=128, num_stages=6, group_m=16),
    WsConfig(block_n=128, block_k=64, num_stages=8),
]
CANDIDATES = {case: [("triton", c) for c in _PRECISE + _FAST] + [("triton_ws", c) for c in _WS] for case in GemmCase}


DISPATCH = "dispatch"  # a row of the shipped choice: ``backend=None``, the shape's class decides (shape_classes)
_CLASS_KERNELS = [("triton_ws", WsConfig()), ("triton", Fp8Config(256, 128, 128, num_warps=8, num_stages=3))]


def _candidates(quick: bool) -> dict[str, list]:
    """Per case the (backend, config) pairs to time: all of ``CANDIDATES``, or (``--quick``) the shipped dispatch
    (backend None: each shape's class) beside the two kernels the classes choose between at their measured launches
    (the warp-specialized default, the single-warpgroup 256 x 128), so that a run shows whether the table still
    picks the faster."""
    if not quick:
        return CANDIDATES
    return {case: [(DISPATCH, None), *_CLASS_KERNELS] for case in CANDIDATES}


def _add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="time the shipped dispatch (per shape class), bf16 _grouped_mm and the two class kernels")
    DG.add_arguments(parser)


PASSES = {"fwd": GemmCase.A2D_B3D, "dgrad": GemmCase.A2D_B3D, "wgrad": GemmCase.A2D_B2D}


def _operands(pass_: str, K: int, N: int, sizes: list[int], seed: int):
    """FP8 rowwise operands (a_q, a_scale, b_q, b_scale) and offs of one pass, from bf16 ``_grouped_mm`` operands."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = sum(sizes)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    rand = lambda *shape: torch.randn(*shape, device="cuda", generator=gen)
    if pass_ == "fwd":
        a, b = rand(rows, K).bfloat16(), (rand(len(sizes), N, K) * K**-0.5).bfloat16().transpose(-2, -1)
    elif pass_ == "dgrad":
        a, b = rand(rows, N).bfloat16(), (rand(len(sizes), K, N) * N**-0.5).bfloat16().transpose(-2, -1)
    else:
        a, b = (rand(rows, N) * 1e-2).bfloat16().t(), rand(rows, K).bfloat16()
    return GG._quantize_fp8_rowwise(a, b, offs), offs


def _bf16_us(pass_: str, K: int, N: int, sizes: list[int]) -> float:
    """``torch._grouped_mm`` of the pass on the bf16 operands the FP8 ones are quantized from."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, G = sum(sizes), len(sizes)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    rand = lambda *shape: torch.randn(*shape, device="cuda", generator=gen).bfloat16()
    a, b = {"fwd": lambda: (rand(rows, K), rand(G, N, K).transpose(-2, -1)),
            "dgrad": lambda: (rand(rows, N), rand(G, K, N).transpose(-2, -1)),
            "wgrad": lambda: (rand(rows, N).t(), rand(rows, K))}[pass_]()  # fmt: skip
    return _us(lambda: torch._grouped_mm(a, b, offs=offs))


def _chosen(case: GemmCase, M: int, N: int, K: int, G: int) -> str:
    """The class and kernel a ``backend=None`` call of this shape runs (kernel terms: ``grouped_gemm.choose``)."""
    picked = GG.choose("fp8_rowwise", case, M, N, K, G)
    table = SC.table_for("fp8_rowwise", arch_of(torch.cuda.get_device_capability()))
    cls = table.classify(SC.GemmShape(case, M, N, K, G)).value if table else "-"
    return f"{cls}: {picked.backend}"


def _check(pass_: str, K: int, N: int, sizes: list[int], config: Fp8Config | None, backend: str | None) -> float:
    """SQNR (dB) of ``backend`` against "emulated"; raises where an empty group's output is not all zeros."""
    ops, offs = _operands(pass_, K, N, sizes, seed=11)
    ref = GG.fp8_rowwise_scaled_grouped_mm(*ops, offs, backend="emulated")
    kwargs = {"config": config} if config is not None else {}
    out = GG.fp8_rowwise_scaled_grouped_mm(*ops, offs, backend=backend, **kwargs)
    if PASSES[pass_] is GemmCase.A2D_B2D:
        for g, size in enumerate(sizes):
            if size == 0 and bool((out[g] != 0).any()):
                raise AssertionError(f"group {g} is empty but its output is not all zeros")
        return sqnr_db(out, ref)
    return sqnr_db(out[: sum(sizes)], ref[: sum(sizes)])


_TIMING = {"samples": 8, "warmup": 2, "target_replay_ms": 20.0}  # every timing of this script (stored with its runs)


def _us(fn) -> float:
    return time_fn(fn, **_TIMING).median_us


def _dense_fp8_us(rows: int, n: int, k: int) -> float:
    """A dense ``torch._scaled_mm`` (rowwise scales, bf16 out) of (rows, k) x (k, n)."""
    a = torch.randn(rows, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa, sb = torch.ones(rows, 1, device="cuda"), torch.ones(1, n, device="cuda")
    return _us(lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))


def _best(rows: list[dict]) -> dict | None:
    timed = [r for r in rows if "us" in r]
    return min(timed, key=lambda r: r["us"]) if timed else None


def _config_label(row: dict) -> str:
    c = row["config"]
    if row["backend"] == "triton_ws":
        return "{block_m}x{block_n}x{block_k} s{num_stages} g{group_m}".format(**c) + ("" if c["tma_store"] else " st")
    return "{block_m}x{block_n}x{block_k} w{num_warps} s{num_stages} x{programs_per_sm}".format(**c)


def _bits(row: dict | None) -> str:
    """How the candidate's full-size outputs compare with torch's: "equal" (bit for bit), else the SQNR against them."""
    if row is None or "sqnr_vs_native_db" not in row:
        return "-"
    return "equal" if row["sqnr_vs_native_db"] == float("inf") else f"{row['sqnr_vs_native_db']:.0f} dB"


def _shipped(rows: list[dict], case: GemmCase) -> dict | None:
    """The warp-specialized row that ran the config a call without one gets today (``fp8_ws.default_config``: what
    the fp8_rowwise recipe's SM90 default backend runs), or None when the run did not time it. A stored config is
    compared on the fields it has (runs before a field existed lack it)."""
    shipped = dataclasses.asdict(WS.default_config(case))
    for r in rows:
        if r["backend"] == "triton_ws" and "us" in r and all(shipped.get(k) == v for k, v in r["config"].items()):
            return r
    return None


def table(paths: list[str]) -> str:
    """Markdown of stored runs: per model and pass, torch's kernel (default and fast accumulation), the dense
    ``_scaled_mm`` of the same FLOPs, and ours with TFLOP/s: the warp-specialized kernel ("triton_ws", torch's sums)
    in its shipped default config -- the headline, what a user of the recipe gets -- and, labelled beside it, the
    fastest of the warp-specialized candidates the run timed; the single-warpgroup kernel's fastest with torch's sums
    (promotion every 128 elements) and without (fast: the tensor core's accumulator throughout); ratios to torch's
    kernel of the same accumulation.
    Where a run holds DeepGEMM rows, two more columns: its TFLOP/s (its own recipe, so marked) and ratio to torch's
    default of the same run; without any, the table is what it was before the peer."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    peer = any(r["backend"] == DG.BACKEND for run in runs for r in run["rows"])
    head = ["card", "model", "pass", "torch", "torch fast acc", "dense _scaled_mm", "ours, shipped default (config)",
            "default / torch", "default / dense", "default vs torch's bits", "ours, best ws candidate (config)",
            "best / torch", "ours, one warpgroup (config)", "ours, fast (config)", "fast / torch fast"]  # fmt: skip
    head += DG.header_cells() if peer else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        rows = run["rows"]
        for model, pass_ in dict.fromkeys((r["model"], r["pass"]) for r in rows):
            mine = [r for r in rows if r["model"] == model and r["pass"] == pass_]
            by = {r["backend"]: r for r in mine if r["backend"] in ("native", "native_fast_accum", "dense_scaled_mm")}
            if "native_fast_accum" not in by:
                continue  # runs before both accumulations were timed
            single = [r for r in mine if r["backend"] == "triton"]
            shipped = _shipped(mine, PASSES[pass_])
            ws = _best([r for r in mine if r["backend"] == "triton_ws"])
            precise = _best([r for r in single if r["config"]["promote"] is not None])
            fast = _best([r for r in single if r["config"]["promote"] is None])
            tf = lambda r: f"{r['tflops']:.0f}" if r else "-"
            mark = lambda r: f"{tf(r)} ({_config_label(r)})" if r else "-"
            ratio = lambda r, base: f"{base['us'] / r['us']:.2f}x" if r else "-"
            line = (f"| {run['device']} | {model} | {pass_} | {tf(by['native'])} | {tf(by['native_fast_accum'])} | "
                    f"{tf(by['dense_scaled_mm'])} | {mark(shipped)} | {ratio(shipped, by['native'])} | "
                    f"{ratio(shipped, by['dense_scaled_mm'])} | {_bits(shipped)} | {mark(ws)} | "
                    f"{ratio(ws, by['native'])} | {mark(precise)} | {mark(fast)} | "
                    f"{ratio(fast, by['native_fast_accum'])} |")  # fmt: skip
            lines.append(line + "".join(f" {c} |" for c in DG.cells(mine, by["native"])) if peer else line)
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--table":
        print(table(sys.argv[2:]))
        return 0
    session = start("tune_fp8_gemm", __doc__.splitlines()[0], "all", "models, comma list, or all", 1 << 14, 1 << 14,
                    _add_arguments)  # fmt: skip
    only = list(MODELS) if session.args.only == "all" else session.args.only.split(",")
    candidates = _candidates(session.args.quick)
    peer = DG.Peer.from_args(session.args, _us, MIN_SQNR_DB)  # exits, saying why, where --only-deepgemm cannot run
    rows_out, skipped = [], []
    for model in only:
        K, N, G, M = MODELS[model]
        for pass_, case in PASSES.items():
            if session.args.only_deepgemm and pass_ not in DG.passes(session.args):
                continue
            flops = 2 * M * N * K
            shape = {"fwd": (M, N, K), "dgrad": (M, K, N), "wgrad": (N, K, M)}[pass_]
            (a_q, sa, b_q, sb), offs = _operands(pass_, K, N, [M // G] * G, seed=0)
            native_us = _us(lambda: GG.fp8_rowwise_scaled_grouped_mm(a_q, sa, b_q, sb, offs, backend="native"))
            fast_us = _us(lambda: GG.fp8_rowwise_scaled_grouped_mm(a_q, sa, b_q, sb, offs, backend="native",
                                                                  use_fast_accum=True))  # fmt: skip
            dense_us = _dense_fp8_us(*shape)
            base = {"model": model, "pass": pass_, "M": M, "N": N, "K": K, "G": G}
            native_sqnr = _check(pass_, K % 2048 + 448, N % 1024 + 320, [608, 0, 800, 640], None, "native")
            print(f"{model:13s} {pass_:5s} native SQNR {native_sqnr:.2f} dB (small case)")
            timed = [("native", native_us), ("native_fast_accum", fast_us), ("dense_scaled_mm", dense_us)]
            if session.args.quick:
                timed.append(("bf16", _bf16_us(pass_, K, N, [M // G] * G)))
            for name, us in timed:
                rows_out.append({**base, "backend": name, "config": None, "us": us, "tflops": flops / us / 1e6})
                print(f"{model:13s} {pass_:5s} {name:16s} {us:9.1f} us {flops / us / 1e6:7.1f} TFLOP/s", flush=True)
            if peer and pass_ in DG.passes(session.args):
                rows_out.append(peer.row(base, pass_, native_us, dense_us))
            for backend, config in [] if session.args.only_deepgemm else candidates[case]:
                if time.monotonic() - session.t0 > session.args.budget_s:
                    skipped.append({**base, "backend": backend, "config": dataclasses.asdict(config)})
                    continue
                row = {**base, "backend": backend, "config": config and dataclasses.asdict(config)}
                run_as = None if backend == DISPATCH else backend
                if backend == DISPATCH:  # the class of the call in the kernel's terms (grouped_gemm module doc)
                    if case is GemmCase.A2D_B3D:  # a (M, K), b (G, N, K)
                        row["chosen"] = _chosen(case, a_q.shape[0], b_q.shape[1], a_q.shape[1], G)
                    else:  # a (N, M), b (K, M)
                        row["chosen"] = _chosen(case, a_q.shape[1], a_q.shape[0], b_q.shape[0], G)
                try:
                    row["sqnr_small_db"] = _check(pass_, K % 2048 + 448, N % 1024 + 320, [608, 0, 800, 640], config,
                                                  run_as)  # fmt: skip
                    fn = lambda c=config, b=run_as: GG.fp8_rowwise_scaled_grouped_mm(a_q, sa, b_q, sb, offs, backend=b,
                                                                                      config=c)  # fmt: skip
                    out, ref = fn(), GG.fp8_rowwise_scaled_grouped_mm(a_q, sa, b_q, sb, offs, backend="native")
                    row["sqnr_vs_native_db"] = sqnr_db(out, ref)
                    if min(row["sqnr_small_db"], row["sqnr_vs_native_db"]) < MIN_SQNR_DB:
                        raise AssertionError(f"SQNR {row['sqnr_small_db']:.1f} / {row['sqnr_vs_native_db']:.1f} dB")
                    del out, ref
                    row["us"] = _us(fn)
                    row["tflops"] = flops / row["us"] / 1e6
                    row["vs_native"] = native_us / row["us"]
                    row["of_dense"] = dense_us / row["us"]
                    print(f"{model:13s} {pass_:5s} {backend} {row.get('chosen', config)}: {row['us']:9.1f} us "
                          f"{row['tflops']:7.1f} TFLOP/s  {row['vs_native']:.3f}x native  {row['of_dense']:.3f} of dense",
                          flush=True)  # fmt: skip
                except Exception as e:  # noqa: BLE001 -- a candidate that fails is reported, not fatal
                    row["error"] = f"{type(e).__name__}: {e}"
                    print(f"{model} {pass_} {config}: FAILED {row['error'][:300]}", flush=True)
                    traceback.print_exc(limit=2)
                rows_out.append(row)
            del a_q, sa, b_q, sb
            torch.cuda.empty_cache()
    if session.args.quick:
        print(quick_summary(rows_out))
    session.finish("tune_fp8_gemm", rows_out, skipped, {}, timing=_TIMING)
    return 0


def quick_summary(rows: list[dict]) -> str:
    """The ``--quick`` run's table: per model and pass, torch's kernel, bf16 ``_grouped_mm`` and the shipped dispatch
    (its class and kernel) in us, the dispatch's ratios to both, and the two class kernels' times: where one of them
    beats the dispatch's choice, the class table is due a look."""
    chosen = {(r["model"], r["pass"]): r["chosen"] for r in rows if "chosen" in r}
    lines = ["model          pass   torch us  bf16 us  dispatch us  /torch  /bf16  ws us    triton256 us  chosen"]
    for model, pass_ in dict.fromkeys((r["model"], r["pass"]) for r in rows):
        by = {r["backend"] if r["backend"] != "triton" else "triton256": r["us"] for r in rows
              if r["model"] == model and r["pass"] == pass_ and "us" in r}  # fmt: skip
        us = lambda name, by=by: by.get(name, float("nan"))
        ours = us(DISPATCH)
        lines.append(f"{model:14s} {pass_:5s} {us('native'):9.1f} {us('bf16'):8.1f} {ours:12.1f} "
                     f"{us('native') / ours:6.2f}x {us('bf16') / ours:5.2f}x {us('triton_ws'):8.1f} "
                     f"{us('triton256'):13.1f}  {chosen.get((model, pass_), '-')}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
