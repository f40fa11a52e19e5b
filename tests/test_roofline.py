"""Efficiency math and the analytic model against hand-worked numbers (seed 000's torchao README, datasheets)."""

from dataclasses import asdict

import pytest
from helpers import fake_stage
from mxkernels.core.cost import Cost
from mxkernels.stages.pipeline import Stage

from mxbench.instruments import roofline
from mxbench.instruments.ceiling_store import Ceilings
from mxbench.instruments.hardware import HardwareSpec, Peak, datasheet_peaks
from mxbench.storage.results import Point, Record, Run

# DeepSeek-V3 shapes of seed 000: M=131072 tokens, K=7168, N=2048.
M, K, N = 131072, 7168, 2048
# 2D quantize of (M, K) bf16: read 2 B/elem, write 1 B/elem + one scale byte per 32 -> M*K*(3 + 1/32) bytes.
QUANT_BYTES_READ, QUANT_BYTES_WRITTEN = 2 * M * K, M * K + M * K // 32
assert QUANT_BYTES_READ + QUANT_BYTES_WRITTEN == 2_847_932_416  # "moves 2.848 GB" (benchmarking.md section 0)
GEMM_FLOPS = 2 * M * N * K  # 3,848,290,697,216


def spec(key="b200", name="B200", hbm=8.0, bf16=2250.0, fp8=4500.0, mxfp8=4500.0) -> HardwareSpec:
    return HardwareSpec(
        key=key, name=name, hbm_tbps=hbm, bf16_tflops=bf16, fp8_tflops=fp8, mxfp8_tflops=mxfp8,
        sms=148, l2_mb=126.5, tdp_w=1000.0, sources={},
    )  # fmt: skip


H100 = {"key": "h100-sxm", "name": "H100 SXM", "hbm": 3.35, "bf16": 989.0, "fp8": 1979.0, "mxfp8": None}

BW = Peak(8.0, "TB/s", "B200 datasheet BW")
PEAKS = {
    "bandwidth": BW,
    "bf16": Peak(2250.0, "TFLOP/s", "B200 datasheet bf16"),
    "fp8": Peak(4500.0, "TFLOP/s", "B200 datasheet fp8"),
    "mxfp8": Peak(4500.0, "TFLOP/s", "B200 datasheet mxfp8"),
}
HOPPER_PEAKS = {
    "bandwidth": Peak(3.35, "TB/s", "H100 SXM datasheet BW"),
    "bf16": Peak(989.0, "TFLOP/s", "H100 SXM datasheet bf16"),
    "fp8": Peak(1979.0, "TFLOP/s", "H100 SXM datasheet fp8"),
}


def record(category="quantize", us=(525.3,), read=QUANT_BYTES_READ, written=QUANT_BYTES_WRITTEN, flops=0,
           precision=None, **kw) -> Record:  # fmt: skip
    return Record(
        point=Point(M, N, K, 8), pass_name=kw.pop("pass_name", "forward"), stage="s", kernel="k",
        category=category, bytes_read=read, bytes_written=written, flops=flops, precision=precision,
        samples_us=list(us), **kw,
    )  # fmt: skip


def test_achieved_throughput_matches_the_seed_readme():
    # torchao README (B200): quantize dim0 of (131072, 7168) in 525.3 us "is 5.42 TB/s"; fwd GEMM 1671.2 us "2.30 PF"
    assert roofline.achieved_tbps(2_847_932_416, 525.3) == pytest.approx(5.4216, abs=1e-4)
    assert roofline.achieved_tflops(GEMM_FLOPS, 1671.2) == pytest.approx(2302.7, abs=0.1)


@pytest.mark.parametrize("fn", [roofline.achieved_tbps, roofline.achieved_tflops])
@pytest.mark.parametrize("us", [0.0, -1.0])
def test_achieved_throughput_rejects_non_positive_time(fn, us):
    with pytest.raises(ValueError, match="us"):
        fn(1000, us)


