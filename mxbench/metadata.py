"""What every run records beside its measurements: versions, git commit, date, command line, seeds, the token-group
sizes of every point and, for a measured run, the card with its clocks, limits and stored ceilings."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from . import REPO_ROOT, __version__
from .instruments import Instruments
from .measure import SweepOptions
from .points import SKEW_METHOD, group_sizes
from .results import Point


def now() -> str:
    """The time now in UTC, to the second (ISO 8601): when a run started or finished."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def git_commit() -> str | None:
    """The repository's HEAD commit (with "+dirty" when tracked files changed); without a git checkout (a copy of
    the tree shipped to a GPU machine) the ``MXBENCH_GIT_COMMIT`` environment variable names it; else None."""
    try:
        sha = _git("rev-parse", "HEAD")
        return sha + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("MXBENCH_GIT_COMMIT") or None


def versions() -> dict[str, Any]:
    """The software a run was made with: torch, CUDA, triton, mxbench and its commit, Python."""
    import torch
    import triton

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "mxbench": __version__, "git_commit": git_commit(), "python": sys.version.split()[0]}  # fmt: skip


def common_metadata(points: Sequence[Point], command: str) -> dict[str, Any]:
    """What any run records: versions, date, command line, seeds and the token-group sizes of every point."""
    return {"date": now(), "command": command or " ".join(sys.argv), **versions(), **points_metadata(points)}


def points_metadata(points: Sequence[Point]) -> dict[str, Any]:
    """The seeds and token-group sizes of ``points`` (a sharded run gathers them for every rank's points)."""
    sizes = {(p.M, p.G, p.groups, p.seed): None for p in points}
    return {
        "seeds": sorted({p.seed for p in points}),
        "group_sizes_method": {"balanced": "even split, remainder over the first groups", "skewed": SKEW_METHOD},
        "group_sizes": [
            {"M": M, "G": G, "groups": kind, "seed": seed, "sizes": group_sizes(M, G, kind, seed)}
            for M, G, kind, seed in sizes
        ],
    }


def run_metadata(points: Sequence[Point], options: SweepOptions, ins: Instruments) -> dict[str, Any]:
    """Metadata of a measured run: the common part plus the card, its clocks and limits, and the options."""
    props = dict(ins.device_properties())
    card = str(props.get("name") or "unknown")
    nvml = dict(ins.snapshot())
    return {
        "card": card,
        "uuid": props.get("uuid"),
        "driver": nvml.get("driver_version"),
        "device_properties": props,
        **common_metadata(points, options.command),
        "nvml": nvml,
        "timing": options.timing(),
        "backend": options.backend,
        "hardware": options.hardware,
        "denominator": options.denominator,
        "ceilings": _plain(ins.ceilings(card)),
        "measured": True,
    }


def _plain(value: Any) -> Any:
    """JSON-ready form of a dataclass (or None / a plain value)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
