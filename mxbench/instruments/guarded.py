"""Calling code the harness does not trust (an implementation under check, a plugin's ``register``): whatever it does
comes back as an ``Outcome``, never as a crash or a silent exit of mxbench.

The call runs in a daemon thread, so that ``SystemExit`` (``sys.exit`` inside it), any other ``BaseException`` and a
hang past ``timeout_s`` are all reported the same way: a one-line ``error`` and the full ``trace``. A hung call is
left running in its thread (Python cannot stop a thread); it holds only copies of the inputs, and the process can
still exit. Only Ctrl-C in the main thread still stops mxbench.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_TIMEOUT_S = 300.0
"""Long enough for the interpreter to run mxkernels' kernels at the check's sizes on a CPU (seconds each)."""


@dataclass(frozen=True)
class Outcome:
    """What a guarded call did: its ``value``, or ``error`` (one line: the exception's type and message, or the
    time limit) with ``trace`` (the full traceback, for ``--verbose``)."""

    value: Any = None
    error: str | None = None
    trace: str = ""


def one_line(e: BaseException) -> str:
    """``Type: message`` on one line (an Inductor or Triton error spans pages)."""
    message = " ".join(str(e).split())
    return f"{type(e).__name__}: {message}" if message else type(e).__name__


def call(fn: Callable[[], Any], timeout_s: float | None = DEFAULT_TIMEOUT_S,
         device: torch.device | None = None) -> Outcome:  # fmt: skip
    """``fn()`` in a daemon thread (with ``device`` current there, a CUDA device being per thread); with
    ``timeout_s`` None, in this thread (no time limit: for code the harness trusts not to hang, such as its own
    kernels and torch.compile of its references), still with every exception but Ctrl-C caught."""
    box: dict[str, Outcome] = {}

    def run() -> None:
        try:
            if device is not None and device.type == "cuda" and timeout_s is not None:
                torch.cuda.set_device(device)
            box["outcome"] = Outcome(value=fn())
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 -- SystemExit and the like included: the caller reports them
            box["outcome"] = Outcome(error=one_line(e), trace=traceback.format_exc())

    if timeout_s is None:
        run()
        return box["outcome"]

    thread = threading.Thread(target=run, name="mxbench-guarded-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return Outcome(error=f"Timeout: did not return within {timeout_s:g} s (left running; raise --timeout)")
    return box["outcome"]


def mutated(originals: Sequence[torch.Tensor], given: Sequence[torch.Tensor], names: Sequence[str]) -> str | None:
    """Which inputs a call changed (``given`` were copies of ``originals`` when it started), or None."""
    changed = []
    for name, before, after in zip(names, originals, given, strict=True):
        if isinstance(before, torch.Tensor) and (after.shape != before.shape or not torch.equal(_bytes(before),
                                                                                               _bytes(after))):
            changed.append(name)
    return None if not changed else f"InputMutated: wrote to its input {', '.join(changed)} (inputs are read-only)"


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (NaN payloads and signed zeros told apart, as the bit-exact rule does)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8).cpu()
