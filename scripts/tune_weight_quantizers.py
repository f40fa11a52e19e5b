"""The FP8 rowwise quantizers whose scale spans a column of a group (3D weights along N, k_groups) at issue 32's
shapes: every candidate launch checked byte for byte against the plain-torch oracle (one that differs is WRONG and not
timed), then timed with mxbench's ``time_fn`` (CUDA-graph replays, cold L2), in us, TB/s over the minimal traffic
(bf16 read once, e4m3 written once, fp32 scales: 3 bytes an element) and % of the H200's 4.8 TB/s datasheet
bandwidth and of the bf16 -> fp8 cast's roof measured first (the same traffic, 2 bytes read and 1 written). Last,
per shape class of ``fp8_hold``'s defaults tables, the launch to ship (rows to paste into ``ALONG_N_DEFAULTS`` /
``K_GROUPS_DEFAULTS``), and the JSON to ``--out``.

    python scripts/tune_weight_quantizers.py --out $OUT/tune_weight_quantizers.json   # under 4 minutes, one H200
    python scripts/tune_weight_quantizers.py --quick                                 # a few candidates a case
    python scripts/tune_weight_quantizers.py --table tune_weight_quantizers.json      # a stored run, no GPU

Shapes (bf16): weights (G, N, K) along N, the scale over N: Qwen3-30B-A3B (128, 1536, 2048) gate|up and
(128, 2048, 768) down; gpt-oss-120b (128, 5760, 2880) and (128, 2880, 2880); DeepSeek-V3 (8, 4096, 7168) and
(8, 7168, 2048). k_groups (M, R) in G balanced groups, the scale over a group's rows: gpt-oss-120b 131072 x 2880 and
x 5760 (128 groups of 1024); Qwen3-30B-A3B 65536 x 2048 and x 768 (128 groups of 512).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import dataclass
from math import prod
from pathlib import Path

# tuning first: it makes mxkernels and mxbench importable from a checkout where they are not installed.
# isort: off
from tuning import start

import torch
import triton
from mxkernels.core.format import quantize_reference as mx_quantize_reference
from mxkernels.layouts import scale_layout
from mxkernels.quant import fp8_colwise as C
from mxkernels.quant import fp8_hold as H
from mxkernels.quant import fp8_rowwise as F
from mxkernels.quant import quantize_blocked as QB
from mxkernels.quant.quantize_cols import ColsConfig
from mxbench.instruments.timing import time_fn

# isort: on

SCRIPT = "tune_weight_quantizers"
DEVICE = "cuda"  # the tests run the whole script on CPU (the interpreter) with tiny cases
DATASHEET_TBPS = 4.8  # NVIDIA H200 SXM, HBM3e (the roof; the bf16 -> fp8 cast's roof is measured beside it)


@dataclass(frozen=True)
class Case:
    """One tensor to quantize: ``kind`` "along_n" with ``shape`` (G, N, K) weights, or "k_groups" with ``shape``
    (M, R) in ``groups`` balanced groups."""

    name: str
    kind: str
    shape: tuple[int, ...]
    groups: int = 0

    @property
    def span(self) -> int:
        """The rows one scale spans: the defaults tables' key (N; the average group); 32 for MXFP8's blocks."""
        if self.kind.startswith("mx_"):
            return 32
        return self.shape[1] if self.kind == "along_n" else -(-self.shape[0] // self.groups)

    @property
    def min_bytes(self) -> int:
        """bf16 read once, e4m3 written once, one fp32 scale a column of each expert or group; MXFP8: the blocked
        quantizers' own costs (e8m0 scales in their blocked images, padding included)."""
        if self.kind == "mx_along_n":
            return QB.quantize_3d_blocked_cost(*self.shape, torch.bfloat16, "N").bytes
        if self.kind == "mx_k_groups":
            return QB.quantize_dim1_blocked_cost(*self.shape, self.groups, torch.bfloat16).bytes
        scales = self.shape[0] * self.shape[2] if self.kind == "along_n" else self.groups * self.shape[1]
        return 3 * prod(self.shape) + 4 * scales


