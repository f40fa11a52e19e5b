"""Efficiency math and the analytic roofline model.

Efficiency is achieved throughput over a *named* peak (``hardware.Peak``): data-movement kernels
(quantize, rearrange, pad) against a bandwidth peak, GEMMs against the compute peak of their precision. The
numerator always comes from the cost the stage declared (``Record.bytes_read`` / ``bytes_written`` / ``flops``);
nothing here recomputes a cost.

The analytic model prices a stage at ``max(bytes / HBM bandwidth, FLOPs / precision peak) + LAUNCH_FLOOR_US``:
the ideal roofline time of the kernel plus a fixed 2 us per launch (torchao's ``KERNEL_LAUNCH_OVERHEAD_SEC``),
so a stage that moves nothing still costs something.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mxkernels.core.cost import Cost
from mxkernels.core.errors import InputError
from mxkernels.core.names import END_TO_END_STAGE, MEMORY_CATEGORIES, Category, Pass

from ..storage.results import OURS, Point, Record, Run
from .ceiling_store import Ceilings, measured_peaks
from .hardware import HardwareSpec, Peak, datasheet_peaks, get_spec

if TYPE_CHECKING:
    from mxkernels.stages.pipeline import Stage

LAUNCH_FLOOR_US = 2.0
"""Added to every modelled stage: the launch overhead no kernel avoids (torchao uses the same 2 us)."""

DENOMINATORS = ("datasheet", "measured")
MODEL_ASSUMPTION = (
    f"time = max(bytes / bandwidth, FLOPs / peak) + {LAUNCH_FLOOR_US:g} us launch overhead, per kernel, at the "
    "spec's datasheet peaks"
)
"""What the analytic model assumes, stated in the header of every model table (stored in a model run's meta)."""
MODEL_AT_PEAK = "model at peak"
"""The efficiency of a model row: the model runs every kernel at its roof by construction, so a percentage of that
roof (99.x%, short of 100% only by the launch overhead) would be circular."""


def achieved_tbps(nbytes: float, us: float) -> float:
    """Bytes moved in ``us`` microseconds -> TB/s (10**12 bytes per second)."""
    if not us > 0:
        raise InputError(f"us must be > 0, got {us!r}")
    return nbytes / us / 1e6


def achieved_tflops(flops: float, us: float) -> float:
    """FLOPs done in ``us`` microseconds -> TFLOP/s (10**12 FLOPs per second)."""
    if not us > 0:
        raise InputError(f"us must be > 0, got {us!r}")
    return flops / us / 1e6


def gemm_peak(peaks: dict[str, Peak], precision: str | None) -> Peak | None:
    """The compute roof a GEMM of ``precision`` runs against, or None when ``peaks`` has none for it.

    A card without MX tensor cores (or a measured ceiling set, which has no MX entry) has no "mxfp8" peak: the
    fp8 peak stands in, and its label says so.
    """
    if precision in peaks:
        return peaks[precision]
    if precision == "mxfp8" and "fp8" in peaks:
        fp8 = peaks["fp8"]
        return replace(fp8, label=f"{fp8.label} (no mxfp8 peak: fp8 roof)")
    return None


def efficiency(record: Record, peaks: dict[str, Peak]) -> tuple[float, Peak] | None:
    """Percent of the peak this record's stage reached, and that peak; None where no roof applies.

    Data-movement categories compare ``record.bytes / median time`` with ``peaks["bandwidth"]``; a rearrange's
    bytes include its whole padded output (zero fill), as its cost declares. GEMMs compare ``flops / median``
    with the peak of ``record.precision``. End-to-end rows, error rows and GEMMs without a known precision have
    no single roof and give None. Model rows (``measured=False``) use ``model_us`` as their time.
    """
    us = record.median_us
    if not record.ok or us is None or us <= 0:
        return None
    if record.category in MEMORY_CATEGORIES:
        peak, achieved = peaks.get("bandwidth"), achieved_tbps(record.bytes, us)
    elif record.category == "gemm" and record.flops:
        peak, achieved = gemm_peak(peaks, record.precision), achieved_tflops(record.flops, us)
    else:
        return None
    return (100.0 * achieved / peak.value, peak) if peak is not None else None


def run_denominator(run: Run, choice: str | None) -> str | None:
    """The denominator a table of ``run`` shows efficiencies against: ``choice`` ("datasheet", "measured"; "none":
    no efficiency values) where given, else the run's own (datasheet when it names a spec, else none)."""
    if choice == "none":
        return None
    if choice is not None:
        return choice
    return run.meta.get("denominator", "datasheet") if run.meta.get("hardware") else None


def peaks_for_run(run: Run, denominator: str = "datasheet") -> dict[str, Peak]:
    """The denominators for ``run``'s card: its spec's datasheet peaks, or its stored measured ceilings.

    ``run.meta["hardware"]`` names the spec (e.g. "h100-sxm"); ``run.meta["ceilings"]`` holds the ``Ceilings``
    fields measured on the card. Measured ceilings have no MX entry; on a card whose spec has MX tensor cores
    (MXFP8 at the fp8 rate) the measured fp8 ceiling is also the mxfp8 roof.
    """
    if denominator not in DENOMINATORS:
        raise InputError(f"denominator must be one of {DENOMINATORS}, got {denominator!r}")
    if denominator == "datasheet":
        return datasheet_peaks(spec_for_run(run))
    stored = run.meta.get("ceilings")
    if run.meta.get("measured") is False:
        raise InputError("denominator='measured' needs a card's measured ceilings, and a model run (model, not "
                         "measured) ran on no card; use denominator='datasheet'")
    if not stored:
        raise InputError(
            f"denominator='measured' needs the card's measured ceilings, but this run of {run.card} stored none "
            "(meta['ceilings']); measure them with `mxbench ceilings` or use denominator='datasheet'"
        )
    peaks = measured_peaks(Ceilings(**stored))
    if run.meta.get("hardware") and spec_for_run(run).mxfp8_tflops is not None and "fp8" in peaks:
        fp8 = peaks["fp8"]
        peaks["mxfp8"] = replace(fp8, label=f"{fp8.label} (mxfp8 runs at the fp8 rate)")
    return {key: _held(key, peak, peaks, run.records) for key, peak in peaks.items()}


def _held(key: str, peak: Peak, peaks: dict[str, Peak], records: list[Record]) -> Peak:
    """The stored ceiling ``peaks[key]`` held against this run's stages that run against it: bandwidth for the
    data-movement categories, each GEMM precision for its GEMMs. Stored ceilings come from `mxbench ceilings`, often
    on another machine of the same model or in another hour, and a run's own kernel can outrun them by a few
    percent."""
    if key == "bandwidth":
        rates = [(achieved_tbps(r.bytes, r.median_us), r) for r in _timed(records)
                 if r.category in MEMORY_CATEGORIES and r.bytes]  # fmt: skip
        return held(peak, rates, "bandwidth")
    rates = [(achieved_tflops(r.flops, r.median_us), r) for r in _timed(records)
             if r.category == "gemm" and r.flops and gemm_peak(peaks, r.precision) is peak]  # fmt: skip
    return held(peak, rates, f"{key} GEMM")


def _timed(records: list[Record]) -> list[Record]:
    return [r for r in records if r.ok and r.measured and r.median_us and r.median_us > 0]


def held(peak: Peak, rates: list[tuple[float, Record]], name: str) -> Peak:
    """``peak``, or the fastest of ``rates`` (the run's own stages against it, each rate in ``peak``'s unit) where
    that beat it, labelled as such: a ceiling that is exceeded is not a ceiling, and no efficiency reads above
    100% of its denominator."""
    best, record = max(rates, key=lambda pair: pair[0], default=(0.0, None))
    if record is None or best <= peak.value:
        return peak
    what = f"{record.stage} ({record.point.recipe}) at M={record.point.M}"
    return Peak(best, peak.unit, f"measured {name} ceiling {best:.4g} {peak.unit}: this run's fastest, {what}, "
                                 f"above the {peak.label}")  # fmt: skip


def spec_for_run(run: Run) -> HardwareSpec:
    """The hardware spec ``run.meta["hardware"]`` names."""
    key = run.meta.get("hardware")
    if not key:
        raise InputError(f"run of {run.card} names no hardware spec (meta['hardware']); pass one explicitly")
    return get_spec(key)


def _compute_tflops(spec: HardwareSpec, precision: str | None) -> float:
    """The datasheet compute peak of ``precision`` on ``spec``. mxfp8 on a card without MX tensor cores is priced
    at its fp8 rate (optimistic: such cards emulate it)."""
    if precision not in ("bf16", "fp8", "mxfp8"):
        raise InputError(f"cost.precision must be 'bf16', 'fp8' or 'mxfp8' when it has FLOPs, got {precision!r}")
    value = getattr(spec, f"{precision}_tflops")
    if value is None and precision == "mxfp8":
        value = spec.fp8_tflops
    if value is None:
        raise InputError(f"cost.precision {precision!r}: {spec.name} has no tensor-core peak for it to model")
    return value


def floor_us(cost: Cost, spec: HardwareSpec) -> float:
    """The roofline floor of one call: max(bytes / HBM bandwidth, FLOPs / peak of its precision), at the
    datasheet peaks (the highest the card can reach). Bandwidth is ``spec.hbm_tbps`` (TB/s), compute
    ``spec.<precision>_tflops`` (TFLOP/s); 1 TB/s moves 10**6 bytes per microsecond."""
    memory_us = cost.bytes / (spec.hbm_tbps * 1e6)
    compute_us = cost.flops / (_compute_tflops(spec, cost.precision) * 1e6) if cost.flops else 0.0
    return max(memory_us, compute_us)


def model_time_us(cost: Cost, spec: HardwareSpec) -> float:
    """Roofline time of one call: ``floor_us`` + LAUNCH_FLOOR_US."""
    return floor_us(cost, spec) + LAUNCH_FLOOR_US


def below_floor(median_us: float, cost: Cost, spec: HardwareSpec) -> str | None:
    """Why a measured ``median_us`` is impossible for a call of ``cost`` on ``spec`` (faster than its roofline
    floor: the call cannot have moved its declared bytes or done its declared FLOPs), or None."""
    floor = floor_us(cost, spec)
    if not median_us < floor:
        return None
    roofs = [f"{cost.bytes} B at {spec.hbm_tbps:g} TB/s"]
    if cost.flops:
        roofs.append(f"{cost.flops} FLOP at {_compute_tflops(spec, cost.precision):g} TFLOP/s {cost.precision}")
    return (f"{median_us:.3g} us is below the roofline floor {floor:.3g} us of the stage's declared cost on "
            f"{spec.name} ({' or '.join(roofs)}, datasheet)")


def cost_of(item: Any) -> Cost:
    """The declared cost of a pipeline ``Stage`` (``.cost``), of a stored ``Record`` (its cost fields) or of a row
    of a runs frame (``views.frame``, from ``DataFrame.itertuples()``: the same fields)."""
    if hasattr(item, "cost"):
        return item.cost
    precision = item.precision if isinstance(item.precision, str) else None  # a frame's missing value is NaN
    return Cost(int(item.bytes_read), int(item.bytes_written), int(item.flops), precision)


def model_step_us(stages: Iterable[Any], spec: HardwareSpec) -> float:
    """The model of a step: its stages (``Stage``s, ``Record``s or frame rows) priced over ``spec`` back to back;
    end-to-end rows are skipped, so a step is never counted twice."""
    return sum(model_time_us(cost_of(i), spec) for i in stages if getattr(i, "category", "") != "end_to_end")


def model_records(
    point: Point, stages: Sequence[Stage], spec: HardwareSpec, *, end_to_end: bool = True
) -> list[Record]:
    """One model Record per stage (``measured=False``, ``model_us`` set, cost fields copied from the stage).

    With ``end_to_end`` a last "end_to_end" / "fwd+bwd" record prices the whole step as the stages back to back:
    its cost is the sum of theirs and its time the sum of their model times.
    """
    records = [
        _priced(
            Record(point, str(s.pass_name), s.name, s.kernel, str(s.category), s.purpose, s.shapes,
                   impl=getattr(s, "impl", OURS)),
            s.cost, spec, s.backend,
        )
        for s in stages
    ]
    if end_to_end and records:
        total = sum((s.cost for s in stages), Cost(0, 0))
        purpose = "forward + backward, stages back to back"
        step = Record(point, Pass.END_TO_END, END_TO_END_STAGE, "all stages", Category.END_TO_END, purpose)
        records.append(replace(_priced(step, total, spec), model_us=sum(r.model_us for r in records)))
    return records


def _priced(record: Record, cost: Cost, spec: HardwareSpec, backend: str | None = None) -> Record:
    """``record`` as a model row: ``cost`` copied in, its model time over ``spec``, ``measured=False``."""
    return replace(
        record, bytes_read=cost.bytes_read, bytes_written=cost.bytes_written, flops=cost.flops,
        precision=cost.precision, backend=backend, method="model", measured=False, model_us=model_time_us(cost, spec),
    )  # fmt: skip


def model_speedup(bf16_stages: Iterable[Any], recipe_stages: Iterable[Any], spec: HardwareSpec) -> float:
    """Model time of the bf16 step over the recipe's step (> 1: the recipe is faster).

    Items are pipeline ``Stage``s, stored ``Record``s or frame rows (their declared costs; end-to-end rows are
    skipped so a step is never counted twice).
    """
    base, recipe = model_step_us(bf16_stages, spec), model_step_us(recipe_stages, spec)
    if not base or not recipe:
        raise InputError("model_speedup needs at least one stage on each side")
    return base / recipe
