"""Time the SM90 MXFP8 grouped-GEMM backends against bf16 ``torch._grouped_mm`` (issue 6).

At DeepSeek-V3 shapes (K = 7168, N = 2048, G = 8 balanced groups; M = 16384 and 131072 tokens), for 2D x 3D
(forward: (M, K) x (G, K, N)) and 2D x 2D (weight gradient: (N, M) x (M, K) -> (G, N, K)). Each variant is a backend
and an explicit ``TileConfig`` (None: the backend's default; no autotuning): "triton_dequant" (dequantize to bf16,
then ``torch._grouped_mm``) against the measured bests of "triton_fp8" as controls. Each is first checked against
the "emulated" backend on a small shape with uneven groups (SQNR in dB; a variant under 40 dB or one that raises is
reported and skipped), then timed with ``mxbench.instruments.timing.time_fn`` (CUDA-graph replays, cold L2, after warm-up
calls). A last row per shape times "triton_dequant"'s dequantize pass alone (both operands), whose traffic is
reported as TB/s. All numbers go to ``$OUT/tune_gemm.json`` when ``$OUT`` is set.

    python scripts/tune_gemm.py                      # both cases, M = 131072 and 16384 (~2 minutes)
    python scripts/tune_gemm.py --M 16384 --case 2d2d
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback

# tuning first: it makes mxkernels and mxbench importable from a checkout where they are not installed.
# isort: off
from tuning import measured_metadata, tuning_run, write_run

import torch
import triton
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.backend import GemmCase
from mxkernels.gemm.dequant import dequantize_blocked
from mxkernels.gemm.mx_triton import TileConfig

from mxbench.instruments.timing import time_fn

# isort: on

K, N, G = 7168, 2048, 8
MIN_SQNR_DB = 40.0


@dataclasses.dataclass(frozen=True)
class Variant:
    backend: str
    config: TileConfig | None = None
    cases: tuple[GemmCase, ...] = tuple(GemmCase)

    @property
    def name(self) -> str:
        c = self.config
        if c is None:
            return f"{self.backend} (default)"
        regs = f" r{c.maxnreg}" if c.maxnreg else ""
        return f"{self.backend} {c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages} g{c.group_m}{regs}"


# triton_fp8's measured bests (docs/perf-log.md, v2 GEMM), now its defaults: controls.
VARIANTS = [
    Variant("triton_dequant"),
    Variant("triton_fp8", TileConfig(128, 64, num_warps=4, num_stages=3, group_m=8), cases=(GemmCase.A2D_B3D,)),
    Variant("triton_fp8", TileConfig(64, 64, num_warps=4, num_stages=4, group_m=8), cases=(GemmCase.A2D_B2D,)),
]


_TIMING = {"samples": 10, "warmup": 2}  # every timing of this script (stored with its runs)

def offsets(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)


def operands(case: GemmCase, M: int, n: int, k: int, sizes: list[int], seed: int):
    """bf16 ``torch._grouped_mm`` operands (a, b) and their MXFP8 operands; 2D x 2D's a is a transposed view."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if case is GemmCase.A2D_B3D:
        a = torch.randn(M, k, device="cuda", generator=gen, dtype=torch.bfloat16)
        b = (torch.randn(len(sizes), n, k, device="cuda", generator=gen) * k**-0.5).bfloat16().transpose(-2, -1)
    else:
        a = (torch.randn(M, n, device="cuda", generator=gen) * 1e-2).bfloat16().t()
        b = torch.randn(M, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    offs = offsets(sizes)
    return a, b, offs, GG.quantize_mxfp8_operands(a, b, offs)


def sqnr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return (10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum())).item()


def small_check(case: GemmCase, variant: Variant) -> float:
    """SQNR (dB) of the variant against "emulated": uneven groups (one empty), sizes and K not multiples of 128,
    N not a multiple of the tile. Its sizes share the timed shapes' Triton specialization (all multiples of 16)."""
    sizes = [608, 0, 800, 640]
    _, _, offs, ops = operands(case, sum(sizes), 320, 1120 if case is GemmCase.A2D_B3D else 448, sizes, seed=11)
    # bf16 output, as timed: an fp32 output would compile the kernel a second time (SQNR ~50 dB, bf16 rounding).
    ref = GG.mxfp8_scaled_grouped_mm(*ops, offs, backend="emulated")
    out = GG.mxfp8_scaled_grouped_mm(*ops, offs, backend=variant.backend, config=variant.config)
    rows = slice(0, sum(sizes)) if case is GemmCase.A2D_B3D else slice(None)
    return sqnr_db(out[rows], ref[rows])


def timed(fn) -> tuple[float, float]:
    """(median, interquartile range) in microseconds per call: cold-L2 graph replays after warm-up calls."""
    t = time_fn(fn, **_TIMING)
    return t.median_us, t.iqr_us