# Ordered so that a run cut short by --budget-s has measured one case of every shape class first.
CASES = (
    Case("gpt-oss-120b k_groups 131072x2880", "k_groups", (131072, 2880), 128),
    Case("qwen3-30b-a3b k_groups 65536x2048", "k_groups", (65536, 2048), 128),
    Case("qwen3-30b-a3b w13 along N", "along_n", (128, 1536, 2048)),
    Case("gpt-oss-120b w2 along N", "along_n", (128, 2880, 2880)),
    Case("gpt-oss-120b w13 along N", "along_n", (128, 5760, 2880)),
    Case("gpt-oss-120b k_groups 131072x5760", "k_groups", (131072, 5760), 128),
    Case("qwen3-30b-a3b k_groups 65536x768", "k_groups", (65536, 768), 128),
    Case("qwen3-30b-a3b w2 along N", "along_n", (128, 2048, 768)),
    Case("deepseek-v3 w13 along N", "along_n", (8, 4096, 7168)),
    Case("deepseek-v3 w2 along N", "along_n", (8, 7168, 2048)),
)


# --mx: MXFP8's blocked quantizers at the same shapes, the scale a 32-row block along N or the groups' rows (dim1 +
# K-groups, wgrad), each with its blocked scale image: ``quantize_blocked``'s defaults against cols-kernel launches.
MX_CASES = (
    Case("mx gpt-oss-120b dim1+K-groups 131072x2880", "mx_k_groups", (131072, 2880), 128),
    Case("mx qwen3-30b-a3b dim1+K-groups 65536x2048", "mx_k_groups", (65536, 2048), 128),
    Case("mx qwen3-30b-a3b w13 along N", "mx_along_n", (128, 1536, 2048)),
    Case("mx gpt-oss-120b w2 along N", "mx_along_n", (128, 2880, 2880)),
    Case("mx qwen3-30b-a3b w2 along N", "mx_along_n", (128, 2048, 768)),
    Case("mx gpt-oss-120b w13 along N", "mx_along_n", (128, 5760, 2880)),
)
MX_COLS = [ColsConfig((128, 64), 1, 3, 2048), ColsConfig((32, 64), 1, 1, 512), ColsConfig((64, 64), 1, 2, 1024),
           ColsConfig((128, 64), 1, 3, 512), ColsConfig((64, 64), 1, 1, 512, prefetch=True),
           ColsConfig((128, 32), 1, 1, 2048, prefetch=True), ColsConfig((32, 128), 1, 1, 1024),
           ColsConfig((64, 128), 2, 2, 1024)]  # fmt: skip


def _hold(strip, hold, warps, per_sm, **kw) -> H.HoldConfig:
    return H.HoldConfig(strip_cols=strip, hold_rows=hold, num_warps=warps, programs_per_sm=per_sm, **kw)