def test_efficiency_reproduces_torchao_percentages_against_achievable_peaks():
    # torchao divides by 0.92 x 8.0 TB/s and 0.78 x 4.5 PF: the README prints 73.7% and 65.6%
    achievable = {"bandwidth": Peak(0.92 * 8.0, "TB/s", "B200 achievable BW"),
                  "mxfp8": Peak(0.78 * 4500, "TFLOP/s", "B200 achievable mxfp8")}  # fmt: skip
    pct, peak = roofline.efficiency(record(), achievable)
    assert round(pct, 1) == 73.7 and peak.label == "B200 achievable BW"
    gemm = record("gemm", us=(1671.2,), read=0, written=0, flops=GEMM_FLOPS, precision="mxfp8")
    pct, peak = roofline.efficiency(gemm, achievable)
    assert round(pct, 1) == 65.6 and peak.label == "B200 achievable mxfp8"


def test_efficiency_against_datasheet_uses_the_median_time():
    # median of (500, 525.3, 900) is 525.3 -> 5.4216 TB/s of 8.0 = 67.77%
    pct, peak = roofline.efficiency(record(us=(900.0, 525.3, 500.0)), PEAKS)
    assert pct == pytest.approx(100 * 2_847_932_416 / 525.3e-6 / 8.0e12)
    assert peak is BW


def test_rearrange_efficiency_counts_the_padded_writes():
    # reads 1 MB of scales, writes a 3 MB zero-padded blocked image in 1 us: 4 MB/us = 4 TB/s = 50% of 8 TB/s
    pct, peak = roofline.efficiency(record("rearrange", us=(1.0,), read=1_000_000, written=3_000_000), PEAKS)
    assert pct == pytest.approx(50.0) and peak is BW


def test_gemm_efficiency_uses_the_peak_of_its_precision():
    bf16 = record("gemm", us=(2000.0,), read=0, written=0, flops=GEMM_FLOPS, precision="bf16")
    pct, peak = roofline.efficiency(bf16, PEAKS)
    assert pct == pytest.approx(100 * GEMM_FLOPS / 2000e-6 / 2250e12) and peak is PEAKS["bf16"]


def test_mxfp8_gemm_without_mx_hardware_falls_back_to_the_fp8_peak_and_says_so():
    gemm = record("gemm", us=(5000.0,), read=0, written=0, flops=GEMM_FLOPS, precision="mxfp8")
    pct, peak = roofline.efficiency(gemm, HOPPER_PEAKS)
    assert peak.value == 1979.0 and peak.unit == "TFLOP/s"
    assert "fp8" in peak.label and peak.label != HOPPER_PEAKS["fp8"].label
    assert pct == pytest.approx(100 * GEMM_FLOPS / 5000e-6 / 1979e12)


@pytest.mark.parametrize(
    "rec",
    [
        record("end_to_end", us=(3000.0,), flops=GEMM_FLOPS),
        record(us=(), error="RuntimeError: boom"),
        record(us=()),  # no samples and no model time
        record("gemm", us=(10.0,), flops=GEMM_FLOPS, precision=None),
    ],
    ids=["end_to_end", "error", "empty", "gemm-without-precision"],
)
def test_no_efficiency_where_no_single_roof_applies(rec):
    assert roofline.efficiency(rec, PEAKS) is None


def test_no_efficiency_without_the_peak_it_needs():
    assert roofline.efficiency(record(), {"bf16": PEAKS["bf16"]}) is None
    gemm = record("gemm", us=(10.0,), read=0, written=0, flops=GEMM_FLOPS, precision="fp8")
    assert roofline.efficiency(gemm, {"bandwidth": BW, "bf16": PEAKS["bf16"]}) is None


def test_model_rows_report_efficiency_of_the_model_time():
    rec = record(us=(), measured=False, model_us=355.991552)  # exactly bytes / 8 TB/s
    pct, _ = roofline.efficiency(rec, PEAKS)
    assert pct == pytest.approx(100.0)


