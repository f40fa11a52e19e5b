"""What the tuning scripts share: their command line, their header, the copy roof they report against, and imports
that work from a plain checkout (the package not installed)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton


def _importable_from_checkout() -> None:
    """Make ``python scripts/<name>.py`` run this checkout's code, installed or not (a fresh GPU machine has no
    install; a development machine may have another worktree's): the repository root goes first on sys.path for
    ``mxbench``, and ``kernels/`` (the folder that holds ``mxkernels``) for the kernel package."""
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root), str(root / "kernels")]


_importable_from_checkout()

# Imported after the path set-up above.
from mxbench.instruments.ceilings import stream_convert
from mxbench.instruments.timing import time_fn


def copy_tbps(rows: int, cols: int, samples: int, dtype: torch.dtype = torch.bfloat16) -> float:
    """TB/s (read + write) of the Triton copy kernel `mxbench ceilings` measures, over a (rows, cols) bf16 tensor;
    with ``dtype=torch.float8_e4m3fn`` its bf16 -> fp8 cast (2 bytes read, 1 written: a quantizer's traffic, the
    ``read2write1`` ceiling).

    A kernel, not ``copy_``: a CUDA graph turns a same-dtype ``copy_`` into a copy-engine memcpy node, which streams
    at another rate than the SM kernels being tuned.
    """
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(rows, cols, device="cuda", dtype=dtype)
    t = time_fn(lambda: stream_convert(x, y), samples=samples, target_replay_ms=5.0)
    if not torch.equal(x.to(dtype), y):
        raise AssertionError("the streaming kernel is wrong")
    return (x.nbytes + y.nbytes) / t.median_us / 1e6


@dataclass(frozen=True)
class Session:
    """A tuning run: its parsed options, its start time, the card, and the copy roof (TB/s) measured first."""

    args: argparse.Namespace
    t0: float
    device: str
    roof: float

    def finish(self, script: str, rows: list, skipped: list, summary: dict) -> None:
        """Say what the time budget skipped and how long the run took; write every number to ``--out`` where the
        script has that option and it is given, else to ``$OUT/<script>.json`` when ``$OUT`` is set."""
        if skipped:
            print(f"{len(skipped)} configs skipped: time budget of {self.args.budget_s:.0f} s spent")
        print(f"done in {time.monotonic() - self.t0:.0f} s")
        path = getattr(self.args, "out", None)
        if path is None and os.environ.get("OUT"):
            path = os.path.join(os.environ["OUT"], f"{script}.json")
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            meta = {"device": self.device, "torch": torch.__version__, "triton": triton.__version__,
                    "copy_tbps": self.roof}  # fmt: skip
            with open(path, "w") as f:
                json.dump({**meta, "rows": rows, "skipped": skipped, **summary}, f, indent=1, default=str)
            print(f"wrote {path}")


def start(
    script: str,
    description: str,
    only_default: str,
    only_help: str,
    rows: int,
    cols: int,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> Session:
    """Parse the shared options (--budget-s, --samples, --only) and the script's own (``add_arguments``), check for a
    GPU, print the header, and time the copy roof over a (rows, cols) bf16 tensor."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--budget-s", type=float, default=170.0, help="stop starting new configs after this")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--only", default=only_default, help=only_help)
    parser.add_argument("--out", default=None, help="JSON file for every number (default: $OUT/<script>.json)")
    if add_arguments:
        add_arguments(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA GPU")
    t0 = time.monotonic()
    device = torch.cuda.get_device_name()
    print(f"{device}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
    return Session(args, t0, device, copy_tbps(rows, cols, args.samples))