# Holding launches by the rows they hold (a case gets those whose hold_rows is its span's next power of two: a
# larger hold only masks registers off). Each list best guess first (--quick keeps the first two). The comments give
# ptxas' registers and stack bytes a thread (sm_90, triton 3.6; scripts/crosscompile_weight_quantizers.py) and so the
# programs an SM: "grid" (one program a strip, no loop) needs ~94-108 registers at 64 elements a thread where the
# persistent loop needs 165-206, so two 8-warp programs share an SM uncapped; caps force the count elsewhere. The
# current default (the rule) is timed as "default" and not repeated.
HOLDS = {
    512: [
        _hold(32, 512, 8, 1, persistent=False),  # 94 regs: 2 an SM, the hardware overlaps them
        _hold(64, 512, 16, 1, persistent=False, max_registers=64),  # whole lines, 2 an SM (stack 72)
        _hold(32, 512, 8, 2, max_registers=128),  # persistent, 2 an SM (stack 8)
        _hold(32, 512, 16, 1, prefetch=True),  # the next strip's loads in flight (128, stack 0)
        _hold(32, 512, 8, 1, persistent=False, max_registers=80),  # 3 an SM (stack 24)
        _hold(64, 512, 16, 1, packed=True, prefetch=True),  # whole lines, next strip in flight (stack 88)
    ],
    1024: [
        _hold(16, 1024, 8, 1, persistent=False),  # 108 regs: 2 an SM (one-sector rows)
        _hold(32, 1024, 16, 1, persistent=False, max_registers=64),  # 2 an SM (stack 96)
        _hold(32, 1024, 16, 1, packed=True, prefetch=True),  # (stack 64)
        _hold(16, 1024, 16, 1, prefetch=True),  # (128, stack 0)
        _hold(16, 1024, 8, 2, max_registers=128),  # persistent, 2 an SM (stack 24)
    ],
    2048: [  # one read of Qwen3's experts along N
        _hold(16, 2048, 16, 1, packed=True, prefetch=True),  # (stack 112)
        _hold(16, 2048, 16, 1, persistent=False, max_registers=64),  # 2 an SM (stack 80)
        _hold(16, 2048, 8, 1, persistent=False, packed=True, max_registers=128),  # 2 an SM (stack 256)
        _hold(32, 2048, 16, 1, packed=True),  # 64 bytes a row, one program (stack 216)
    ],
    4096: [_hold(16, 4096, 16, 1, packed=True)],  # gpt-oss-120b's 2880 and DeepSeek-V3's 4096 along N (stack 584)
}
# Walking launches (two passes, the second from L2 while the strips in flight fit there), for every case: more
# programs an SM (capped so that they fit: uncapped the walking kernel takes 150-255 registers), and shared-memory
# pipelined loads (cp.async, num_stages) with few warps. The 1/SM ones keep the strips in flight small enough for L2
# (132 x 7168 rows x 16 columns x 2 bytes = 30 MB at DeepSeek-V3's longest) with ~24-32 KB of loads in flight an SM.
WALKS = [C.WalkConfig(32, 256, num_warps=4, programs_per_sm=4, prefetch=False, num_stages=3, max_registers=128),
         C.WalkConfig(16, 256, num_warps=4, programs_per_sm=1, prefetch=False, num_stages=4),  # 128 regs
         C.WalkConfig(32, 128, num_warps=4, programs_per_sm=1, prefetch=False, num_stages=4),  # 145 regs
         C.WalkConfig(64, 128, num_warps=4, programs_per_sm=4, prefetch=False, num_stages=3, max_registers=128),
         C.WalkConfig(64, 256, num_warps=8, programs_per_sm=2, max_registers=128)]  # fmt: skip


def label(config) -> str:
    if config is None:
        return "default"
    if isinstance(config, H.HoldConfig):
        return config.label()
    if isinstance(config, C.WalkConfig):
        how = "prefetch" if config.prefetch else f"s{config.num_stages}"
        cap = f" r{config.max_registers}" if config.max_registers else ""
        return f"walk {config.strip_cols}x{config.step_rows} w{config.num_warps} {config.programs_per_sm}/SM {how}{cap}"
    if isinstance(config, ColsConfig):
        how = "prefetch" if config.prefetch else f"s{config.num_stages}"
        return f"cols {config.tile[0]}x{config.tile[1]} w{config.num_warps} {how} g{config.group_cols}"
    if isinstance(config, C.ColwiseConfig):
        return f"strips {config.strip_cols}x{config.chunk_rows} step {config.step_rows} g{config.group_cols}" + (
            " split" if config.split else "")  # fmt: skip
    return repr(config)


def candidates(case: Case, quick: bool) -> list:
    """The default (None) first, the old split launch for k_groups, then the holds sized for the case's span and
    the walking launches; --quick: the default and two of each. MXFP8: the default and the cols launches."""
    if case.kind.startswith("mx_"):
        cols = [c for c in MX_COLS if c != default_config(case)]
        return [None, *cols[: 3 if quick else None]]
    shipped = default_config(case)  # timed once, as the default (a table row may name one of the candidates)
    holds = [h for h in HOLDS.get(triton.next_power_of_2(case.span), []) if h != shipped]
    walks = [w for w in WALKS if w not in (C.ALONG_N_CONFIG, shipped)]
    old = [C.K_GROUPS_CONFIG, C.ALONG_N_CONFIG] if case.kind == "k_groups" else [C.ALONG_N_CONFIG]
    old = [c for c in old if c != shipped]
    if quick:
        return [None, *holds[:2], *walks[:2]]
    return [None, *holds, *walks, *old]


