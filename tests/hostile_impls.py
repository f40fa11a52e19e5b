"""Implementations of MXFP8 ``quantize_a`` that end, stop or break the process that calls them, each planted for
``check``'s child processes (issue 34, item 5); ``correct`` and ``wrong`` are the controls. Module-level functions:
a spawned child imports them by name."""

from __future__ import annotations

import os
import signal
import time

import torch
from mxkernels.core.format import quantize_reference


def correct(a, *, mode):
    return quantize_reference(a, mode)


def wrong(a, *, mode):
    q, s = quantize_reference(a, mode)
    q = q.view(torch.uint8).clone()
    q[0, 0] ^= 1  # one bit of one element
    return q.view(torch.float8_e4m3fn), s


def exits_3(a, *, mode):
    os._exit(3)


def kills_itself(a, *, mode):
    os.kill(os.getpid(), signal.SIGKILL)


def raises(a, *, mode):
    raise RuntimeError("planted failure")


def hangs(a, *, mode):
    time.sleep(3600)


def breaks_cuda(a, *, mode):
    """An out-of-bounds index on the device: a device-side assert, after which the process's CUDA context is
    unusable."""
    index = torch.full((1,), a.numel() * 4, device=a.device, dtype=torch.long)
    a.reshape(-1)[index].sum().item()
    return quantize_reference(a, mode)
