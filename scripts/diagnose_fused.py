"""Where is triton_fused wrong at DeepSeek-V3 sizes? (It is withheld on GPUs until this is found: docs/perf-log.md.)

Runs the fused kernels on the GPU test's operands (kernels/tests/gemm_oracle.py ``gpu_case``) with the output
pre-filled with NaN, against the emulated backend in fp32, for each case, output dtype and a few configs, twice
each: unwritten elements stay NaN, wrong ones differ, and a result that changes between two identical calls is a
race. Prints one line per run and, for a wrong one, the output tiles that hold the bad elements.

    python scripts/diagnose_fused.py [--M 16384] [--out diag.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kernels" / "tests"))

from gemm_oracle import gpu_case, gpu_sizes, sqnr, valid
from kernel_helpers import offsets
from mxkernels.gemm import fused as gemm_fused
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.backend import GemmCase


class _NaNEmpty:
    """``torch`` for gemm_fused, but ``empty`` fills with NaN: an element the kernel never writes stays NaN."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*size, dtype=None, device=None):
        return torch.full(size, float("nan"), dtype=dtype, device=device)


def bad_tiles(out: torch.Tensor, ref: torch.Tensor, block_m: int, block_n: int, case: GemmCase) -> dict:
    """Bad elements (NaN where the reference is finite, or off by more than 3% of the reference's RMS) per tile."""
    tol = 3e-2 * ref.float().pow(2).mean().sqrt()
    wrong = (out.float() - ref.float()).abs() > tol
    wrong |= out.isnan() & ~ref.isnan()
    unwritten = out.isnan() & ~ref.isnan()
    if case is GemmCase.A2D_B2D:  # (G, N, K): tiles are block_n rows of N by block_m columns of K
        wrong, unwritten = wrong.flatten(0, 1), unwritten.flatten(0, 1)
        rows, cols = block_n, block_m
    else:
        rows, cols = block_m, block_n
    idx = wrong.nonzero()
    tiles: dict[str, int] = {}
    for r, c in idx[:200000].tolist():
        key = f"{r // rows},{c // cols}"
        tiles[key] = tiles.get(key, 0) + 1
    in_rows = torch.bincount(idx[:, 0] % rows, minlength=rows).tolist() if len(idx) else []
    in_cols = torch.bincount(idx[:, 1] % cols // 8, minlength=cols // 8).tolist() if len(idx) else []
    return {"wrong": int(wrong.sum()), "unwritten": int(unwritten.sum()), "tiles": dict(sorted(tiles.items())[:40]),
            "n_tiles_bad": len(tiles), "rows_in_tile": in_rows, "col_octets_in_tile": in_cols,
            "max_abs_err": float((out.float() - ref.float()).nan_to_num(0).abs().max())}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--M", type=int, default=16384)
    p.add_argument("--out", type=Path)
    p.add_argument("--only-2d3d", action="store_true")
    args = p.parse_args()
    gemm_fused.FUSED_WITHHELD = None
    gemm_fused.torch = _NaNEmpty()
    torch.backends.cuda.matmul.allow_tf32 = False
    M, K, N, G = args.M, 7168, 2048, 8
    sizes = gpu_sizes(M, G, 32)
    report = []
    for case in tuple(GemmCase)[: 1 if args.only_2d3d else 2]:
        ops, _ = gpu_case(case, M, K, N, G, sizes)
        offs = offsets(sizes, "cuda")
        ref = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="emulated", out_dtype=torch.float32)
        base = gemm_fused.default_config(case)
        configs = {"default": base, "stages1": dataclasses.replace(base, num_stages=1),
                   "stages2": dataclasses.replace(base, num_stages=2),
                   "stages3": dataclasses.replace(base, num_stages=3),
                   "128x256_w4": dataclasses.replace(base, num_warps=4),
                   "128x128_w8": dataclasses.replace(base, block_n=128),
                   "one_program": dataclasses.replace(base, max_programs=1),
                   "64x128_w4": dataclasses.replace(base, block_m=64, block_n=128, num_warps=4)}  # fmt: skip
        for name, config in configs.items():
            for out_dtype in (torch.bfloat16, torch.float32) if name == "default" else (torch.bfloat16,):
                outs = []
                for _ in range(2):
                    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="triton_fused", out_dtype=out_dtype,
                                                     config=config)  # fmt: skip
                    torch.cuda.synchronize()
                    outs.append(out)
                o, r = valid(outs[0], sizes, case), valid(ref, sizes, case)
                row = {"case": case, "config": name, "out": str(out_dtype), "sizes": sizes,
                       "sqnr_db": float(sqnr(o.float().nan_to_num(0), r)),
                       "repeatable": bool(torch.equal(outs[0].nan_to_num(12345), outs[1].nan_to_num(12345))),
                       **bad_tiles(o, r, config.block_m, config.block_n, case)}  # fmt: skip
                print(json.dumps(row), flush=True)
                report.append(row)
                if args.out:
                    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
