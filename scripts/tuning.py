"""What the tuning scripts share: the roof they report against."""

from __future__ import annotations

import torch

from mxbench.ceilings import stream_convert
from mxbench.timing import time_fn


def copy_tbps(rows: int, cols: int, samples: int) -> float:
    """TB/s (read + write) of the Triton copy kernel `mxbench ceilings` measures, over a (rows, cols) bf16 tensor.

    A kernel, not ``copy_``: a CUDA graph turns a same-dtype ``copy_`` into a copy-engine memcpy node, which streams
    at another rate than the SM kernels being tuned.
    """
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t = time_fn(lambda: stream_convert(x, y), samples=samples, target_replay_ms=5.0)
    if not torch.equal(x, y):
        raise AssertionError("the copy kernel is wrong")
    return 2 * x.numel() * x.element_size() / t.median_us / 1e6