def check_variants(case: GemmCase, variants: list[Variant], t0: float) -> dict[Variant, tuple[float, str | None]]:
    """variant -> (SQNR against emulated, error or None) on the small shape."""
    checked = {}
    for v in variants:
        try:
            db = small_check(case, v)
            checked[v] = (db, None if db >= MIN_SQNR_DB else f"SQNR {db:.1f} dB < {MIN_SQNR_DB} against emulated")
        except Exception as exc:  # noqa: BLE001 -- report and go on: one bad config must not hide the others
            checked[v] = (float("nan"), f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
            traceback.print_exc()
        print(f"# [{time.time() - t0:4.0f}s] check {case} {v.name}: {checked[v][0]:.1f} dB {checked[v][1] or ''}")
    return checked


def time_shape(case: GemmCase, M: int, checked: dict[Variant, tuple[float, str | None]]) -> list[dict]:
    """Rows of the bf16 baseline and every checked variant at M tokens in G equal groups."""
    sizes = [M // G] * G
    a, b, offs, ops = operands(case, M, N, K, sizes, seed=0)
    flops = 2 * M * N * K
    shape = {"case": case, "M": M, "K": K, "N": N, "G": G}
    print(f"{'case':5} {'M':>7} {'variant':28} {'us':>9} {'iqr':>6} {'TFLOP/s':>8} {'vs bf16':>7} {'SQNR dB':>8}")
    us, iqr = timed(lambda: torch._grouped_mm(a, b, offs=offs))
    bf16 = flops / us / 1e6
    rows = [{**shape, "variant": "bf16 torch._grouped_mm", "backend": "bf16", "us": us, "iqr_us": iqr, "tflops": bf16}]
    print(f"{case:5} {M:7d} {'bf16 torch._grouped_mm':28} {us:9.1f} {iqr:6.1f} {bf16:8.1f}")
    for v, (db, error) in checked.items():
        config = dataclasses.asdict(v.config) if v.config else None  # None: the backend's default
        row = {**shape, "variant": v.name, "backend": v.backend, "config": config, "sqnr_db": db}
        if error is None:
            try:
                us, iqr = timed(lambda v=v: GG.mxfp8_scaled_grouped_mm(*ops, offs, backend=v.backend, config=v.config))
                row.update(us=us, iqr_us=iqr, tflops=flops / us / 1e6)
            except Exception as exc:  # noqa: BLE001 -- as in check_variants
                error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                traceback.print_exc()
        row["error"] = error
        rows.append(row)
        if error is None:
            line = f"{us:9.1f} {iqr:6.1f} {row['tflops']:8.1f} {row['tflops'] / bf16:7.2f} {db:8.1f}"
        else:
            line = f"FAILED: {error}"
        print(f"{case:5} {M:7d} {v.name:28} {line}", flush=True)
    rows.append(time_dequantize(shape, ops, offs))
    return rows


def time_dequantize(shape: dict, ops, offs: torch.Tensor) -> dict:
    """Row of triton_dequant's dequantize pass alone: both operands to bf16 (e4m3 + blocked scales in, bf16 out)."""
    a_q, a_sb, b_q, b_sb = ops
    a_layout = "m_groups" if b_q.dim() == 3 else "k_groups"
    b_args = (b_q, b_sb, None, "3d") if b_q.dim() == 3 else (b_q, b_sb, offs, "k_groups")

    def run():
        dequantize_blocked(a_q, a_sb, offs, layout=a_layout)
        dequantize_blocked(*b_args[:3], layout=b_args[3])

    us, iqr = timed(run)
    moved = sum(q.numel() * 3 + s.numel() for q, s in ((a_q, a_sb), (b_q, b_sb)))  # 1 byte in, 2 out, scales
    print(f"{shape['case']:5} {shape['M']:7d} {'dequantize pass only':28} {us:9.1f} {iqr:6.1f} "
          f"{moved / us / 1e6:8.2f} TB/s", flush=True)  # fmt: skip
    return {**shape, "variant": "dequantize pass only", "backend": "triton_dequant", "us": us, "iqr_us": iqr,
            "tb_per_s": moved / us / 1e6}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--M", type=int, nargs="+", default=[131072, 16384], help="tokens (sum of group sizes)")
    parser.add_argument("--case", nargs="+", type=GemmCase, default=list(GemmCase), choices=list(GemmCase))
    parser.add_argument("--match", default="", help="only variants whose name contains this")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("tune_gemm.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the emulated reference multiplies in fp32
    meta = measured_metadata(" ".join(sys.argv), _TIMING)  # before any timing: the clocks the run started under
    device = torch.cuda.get_device_name()
    print(f"# {device} cc={torch.cuda.get_device_capability()} torch {torch.__version__} triton {triton.__version__}")
    rows, t0 = [], time.time()
    for case in args.case:
        checked = check_variants(case, [v for v in VARIANTS if args.match in v.name and case in v.cases], t0)
        for M in args.M:
            rows += time_shape(case, M, checked)
            torch.cuda.empty_cache()
            print(f"# [{time.time() - t0:4.0f}s] done {case} M={M}")
    if os.environ.get("OUT"):
        from mxbench.measuring.metadata import now

        run = tuning_run("tune_gemm", {**meta, "finished": now()}, rows, [], {}, None)
        write_run(os.path.join(os.environ["OUT"], "tune_gemm.json"), run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
