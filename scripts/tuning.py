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
from mxbench.measuring.metadata import now
from mxbench.storage.validation import Published, validate

SCHEMA = 1
"""The version of ``mxbench/data/tuning.schema.json`` written."""
TIME_FN = {"function": "mxbench.instruments.timing.time_fn", "cold_l2": True, "use_graph": True, "warmup": 3,
           "target_replay_ms": 10.0}  # fmt: skip
"""``time_fn``'s defaults: a script's ``timing`` names what it changes (samples always)."""


def measured_metadata(command: str, timing: dict) -> dict:
    """The run metadata a measured mxbench run carries (card, driver, clocks and power limits as found, versions,
    commits, date, command line), with ``timing``: ``mxbench.measuring.metadata.tuning_metadata``."""
    from mxbench.instruments.kit import Instruments
    from mxbench.measuring.metadata import tuning_metadata

    return tuning_metadata(Instruments.real(), command, {**TIME_FN, **timing})


def tuning_run(script: str, meta: dict, rows: list, skipped: list, summary: dict, copy_roof: float | None) -> dict:
    """A tuning run as ``tuning.schema.json`` publishes it; the fields files before the schema had stay where they
    were (``--table`` and the other readers read them)."""
    run = {"schema": SCHEMA, "kind": "tuning", "script": script, "meta": meta, "device": meta["card"],
           "torch": meta["torch"], "triton": meta["triton"], "copy_tbps": copy_roof, "rows": rows,
           "skipped": skipped, **summary}  # fmt: skip
    validate(run, Published.TUNING)  # the metadata held to the schema; rows are each script's own
    return run


def write_run(path: str, run: dict) -> None:
    """Write ``run`` to ``path`` (its folder made), whole or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(run, f, indent=1, default=str)
    os.replace(tmp, path)
    print(f"wrote {path}")


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
    """A tuning run: its parsed options, its start time, the card, the copy roof (TB/s) measured first, and the run
    metadata taken before any timing (``measured_metadata``: the clocks and limits the run started under)."""

    args: argparse.Namespace
    t0: float
    device: str
    roof: float
    meta: dict

    def finish(self, script: str, rows: list, skipped: list, summary: dict, timing: dict | None = None) -> None:
        """Say what the time budget skipped and how long the run took; write every number with the run's metadata
        (``tuning.schema.json``) to ``--out`` where the script has that option and it is given, else to
        ``$OUT/<script>.json`` when ``$OUT`` is set. ``timing``: the script's ``time_fn`` settings beyond
        ``TIME_FN`` (default: ``--samples``)."""
        if skipped:
            print(f"{len(skipped)} configs skipped: time budget of {self.args.budget_s:.0f} s spent")
        print(f"done in {time.monotonic() - self.t0:.0f} s")
        path = getattr(self.args, "out", None)
        if path is None and os.environ.get("OUT"):
            path = os.path.join(os.environ["OUT"], f"{script}.json")
        if path:
            meta = {**self.meta, "timing": {**self.meta["timing"], **(timing or {})}, "finished": now()}
            write_run(path, tuning_run(script, meta, rows, skipped, summary, self.roof))


def start(
    script: str,
    description: str,
    only_default: str,
    only_help: str,
    rows: int,
    cols: int,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    roof_dtype: torch.dtype = torch.bfloat16,
) -> Session:
    """Parse the shared options (--budget-s, --samples, --only) and the script's own (``add_arguments``), check for a
    GPU, print the header, and time the copy roof over a (rows, cols) bf16 tensor (``roof_dtype`` its output: fp8 for
    a quantizer's traffic, 2 bytes read and 1 written, which a bf16 copy's 2 + 2 does not bound)."""
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
    meta = measured_metadata(" ".join(sys.argv), {"samples": args.samples})
    return Session(args, t0, device, copy_tbps(rows, cols, args.samples, roof_dtype), meta)
