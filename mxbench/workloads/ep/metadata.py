"""What an EP run records beside its measurements: the ranks and their devices, the interconnect, the routing.

On top of what every run records (versions, date, command line), an EP run adds the world size, the backend, the
NCCL version, the ``nvidia-smi topo -m`` matrix (how the GPUs are connected), every rank's host and device, the
multicast settings its workers ran with, the layer's sizes, and the routing: method, seed and every rank's copies
per (rank, local expert), so the split sizes of any record can be read back.
"""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

import torch

from ...instruments.hardware import detect, device_properties
from ...measuring.dist import Context
from ...measuring.dist import MULTICAST_OFF

TOPOLOGY_TIMEOUT_S = 20


def nccl_version() -> str | None:
    """NCCL's version as "major.minor.patch", None without CUDA."""
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def topology() -> str | None:
    """``nvidia-smi topo -m`` as printed, or None where it cannot run."""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=TOPOLOGY_TIMEOUT_S, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def rank_info(ctx: Context) -> dict[str, Any]:
    """This rank's host, device and the hardware spec it matches (gathered from every rank)."""
    props = device_properties(ctx.local_rank) if ctx.device.type == "cuda" else {"name": None, "reason": "CPU"}
    spec = detect(ctx.local_rank) if ctx.device.type == "cuda" else None
    return {"rank": ctx.rank, "local_rank": ctx.local_rank, "host": platform.node(), "device": str(ctx.device),
            "device_properties": props, "hardware": spec.key if spec else None}  # fmt: skip


def ep_metadata(ctx: Context, ranks: list[dict[str, Any]], layer: dict[str, Any], routing: dict[str, Any],
                strategies: list[str], timing: dict[str, Any], command: str) -> dict[str, Any]:  # fmt: skip
    """Run metadata (module doc), made on rank 0 from every rank's ``rank_info``."""
    from ...measuring.metadata import now, versions  # what every run records

    names = [r["device_properties"].get("name") for r in ranks]
    first = ranks[0]
    return {
        "kind": "ep",
        "card": names[0] or "cpu",
        "cards": sorted({str(n) for n in names}),
        "hardware": first["hardware"],
        "device_properties": first["device_properties"],
        "date": now(),
        "command": command,
        **versions(),
        "world_size": ctx.world,
        "backend": ctx.backend,
        "nccl": nccl_version() if ctx.backend == "nccl" else None,
        "topology": topology() if ctx.device.type == "cuda" else None,
        "hosts": sorted({r["host"] for r in ranks}),
        "ranks": ranks,
        "multicast_env": {k: os.environ.get(k) for k in MULTICAST_OFF},
        "layer": layer,
        "routing": routing,
        "strategies": strategies,
        "timing": timing,
        "measured": True,
    }