# ------------------------------------------------------------------------------------------------- peaks


def run_with(meta) -> Run:
    return Run(meta={"card": "NVIDIA B200", **meta})


def test_datasheet_peaks_for_run_come_from_the_named_spec(monkeypatch):
    b200 = spec()
    monkeypatch.setattr(roofline, "get_spec", lambda key: {"b200": b200}[key])
    assert roofline.peaks_for_run(run_with({"hardware": "b200"})) == datasheet_peaks(b200)


def test_peaks_for_run_needs_a_spec_name():
    with pytest.raises(ValueError, match="hardware"):
        roofline.peaks_for_run(run_with({}))


def test_measured_peaks_need_stored_ceilings():
    with pytest.raises(ValueError, match="ceilings"):
        roofline.peaks_for_run(run_with({"hardware": "b200"}), "measured")


def test_unknown_denominator_is_rejected():
    with pytest.raises(ValueError, match="denominator"):
        roofline.peaks_for_run(run_with({"hardware": "b200"}), "achievable")


def test_measured_peaks_come_from_the_stored_ceilings(monkeypatch):
    monkeypatch.setattr(roofline, "get_spec", lambda key: spec())
    c = Ceilings(card="NVIDIA B200", power_limit_w=1000.0, copy_tbps=6.1, read2write1_tbps=6.3, read_tbps=6.9,
                 bandwidth_tbps=6.4, bf16_tflops=1745.0, fp8_tflops=3432.0, meta={})  # fmt: skip
    peaks = roofline.peaks_for_run(run_with({"hardware": "b200", "ceilings": asdict(c)}), "measured")
    assert peaks["bandwidth"].value == 6.4 and peaks["bf16"].value == 1745.0 and peaks["fp8"].value == 3432.0
    # B200 runs MXFP8 at the fp8 rate: the measured fp8 ceiling is its roof, labelled as such
    assert peaks["mxfp8"].value == 3432.0 and peaks["mxfp8"].label != peaks["fp8"].label


def test_a_stored_ceiling_the_run_beats_gives_way_to_its_fastest_stage(monkeypatch):
    monkeypatch.setattr(roofline, "get_spec", lambda key: spec())
    c = Ceilings(card="NVIDIA B200", power_limit_w=1000.0, copy_tbps=5.0, read2write1_tbps=5.2, read_tbps=5.3,
                 bandwidth_tbps=5.3, bf16_tflops=2000.0, fp8_tflops=4000.0, meta={})  # fmt: skip
    # quantize: 2,847,932,416 B in 525.3 us = 5.4216 TB/s > 5.3; bf16 GEMM in 1671.2 us = 2302.7 TF > 2000; the fp8
    # GEMM (1000 us: 3848.3 TF) stays under its 4000, and a failed record counts for nothing
    gemm = record("gemm", us=(1671.2,), read=0, written=0, flops=GEMM_FLOPS, precision="bf16")
    slow_fp8 = record("gemm", us=(1000.0,), read=0, written=0, flops=GEMM_FLOPS, precision="fp8")
    failed = record(us=(1.0,), error="boom")
    run = Run(meta={"card": "NVIDIA B200", "hardware": "b200", "ceilings": asdict(c)},
              records=[record(), gemm, slow_fp8, failed])  # fmt: skip
    peaks = roofline.peaks_for_run(run, "measured")
    assert peaks["bandwidth"].value == pytest.approx(5.4216, abs=1e-4) and peaks["fp8"].value == 4000.0
    assert peaks["bf16"].value == pytest.approx(2302.7, abs=0.1)
    assert "this run's fastest, s (mxfp8) at M=131072, above the measured bf16 GEMM ceiling 2000" in peaks["bf16"].label
    assert max(roofline.efficiency(r, peaks)[0] for r in (record(), gemm, slow_fp8)) == pytest.approx(100.0)


# ------------------------------------------------------------------------------------------------- model


