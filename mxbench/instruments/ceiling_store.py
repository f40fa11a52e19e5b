"""The stored measured ceilings (``results/<card-slug>/ceilings.json``, one entry per power limit) and the
denominators they give. Apart from ``ceilings``, which measures them with torch and triton kernels: a table against
measured ceilings reads this and imports neither."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..storage.entries import read_entries, write_entries
from ..storage.validation import Published, schema_file
from .hardware import Peak, card_slug

SCHEMA_VERSION: int = schema_file(Published.CEILINGS)["x-mxbench-schema"]
_BANDWIDTH_KERNELS = {"copy": "copy_tbps", "read2write1": "read2write1_tbps", "read": "read_tbps"}
# A stored entry matches a requested power limit within this many watts (NVML works in milliwatts).
_LIMIT_TOLERANCE_W = 0.5


@dataclass
class Ceilings:
    """Ceilings of ``card`` (the torch device name) at ``power_limit_w`` (the enforced limit while measuring; None
    when NVML could not tell). Bandwidths in TB/s, ``bandwidth_tbps`` the best of the three; GEMMs in TFLOP/s, each
    the best of its candidate shapes, ``bf16_shape`` / ``fp8_shape`` naming the one that gave it (None in entries
    measured before shapes were recorded); ``fp8_tflops`` None where the card or torch has no fp8 GEMM
    (``meta["fp8_error"]`` says why)."""

    card: str
    power_limit_w: float | None
    copy_tbps: float
    read2write1_tbps: float
    read_tbps: float
    bandwidth_tbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    meta: dict[str, Any] = field(default_factory=dict)
    bf16_shape: str | None = None
    fp8_shape: str | None = None


def _path(results_dir: str | Path, card: str) -> Path:
    return Path(results_dir) / card_slug(card) / "ceilings.json"


def _same_limit(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= _LIMIT_TOLERANCE_W


def _read_entries(path: Path) -> list[Ceilings]:
    return [Ceilings(**e) for e in read_entries(path, Published.CEILINGS)]


def save_ceilings(c: Ceilings, results_dir: str | Path) -> Path:
    """Write ``c`` into ``results_dir/<card-slug>/ceilings.json``, replacing the entry of the same power limit and
    keeping the others (sorted by limit, unknown first). Written atomically; returns the path."""
    path = _path(results_dir, c.card)
    entries = [e for e in _read_entries(path) if not _same_limit(e.power_limit_w, c.power_limit_w)] + [c]
    entries.sort(key=lambda e: (e.power_limit_w is not None, e.power_limit_w or 0.0))
    return write_entries(path, SCHEMA_VERSION, c.card, [asdict(e) for e in entries])


def load_ceilings(results_dir: str | Path, card: str, power_limit_w: float | None = None) -> Ceilings | None:
    """The stored ceilings of ``card`` (a device name or its slug) at ``power_limit_w`` (within 0.5 W), or None.

    ``power_limit_w`` None: the entry measured at the highest limit (the card uncapped), else one whose limit is
    unknown.
    """
    entries = _read_entries(_path(results_dir, card))
    if power_limit_w is not None:
        return next((e for e in entries if _same_limit(e.power_limit_w, power_limit_w)), None)
    known = [e for e in entries if e.power_limit_w is not None]
    if known:
        return max(known, key=lambda e: e.power_limit_w)
    return entries[0] if entries else None


def measured_peaks(c: Ceilings) -> dict[str, Peak]:
    """Denominators from measured ceilings: "bandwidth" (the best streaming kernel), "bf16" and, where measured,
    "fp8"; each label says "measured ... ceiling" with the card and power limit."""
    where = f"{c.card}, {c.power_limit_w:g} W" if c.power_limit_w is not None else f"{c.card}, limit unknown"
    kernel = max(_BANDWIDTH_KERNELS, key=lambda k: getattr(c, _BANDWIDTH_KERNELS[k]))
    peaks = {
        "bandwidth": Peak(c.bandwidth_tbps, "TB/s", f"measured {kernel} ceiling {c.bandwidth_tbps:.3g} TB/s ({where})"),
    }
    for kind, value, shape in (("bf16", c.bf16_tflops, c.bf16_shape), ("fp8", c.fp8_tflops, c.fp8_shape)):
        if value is not None:
            by = f"; {shape}" if shape else ""
            peaks[kind] = Peak(value, "TFLOP/s", f"measured {kind} GEMM ceiling {value:.4g} TFLOP/s ({where}{by})")
    return peaks
