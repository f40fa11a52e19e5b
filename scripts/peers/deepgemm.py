"""The DeepGEMM peer's part of scripts/tune_fp8_gemm.py: its options, its rows (checked, then timed) and its table
columns. The kernel, recipe and reference are ``mxkernels.peers.deepgemm``; the library is built by
scripts/peers/build_deepgemm.sh.

Its rows time DeepGEMM's m-grouped contiguous GEMM for fwd, (M, K) x (G, N, K), and dgrad, (M, N) x (G, K, N), at the
script's shapes, on operands drawn as the script draws its own (normal activations, weights scaled by 1/sqrt of the
contraction) and quantized into DeepGEMM's recipe (1x128 / 128x128 scales). The balanced groups (M / G = 16384 rows)
are already 128-aligned, so the timed layout has no padding rows. With ``--deepgemm-passes`` naming wgrad, its k-grouped GEMM
for wgrad, (N, M) x (K, M) -> (G, N, K) in its own recipe (1x128 scales on both operands, fp32 out accumulated into
a zeroed buffer; the timed replays keep accumulating, as DeepGEMM's own benchmark does with c = d). wgrad is opt-in
and best run as its own process: its kernel was built and checked here without a GPU, and a fault in it would end
the process and lose the rows after it.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
from mxkernels.peers import deepgemm as D
from tune_gemm import sqnr_db

PASSES = ("fwd", "dgrad", "wgrad")  # wgrad only where --deepgemm-passes names it
BACKEND = "deepgemm"
COLUMN = f"DeepGEMM ({D.RECIPE})"
# The small check: 8 groups (the timed instance's G), ragged sizes padded to 128-row blocks, one empty group.
SMALL_SIZES = [1000, 0, 896, 100, 2048, 384, 640, 256]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deepgemm", action="store_true", help="also time DeepGEMM's grouped GEMM (fwd, dgrad)")
    parser.add_argument("--only-deepgemm", action="store_true",
                        help="time DeepGEMM's GEMM and the ratios' denominators (torch's, dense) only")  # fmt: skip
    parser.add_argument("--deepgemm-passes", default="fwd,dgrad", type=_passes,
                        help="the peer's passes, comma list of fwd, dgrad, wgrad (default fwd,dgrad)")  # fmt: skip


def _passes(text: str) -> tuple[str, ...]:
    chosen = tuple(p for p in text.split(",") if p)
    if not chosen or set(chosen) - set(PASSES):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma list of {', '.join(PASSES)}")
    return chosen


def passes(args: argparse.Namespace) -> tuple[str, ...]:
    """The passes the peer runs in this run."""
    return args.deepgemm_passes


def _operands(pass_: str, K: int, N: int, sizes: list[int], seed: int) -> D.Operands:
    """DeepGEMM's operands of one pass: a (rows, contraction), b (G, out, contraction), from bf16 as the script's."""
    kc, n_out = (K, N) if pass_ == "fwd" else (N, K)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    indices, _ = D.m_indices(sizes, "cuda")
    a = torch.randn(indices.numel(), kc, device="cuda", generator=gen).bfloat16()
    b = (torch.randn(len(sizes), n_out, kc, device="cuda", generator=gen) * kc**-0.5).bfloat16()
    return D.operands(a, b, indices)


def _k_grouped_operands(K: int, N: int, sizes: list[int], seed: int) -> D.KOperands:
    """wgrad's operands, dY (tokens, N) scaled as the script's and X (tokens, K), in the k-grouped recipe."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dy = (torch.randn(sum(sizes), N, device="cuda", generator=gen) * 1e-2).bfloat16()
    x = torch.randn(sum(sizes), K, device="cuda", generator=gen).bfloat16()
    return D.k_grouped_operands(dy, x, sizes)


