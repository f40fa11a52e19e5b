"""The MXFP8 grouped GEMMs of "triton_fused" against bf16 ``torch._grouped_mm`` and "triton_dequant".

    python scripts/tune_fused_gemm.py --out $OUT/tune_gemm.json          # ~3-4 minutes on an H100 / H200
    python scripts/tune_fused_gemm.py --profile                          # + torch.profiler of each case's best
    python scripts/tune_fused_gemm.py --ncu-target fwd                   # one launch per candidate, for ncu

At DeepSeek-V3 shapes (K = 7168, N = 2048, G = 8 balanced groups, M = 131072 tokens), for each GEMM of the training
step -- fwd (M, K) x (G, K, N), dgrad (M, N) x (G, N, K), wgrad (N, M) x (M, K) -> (G, N, K) -- it times:

* bf16 ``torch._grouped_mm`` on the bf16 operands (the denominator of every ratio);
* "triton_dequant" (today's SM90 default: both operands dequantized to bf16, then ``torch._grouped_mm``), and its
  dequantization pass alone;
* "triton_fused" with each candidate ``FusedConfig`` (``CANDIDATES``; the first of a case is the default), each first
  checked against "emulated" at a reduced size with uneven groups, one empty (SQNR in dB, bf16 output; under
  ``MIN_SQNR_DB`` or an exception: reported and skipped);
* the pass that dequantizes "triton_fused"'s other operand once (2D x 3D: the weights; 2D x 2D: grad_out^T), and
  the fused kernel's own schedule on bf16 operands (``gemm_fused.run_bf16_control``): fused = pass + kernel, and
  kernel vs control is what the in-register dequantization costs, control vs ``torch._grouped_mm`` what the Triton
  GEMM itself gives away.

Every time is ``mxbench.instruments.timing.time_fn`` (cold-L2 CUDA-graph replays after warm-up calls). The table printed last
has case, backend, config, us, TFLOP/s and the ratio to bf16; the JSON has every row. A candidate that fails is
printed, recorded with its error and skipped; candidates left when ``--budget-s`` is spent are listed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from functools import partial

# tuning first: it makes mxkernels and mxbench importable from a checkout where they are not installed.
# isort: off
from tuning import start

import torch
from mxkernels.gemm import fused as gemm_fused
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.backend import GemmCase
from mxkernels.gemm.dequant import dequantize_blocked
from mxkernels.gemm.fused import FusedConfig
from mxbench.instruments.timing import time_fn
from tune_gemm import operands, sqnr_db

# isort: on

M, K, N, G = 131072, 7168, 2048, 8
MIN_SQNR_DB = 40.0
# case -> (kind, output columns n, contraction k) in tune_gemm.operands' terms (2D x 3D: a (M, k) @ b (G, k, n);
# 2D x 2D: a (n, M) @ b (M, k) -> (G, n, k)).
CASES = {"fwd": (GemmCase.A2D_B3D, N, K), "dgrad": (GemmCase.A2D_B3D, K, N), "wgrad": (GemmCase.A2D_B2D, N, K)}
# Candidates per case, the first the default (gemm_fused._DEFAULT_CONFIGS), chosen from the SM90 SASS (registers,
# spills, wgmma kept in flight; docs/perf-log.md) rather than by sweeping: 128 x 256 tiles (the dequantization
# amortized over 256 columns), 64-wide steps three or four deep or 128-wide steps two deep (shared memory: 40 / 80 KiB
# a stage), row-major or banded tile order; for wgrad also both operands dequantized in the load path.
_2D3D = [  # (four stages deep is not a candidate: its bf16 outputs race, see gemm_fused._DEFAULT_CONFIGS)
    FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=3),
    FusedConfig(128, 256, block_k=128, num_warps=8, num_stages=2),
    FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=3, group_m=8),
]
CANDIDATES = {
    "fwd": _2D3D,
    "dgrad": _2D3D,
    "wgrad": [  # (its 128-wide steps spill at 255 registers: not a candidate)
        FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=4, group_m=8),
        FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=3, group_m=1),
        FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=4, group_m=4),
        FusedConfig(128, 256, block_k=64, num_warps=8, num_stages=3, group_m=8, fuse_both=True),
    ],
}


def config_name(c: FusedConfig) -> str:
    both = " both-in-kernel" if c.fuse_both else ""
    return f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages} g{c.group_m}{both}"


def timed(fn, samples: int) -> tuple[float, float]:
    """(median, interquartile range) in microseconds per call: cold-L2 graph replays after warm-up calls."""
    t = time_fn(fn, samples=samples, warmup=2)
    return t.median_us, t.iqr_us


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def check(case: str, config: FusedConfig) -> float:
    """SQNR (dB) of "triton_fused" against "emulated" at a reduced size: uneven groups, two empty, widths not
    multiples of the tiles; G and every size's divisibility by 16 as timed, so the check compiles the very kernel
    the timing runs."""
    kind, n, k = CASES[case]
    sizes = [608, 0, 800, 640, 96, 0, 352, 32]
    _, _, offs, ops = operands(kind, sum(sizes), n // 8 + 64, k // 8 + 64, sizes, seed=11)
    ref = GG.mxfp8_scaled_grouped_mm(*ops, offs, backend="emulated")
    out = GG.mxfp8_scaled_grouped_mm(*ops, offs, backend="triton_fused", config=config)
    rows = slice(0, sum(sizes)) if kind is GemmCase.A2D_B3D else slice(None)
    return sqnr_db(out[rows], ref[rows])


def dequant_pass(case: str, ops, offs, which: str):
    """A zero-argument call of one dequantization pass at the case's full size: "both" is triton_dequant's, "once"
    the one triton_fused makes of its other operand (default config)."""
    a_q, a_sb, b_q, b_sb = ops
    if CASES[case][0] is GemmCase.A2D_B3D:
        if which == "once":
            return lambda: dequantize_blocked(b_q, b_sb, layout="3d")
        return lambda: (
            dequantize_blocked(a_q, a_sb, offs, layout="m_groups"),
            dequantize_blocked(b_q, b_sb, layout="3d"),
        )
    if which == "once":
        return lambda: dequantize_blocked(a_q, a_sb, offs, layout="k_groups")
    return lambda: (dequantize_blocked(a_q, a_sb, offs, layout="k_groups"),
                    dequantize_blocked(b_q, b_sb, offs, layout="k_groups"))  # fmt: skip


def control_operands(case: str, a: torch.Tensor, b: torch.Tensor):
    """``run_bf16_control``'s operands (contraction contiguous) from ``torch._grouped_mm``'s (a, b)."""
    if CASES[case][0] is GemmCase.A2D_B3D:
        return a.contiguous(), b.transpose(-2, -1).contiguous()
    return a.contiguous(), b.t().contiguous()


def run_case(case: str, session, rows: list, skipped: list) -> None:
    args, t0 = session.args, session.t0
    kind, n, k = CASES[case]
    flops = 2 * M * n * k
    shape = {"case": case, "kind": kind, "M": M, "N": n, "K": k, "G": G}

    def row(backend: str, config: str, us: float | None, iqr: float | None = None, gemm=True, **extra) -> dict:
        """A GEMM row gets TFLOP/s; a row of a dequantization pass alone only its time."""
        r = {**shape, "backend": backend, "config": config, "us": us, "iqr_us": iqr, **extra}
        if us and gemm:
            r["tflops"] = flops / us / 1e6
        rows.append(r)
        return r

    checked = []
    for config in CANDIDATES[case]:
        if time.monotonic() - t0 > args.budget_s:
            skipped.append(f"{case} {config_name(config)}")
            continue
        try:
            db = check(case, config)
            error = None if db >= MIN_SQNR_DB else f"SQNR {db:.1f} dB < {MIN_SQNR_DB} against emulated"
        except Exception as exc:  # noqa: BLE001 -- one bad candidate must not hide the others
            db, error = float("nan"), error_text(exc)
            traceback.print_exc()
        print(f"# [{time.monotonic() - t0:4.0f}s] check {case} {config_name(config)}: {db:.1f} dB {error or ''}",
              flush=True)  # fmt: skip
        checked.append((config, db, error))

    a, b, offs, ops = operands(kind, M, n, k, [M // G] * G, seed=0)
    us, iqr = timed(partial(torch._grouped_mm, a, b, offs=offs), args.samples)
    bf16 = row("bf16", "torch._grouped_mm", us, iqr)["tflops"]
    for config, fn, gemm in (
        ("default", partial(GG.mxfp8_scaled_grouped_mm, *ops, offs, backend="triton_dequant"), True),
        ("  its dequantize pass alone", dequant_pass(case, ops, offs, "both"), False),
    ):
        try:
            row("triton_dequant", config, *timed(fn, args.samples), gemm=gemm)
        except Exception as exc:  # noqa: BLE001
            row("triton_dequant", config, None, error=error_text(exc))
            traceback.print_exc()
    for config, db, error in checked:
        if error is None:
            try:
                fused = partial(GG.mxfp8_scaled_grouped_mm, *ops, offs, backend="triton_fused", config=config)
                us, iqr = timed(fused, args.samples)
                row("triton_fused", config_name(config), us, iqr, sqnr_db=db, fields=dataclasses.asdict(config))
                continue
            except Exception as exc:  # noqa: BLE001
                error = error_text(exc)
                traceback.print_exc()
        row("triton_fused", config_name(config), None, sqnr_db=db, error=error, fields=dataclasses.asdict(config))
    # Where the fused time goes, at the default config: the once-per-call pass and the kernel's bf16 schedule.
    default = CANDIDATES[case][0]
    try:
        once = dequant_pass(case, ops, offs, "once")
        row("triton_fused", "  its dequantize-once pass alone", *timed(once, args.samples), gemm=False)
        control = partial(gemm_fused.run_bf16_control, *control_operands(case, a, b), offs, default)
        row("triton_fused", f"  bf16 control {config_name(default)}", *timed(control, args.samples))
    except Exception as exc:  # noqa: BLE001
        row("triton_fused", "  pass / bf16 control", None, error=error_text(exc))
        traceback.print_exc()
    for r in rows:
        if r["case"] == case and r.get("tflops"):
            r["vs_bf16"] = r["tflops"] / bf16
    print(f"# [{time.monotonic() - t0:4.0f}s] done {case}", flush=True)


def print_table(rows: list) -> None:
    print(f"{'case':6} {'backend':15} {'config':44} {'us':>9} {'TFLOP/s':>8} {'vs bf16':>7}")
    for r in rows:
        us = f"{r['us']:9.1f}" if r.get("us") else f"{'-':>9}"
        tf = f"{r['tflops']:8.1f}" if r.get("tflops") else f"{'':>8}"
        ratio = f"{r['vs_bf16']:7.3f}" if r.get("vs_bf16") else ""
        note = f"  {r['error']}" if r.get("error") else ""
        print(f"{r['case']:6} {r['backend']:15} {r['config'][:44]:44} {us} {tf} {ratio}{note}")


def best_fused(rows: list, case: str) -> FusedConfig:
    timed_rows = [r for r in rows if r["case"] == case and r.get("fields") and r.get("us")]
    if not timed_rows:
        return CANDIDATES[case][0]
    return FusedConfig(**min(timed_rows, key=lambda r: r["us"])["fields"])


def profile(rows: list, cases: list[str]) -> dict:
    """Each case's fastest "triton_fused" config run under ``torch.profiler``: the time of every kernel of one call
    (the once-per-call dequantization pass and the fused kernel), and the ncu command that reads the fused kernel's
    counters."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    report = {}
    for case in cases:
        kind, n, k = CASES[case]
        config = best_fused(rows, case)
        _, _, offs, ops = operands(kind, M, n, k, [M // G] * G, seed=0)
        call = partial(GG.mxfp8_scaled_grouped_mm, *ops, offs, backend="triton_fused", config=config)
        call()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        kernels = {e.key: e.device_time_total / e.count for e in prof.key_averages() if e.device_time_total > 0}
        print(f"# profile {case} {config_name(config)}: us per call by kernel")
        for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
            print(f"#   {us:9.1f}  {name[:90]}")
        report[case] = {"config": dataclasses.asdict(config), "kernel_us": kernels}
        del call, ops
        torch.cuda.empty_cache()
    kernel = "regex:_fused_2d(3d|2d)_kernel"
    print("# hardware counters of the fused kernels (Firecracker machines; leave the clocks alone):")
    print(
        f"#   ncu --clock-control none -k '{kernel}' --launch-skip 1 --launch-count 1 --section SpeedOfLight "
        "--section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats "
        "--section WarpStateStats --section Occupancy python scripts/tune_fused_gemm.py --ncu-target fwd"
    )
    print(
        "#   (issue-slot use and warp stalls say whether the CUDA cores' dequantization or the tensor pipe bounds it)"
    )
    return report


def ncu_target(case: str) -> None:
    """Two launches of each candidate of ``case`` at full size and nothing else, for ``ncu`` to profile."""
    kind, n, k = CASES[case]
    _, _, offs, ops = operands(kind, M, n, k, [M // G] * G, seed=0)
    for config in CANDIDATES[case]:
        for _ in range(2):
            GG.mxfp8_scaled_grouped_mm(*ops, offs, backend="triton_fused", config=config)
    torch.cuda.synchronize()
    print(f"ran {case}: {', '.join(config_name(c) for c in CANDIDATES[case])}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # No candidate check starts after 200 s: with the timings after it, about 4 minutes in all.
    parser.set_defaults(budget_s=200.0)
    parser.add_argument("--profile", action="store_true", help="then run each case's best under torch.profiler")
    parser.add_argument("--ncu-target", choices=list(CASES), help="only launch this case's candidates (for ncu)")


def main() -> int:
    session = start("tune_fused_gemm", __doc__.split("\n\n")[0], ",".join(CASES), "cases, comma list",
                    16384, 2048, add_arguments)  # fmt: skip
    args = session.args
    gemm_fused.FUSED_WITHHELD = None  # withheld from users on GPUs, not from the script that measures it
    if args.ncu_target:
        ncu_target(args.ncu_target)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # the emulated reference multiplies in fp32
    props = torch.cuda.get_device_properties(0)
    print(f"# {session.device} cc={props.major}.{props.minor} SMs={props.multi_processor_count} "
          f"copy roof {session.roof:.2f} TB/s", flush=True)  # fmt: skip
    cases = [c for c in args.only.split(",") if c]
    for case in cases:
        if case not in CASES:
            sys.exit(f"--only: unknown case {case!r}; cases: {', '.join(CASES)}")
    rows, skipped = [], []
    for case in cases:
        try:
            run_case(case, session, rows, skipped)
        except Exception as exc:  # noqa: BLE001 -- keep the other cases (an OOM, a broken baseline)
            rows.append({"case": case, "backend": "case", "config": "error", "us": None, "error": error_text(exc)})
            traceback.print_exc()
        torch.cuda.empty_cache()  # the case's operands went with run_case
    summary = {"shape": {"M": M, "K": K, "N": N, "G": G}, "min_sqnr_db": MIN_SQNR_DB}
    if args.profile:
        summary["profile"] = profile(rows, cases)
    print_table(rows)
    session.finish("tune_fused_gemm", rows, skipped, summary, timing={"samples": session.args.samples, "warmup": 2})  # timed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