def default_config(case: Case):
    if case.kind.startswith("mx_"):
        return QB.ALONG_N_BLOCKED if case.kind == "mx_along_n" else QB.DIM1_BLOCKED
    if case.kind == "along_n":
        return H.along_n_config(case.span)
    return H.k_groups_config(case.shape[0], case.groups)


def shape_class(case: Case) -> int:
    """The bound of the defaults table's row that ``case`` falls in (MXFP8: one class a kind, 1 << 31)."""
    if case.kind.startswith("mx_"):
        return 1 << 31
    table = H.ALONG_N_DEFAULTS if case.kind == "along_n" else H.K_GROUPS_DEFAULTS
    return next(bound for bound, _ in table if case.span <= bound)


# ---- running ------------------------------------------------------------------------------------------------


def setup(case: Case):
    """(quantize(config) -> outputs, the oracle's outputs, tensors to keep) of a case, random normal bf16 values."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    if case.kind.startswith("mx_"):
        return _mx_setup(case, gen)
    if case.kind == "along_n":
        w = (torch.randn(case.shape, device=DEVICE, generator=gen) * case.shape[2] ** -0.5).bfloat16()
        ref = F.quantize_fp8_rowwise_reference(w.transpose(-2, -1))
        return (lambda c: F.quantize_fp8_rowwise_3d(w, along="N", config=c)), ref, (w,)
    M, R = case.shape
    x = torch.randn(M, R, device=DEVICE, generator=gen).bfloat16()
    offs = torch.arange(1, case.groups + 1, device=DEVICE, dtype=torch.int32) * (M // case.groups)
    ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
    return (lambda c: F.quantize_fp8_rowwise_k_groups(x, offs, config=c)), ref, (x, offs)


def _mx_oracle(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 (RCEIL) oracle bytes of t (..., L), blocks along L, 8192 rows at a time (fp32 temporaries)."""
    rows = t.reshape(-1, t.shape[-1])
    parts = [mx_quantize_reference(rows[i : i + 8192].contiguous(), "rceil") for i in range(0, rows.shape[0], 8192)]
    q = torch.cat([p[0].view(torch.uint8) for p in parts]).view(t.shape)
    return q, torch.cat([p[1].view(torch.uint8) for p in parts]).view(*t.shape[:-1], -1)