def test_model_time_of_a_quantize_is_bytes_over_bandwidth_plus_the_launch_floor():
    # 2,847,932,416 B / 8.0e12 B/s = 355.991552 us; + 2 us launch floor
    cost = Cost(QUANT_BYTES_READ, QUANT_BYTES_WRITTEN)
    assert roofline.model_time_us(cost, spec()) == pytest.approx(357.991552, rel=1e-12)
    assert roofline.LAUNCH_FLOOR_US == 2.0


def test_model_time_of_a_gemm_is_compute_bound_at_its_precision():
    # 3,848,290,697,216 FLOP / 4.5e15 = 855.175710 us; bf16 at 2.25e15 = 1710.351421 us; operand bytes are far less
    gemm_bytes = Cost(M * K + N * K * 8, M * N * 2, GEMM_FLOPS, "mxfp8")
    assert roofline.model_time_us(gemm_bytes, spec()) == pytest.approx(855.175710 + 2, rel=1e-8)
    bf16 = Cost(2 * M * K + 2 * N * K * 8, M * N * 2, GEMM_FLOPS, "bf16")
    assert roofline.model_time_us(bf16, spec()) == pytest.approx(1710.351421 + 2, rel=1e-8)


def test_model_time_takes_the_larger_of_memory_and_compute():
    # 16e9 B at 8 TB/s = 2000 us outweighs 4.5e12 FLOP at 4500 TF/s = 1000 us
    assert roofline.model_time_us(Cost(16_000_000_000, 0, 4_500_000_000_000, "fp8"), spec()) == pytest.approx(2002.0)


def test_model_of_an_empty_call_is_the_launch_floor():
    assert roofline.model_time_us(Cost(0, 0), spec()) == 2.0


def test_model_prices_mxfp8_at_the_fp8_rate_on_a_card_without_mx_hardware():
    # H100: 1979 TF fp8 -> 3,848,290,697,216 / 1.979e15 = 1944.563 us
    t = roofline.model_time_us(Cost(0, 0, GEMM_FLOPS, "mxfp8"), spec(**H100))
    assert t == pytest.approx(1944.563263 + 2, rel=1e-8)


def test_model_of_fp8_on_a_card_without_fp8_tensor_cores_is_refused():
    a100 = spec(key="a100", name="A100 SXM", hbm=2.039, bf16=312.0, fp8=None, mxfp8=None)
    assert roofline.model_time_us(Cost(0, 0, 312_000_000_000, "bf16"), a100) == pytest.approx(1000.0 + 2)
    with pytest.raises(ValueError, match="A100 SXM has no tensor-core peak"):
        roofline.model_time_us(Cost(0, 0, 10, "mxfp8"), a100)


def test_model_rejects_flops_without_a_known_precision():
    with pytest.raises(ValueError, match="precision"):
        roofline.model_time_us(Cost(0, 0, 10, "fp4"), spec())


