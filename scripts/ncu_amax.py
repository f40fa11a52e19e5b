"""Launches for ``ncu`` to profile (nothing timed): the FP8 rowwise quantizer of DeepSeek-V3's A (131072, 7168) bf16
alone, then with the per-group column amax of ``fp8_amax``, then the second quantizer from that amax, twice each.

    ncu --clock-control none -k 'regex:_row' --launch-skip 0 --launch-count 4 --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section LaunchStats python scripts/ncu_amax.py
"""

import torch
from mxkernels.quant import fp8_amax as A
from mxkernels.quant import fp8_rowwise as F

M, K, G = 131072, 7168, 8
x = torch.randn(M, K, device="cuda").bfloat16()
offs = torch.arange(1, G + 1, device="cuda", dtype=torch.int32) * (M // G)
for _ in range(2):
    F.quantize_fp8_rowwise(x)
for _ in range(2):
    _, _, amax = A.quantize_fp8_rowwise_with_amax(x, offs)
for _ in range(2):
    A.quantize_fp8_rowwise_k_groups_from_amax(x, amax, offs)
torch.cuda.synchronize()
print("ran: rowwise x2, rowwise + amax x2, k_groups from amax x2")
