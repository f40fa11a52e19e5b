"""Quantizers on a CUDA GPU, in one run: FP8 rowwise, MXFP8 quantize_3d along N, and the fused-scale MXFP8
quantizers, each checked bit-exact and timed beside its old default and the streaming roof.

    python scripts/tune_fp8_and_fused_quantizers.py [--out PATH] [--budget-s 170] [--samples 10]
        [--only fp8,along_n,fused,amax,fine,fine_amax]

DeepSeek-V3 sizes (M = 131072 tokens in G = 8 balanced groups, K = 7168, N = 2048, bf16, RCEIL), plus Llama 4
Scout's weights (16, 8192, 5120) for quantize_3d along N. First the roof: the Triton streaming kernels of
``mxbench ceilings`` on a (131072, 7168) bf16 tensor, copy (bf16 -> bf16) and cast (bf16 -> e4m3, a quantizer's
2 + 1 bytes per element); "stream" is the better of the two. Then per case: the reference (the plain-torch oracle,
computed once, in chunks), and each launch -- the old default first, the new default, the other candidates --
run once and compared byte for byte with it, then timed with ``mxbench.instruments.timing.time_fn`` (cold-L2 CUDA-graph
replays). TB/s is over the case's minimal traffic (input read once, outputs written once, the blocked buffers'
zero fill included), the same count for every launch of a case, so a launch that reads twice shows it as a lower
rate. The fused cases' old default is the unfused pair, quantize then rearrange, timed as one call. A failing
launch is printed and skipped; launches left when the time budget runs out are listed. Also checked, not timed:
the strips kernel three times (its last-arriver pass 2 races if anything does) and every group-aware launch on
groups that are empty or off 16-row boundaries. The "amax" group: the FP8 rowwise quantizers of ``fp8_amax`` (a
tensor's first quantizer folding the column amaxes per group, its second scaling from them), beside the unfused
quantizers they replace. The "fine" group (issue 32): the 3D-along-N and k_groups quantizers at Qwen3-30B-A3B's,
gpt-oss-120b's and DeepSeek-V3's shapes (131072 routed rows, 128 or 8 balanced groups), old default, new default
(the holding kernel where a strip fits) and holding launches. The "fine_amax" group: the fused-scale pair (along K
with the table, along N from it) at those models' weights. (The "both" group, both copies from one read, went with
the kernel it timed: docs/perf-log.md.) Last, the table and the JSON (``--out``, default
``$OUT/tune_fp8_and_fused_quantizers.json``, ``$OUT`` default ./out).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from mxkernels.layouts import scale_layout
from mxkernels.quant import fp8_amax as A
from mxkernels.quant import fp8_colwise as C
from mxkernels.quant import fp8_hold as H
from mxkernels.quant import fp8_rowwise as F
from mxkernels.quant import quantize as Q
from mxkernels.quant import quantize_blocked as QB
from tune_quantize import make_input
from tune_quantize import reference as mx_reference
from tuning import copy_tbps, start

from mxbench.instruments.timing import time_fn

M, K, N, G = 131072, 7168, 2048, 8
SCOUT = (16, 8192, 5120)  # Llama 4 Scout's expert weights (G, N, K)
SCRIPT = "tune_fp8_and_fused_quantizers"
BF16 = torch.bfloat16


@dataclass
class Launch:
    """One launch of a case: its label, role ("old", "new" or "candidate") and a zero-argument call returning the
    outputs to compare with the reference."""

    label: str
    role: str
    run: Callable[[], tuple]


@dataclass
class Case:
    name: str
    group: str
    min_bytes: int
    setup: Callable[[], tuple[dict, tuple, list[Launch]]]
    """-> (tensors to keep alive, reference outputs, launches); called when the case runs, so inputs live one case
    at a time."""
    extra: dict = field(default_factory=dict)


def offsets(sizes, device="cuda") -> torch.Tensor:
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32, device=device)


BALANCED = [M // G] * G


def chunked(fn, x: torch.Tensor, rows: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """fn (a rowwise reference: one output row and one scale per input row) over x's rows in chunks."""
    parts = [fn(x[i : i + rows]) for i in range(0, x.shape[0], rows)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


# ---- the cases ----------------------------------------------------------------------------------------------


def fp8_rows_case(name: str, shape: tuple[int, ...], launches: list[tuple[str, str, object]]) -> Case:
    rows, cols = (shape[0] * shape[1], shape[2]) if len(shape) == 3 else shape

    def setup():
        x = make_input(shape).view(rows, cols)
        ref = chunked(F.quantize_fp8_rowwise_reference, x)
        runs = [Launch(label, role, lambda c=c: F.quantize_fp8_rowwise(x, config=c)) for label, role, c in launches]
        return {"x": x}, ref, runs

    return Case(name, "fp8", rows * cols * 3 + 4 * rows, setup)


def fp8_cols_case(name: str, launches: list[tuple[str, str, object]], k_groups: tuple[int, list[int]] | None,
                  weights: tuple[int, int, int] = (G, N, K), group: str = "fp8", rows: int = M) -> Case:  # fmt: skip
    """3D along N of ``weights`` (default DeepSeek-V3's), or (k_groups = (R, sizes)) the k_groups quantizer of a
    (rows, R)."""
    if k_groups is None:
        elems, scales = weights[0] * weights[1] * weights[2], weights[0] * weights[2]
    else:
        elems, scales = rows * k_groups[0], len(k_groups[1]) * k_groups[0]

    def setup():
        if k_groups is None:
            w = make_input(weights)
            ref = F.quantize_fp8_rowwise_reference(w.transpose(-2, -1))
            call = lambda c: F.quantize_fp8_rowwise_3d(w, along="N", config=c)
            keep = {"w": w}
        else:
            x, offs = make_input((rows, k_groups[0])), offsets(k_groups[1])
            ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
            call = lambda c: F.quantize_fp8_rowwise_k_groups(x, offs, config=c)
            keep = {"x": x, "offs": offs}
        return keep, ref, [Launch(label, role, lambda c=c: call(c)) for label, role, c in launches]

    return Case(name, group, elems * 3 + 4 * scales, setup)


# Fine-grained shapes (issue 32): 131072 routed rows in 128 balanced groups; the experts' weights (G, N, K) with
# N the along-N contraction (gate | up stacked: 2 x the intermediate size). DeepSeek-V3 (8 experts a GPU) beside them
# as the control the defaults must not move.
FINE_ROWS = 131072
FINE = {
    "qwen3-30b-a3b": {"groups": 128, "weights": [(128, 1536, 2048), (128, 2048, 768)], "k_groups": [2048, 1536, 768]},
    "gpt-oss-120b": {"groups": 128, "weights": [(128, 5760, 2880), (128, 2880, 2880)], "k_groups": [2880, 5760]},
    "deepseek-v3": {"groups": 8, "weights": [(8, 4096, 7168), (8, 7168, 2048)], "k_groups": [7168, 4096]},
}


def fine_cases() -> list[Case]:
    """The 3D-along-N and k_groups quantizers at the fine-grained shapes: the old default (walking / split strips),
    the new default (``along_n_config`` / ``k_groups_config``: holding where a strip fits) and holding launches."""
    Hold = H.HoldConfig
    holds = [("hold 64 x 512 w16 1/SM", "candidate", Hold(64, 512, num_warps=16, programs_per_sm=1)),
             ("hold 32 x 1024 w16 1/SM", "candidate", Hold(32, 1024, num_warps=16, programs_per_sm=1)),
             ("hold 16 x 2048 w16 1/SM", "candidate", Hold(16, 2048, num_warps=16, programs_per_sm=1)),
             ("hold 16 x 1024 w8 2/SM", "candidate", Hold(16, 1024, num_warps=8, programs_per_sm=2)),
             ("hold 16 x 2048 w8 1/SM", "candidate", Hold(16, 2048, num_warps=8, programs_per_sm=1)),
             ("hold 8 x 4096 w16 1/SM (half sectors)", "candidate", Hold(8, 4096, num_warps=16, programs_per_sm=1))]  # fmt: skip
    out = []
    for model, spec in FINE.items():
        g = spec["groups"]
        sizes = [FINE_ROWS // g] * g
        for shape in spec["weights"]:
            launches = [("old: walking 64 x 512 w8", "old", C.ALONG_N_CONFIG), (f"new: {H.along_n_config(shape[1])}", "new", None)]
            launches += [h for h in holds if h[2].hold_rows >= shape[1]]
            out.append(fp8_cols_case(f"fine {model} W{shape} along N", launches, None, shape, group="fine"))
        for r in spec["k_groups"]:
            launches = [("old: split strips 64 x 512", "old", C.K_GROUPS_CONFIG),
                        (f"new: {H.k_groups_config(FINE_ROWS, g)}", "new", None)]
            launches += [h for h in holds if h[2].hold_rows >= FINE_ROWS // g]
            out.append(fp8_cols_case(f"fine {model} k_groups ({FINE_ROWS}, {r}) G={g}", launches, (r, sizes),
                                     group="fine", rows=FINE_ROWS))  # fmt: skip
    return out


def along_n_case(name: str, shape: tuple[int, int, int], launches: list[tuple[str, str, object]]) -> Case:
    def setup():
        w = make_input(shape)
        ref = mx_reference(w.transpose(1, 2), "rceil")
        runs = [Launch(label, role, lambda c=c: Q.quantize_3d(w, "N", config=c)) for label, role, c in launches]
        return {"w": w}, ref, runs

    return Case(name, "along_n", Q.quantize_3d_cost(*shape, BF16).bytes, setup)


def fused_case(name: str, kind: str, cols: int, launches: list[tuple[str, str, object]]) -> Case:
    """kind: "dim0" (M-groups), "dim1" (K-groups) on an (M, cols) operand, or "3d_K" / "3d_N" on the weights."""
    if kind == "dim0":
        cost = QB.quantize_dim0_blocked_cost(M, cols, G, BF16)
    elif kind == "dim1":
        cost = QB.quantize_dim1_blocked_cost(M, cols, G, BF16)
    else:
        cost = QB.quantize_3d_blocked_cost(G, N, K, BF16, kind[-1])

    def setup():
        offs = offsets(BALANCED)
        if kind in ("dim0", "dim1"):
            x = make_input((M, cols))
            fused = QB.quantize_dim0_blocked if kind == "dim0" else QB.quantize_dim1_blocked
            if kind == "dim0":
                q, s = mx_reference(x, "rceil")
                ref = (q, scale_layout.rearrange_m_groups_reference(s, offs))
                quantize, rearrange = Q.quantize_dim0, scale_layout.rearrange_m_groups
            else:
                q, s = mx_reference(x.t(), "rceil")
                ref = (q, scale_layout.rearrange_k_groups_reference(s, offs))
                quantize, rearrange = Q.quantize_dim1, scale_layout.rearrange_k_groups

            def unfused():
                q, s = quantize(x)
                return q, rearrange(s, offs)

            call = lambda c: fused(x, offs, config=c)
            keep = {"x": x}
        else:
            along = kind[-1]
            x = make_input((G, N, K))
            q, s = mx_reference(x if along == "K" else x.transpose(1, 2), "rceil")
            ref = (q, scale_layout.rearrange_3d_reference(s))

            def unfused():
                q, s = Q.quantize_3d(x, along)
                return q, scale_layout.rearrange_3d(s)

            call = lambda c: QB.quantize_3d_blocked(x, along, config=c)
            keep = {"x": x}
        runs = [Launch("quantize + rearrange (unfused)", "old", unfused)]
        runs += [Launch(label, role, lambda c=c: call(c)) for label, role, c in launches]
        return {**keep, "offs": offs}, ref, runs

    return Case(name, "fused", cost.bytes, setup)


def amax_rows_case(name: str, shape: tuple[int, ...], launches: list[tuple[str, str, object]]) -> Case:
    """The rows quantizer that also folds the column amax per group (``fp8_amax``) of an (M, C) operand in G
    balanced groups or of (G, N, K) weights, beside the plain rows quantizer (its old: the same first two outputs,
    no table)."""
    rows, cols = (shape[0] * shape[1], shape[2]) if len(shape) == 3 else shape
    groups = shape[0] if len(shape) == 3 else G

    def setup():
        x = make_input(shape)
        if len(shape) == 3:
            q, scale = chunked(F.quantize_fp8_rowwise_reference, x.view(rows, cols))
            ref = (q.view(shape), scale.view(shape[:2]), x.float().abs().amax(dim=1))
            call = lambda c: A.quantize_fp8_rowwise_3d_with_amax(x, config=c)
            plain = lambda: F.quantize_fp8_rowwise_3d(x, along="K")
            keep = {"x": x}
        else:
            offs = offsets(BALANCED)
            ref = (*chunked(F.quantize_fp8_rowwise_reference, x), A.column_amax_reference(x, offs))
            call = lambda c: A.quantize_fp8_rowwise_with_amax(x, offs, config=c)
            plain = lambda: F.quantize_fp8_rowwise(x)
            keep = {"x": x, "offs": offs}
        runs = [Launch("old: rows quantizer alone (no table)", "old", plain)]
        runs += [Launch(label, role, lambda c=c: call(c)) for label, role, c in launches]
        return keep, ref, runs

    return Case(name, "amax", A.with_amax_cost(rows, cols, groups, BF16).bytes, setup)


def from_amax_case(name: str, launches: list[tuple[str, str, object]], k_groups: int | None,
                   weights: tuple[int, int, int] = (G, N, K)) -> Case:  # fmt: skip
    """The second quantizer from the column amaxes (``fp8_amax``): k_groups of an (M, k_groups) operand in G
    balanced groups, or 3D along N of ``weights``; beside the unfused default, which finds the amaxes itself."""
    if k_groups is None:
        rows, cols, groups = weights[0] * weights[1], weights[2], weights[0]
    else:
        rows, cols, groups = M, k_groups, G

    def setup():
        if k_groups is None:
            w = make_input(weights)
            amax = w.float().abs().amax(dim=1)
            ref = F.quantize_fp8_rowwise_reference(w.transpose(-2, -1))
            unfused = lambda: F.quantize_fp8_rowwise_3d(w, along="N")
            call = lambda c: A.quantize_fp8_rowwise_3d_from_amax(w, amax, config=c)
            keep = {"w": w, "amax": amax}
        else:
            x, offs = make_input((M, k_groups)), offsets(BALANCED)
            amax = A.column_amax_reference(x, offs)
            ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
            unfused = lambda: F.quantize_fp8_rowwise_k_groups(x, offs)
            call = lambda c: A.quantize_fp8_rowwise_k_groups_from_amax(x, amax, offs, config=c)
            keep = {"x": x, "offs": offs, "amax": amax}
        runs = [Launch("old: unfused default (finds the amax itself)", "old", unfused)]
        runs += [Launch(label, role, lambda c=c: call(c)) for label, role, c in launches]
        return keep, ref, runs

    return Case(name, "amax", A.from_amax_cost(rows, cols, groups, BF16).bytes, setup)


def strips(strip, chunk, step, group=256, warps=8, **kw) -> C.ColwiseConfig:
    return C.ColwiseConfig(strip_cols=strip, chunk_rows=chunk, step_rows=step, group_cols=group, num_warps=warps, **kw)


def cases() -> list[Case]:
    old_rows, old_cols = F.TWO_PASS_ROWS_CONFIG, C.TWO_PASS_COLWISE_CONFIG
    k_groups = [("old: two-pass colwise (64, 64) w4", "old", old_cols), ("new: the default (k_groups: split strips; 3D along N: walking)", "new", None),
                ("strips, split (two launches)", "candidate", replace(C.COLWISE_CONFIG, split=True)),
                ("strips 16 x 512 g64 w8", "candidate", strips(16, 512, 512, group=64)),
                ("strips 32 x 256 g256, step 256, w8", "candidate", strips(32, 256, 256)),
                ("strips 8 x 1024 g256, step 1024, w8", "candidate", strips(8, 1024, 1024)),
                ("split: 64 x 512, step 128, g1024 w8", "candidate", strips(64, 512, 128, group=1024, split=True)),
                ("split: 32 x 256, step 256, g256 w8", "candidate", strips(32, 256, 256, split=True)),
                ("split: 64 x 256, step 64, g512 w4", "candidate", strips(64, 256, 64, group=512, warps=4, split=True)),
                ("split: 32 x 512, step 128, g256 w8", "candidate", strips(32, 512, 128, split=True))]  # fmt: skip
    W = C.WalkConfig
    walk_k_groups = [("walk 8 x 1024 w8, 1/SM", "candidate", W(8, 1024, 8, 1)),
                     ("walk 16 x 1024 w8, 1/SM", "candidate", W(16, 1024, 8, 1)),
                     ("walk 16 x 2048 w16, 1/SM", "candidate", W(16, 2048, 16, 1)),
                     ("walk 8 x 2048 w8, 1/SM", "candidate", W(8, 2048, 8, 1)),
                     ("walk 16 x 1024 w16, 2/SM", "candidate", W(16, 1024, 16, 2)),
                     ("walk 32 x 1024 w16, 1/SM", "candidate", W(32, 1024, 16, 1))]
    walk_n = [("walk 64 x 512 w8, 1/SM", "candidate", W(64, 512, 8, 1)),
              ("walk 32 x 512 w8, 1/SM", "candidate", W(32, 512, 8, 1)),
              ("walk 64 x 512 w16, 2/SM", "candidate", W(64, 512, 16, 2))]
    old_n = replace(Q.ALONG_N_COLS, scale_words=False)
    R = A.AmaxRowsConfig
    amax_rows = [("new: the default", "new", None), ("1/SM w8", "candidate", R(1, 8)), ("2/SM w8", "candidate", R(2, 8)),
                 ("1/SM w16", "candidate", R(1, 16)), ("2/SM w16", "candidate", R(2, 16)),
                 ("8/SM w8", "candidate", R(8, 8)), ("3/SM w8, <= 80 registers", "candidate", R(3, 8, max_registers=80)),
                 ("4/SM w8, <= 64 registers", "candidate", R(4, 8, max_registers=64)),
                 ("2/SM w8, <= 96 registers", "candidate", R(2, 8, max_registers=96))]  # fmt: skip
    amax_rows_narrow = amax_rows + [("2/SM w4", "candidate", R(2, 4)), ("4/SM w4", "candidate", R(4, 4)),
                                    ("2/SM w8, 8 rows", "candidate", R(2, 8, 8)), ("4/SM w8", "candidate", R(4, 8)),
                                    ("8/SM w4", "candidate", R(8, 4)), ("4/SM w8, 8 rows", "candidate", R(4, 8, 8)),
                                    ("6/SM w4", "candidate", R(6, 4)), ("16/SM w4, 1 row", "candidate", R(16, 4, 1)),
                                    ("16/SM w4, 2 rows", "candidate", R(16, 4, 2)),
                                    ("16/SM w8, 2 rows", "candidate", R(16, 8, 2)),
                                    ("32/SM w4, 1 row", "candidate", R(32, 4, 1))]  # fmt: skip
    pass2 = [("new: the default (k_groups 64 x 512 step 128 g1024 w8; along N 64 x 128 g512 w4)", "new", None),
             ("16 x 512, step 512, g256 w8 (the split launch's)", "candidate", strips(16, 512, 512)),
             ("32 x 256, step 256, g256 w8", "candidate", strips(32, 256, 256)),
             ("64 x 128, step 128, g512 w4", "candidate", strips(64, 128, 128, group=512, warps=4)),
             ("64 x 256, step 64, g512 w4", "candidate", strips(64, 256, 64, group=512, warps=4)),
             ("32 x 512, step 128, g256 w4", "candidate", strips(32, 512, 128, warps=4)),
             ("64 x 64, step 64, g512 w2", "candidate", strips(64, 64, 64, group=512, warps=2)),
             ("16 x 1024, step 256, g256 w8", "candidate", strips(16, 1024, 256)),
             ("32 x 128, step 128, g512 w4, 3 stages", "candidate",
              strips(32, 128, 128, group=512, warps=4, prefetch=False, num_stages=3)),
             ("64 x 512, step 128, g1024 w8", "candidate", strips(64, 512, 128, group=1024))]  # fmt: skip
    amax_cases = [
        amax_rows_case("amax: rowwise A + table (131072, 7168)", (M, K), amax_rows),
        from_amax_case("amax: k_groups A from table", pass2, K),
        amax_rows_case("amax: rowwise grad_out + table (131072, 2048)", (M, N), amax_rows_narrow),
        from_amax_case("amax: k_groups grad_out from table", pass2, N),
        amax_rows_case("amax: W along K + table (8, 2048, 7168)", (G, N, K), amax_rows),
        from_amax_case("amax: W along N from table (8, 2048, 7168)", pass2, None),
        from_amax_case(f"amax: W along N from table Scout {SCOUT}", pass2, None, SCOUT),
    ]
    # The fused-scale pair at the fine-grained weights (issue 32): the layer's --fuse path quantizes each weight
    # along K with the table, then along N from it; narrow rows (768-2880) want more programs an SM than the defaults.
    fine_amax = []
    for model, spec in FINE.items():
        for shape in spec["weights"]:
            fine_amax.append(amax_rows_case(f"fine_amax {model} W{shape} along K + table", shape, amax_rows_narrow))
            fine_amax.append(from_amax_case(f"fine_amax {model} W{shape} along N from table", pass2, None, shape))
    for case in fine_amax:
        case.group = "fine_amax"
    return fine_cases() + amax_cases + fine_amax + [
        fp8_rows_case("fp8 rowwise A (131072, 7168)", (M, K), [
            ("old: two passes (4, 1024) w4", "old", old_rows), ("new: one read (1, 8192) w8", "new", None),
            ("one read (2, 8192) w16", "candidate", F.Fp8RowwiseConfig(2, 8192, 16)),
        ]),
        fp8_cols_case("fp8 k_groups A (131072, 7168) -> (7168, 131072)", k_groups[:3] + k_groups[6:] + walk_k_groups[:1],
                      (K, BALANCED)),
        fp8_cols_case("fp8 k_groups grad_out (131072, 2048) -> (2048, 131072)", k_groups[:3] + k_groups[6:] + walk_k_groups[:1],
                      (N, BALANCED)),
        fp8_rows_case("fp8 rowwise grad_out (131072, 2048)", (M, N), [
            ("old: two passes (4, 1024) w4", "old", old_rows), ("new: one read (4, 2048) w8", "new", None),
            ("one read (8, 2048) w8", "candidate", F.Fp8RowwiseConfig(8, 2048, 8)),
        ]),
        fp8_cols_case("fp8 3D along N (8, 2048, 7168) -> (8, 7168, 2048)", k_groups[:3] + walk_n, None),
        fp8_cols_case(f"fp8 3D along N Scout {SCOUT}", k_groups[1:2] + walk_n[:2], None, SCOUT),
        fp8_rows_case("fp8 3D along K (8, 2048, 7168)", (G, N, K), [
            ("old: two passes (4, 1024) w4", "old", old_rows), ("new: one read (1, 8192) w8", "new", None),
        ]),
        along_n_case("mx quantize_3d N (8, 2048, 7168)", (G, N, K), [
            ("old: (128, 64) w1 s3 g2048, scale bytes", "old", old_n),
            ("new: (128, 64) w1 s3 g2048, scale words", "new", None),
            ("(256, 64) w1 s3 g2048, int64 words", "candidate", Q.ColsConfig((256, 64), 1, 3, 2048)),
            ("(128, 64) w1 s1 g2048, words", "candidate", Q.ColsConfig((128, 64), 1, 1, 2048)),
            ("(128, 32) w1 prefetch g2048, words", "candidate", Q.ColsConfig((128, 32), 1, 1, 2048, prefetch=True)),
        ]),
        along_n_case(f"mx quantize_3d N Scout {SCOUT}", SCOUT, [
            ("old: (128, 64) w1 s3 g2048, scale bytes", "old", old_n),
            ("new: (128, 64) w1 s3 g2048, scale words", "new", None),
        ]),
        fused_case("mx A dim0 + M-groups (131072, 7168)", "dim0", K, [("new: fused (32, 512) w8", "new", None)]),
        fused_case("mx A dim1 + K-groups (131072, 7168)", "dim1", K, [
            ("new: fused (32, 64) w1 g512", "new", None),
            ("fused (64, 64) w1 g512", "candidate", Q.ColsConfig((64, 64), 1, 1, 512)),
        ]),
        fused_case("mx grad_out dim0 + M-groups (131072, 2048)", "dim0", N, [("new: fused (32, 512) w8", "new", None)]),
        fused_case("mx grad_out dim1 + K-groups (131072, 2048)", "dim1", N, [("new: fused (32, 64) w1 g512", "new", None)]),
        fused_case("mx W along K + 3D blocked (8, 2048, 7168)", "3d_K", K, [("new: fused (32, 512) w8", "new", None)]),
        fused_case("mx W along N + 3D blocked (8, 2048, 7168)", "3d_N", K, [
            ("new: fused (128, 64) w1 s3 g2048", "new", None),
            ("fused (256, 64) w1 s3 g2048", "candidate", Q.ColsConfig((256, 64), 1, 3, 2048)),
        ]),
    ]  # fmt: skip


# ---- checks that are not timed: races and group shapes -------------------------------------------------------


def race_and_group_checks() -> list[dict]:
    """The strips kernel run three times at full size (a race in its pass 2 would show as a differing run), and the
    group-aware launches on groups empty, first or last, and off 16-row (FP8) or 128-row (MX images) boundaries."""
    results = []

    def check(name, got, want):
        ok = all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want, strict=True))
        results.append({"check": name, "ok": ok})
        print(f"  check {name}: {'ok' if ok else 'MISMATCH'}", flush=True)

    x = make_input((M, N))
    offs = offsets(BALANCED)
    ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
    for i in range(3):
        check(f"fp8 k_groups grad_out, strips default, run {i + 1}", F.quantize_fp8_rowwise_k_groups(x, offs), ref)
    small = x[: M // 8]
    rows = small.shape[0]
    fp8_sizes, mx_sizes = [rows // 3 + 1, 0, 3, rows - rows // 3 - 4], [rows // 4, 0, 32, rows - rows // 4 - 32]
    skew, mx_groups = offsets(fp8_sizes), offsets(mx_sizes)
    for config in (None, replace(C.COLWISE_CONFIG, split=True), C.TWO_PASS_COLWISE_CONFIG, C.WalkConfig(8, 1024)):
        check(f"fp8 k_groups groups {fp8_sizes}, {type(config).__name__}",
              F.quantize_fp8_rowwise_k_groups(small, skew, config=config),
              F.quantize_fp8_rowwise_k_groups_reference(small, skew))  # fmt: skip
    q, s = mx_reference(small, "rceil")
    check(f"mx dim0 + M-groups, groups {fp8_sizes}", QB.quantize_dim0_blocked(small, skew),
          (q, scale_layout.rearrange_m_groups_reference(s, skew)))  # fmt: skip
    q, s = mx_reference(small.t(), "rceil")
    check(f"mx dim1 + K-groups, groups {mx_sizes}", QB.quantize_dim1_blocked(small, mx_groups),
          (q, scale_layout.rearrange_k_groups_reference(s, mx_groups)))  # fmt: skip
    return results


# ---- running ------------------------------------------------------------------------------------------------


def same(got: tuple, ref: tuple) -> str | None:
    """None when every output equals the reference byte for byte, else what differs."""
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        g, r = g.view(torch.uint8) if g.dtype.itemsize == 1 else g, r.view(torch.uint8) if r.dtype.itemsize == 1 else r
        if g.shape != r.shape:
            return f"output {i}: shape {tuple(g.shape)}, reference {tuple(r.shape)}"
        if not torch.equal(g, r):
            return f"output {i}: {(g != r).sum().item()} of {g.numel()} elements differ"
    return None


def case_roof(case: Case, stream: float, samples: int) -> float:
    """A case's ceiling: the better of the run's streaming roof and the bf16 -> e4m3 cast (a quantizer's traffic)
    over as many elements as the case moves (its minimal bytes / 3), as a (., 1024) tensor: a launch of another
    size streams at another rate (a rows quantizer at 368640 x 2880 passed the (131072, 7168) cast by 1%)."""
    cols = 1024
    rows = max(case.min_bytes // 3 // cols, 1)
    return max(stream, copy_tbps(rows, cols, samples, torch.float8_e4m3fn))


def measure(case: Case, launch: Launch, ref: tuple, samples: int, roofs: dict) -> dict:
    row = {"case": case.name, "group": case.group, "config": launch.label, "role": launch.role,
           "min_bytes": case.min_bytes}  # fmt: skip
    try:
        got = launch.run()
        wrong = same(got, ref[: len(got)])  # a control may return fewer outputs (the rows quantizer: no table)
        torch.cuda.synchronize()
        if wrong:
            raise AssertionError(f"not bit-exact: {wrong}")
        t = time_fn(launch.run, samples=samples, target_replay_ms=5.0)
        tbps = case.min_bytes / t.median_us / 1e6
        row.update(ok=True, us=t.median_us, iqr_us=t.iqr_us, tbps=tbps, roof_tbps=roofs["case"],
                   pct_stream=tbps / roofs["case"])  # fmt: skip
    except Exception as e:  # noqa: BLE001 (a failing launch is reported and the run goes on)
        row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        traceback.print_exc(limit=2, file=sys.stderr)
    return row


def line(r: dict) -> str:
    if not r["ok"]:
        return f"{r['case'][:44]:44s} {r['config'][:42]:42s} FAILED {r['error']}"
    return (f"{r['case'][:44]:44s} {r['config'][:42]:42s} {r['us']:9.1f} {r['tbps']:6.2f} {r['pct_stream']:6.1%} "
            f"{r['roof_tbps']:6.2f}")  # fmt: skip


def main() -> None:
    os.environ.setdefault("OUT", "out")
    session = start(SCRIPT, __doc__.split("\n\n")[0], "fp8,along_n,fused,amax,fine", "comma-separated groups", M, K)
    args, t0 = session.args, session.t0
    if args.out is None:
        args.out = os.path.join(os.environ["OUT"], f"{SCRIPT}.json")
    roofs = {"copy": session.roof, "read2write1": copy_tbps(M, K, args.samples, torch.float8_e4m3fn)}
    roofs["stream"] = max(roofs.values())
    print(f"roof over (131072, 7168) bf16: copy {roofs['copy']:.2f} TB/s, cast to e4m3 {roofs['read2write1']:.2f} "
          f"TB/s; stream = {roofs['stream']:.2f}", flush=True)  # fmt: skip
    only = set(filter(None, args.only.split(",")))
    rows, skipped, checks = [], [], []
    header = f"{'case':44s} {'config':42s} {'us':>9s} {'TB/s':>6s} {'%roof':>6s} {'roof':>6s}"
    print(header, flush=True)
    for case in cases():
        if only and case.group not in only:
            continue
        if time.monotonic() - t0 > args.budget_s:
            skipped.append({"case": case.name})
            continue
        try:
            keep, ref, launches = case.setup()
        except Exception as e:  # noqa: BLE001
            rows.append({"case": case.name, "group": case.group, "config": "(setup)", "role": "setup", "ok": False,
                         "error": f"{type(e).__name__}: {e}"[:300]})  # fmt: skip
            traceback.print_exc(limit=2, file=sys.stderr)
            continue
        roofs["case"] = case_roof(case, roofs["stream"], args.samples)
        for launch in launches:
            if time.monotonic() - t0 > args.budget_s:
                skipped.append({"case": case.name, "config": launch.label})
                continue
            rows.append(measure(case, launch, ref, args.samples, roofs))
            print(line(rows[-1]), flush=True)
        del keep, ref, launches
        torch.cuda.empty_cache()
    if not only or "fp8" in only or "fused" in only:
        try:
            checks = race_and_group_checks()
        except Exception as e:  # noqa: BLE001
            checks = [{"check": "(race and group checks)", "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}]
            traceback.print_exc(limit=2, file=sys.stderr)

    print(f"\n{session.device}; roof: copy {roofs['copy']:.2f} TB/s, cast {roofs['read2write1']:.2f} TB/s. TB/s over "
          "each case's minimal traffic; %roof of the case's roof (the better of those two and the cast over the "
          "case's elements); old = the default before issue 11")  # fmt: skip
    print(header)
    for r in rows:
        print(line(r))
    bad = [c["check"] for c in checks if not c["ok"]] + [f"{r['case']} / {r['config']}" for r in rows if not r["ok"]]
    print(f"not ok: {'; '.join(bad)}" if bad else "every launch and check bit-exact")
    roofs.pop("case", None)  # each row keeps its own (roof_tbps)
    session.finish(
        SCRIPT, rows, skipped, {"roofs_tbps": roofs, "checks": checks, "sizes": {"M": M, "K": K, "N": N, "G": G}},
        timing={"target_replay_ms": 5.0},
    )


if __name__ == "__main__":
    main()