def stages() -> list[Stage]:
    quant = Cost(QUANT_BYTES_READ, QUANT_BYTES_WRITTEN)
    gemm = Cost(M * K + M * K // 32, 2 * M * N, GEMM_FLOPS, "mxfp8")
    return [
        fake_stage("forward", "quantize_a", "quantize_dim0", "quantize", "Quantize A", f"({M}, {K})", quant),
        fake_stage("forward", "gemm_fwd", "mxfp8_grouped_mm", "gemm", "2D x 3D", "", gemm, backend="native"),
    ]


def test_model_records_copy_the_declared_costs_and_are_marked_as_model():
    point = Point(M, N, K, 8)
    recs = roofline.model_records(point, stages(), spec(), end_to_end=False)
    assert len(recs) == 2
    for r, s in zip(recs, stages(), strict=True):
        assert (r.pass_name, r.stage, r.kernel, r.category, r.backend) == (
            s.pass_name, s.name, s.kernel, s.category, s.backend,
        )  # fmt: skip
        assert (r.bytes_read, r.bytes_written, r.flops, r.precision) == (
            s.cost.bytes_read, s.cost.bytes_written, s.cost.flops, s.cost.precision,
        )  # fmt: skip
        assert r.measured is False and r.samples_us == [] and r.point == point
    assert recs[0].model_us == pytest.approx(357.991552)
    assert recs[1].model_us == pytest.approx(857.175710)
    assert recs[0].median_us == recs[0].model_us and recs[0].ok


def test_model_records_end_with_the_step_back_to_back():
    recs = roofline.model_records(Point(M, N, K, 8), stages(), spec())
    e2e = recs[-1]
    assert (e2e.pass_name, e2e.stage, e2e.category) == ("end_to_end", "fwd+bwd", "end_to_end")
    assert e2e.model_us == pytest.approx(357.991552 + 857.175710)
    assert e2e.flops == GEMM_FLOPS and e2e.bytes == sum(s.cost.bytes for s in stages())


def test_model_speedup_is_bf16_step_time_over_the_recipe_step_time():
    bf16 = [fake_stage("forward", "gemm_fwd", "grouped_mm", "gemm", "", "", Cost(0, 0, GEMM_FLOPS, "bf16"))]
    # bf16: 1710.351421 + 2; mxfp8: (355.991552 + 2) + (855.175710 + 2) -> 1712.351421 / 1215.167262
    assert roofline.model_speedup(bf16, stages(), spec()) == pytest.approx(1712.351421 / 1215.167262, rel=1e-8)


def test_model_speedup_reads_stored_records_and_skips_end_to_end_rows():
    point = Point(M, N, K, 8)
    recs = roofline.model_records(point, stages(), spec())  # includes an end-to-end row
    bf16 = [record("gemm", us=(1.0,), read=0, written=0, flops=GEMM_FLOPS, precision="bf16")]
    assert roofline.model_speedup(bf16, recs, spec()) == pytest.approx(1712.351421 / 1215.167262, rel=1e-8)


def test_model_speedup_needs_stages_on_both_sides():
    with pytest.raises(ValueError, match="stage"):
        roofline.model_speedup([], stages(), spec())


def test_a_mixed_precision_sum_runs_against_its_faster_roof():
    """bf16 + FP8 FLOPs (the FP8 layer's graph: the router's bf16 GEMMs beside the experts' FP8 ones) sum to the FP8
    roof, whichever comes first; a part with no FLOPs does not label the sum."""
    router, experts = Cost(10, 0, 4_000, "bf16"), Cost(10, 0, 96_000, "fp8")
    for total in (router + experts, experts + router):
        assert total == Cost(20, 0, 100_000, "fp8")
    assert (Cost(5, 5) + router).precision == "bf16" and (Cost(1, 1, 0, "fp8") + router).precision == "bf16"
    assert (experts + Cost(1, 1, 8, "mxfp8")).precision == "mxfp8"


def test_the_fp8_layers_graph_is_held_to_a_floor_it_can_meet():
    """The FP8 rowwise Scout layer's fused graph measured 99.3 ms on an H200 (layer-llama4-scout-no-shared-sixth):
    its 99.08 TFLOP at the bf16 peak would floor it at 100.2 ms and call it impossible; at the FP8 peak the floor is
    50.1 ms (hand-worked: 99084895518720 / 1979e12 s), which that time passes and half of it does not."""
    from mxkernels.stages.layer import LayerShape, layer_stages

    shape = LayerShape(T=131072, K=5120, N=8192, E=8, top_k=1)
    total = sum((s.cost for s in layer_stages("fp8_rowwise", shape, fuse=True)), Cost(0, 0))
    assert total.flops == 99_084_895_518_720 and total.precision == "fp8"
    h200 = spec("h200", "H200 SXM", 4.8, 989.0, 1979.0, None)
    floor = roofline.floor_us(total, h200)
    assert floor == pytest.approx(99_084_895_518_720 / 1979e6)
    assert roofline.below_floor(99.3e3, total, h200) is None
    assert "below the roofline floor" in roofline.below_floor(floor / 2, total, h200)
