"""Hardware: the spec table (a source for every number), card detection, device properties, named peaks.

Specs live in ``mxbench/data/hardware.toml``; all TFLOP/s are dense (no 2:4 sparsity). Every efficiency figure is
taken against a ``Peak`` whose label names its denominator: a datasheet number (``datasheet_peaks``), a ceiling
measured on the card (``ceiling_store.measured_peaks``) or a projection onto another card's spec.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from mxkernels.core.errors import InputError

UNITS = ("TB/s", "TFLOP/s")
_NUMBERS = ("hbm_tbps", "bf16_tflops", "fp8_tflops", "mxfp8_tflops", "sms", "l2_mb", "tdp_w", "nvlink_gbps", "nic_gbps")
_OPTIONAL = ("fp8_tflops", "mxfp8_tflops", "nvlink_gbps", "nic_gbps")


@dataclass
class HardwareSpec:
    """Per-GPU peaks of one card. ``fp8_tflops`` / ``mxfp8_tflops`` None: no FP8 / no MX tensor cores.

    ``l2_mb``: MiB of last-level cache before HBM. ``nvlink_gbps``: the GPU-to-GPU interconnect per GPU in GB/s,
    both directions together (NVIDIA's convention), None where not recorded. ``nic_gbps``: the scale-out network
    per GPU of the card's HGX/DGX host (one NIC per GPU), both directions together too, None where not recorded. ``sources`` maps each number's field name to where it comes
    from. ``match`` / ``exclude`` / ``memory_gib`` recognise the card from its torch device name and memory.
    """

    key: str
    name: str
    hbm_tbps: float
    bf16_tflops: float
    fp8_tflops: float | None
    mxfp8_tflops: float | None
    sms: int
    l2_mb: float
    tdp_w: float
    sources: dict[str, str]
    notes: str = ""
    aliases: tuple[str, ...] = ()
    match: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    memory_gib: tuple[float, float] | None = None
    nvlink_gbps: float | None = None
    nic_gbps: float | None = None


@dataclass(frozen=True)
class Peak:
    """A denominator: ``value`` in ``unit`` ("TB/s" or "TFLOP/s"), ``label`` naming where it comes from."""

    value: float
    unit: str
    label: str

    def __post_init__(self):
        if self.unit not in UNITS:
            raise InputError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if not self.value > 0:
            raise InputError(f"value must be positive, got {self.value}")


def _normalize(key: str) -> str:
    return re.sub(r"[\s_]+", "-", key.strip().lower())


def _spec_from_toml(key: str, entry: dict[str, Any]) -> HardwareSpec:
    entry = dict(entry)
    sources = entry.pop("sources", {})
    missing = [f for f in _NUMBERS if f not in _OPTIONAL and f not in entry]
    unsourced = [f for f in _NUMBERS if f in entry and f not in sources]
    if missing or unsourced:
        raise ValueError(f"hardware.toml [{key}]: missing numbers {missing}, numbers without a source {unsourced}")
    memory = entry.pop("memory_gib", None)
    return HardwareSpec(
        key=key,
        name=entry.pop("name"),
        hbm_tbps=float(entry.pop("hbm_tbps")),
        bf16_tflops=float(entry.pop("bf16_tflops")),
        fp8_tflops=_float_or_none(entry.pop("fp8_tflops", None)),
        mxfp8_tflops=_float_or_none(entry.pop("mxfp8_tflops", None)),
        sms=int(entry.pop("sms")),
        l2_mb=float(entry.pop("l2_mb")),
        tdp_w=float(entry.pop("tdp_w")),
        sources=dict(sources),
        notes=entry.pop("notes", ""),
        aliases=tuple(entry.pop("aliases", ())),
        match=tuple(entry.pop("match", ())),
        exclude=tuple(entry.pop("exclude", ())),
        memory_gib=(float(memory[0]), float(memory[1])) if memory else None,
        nvlink_gbps=_float_or_none(entry.pop("nvlink_gbps", None)),
        nic_gbps=_float_or_none(entry.pop("nic_gbps", None)),
    )


def _float_or_none(x: Any) -> float | None:
    return None if x is None else float(x)


def load_specs() -> dict[str, HardwareSpec]:
    """Every spec of ``data/hardware.toml`` by key (e.g. "b200", "h100-sxm")."""
    text = resources.files("mxbench").joinpath("data/hardware.toml").read_text()
    return {key: _spec_from_toml(key, entry) for key, entry in tomllib.loads(text).items()}


def get_spec(key: str) -> HardwareSpec:
    """The spec named ``key`` or one of its aliases, case-insensitive; spaces and underscores read as '-'
    ("b200", "H100", "h100-sxm", "H100 SXM"). Unknown keys raise ``InputError`` listing the valid ones."""
    specs = load_specs()
    wanted = _normalize(key)
    for spec in specs.values():
        if wanted == spec.key or wanted in (_normalize(a) for a in spec.aliases):
            return spec
    raise InputError(f"unknown hardware {key!r}; valid keys: {', '.join(specs)}")


def match_spec(device_name: str, memory_bytes: int | None, specs: dict[str, HardwareSpec]) -> HardwareSpec | None:
    """The spec whose ``match`` substring is the longest found in ``device_name`` (case-insensitive), among specs
    none of whose ``exclude`` substrings appear and whose ``memory_gib`` range holds ``memory_bytes``."""
    name = device_name.lower()
    best, best_len = None, 0
    for spec in specs.values():
        if any(x.lower() in name for x in spec.exclude):
            continue
        if spec.memory_gib is not None and memory_bytes is not None:
            lo, hi = spec.memory_gib
            if not lo <= memory_bytes / 2**30 <= hi:
                continue
        for pattern in spec.match:
            if pattern.lower() in name and len(pattern) > best_len:
                best, best_len = spec, len(pattern)
    return best


def detect(device: int = 0) -> HardwareSpec | None:
    """The spec of CUDA device ``device`` (by name and memory size), or None without CUDA or for an unknown card."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    return match_spec(props.name, props.total_memory, load_specs())


def bus_bandwidth_tbps(bus_width_bits: int, memory_clock_khz: int) -> float:
    """Theoretical DRAM bandwidth from the bus: bus width / 8 bytes x memory clock x 2 (double data rate), TB/s."""
    return bus_width_bits / 8 * memory_clock_khz * 1e3 * 2 / 1e12


def device_properties(device: int = 0) -> dict[str, Any]:
    """Run metadata of CUDA device ``device``: name, uuid, SMs, L2 and memory size (bytes), memory bus width
    (bits) and clock (MHz), the bus bandwidth they imply (TB/s) and the compute capability. Fields this torch
    does not report are None; without CUDA, ``{"name": None, "reason": ...}``."""
    import torch

    if not torch.cuda.is_available():
        return {"name": None, "reason": "no CUDA device"}
    p = torch.cuda.get_device_properties(device)
    bus = getattr(p, "memory_bus_width", None)
    clock_khz = getattr(p, "memory_clock_rate", None)
    uuid = getattr(p, "uuid", None)
    return {
        "name": p.name,
        "uuid": None if uuid is None else str(uuid),
        "sms": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "total_memory_bytes": p.total_memory,
        "memory_bus_width_bits": bus,
        "memory_clock_mhz": clock_khz / 1000 if clock_khz else None,
        "bandwidth_tbps": bus_bandwidth_tbps(bus, clock_khz) if bus and clock_khz else None,
        "compute_capability": f"{p.major}.{p.minor}",
    }


def card_slug(card: str) -> str:
    """A folder name for ``card``: lower case, runs of anything but letters and digits as '-'
    ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3")."""
    slug = re.sub(r"[^a-z0-9]+", "-", card.lower()).strip("-")
    if not slug:
        raise InputError(f"card must contain letters or digits, got {card!r}")
    return slug


def datasheet_peaks(spec: HardwareSpec) -> dict[str, Peak]:
    """The datasheet denominators of ``spec``: "bandwidth" (TB/s) and "bf16", "fp8", "mxfp8" (dense TFLOP/s).

    A card without FP8 or MX tensor cores has no "fp8" / "mxfp8" entry.
    """
    peaks = {"bandwidth": Peak(spec.hbm_tbps, "TB/s", f"{spec.name} datasheet {spec.hbm_tbps:g} TB/s")}
    for key, value in (("bf16", spec.bf16_tflops), ("fp8", spec.fp8_tflops), ("mxfp8", spec.mxfp8_tflops)):
        if value is not None:
            label = f"{spec.name} datasheet dense {key.upper()} {value:g} TFLOP/s"
            peaks[key] = Peak(value, "TFLOP/s", label)
    return peaks


def link_peak(spec: HardwareSpec) -> Peak | None:
    """The datasheet interconnect roof of ``spec`` in TB/s, both directions together (the denominator of an
    all-to-all's bytes sent plus received per rank), or None where the spec records none."""
    if spec.nvlink_gbps is None:
        return None
    label = f"{spec.name} datasheet NVLink {spec.nvlink_gbps:g} GB/s (both directions, per GPU)"
    return Peak(spec.nvlink_gbps / 1000.0, "TB/s", label)


def nic_peak(spec: HardwareSpec) -> Peak | None:
    """The datasheet scale-out roof of ``spec`` per GPU in TB/s, both directions together (the denominator of an
    all-to-all's inter-node bytes sent plus received per rank), or None where the spec records none."""
    if spec.nic_gbps is None:
        return None
    label = f"{spec.name} host datasheet NIC {spec.nic_gbps:g} GB/s (both directions, per GPU)"
    return Peak(spec.nic_gbps / 1000.0, "TB/s", label)
