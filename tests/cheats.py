"""Implementations of ``quantize_a`` (MXFP8, ``fn(a, *, mode) -> (q, scales)``) that compute the right outputs
whenever ``check`` calls them, and cheat when timed: each must be caught by the timing (an error row, or
IMPOSSIBLE), never reported as a time. ``honest`` is the control: the same quantizer, no cheat.

Each cheat returns copies of what it remembers (``clone``), so the timed graph holds a little GPU work (the copies)
and is not refused as empty: the time of those copies is what the gate reported before the fresh-inputs check.
``forget()`` clears what they remember (tests call it between runs).
"""

from __future__ import annotations

import torch
from mxkernels.quant.quantize import quantize_dim0

_CACHE: dict[tuple, tuple] = {}
_FIRST: dict[tuple, tuple] = {}
_PREMADE: dict[tuple, tuple] = {}


def forget() -> None:
    for memory in (_CACHE, _FIRST, _PREMADE):
        memory.clear()


def _copies(outputs: tuple) -> tuple:
    return tuple(t.clone() for t in outputs)


def honest(a, *, mode):
    return quantize_dim0(a, mode=mode)


def caching(a, *, mode):
    """Remembers the output per input buffer (data pointer, shape, mode): stale once new values are written there."""
    key = (a.data_ptr(), tuple(a.shape), mode)
    if key not in _CACHE:
        _CACHE[key] = quantize_dim0(a, mode=mode)
    return _copies(_CACHE[key])


def skip_on_repeat(a, *, mode):
    """Does the work on the first call of a shape and mode only; later calls return that first output."""
    key = (tuple(a.shape), mode)
    if key not in _FIRST:
        _FIRST[key] = quantize_dim0(a, mode=mode)
    return _copies(_FIRST[key])


def _capturing() -> bool:
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # a torch built without CUDA
        return False


def capture_detecting(a, *, mode):
    """Computes when called eagerly (as ``check`` calls it), and returns its last eager output while a CUDA graph is
    being captured (what the timed replays then run)."""
    key = (tuple(a.shape), mode)
    if _capturing() and key in _PREMADE:
        return _copies(_PREMADE[key])
    _PREMADE[key] = quantize_dim0(a, mode=mode)
    return _PREMADE[key]


CHEATS = ("caching", "skip_on_repeat", "capture_detecting")
