"""The measured all-to-all ceiling: what one large, evenly split ``all_to_all_single`` reaches on these GPUs.

Every rank sends ``size_bytes`` split evenly over the ranks (its own chunk stays local), timed on every rank in
step (``rank_timing``: a CUDA graph of back-to-back calls where NCCL lets it be captured). The rate is the bytes
sent to and received from the other ranks over the slowest rank's median time: both directions together, the
convention of the NVLink datasheet figure (``hardware.link_peak``); the one-way rate is half of it. Stored per card
and world size in ``results/<card>/alltoall_ceilings.json`` (one entry per world size, the latest kept), the
denominator that EP tables name "measured all-to-all ceiling".
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...instruments.hardware import Peak, card_slug
from ...storage.entries import read_entries, write_entries
from ...storage.validation import Published, schema_file

if TYPE_CHECKING:
    from ...measuring.dist import Context

FILE = "alltoall_ceilings.json"
SCHEMA_VERSION: int = schema_file(Published.ALLTOALL_CEILINGS)["x-mxbench-schema"]
DEFAULT_BYTES = 2**30


def measure_alltoall_ceiling(ctx: Context, size_bytes: int = DEFAULT_BYTES, samples: int = 20) -> dict | None:
    """The ceiling entry on rank 0 (None elsewhere); see the module doc. Needs a GPU per rank."""
    # here, not at the top: the EP tables read a stored ceiling (alltoall_peak) and need no torch (a 3 s import)
    import torch
    import torch.distributed as dist

    from ...measuring.dist import gather
    from .metadata import nccl_version
    from .rank_timing import across_ranks, time_on_ranks

    world = ctx.world
    if size_bytes < world or size_bytes % world:
        raise ValueError(f"size_bytes must be a positive multiple of the world size {world}, got {size_bytes}")
    send = torch.empty(size_bytes, dtype=torch.uint8, device=ctx.device)
    recv = torch.empty_like(send)
    timing = time_on_ranks(ctx, lambda: dist.all_to_all_single(recv, send, group=ctx.group), graph=True,
                           samples=samples)  # fmt: skip
    stats = gather(ctx, timing.summary())
    if not ctx.root:
        return None
    spread = across_ranks(stats)
    if not spread:
        raise RuntimeError(f"the all-to-all could not be timed: {[s.get('error') for s in stats]}")
    remote = 2 * size_bytes * (world - 1) // world  # sent to the other ranks plus received from them, per rank
    return {
        "card": torch.cuda.get_device_name(ctx.device),
        "world_size": world,
        "size_bytes": size_bytes,
        "nccl": nccl_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "bidirectional_gbps": remote / spread["max_us"] / 1e3,
        "one_way_gbps": remote / 2 / spread["max_us"] / 1e3,
        "median_us": spread["max_us"],
        "ranks": stats,
    }


def _path(results_dir: str | Path, card: str) -> Path:
    return Path(results_dir) / card_slug(card) / FILE


def save_alltoall_ceiling(entry: dict[str, Any], results_dir: str | Path) -> Path:
    """Write ``entry`` into its card's file, replacing the entry of the same world size. Returns the path."""
    path = _path(results_dir, entry["card"])
    entries = [e for e in _read(path) if e["world_size"] != entry["world_size"]] + [entry]
    return write_entries(path, SCHEMA_VERSION, entry["card"], sorted(entries, key=lambda e: e["world_size"]))


def _read(path: Path) -> list[dict[str, Any]]:
    return read_entries(path, Published.ALLTOALL_CEILINGS)


def load_alltoall_ceiling(results_dir: str | Path, card: str, world: int) -> dict[str, Any] | None:
    """The stored ceiling of ``card`` at ``world`` ranks, or None."""
    return next((e for e in _read(_path(results_dir, card)) if e["world_size"] == world), None)


def alltoall_peak(entry: dict[str, Any]) -> Peak:
    gbps = entry["bidirectional_gbps"]
    label = (f"measured all-to-all ceiling {gbps:.0f} GB/s (both directions; {entry['card']}, {entry['world_size']} "
             f"ranks, NCCL {entry.get('nccl') or '?'})")  # fmt: skip
    return Peak(gbps / 1000.0, "TB/s", label)


def run_alltoall_ceiling(results_dir: str | Path, echo=print) -> int:
    """``mxbench ceilings`` on every process of a torchrun: measure, store (rank 0), leave. Returns the exit code."""
    from ...measuring.dist import init, leave

    ctx = None
    try:
        ctx = init()
        entry = measure_alltoall_ceiling(ctx)
        if entry is not None:
            path = save_alltoall_ceiling(entry, results_dir)
            first = entry["ranks"][0]
            echo(f"all-to-all ceiling: {entry['bidirectional_gbps']:.0f} GB/s both directions "
                 f"({entry['one_way_gbps']:.0f} GB/s each way), {entry['world_size']} ranks, {entry['size_bytes']} "
                 f"bytes per rank, NCCL {entry['nccl']}, timed with {first.get('method')}"
                 + (f" (graph capture failed: {first['graph_error']})" if first.get("graph_error") else ""))  # fmt: skip
            echo(f"stored: {path}")
    finally:
        code = leave(ctx, 0)
    return code
