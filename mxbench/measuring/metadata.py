"""What every run records beside its measurements: versions, git commit, date, command line, seeds, the token-group
sizes of every point, the code of every implementation that ran (``provenance``) and, for a measured run, the card
with its clocks, limits and stored ceilings."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from mxkernels.core.names import OURS

from ..instruments.kit import Instruments
from ..instruments.provenance import git_commit, implementations_meta
from ..plan.points import SKEW_METHOD, group_sizes
from ..storage.results import Point
from ..version import __version__
from .stages import SweepOptions

OUR_MODULE = "mxkernels"
"""The module named for our own implementation (``Record.impl`` "mxkernels"): the kernel package."""


def now() -> str:
    """The time now in UTC, to the second (ISO 8601): when a run started or finished."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def versions() -> dict[str, Any]:
    """The software a run was made with: torch, CUDA, triton, mxbench and its commit (``provenance.git_commit``),
    Python."""
    import torch
    import triton

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "mxbench": __version__, "git_commit": git_commit(), "python": sys.version.split()[0]}  # fmt: skip


def implementation_modules(impls: Iterable = ()) -> dict[str, str | None]:
    """Implementation name -> module for ``meta["implementations"]``: ours (always: every step runs some of our
    stages) and each of ``impls`` (``registry.Implementation``; the first module seen for a name)."""
    modules: dict[str, str | None] = {OURS: OUR_MODULE}
    for impl in impls:
        modules.setdefault(impl.name, impl.module)
    return modules


def common_metadata(
    points: Sequence[Point], command: str, implementations: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    """What any run records: versions, date, command line, seeds, the token-group sizes of every point, and the
    code of every implementation (``implementations``: name -> module; default ours alone)."""
    return {
        "date": now(),
        "command": command or " ".join(sys.argv),
        **versions(),
        "implementations": implementations_meta(implementations or implementation_modules()),
        **points_metadata(points),
    }


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


def card_metadata(ins: Instruments) -> dict[str, Any]:
    """The card a measurement ran on: name, uuid, driver, its properties, and NVML's snapshot (clocks, power limits,
    temperature, performance state) as found."""
    props = dict(ins.device_properties())
    nvml = dict(ins.snapshot())
    return {"card": str(props.get("name") or "unknown"), "uuid": props.get("uuid"),
            "driver": nvml.get("driver_version"), "device_properties": props, "nvml": nvml}  # fmt: skip


def tuning_metadata(ins: Instruments, command: str, timing: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata of a tuning run (``scripts/tune_*.py``; ``tuning.schema.json``): what a measured run records
    of the card, the software and the code, and ``timing``, the settings its ``time_fn`` calls used."""
    return {
        **card_metadata(ins),
        "date": now(),
        "command": command or " ".join(sys.argv),
        **versions(),
        "implementations": implementations_meta(implementation_modules()),
        "timing": dict(timing),
        "measured": True,
        "kind": "tuning",
    }


def run_metadata(points: Sequence[Point], options: SweepOptions, ins: Instruments) -> dict[str, Any]:
    """Metadata of a measured run: the common part plus the card, its clocks and limits, and the options."""
    card = card_metadata(ins)
    nvml = card.pop("nvml")
    return {
        **card,
        **common_metadata(points, options.command, implementation_modules(options.impls)),
        "nvml": nvml,
        "timing": options.timing(),
        "backend": options.backend,
        "hardware": options.hardware,
        "denominator": options.denominator,
        "ceilings": _plain(ins.ceilings(card["card"])),
        "measured": True,
    }


def _plain(value: Any) -> Any:
    """JSON-ready form of a dataclass (or None / a plain value)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
