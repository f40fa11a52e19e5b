"""Tune the tiles and warps of the MXFP8 quantizers (``mxkernels.quant.quantize``) on a CUDA GPU.

    python scripts/tune_quantize.py [--budget-s 170] [--samples 10] [--only dim1,3d_N]

For each quantizer at DeepSeek-V3 and Llama 4 Scout shapes (bf16 input, RCEIL) and each candidate config passed
explicitly (rows kernel: tile, num_warps; cols kernel: tile, num_warps, num_stages and the column-group width
``group_cols``, 0 = whole width; the first cols config is the control), the output is first checked bit-exact against ``quantize_reference`` (computed once per case, in
chunks), then timed with ``mxbench.instruments.timing.time_fn`` (cold-L2 CUDA-graph replays). One line per (quantizer, shape,
config): median us, IQR, TB/s over ``quantize_2d_cost`` (2 B read + 1 + 1/32 B written per element) and the fraction
of a plain copy kernel's TB/s measured first on the same card (the target is >= 90%). Then the best config per case,
per quantizer the config with the least total time, and RCEIL vs FLOOR at the control config, timed back to back
as rceil, floor, rceil (so drift between runs shows). By default only the cols quantizers (dim1, 3d_N) run.
A failing config is reported and skipped; configs left when the budget runs out are listed. All numbers go to
``$OUT/tune_quantize.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import sys
import time
import traceback

import torch
from mxkernels.quant import quantize as qz
from mxkernels.core.format import BLOCK_SIZE, quantize_reference

from mxbench.instruments.timing import time_fn
from tuning import start

M = 131072
# (tile, num_warps) candidates (the fields of qz.RowsConfig). Rows kernel: every tile keeps 16 contiguous elements per
# thread.
ROWS_CONFIGS = [((32, 512), 8), ((32, 256), 4), ((64, 256), 8), ((16, 512), 4), ((16, 256), 2), ((8, 512), 2)]
# Cols kernel (tile, num_warps, num_stages, group columns: the fields of qz.ColsConfig): rows > 32 walk the tile 32
# rows at a time; stages > 1 copy the next steps' input into shared memory while a step computes (their register
# counts are in docs/perf-log.md); group 0 is the previous program order (whole width). Control first: the best of
# the last round, (64, 64) w1, in the old order.
COLS_CONFIGS = [((64, 64), 1, 1, 0), ((64, 64), 1, 1, 2048), ((32, 64), 1, 1, 0), ((32, 64), 1, 1, 2048),
                ((32, 64), 1, 1, 512), ((64, 64), 1, 2, 2048), ((64, 64), 1, 3, 2048), ((128, 64), 1, 3, 2048),
                ((256, 64), 1, 3, 2048), ((128, 64), 1, 2, 0), ((64, 64), 2, 2, 2048), ((64, 64), 1, 1, 512)]  # fmt: skip
# (quantizer, shape): 2D shapes are x (M, K); 3D shapes are w (G, N, K). Most important first.
CASES = [
    ("dim1", (M, 7168)), ("3d_N", (8, 2048, 7168)), ("dim0", (M, 7168)), ("3d_K", (8, 2048, 7168)),
    ("dim1", (M, 2048)), ("dim0", (M, 2048)),
    ("3d_N", (16, 8192, 5120)), ("3d_K", (16, 8192, 5120)), ("dim1", (M, 5120)), ("dim0", (M, 5120)),
    ("dim1", (M, 8192)), ("dim0", (M, 8192)),
]  # fmt: skip


def make_input(shape: tuple[int, ...]) -> torch.Tensor:
    """bf16 normals with a random power-of-two magnitude per row and per column (so blocks along either dim mix)."""
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    x *= torch.exp2(torch.randint(-20, 20, (*shape[:-1], 1), device="cuda")).bfloat16()
    x *= torch.exp2(torch.randint(-4, 4, (shape[-1],), device="cuda")).bfloat16()
    return x


def launcher(kind: str, x: torch.Tensor):
    """(run(mode, config) -> (q, s), blocks-last view t of x that ``quantize_reference`` quantizes). A rows config
    is the fields of ``RowsConfig`` (tile, num_warps), a cols config those of ``ColsConfig`` (tile, num_warps,
    num_stages, group_cols)."""
    if kind == "dim0":
        return lambda m, c: qz.quantize_dim0(x, m, config=qz.RowsConfig(*c)), x
    if kind == "3d_K":
        return lambda m, c: qz.quantize_3d(x, "K", m, config=qz.RowsConfig(*c)), x

    def run(m, c):
        if kind == "dim1":
            return qz.quantize_dim1(x, m, config=qz.ColsConfig(*c))
        return qz.quantize_3d(x, "N", m, config=qz.ColsConfig(*c))

    return run, (x.t() if kind == "dim1" else x.transpose(1, 2))


def reference(t: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle bytes of t (..., L), blocks along L, computed 4096 rows at a time (the oracle's fp32 temporaries of a
    whole (131072, 8192) input would take tens of GB)."""
    rows = t.reshape(-1, t.shape[-1])
    q = torch.empty(rows.shape, dtype=torch.uint8, device="cuda")
    s = torch.empty((rows.shape[0], rows.shape[1] // BLOCK_SIZE), dtype=torch.uint8, device="cuda")
    for i in range(0, rows.shape[0], 4096):
        qi, si = quantize_reference(rows[i : i + 4096].contiguous(), mode)
        q[i : i + 4096], s[i : i + 4096] = qi.view(torch.uint8), si.view(torch.uint8)
    return q.view(t.shape), s.view(*t.shape[:-1], -1)


def measure(kind: str, shape, run, ref, mode: str, config: tuple, samples: int) -> dict:
    cost = (qz.quantize_3d_cost(*shape, torch.bfloat16) if len(shape) == 3 else
            qz.quantize_2d_cost(*shape, torch.bfloat16))  # fmt: skip
    row = {"quantizer": kind, "shape": list(shape), "mode": mode, "tile": list(config[0]), "num_warps": config[1],
           "config": list(config), "bytes": cost.bytes}  # fmt: skip
    try:
        if ref is not None:
            q, s = run(mode, config)
            torch.cuda.synchronize()
            for name, got, want in (("scales", s, ref[1]), ("data", q, ref[0])):
                got = got.view(torch.uint8)
                if not torch.equal(got, want):
                    raise AssertionError(f"{name} differ from the reference in {(got != want).sum()} bytes")
            del q, s
        t = time_fn(lambda: run(mode, config), samples=samples, target_replay_ms=5.0)
        row.update(us=t.median_us, iqr_us=t.iqr_us, tbps=cost.bytes / t.median_us / 1e6, ok=True)
    except Exception as e:  # noqa: BLE001 (a failing config is reported and skipped)
        row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        traceback.print_exc(limit=1, file=sys.stderr)
    return row


def config_name(config) -> str:
    """(tile, warps) -> "(32, 512) w8"; (tile, warps, stages, group) -> "(64, 64) w1 s2 g2048"."""
    extra = f" s{config[2]} g{config[3]}" if len(config) > 2 else ""
    return f"{tuple(config[0])!s:10s} w{config[1]}{extra}"


def fmt(r: dict) -> str:
    return f"{r['quantizer']:5s} {tuple(r['shape'])!s:18s} {r['mode']:5s} {config_name(r['config']):22s}"


def main() -> None:
    only_help = "comma-separated quantizers (dim0, dim1, 3d_K, 3d_N)"
    session = start("tune_quantize", __doc__.split("\n\n")[0], "dim1,3d_N", only_help, M, 7168)
    args, t0, roof = session.args, session.t0, session.roof
    print(f"copy kernel bf16 (131072 x 7168): {roof:.2f} TB/s (read + write); 90% = {0.9 * roof:.2f}", flush=True)

    only = set(filter(None, args.only.split(",")))
    rows, skipped = [], []
    for kind, shape in CASES:
        if only and kind not in only:
            continue
        configs = ROWS_CONFIGS if kind in ("dim0", "3d_K") else COLS_CONFIGS
        if time.monotonic() - t0 > args.budget_s:
            skipped += [{"quantizer": kind, "shape": shape, "config": c} for c in configs]
            continue
        x = make_input(shape)
        run, t = launcher(kind, x)
        ref = reference(t, "rceil")
        control = configs[0]
        # FLOOR once per quantizer, at its first (largest) shape, between two RCEIL runs of the control.
        floor_done = any(r["quantizer"] == kind and r["mode"] == "floor" for r in rows)
        extra = [] if floor_done else [("floor", control), ("rceil", control)]
        for mode, config in [("rceil", c) for c in configs] + extra:
            if time.monotonic() - t0 > args.budget_s:
                skipped.append({"quantizer": kind, "shape": shape, "mode": mode, "config": config})
                continue
            r = measure(kind, shape, run, ref if mode == "rceil" else None, mode, config, args.samples)
            r["control"] = config == control
            rows.append(r)
            status = (f"{r['us']:9.2f} us +-{r['iqr_us']:5.2f}  {r['tbps']:5.2f} TB/s  {r['tbps'] / roof:4.0%} of copy"
                      if r["ok"] else f"FAILED {r['error']}")  # fmt: skip
            tag = "  (control)" if r["control"] else ""
            print(f"[{time.monotonic() - t0:4.0f}s] {fmt(r)} {status}{tag}", flush=True)
        del x, t, ref, run
        torch.cuda.empty_cache()

    ok = [r for r in rows if r["ok"] and r["mode"] == "rceil"]
    best_case = {}
    for r in ok:
        key = (r["quantizer"], tuple(r["shape"]))
        if key not in best_case or r["us"] < best_case[key]["us"]:
            best_case[key] = r
    print("\nbest per case (rceil):")
    for r in best_case.values():
        flag = "" if r["tbps"] >= 0.9 * roof else "  < 90% of copy"
        print(f"  {fmt(r)} {r['us']:9.2f} us {r['tbps']:5.2f} TB/s {r['tbps'] / roof:4.0%}{flag}")
    print("best per quantizer (least total time over the cases every config finished):")
    best_kind = {}
    for kind in dict.fromkeys(r["quantizer"] for r in ok):
        cases = {tuple(r["shape"]) for r in ok if r["quantizer"] == kind}
        totals = {}
        for r in ok:
            if r["quantizer"] == kind:
                totals.setdefault(tuple(map(str, r["config"])), {})[tuple(r["shape"])] = r["us"]
        full = {c: sum(v.values()) for c, v in totals.items() if set(v) == cases}
        if full:
            c = min(full, key=full.get)
            best_kind[kind] = {"config": list(c), "total_us": full[c]}
            print(f"  {kind:5s} {' '.join(c)}  total {full[c]:.1f} us over {len(cases)} shapes")
    print("rceil vs floor at the control config (rceil runs before and after floor):")
    for f in (r for r in rows if r["ok"] and r["mode"] == "floor"):
        same = [r for r in ok if r["control"] and r["quantizer"] == f["quantizer"] and r["shape"] == f["shape"]]
        rceil = ", ".join(f"{r['us']:.2f}" for r in same)
        print(f"  {f['quantizer']:5s} {tuple(f['shape'])}: rceil {rceil} us, floor {f['us']:.2f} us")
    keys = ("quantizer", "shape", "config", "us", "tbps")
    best = [{k: r[k] for k in keys} for r in best_case.values()]
    summary = {"best_per_case": best, "best_per_quantizer": best_kind}
    session.finish("tune_quantize", rows, skipped, summary, timing={"target_replay_ms": 5.0})


if __name__ == "__main__":
    main()
