"""Where the along-K weight quantizer with the column-amax table loses against the plain rows quantizer: the same
weights through ``fp8_rowwise.quantize_fp8_rowwise_3d(along="K")`` (non-persistent, no table), ``fp8_amax``'s
rows kernel without the table (``groups`` 0) and with it, over grids from few persistent programs to many, each
timed with ``time_fn`` (cold-L2 graph replays) on one GPU; every output (the table too, where there is one)
checked equal to the shipped ``quantize_fp8_rowwise_3d_with_amax``'s first.

    python scripts/probe_rows_amax.py [--out PATH] [--samples 5]
"""

from __future__ import annotations

# isort: off
from tuning import start

import torch
from mxkernels.core.runtime import launch_by_width
from mxkernels.quant import fp8_amax as A
from mxkernels.quant import fp8_rowwise as F
from tune_quantize import make_input
from mxbench.instruments.timing import time_fn

# isort: on

SCRIPT = "probe_rows_amax"
WEIGHTS = {"qwen3-30b-a3b": [(128, 1536, 2048), (128, 2048, 768)], "deepseek-v2-lite": [(64, 2816, 2048)],
           "gpt-oss-120b": [(128, 2880, 2880)], "deepseek-v3": [(8, 4096, 7168)]}  # fmt: skip
R = A.AmaxRowsConfig
# Grids from the shipped few persistent programs to many one-span programs (a grid in waves, as the plain
# quantizer's). (Spans within an expert each storing a partial table, reduced after, instead of atomics:
# probe_rows_amax-3-span.json, commit cca21ff; no faster, and taken back out.)
CONFIGS = [R(6, 4), R(16, 4, block_rows=1), R(16, 4, block_rows=2), R(32, 4, block_rows=1), R(64, 4, block_rows=1),
           R(64, 4, block_rows=2), R(16, 8, block_rows=4), R(64, 8, block_rows=4)]  # fmt: skip


def variants(w):
    G, N, K = w.shape
    config = launch_by_width(A.WEIGHT_ROWS_DEFAULTS, K)
    out = {
        "plain rows (fp8_rowwise, no table)": lambda: F.quantize_fp8_rowwise_3d(w, along="K"),
        "amax kernel + table (shipped)": lambda: A.quantize_fp8_rowwise_3d_with_amax(w),
    }
    for c in [config, *CONFIGS]:
        name = f"{c.programs_per_sm}/SM w{c.num_warps} r{c.block_rows} cap{c.max_registers}"
        out[f"{name} no table"] = lambda c=c: A._rows_with_amax(w.view(G * N, K), None, 0, 1, c)
        out[f"{name} + table"] = lambda c=c: A._rows_with_amax(w.view(G * N, K), None, G, N, c)
    return out


def main() -> None:
    session = start(SCRIPT, __doc__, "", "", 131072, 2048)
    rows = []
    for model, shapes in WEIGHTS.items():
        for shape in shapes:
            w = make_input(shape)
            ref = [t.reshape(-1) for t in A.quantize_fp8_rowwise_3d_with_amax(w)]
            for label, fn in variants(w).items():
                got = [t.reshape(-1) for t in fn()]  # the along-K copy and scales, and the table where there is one
                ok = all(torch.equal(g.view(torch.uint8) if g.dtype.itemsize == 1 else g,
                                     r.view(torch.uint8) if r.dtype.itemsize == 1 else r)
                         for g, r in zip(got, ref[:len(got)], strict=True))  # fmt: skip
                t = time_fn(fn, samples=session.args.samples, target_replay_ms=5.0)
                tbps = 3 * w.numel() / t.median_us / 1e6
                rows.append({"model": model, "shape": list(shape), "variant": label, "ok": ok, "us": t.median_us,
                             "iqr_us": t.iqr_us, "tbps": tbps})  # fmt: skip
                print(f"{model:18s} {shape!s:18s} {label:30s} {t.median_us:8.1f} us {tbps:5.2f} TB/s ok={ok}")
            del w, ref
    session.finish(SCRIPT, rows, [], {})


if __name__ == "__main__":
    main()
