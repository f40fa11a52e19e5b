"""Launches for ``ncu`` to profile (nothing timed): at Qwen3-30B-A3B's layer (``tune_layer_fused.layout``: 131072
routed rows of 128 experts, K 2048, N 768), each FP8 rowwise fused stage's chain (the producer's kernel, the rows
quantizer with the column amax) and the fused call at its default and at the narrow-row launch, twice each (the
first compiles).

    ncu --clock-control none -k 'regex:_(gather|swiglu|rows_amax|rowwise)' --launch-skip 0 --section SpeedOfLight \\
        --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python scripts/ncu_fused.py
"""

import tuning  # noqa: F401, I001 (first: puts this checkout's kernels/ on the path)
import torch
from mxkernels.moe import moe_fused, moe_rows, swiglu
from mxkernels.quant import fp8_amax, fp8_rowwise
from mxkernels.quant.fp8_amax import AmaxRowsConfig
from tune_layer_fused import layout

K, N, E, TOP_K, TOKENS = 2048, 768, 128, 8, 16384
x, src, w, offs, rows, _ = layout(K, E, TOP_K, TOKENS)
h = torch.randn(rows, 2 * N, device="cuda", dtype=torch.bfloat16)
h1, h3 = swiglu.split_halves(h)
narrow = AmaxRowsConfig(programs_per_sm=8, num_warps=4, block_rows=4)
calls = {
    "gather": lambda: moe_rows.gather_weighted(x, src, w),
    "rows quantizer (plain)": lambda: fp8_rowwise.quantize_fp8_rowwise(xs),
    "rows quantizer + amax": lambda: fp8_amax.quantize_fp8_rowwise_with_amax(xs, offs),
    "fused gather, default": lambda: moe_fused.gather_quantize_fp8(x, src, w, offs),
    "fused gather, 8/SM w4": lambda: moe_fused.gather_quantize_fp8(x, src, w, offs, config=narrow),
    "swiglu": lambda: swiglu.swiglu(h1, h3),
    "fused swiglu, default": lambda: moe_fused.swiglu_quantize_fp8(h1, h3, offs),
}
xs = moe_rows.gather_weighted(x, src, w)
for name, call in calls.items():
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    print("ran", name, flush=True)