def _mx_setup(case: Case, gen: torch.Generator):
    if case.kind == "mx_along_n":
        w = (torch.randn(case.shape, device=DEVICE, generator=gen) * case.shape[2] ** -0.5).bfloat16()
        q, scales = _mx_oracle(w.transpose(1, 2))
        ref = (q, scale_layout.rearrange_3d_reference(scales))
        return (lambda c: QB.quantize_3d_blocked(w, "N", config=c)), ref, (w,)
    M, R = case.shape
    x = torch.randn(M, R, device=DEVICE, generator=gen).bfloat16()
    offs = torch.arange(1, case.groups + 1, device=DEVICE, dtype=torch.int32) * (M // case.groups)
    q, scales = _mx_oracle(x.t())
    ref = (q, scale_layout.rearrange_k_groups_reference(scales, offs))
    return (lambda c: QB.quantize_dim1_blocked(x, offs, config=c)), ref, (x, offs)


def differs(got, ref) -> str | None:
    """None when every output equals the reference byte for byte, else what differs."""
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        g, r = (t.view(torch.uint8) if t.dtype.itemsize == 1 else t.view(torch.int32) for t in (g, r))
        if g.shape != r.shape:
            return f"output {i}: shape {tuple(g.shape)}, oracle {tuple(r.shape)}"
        if not torch.equal(g, r):
            return f"output {i}: {(g != r).sum().item()} of {g.numel()} elements differ"
    return None


def measure(case: Case, config, run, ref, default_out, samples: int, roof: float) -> dict:
    row = {"case": case.name, "kind": case.kind, "shape": list(case.shape), "groups": case.groups,
           "span": case.span, "class": shape_class(case), "config": label(config), "config_repr": repr(config),
           "min_bytes": case.min_bytes}  # fmt: skip
    try:
        got = run(config)
        wrong = differs(got, ref)
        row["bits_equal_oracle"] = wrong is None
        row["bits_equal_default"] = config is None or (default_out is not None and differs(got, default_out) is None)
        if wrong:
            row.update(ok=False, error=f"WRONG: {wrong}")
            return row
        del got
        t = time_fn(lambda: run(config), samples=samples, target_replay_ms=5.0)
        tbps = case.min_bytes / t.median_us / 1e6
        row.update(ok=True, us=t.median_us, iqr_us=t.iqr_us, tbps=tbps, pct_datasheet=tbps / DATASHEET_TBPS,
                   pct_cast=tbps / roof)  # fmt: skip
    except Exception as e:  # noqa: BLE001 (a failing launch is reported and the run goes on)
        row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        traceback.print_exc(limit=2, file=sys.stderr)
    return row


HEADER = (
    f"{'case':36s} {'candidate':44s} {'us':>9s} {'TB/s':>6s} {'%4.8':>6s} {'%cast':>6s} {'bits':>6s} {'x dflt':>6s}"
)


def line(r: dict, default_us: float | None) -> str:
    if not r["ok"]:
        return (
            f"{r['case'][:36]:36s} {r['config'][:44]:44s} {'WRONG' if 'WRONG' in r['error'] else 'FAILED'} {r['error']}"
        )
    speed = f"{default_us / r['us']:6.2f}" if default_us else "     -"
    # Runs before the cast roof stored a bf16 copy's ("pct_copy"), which a quantizer's lighter writes can pass.
    cast = f"{r['pct_cast']:6.1%}" if "pct_cast" in r else "     -"
    return (f"{r['case'][:36]:36s} {r['config'][:44]:44s} {r['us']:9.1f} {r['tbps']:6.2f} {r['pct_datasheet']:6.1%} "
            f"{cast} {'=' if r['bits_equal_oracle'] else 'WRONG':>6s} {speed}")  # fmt: skip


def ship(rows: list[dict]) -> list[dict]:
    """Per shape class (kind, table bound): the candidate correct and timed on every case of the class with the least
    total time, against the default's total. Ties and a missing default keep the default."""
    picks = []
    for kind, bound in sorted({(r["kind"], r["class"]) for r in rows}):
        mine = [r for r in rows if (r["kind"], r["class"]) == (kind, bound)]
        cases = {r["case"] for r in mine}
        totals = {}
        for config in {r["config"] for r in mine}:
            timed = [r for r in mine if r["config"] == config and r["ok"]]
            if {r["case"] for r in timed} == cases:
                totals[config] = (sum(r["us"] for r in timed), timed[0]["config_repr"])
        if not totals:
            continue
        best = min(totals, key=lambda c: totals[c][0])
        default = totals.get("default", (None, None))[0]
        if default is not None and totals[best][0] >= default:
            best = "default"
        picks.append({"kind": kind, "class": bound, "cases": sorted(cases), "ship": best,
                      "config_repr": totals[best][1], "total_us": totals[best][0], "default_total_us": default,
                      "speedup": default / totals[best][0] if default else None})  # fmt: skip
    return picks


def print_ship(picks: list[dict]) -> None:
    print("\nship, per shape class (fp8_hold.ALONG_N_DEFAULTS / K_GROUPS_DEFAULTS rows; 'default' = keep the row):")
    for p in picks:
        table = {"along_n": "ALONG_N_DEFAULTS", "k_groups": "K_GROUPS_DEFAULTS",
                 "mx_along_n": "quantize_blocked.ALONG_N_BLOCKED (whole)",
                 "mx_k_groups": "quantize_blocked.DIM1_BLOCKED (whole)"}[p["kind"]]  # fmt: skip
        gain = f"{p['speedup']:.2f}x the default" if p["speedup"] else "default not timed"
        print(
            f"  {table} rows <= {p['class']}: {p['ship']}  ({p['total_us']:.1f} us over {len(p['cases'])} "
            f"case(s), {gain})"
        )
        if p["ship"] != "default":
            print(f"    ({p['class']}, {p['config_repr']}),")


def print_plan(quick: bool, cases=CASES) -> None:
    """The cases, their shape classes and candidates, and the kernels to compile (no GPU needed)."""
    kernels = set()
    for case in cases:
        configs = candidates(case, quick)
        print(
            f"{case.name} {case.shape} span {case.span}, class <= {shape_class(case)}, "
            f"default {label(default_config(case))}: {len(configs)} candidates"
        )
        for config in configs:
            print(f"    {label(config)}")
            kernels.add((case.kind, repr(config if config is not None else default_config(case))))
    print(f"{sum(len(candidates(c, quick)) for c in cases)} launches, about {len(kernels)} kernels to compile")


def print_table(rows: list[dict]) -> list[dict]:
    """Every case's launches fastest first, the picks per shape class, and what was not bit-exact; the picks."""
    print(HEADER)
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        default_us = next((r["us"] for r in mine if r["config"] == "default" and r["ok"]), None)
        for r in sorted(mine, key=lambda r: r.get("us", float("inf"))):
            print(line(r, default_us))
    picks = ship(rows)
    print_ship(picks)
    wrong = [f"{r['case']} / {r['config']}" for r in rows if not r["ok"]]
    print(f"not ok: {'; '.join(wrong)}" if wrong else "every candidate bit-exact against the oracle")
    return picks


def sweep(cases, args, session, rows: list, skipped: list) -> None:
    """Every case's candidates into ``rows`` (those past the time budget into ``skipped``), each printed as done."""
    for case in cases:
        run, ref, keep = setup(case)
        default_out, default_us = None, None
        for config in candidates(case, args.quick):
            if time.monotonic() - session.t0 > args.budget_s:
                skipped.append({"case": case.name, "config": label(config), "why": "budget"})
                continue
            row = measure(case, config, run, ref, default_out, args.samples, session.roof)
            if config is None and row.get("bits_equal_oracle"):
                default_out, default_us = ref, row.get("us")  # the default equals the oracle: compare to either
            rows.append(row)
            print(line(row, default_us), flush=True)
        del run, ref, keep, default_out
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def main() -> int:
    def options(parser):
        parser.add_argument("--quick", action="store_true", help="the default and two holds and walks a case")
        parser.add_argument("--cases", default="", help="comma-separated substrings of case names (default: all)")
        parser.add_argument("--list", action="store_true", help="print the cases and candidates and exit (no GPU)")
        parser.add_argument("--table", metavar="JSON", help="print a stored run's table and picks and exit (no GPU)")
        parser.add_argument("--mx", action="store_true", help="MXFP8's blocked quantizers instead (3D along N, dim1)")

    if "--table" in sys.argv:  # a stored run's table and picks, no GPU
        print_table(json.loads(Path(sys.argv[sys.argv.index("--table") + 1]).read_text())["rows"])
        return 0
    if "--list" in sys.argv:
        print_plan("--quick" in sys.argv, MX_CASES if "--mx" in sys.argv else CASES)
        return 0
    session = start(SCRIPT, __doc__.splitlines()[0], "all", "unused (see --cases)", 131072, 2880, options,
                    roof_dtype=torch.float8_e4m3fn)
    args = session.args
    wanted = [s for s in args.cases.split(",") if s]
    cases = [c for c in (MX_CASES if args.mx else CASES) if not wanted or any(w in c.name for w in wanted)]
    print(f"cast roof (bf16 -> fp8, 2 B read + 1 written) {session.roof:.2f} TB/s; datasheet {DATASHEET_TBPS} TB/s",
          flush=True)
    print(HEADER, flush=True)
    rows, skipped = [], []
    try:
        sweep(cases, args, session, rows, skipped)
    except KeyboardInterrupt:  # SIGINT (a session's deadline): keep what was measured, write it, say what was not
        done = {(r["case"], r["config"]) for r in rows} | {(r["case"], r["config"]) for r in skipped}
        skipped += [{"case": c.name, "config": label(k), "why": "interrupted"} for c in cases
                    for k in candidates(c, args.quick) if (c.name, label(k)) not in done]  # fmt: skip
        print(f"interrupted: {len(rows)} launches measured, {len(skipped)} not", flush=True)
    print(f"\n{session.device}; cast roof {session.roof:.2f} TB/s; TB/s over 3 bytes an element + scales")
    picks = print_table(rows)
    session.finish(SCRIPT, rows, skipped, {"ship": picks, "datasheet_tbps": DATASHEET_TBPS,
                                           "cases": [c.__dict__ for c in cases]},
                   timing={"target_replay_ms": 5.0})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