@dataclass
class Peer:
    lib: D.Library
    timer: Callable[[Callable[[], object]], float]
    min_sqnr_db: float

    @classmethod
    def from_args(cls, args: argparse.Namespace, timer, min_sqnr_db: float) -> Peer | None:
        """The peer where asked for and loadable; None where not asked for. Where the library cannot run, a run with
        --only-deepgemm exits saying why (nothing else to do); with --deepgemm it goes on without the peer's rows."""
        if not (args.deepgemm or args.only_deepgemm):
            return None
        try:
            return cls(D.load(), timer, min_sqnr_db)
        except D.PeerUnavailable as e:
            if args.only_deepgemm:
                sys.exit(f"tune_fp8_gemm --only-deepgemm: DeepGEMM peer unavailable: {e}")
            print(f"DeepGEMM peer skipped: {e}", flush=True)
            return None

    def _check(self, ops: D.Operands) -> float:
        """SQNR (dB) against the recipe's reference (fp32 on the device); raises where a padding row is not zero."""
        out = self.lib.gemm(ops)
        ref = D.reference(ops.a, ops.sfa, ops.b, ops.sfb, ops.indices, dtype=torch.float32)
        if bool(out[ops.indices == -1].ne(0).any()):
            raise AssertionError("a padding row's output is not zero")
        return sqnr_db(out, ref)

    def _check_k_grouped(self, ops: D.KOperands) -> float:
        """SQNR (dB) of the wgrad GEMM against its recipe's reference; raises where an empty group is not zero."""
        out = self.lib.k_grouped_gemm(ops)
        for g, k in enumerate(ops.ks):
            if k == 0 and bool(out[g].ne(0).any()):
                raise AssertionError(f"group {g} is empty but its output is not all zeros")
        return sqnr_db(out, D.k_grouped_reference(ops, dtype=torch.float32))

    def row(self, base: dict, pass_: str, native_us: float, dense_us: float) -> dict:
        """The peer's row of one model and pass: checked small and at full size, then timed; an error is recorded in
        the row (and printed), not raised."""
        K, N, G, M = base["K"], base["N"], base["G"], base["M"]
        if pass_ == "wgrad":
            small = [s // D.BLOCK * D.BLOCK for s in SMALL_SIZES]  # k-grouped: every group a multiple of 128
            check, make = self._check_k_grouped, lambda sizes, seed: _k_grouped_operands(K, N, sizes, seed)
            row = {
                **base,
                "backend": BACKEND,
                "recipe": D.K_GROUPED_RECIPE,
                "config": self.lib.k_grouped_config(N, K, G),
            }
        else:
            n_out, kc = (N, K) if pass_ == "fwd" else (K, N)
            small, check, make = SMALL_SIZES, self._check, lambda sizes, seed: _operands(pass_, K, N, sizes, seed)
            row = {**base, "backend": BACKEND, "recipe": D.RECIPE, "config": self.lib.config(n_out, kc, G)}
        try:
            row["sqnr_small_db"] = check(make(small, 11))
            ops = make([M // G] * G, 0)
            row["sqnr_full_db"] = check(ops)
            torch.cuda.empty_cache()
            if min(row["sqnr_small_db"], row["sqnr_full_db"]) < self.min_sqnr_db:
                raise AssertionError(f"SQNR {row['sqnr_small_db']:.1f} / {row['sqnr_full_db']:.1f} dB")
            if pass_ == "wgrad":
                out = torch.zeros(G, N, K, device="cuda")
                row["us"] = self.timer(lambda: self.lib.k_grouped_gemm(ops, out))
            else:
                row["us"] = self.timer(lambda: self.lib.gemm(ops))
            row["tflops"] = 2 * M * N * K / row["us"] / 1e6
            row["vs_native"] = native_us / row["us"]
            row["of_dense"] = dense_us / row["us"]
            print(f"{base['model']:13s} {pass_:5s} deepgemm ({row['recipe']}) {row['us']:9.1f} us {row['tflops']:7.1f} "
                  f"TFLOP/s  {row['vs_native']:.3f}x native  {row['of_dense']:.3f} of dense  SQNR "
                  f"{row['sqnr_small_db']:.1f} / {row['sqnr_full_db']:.1f} dB", flush=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001 -- the peer failing is reported in its row, not fatal
            row["error"] = f"{type(e).__name__}: {e}"
            print(f"{base['model']} {pass_} deepgemm: FAILED {row['error'][:300]}", flush=True)
            traceback.print_exc(limit=2)
        return row


def header_cells() -> list[str]:
    return [COLUMN, "DeepGEMM / torch"]


def cells(rows: list[dict], native: dict) -> list[str]:
    """The peer's cells of one table line from the same run's rows: TFLOP/s and the ratio to torch's default, "-"
    where the run has no timed peer row for the pass (wgrad, a failed check, a run without --deepgemm)."""
    timed = [r for r in rows if r["backend"] == BACKEND and "us" in r]
    if not timed:
        return ["-", "-"]
    other = f" ({timed[0]['recipe']})" if timed[0]["recipe"] != D.RECIPE else ""  # wgrad: 1x128 on both
    return [f"{timed[0]['tflops']:.0f}{other}", f"{native['us'] / timed[0]['us']:.2f}x"]
