"""The B200 projection of a run measured on a card without MX tensor cores, against hand-worked numbers: every
kernel keeps its fraction of its roof; MXFP8 GEMMs take the bf16 GEMM's; the peak model beside it."""

from __future__ import annotations

import csv
import io

import pytest
from mxkernels.core.errors import InputError
from test_report import BF16_GEMM_US, MX_E2E_US, MX_GEMM_US, mxfp8_stages, synthetic_run

from mxbench.instruments.hardware import get_spec
from mxbench.workloads.step.projection import project, projected_speedups, projection_table
from mxbench.instruments.roofline import model_speedup

H100 = get_spec("h100-sxm")  # 3.35 TB/s, bf16 989, fp8 1979, no mxfp8
B200 = get_spec("b200")  # 8.0 TB/s, bf16 2250, mxfp8 4500


@pytest.fixture(scope="module")
def h100_run():
    return synthetic_run(Ms=(65536, 131072), card="NVIDIA H100 80GB HBM3", hardware="h100-sxm")


def test_data_movement_keeps_its_fraction_of_the_bandwidth_roof(h100_run):
    proj = project(h100_run, "b200")
    qa = proj[(proj["stage"] == "quantize_a") & (proj["M"] == 131072)].iloc[0]
    # 500 us on 3.35 TB/s -> the same fraction of 8.0 TB/s: 500 * 3.35 / 8.0
    assert qa["projected_us"] == pytest.approx(500.0 * 3.35 / 8.0, rel=1e-12)
    assert qa["carried_from"] == "own" and qa["carried_peak"] == "H100 SXM datasheet 3.35 TB/s"
    assert qa["target_peak"] == "B200 datasheet 8 TB/s"
    assert qa["model_us"] == pytest.approx(qa["bytes"] / 8e6 + 2.0, rel=1e-12)  # the peak model + launch floor


def test_mxfp8_gemms_take_the_bf16_gemms_efficiency_without_mx_tensor_cores(h100_run):
    proj = project(h100_run, "b200")
    at = proj[(proj["M"] == 131072) & (proj["category"] == "gemm")].set_index(["recipe", "pass_name"])
    for p in MX_GEMM_US:
        bf16, mx = at.loc[("bf16", p)], at.loc[("mxfp8", p)]
        # bf16: its own fraction of 989 carried to 2250; mxfp8: the bf16 GEMM's fraction, carried to 4500
        assert bf16["projected_us"] == pytest.approx(BF16_GEMM_US[p] * 989 / 2250, rel=1e-12)
        assert mx["projected_us"] == pytest.approx(BF16_GEMM_US[p] * 989 / 4500, rel=1e-12)
        assert mx["carried_from"] == "bf16 GEMM" and mx["carried_pct"] == bf16["carried_pct"]
        assert mx["target_peak"] == "B200 datasheet dense MXFP8 4500 TFLOP/s"


def test_projected_and_peak_model_speedups(h100_run):
    proj = project(h100_run, "b200")
    (s,) = projected_speedups(proj[proj["M"] == 131072]).itertuples()
    memory_us = sum(t[-2] for t in mxfp8_stages(131072) if t[3] != "gemm")  # measured, every mxfp8 stage but GEMMs
    recipe_us = memory_us * 3.35 / 8.0 + sum(BF16_GEMM_US.values()) * 989 / 4500
    bf16_us = sum(BF16_GEMM_US.values()) * 989 / 2250
    assert s.recipe_us == pytest.approx(recipe_us, rel=1e-9) and s.bf16_us == pytest.approx(bf16_us, rel=1e-9)
    assert s.net == pytest.approx(bf16_us / recipe_us, rel=1e-9)
    assert (s.gemm_forward, s.gemm_backward_input, s.gemm_backward_weight) == pytest.approx((2.0, 2.0, 2.0))
    records = [r for r in h100_run.records if r.point.M == 131072 and r.category != "end_to_end"]
    model = model_speedup([r for r in records if r.point.recipe == "bf16"],
                          [r for r in records if r.point.recipe == "mxfp8"], B200)  # fmt: skip
    assert s.model_net == pytest.approx(model, rel=1e-12)


def test_the_tables_say_what_the_projection_is(h100_run):
    text = projection_table(h100_run, "speedup", "markdown", "b200")
    assert text.startswith("- **Card:** NVIDIA H100 80GB HBM3 (spec h100-sxm)")
    assert "- **Projection:** B200 datasheet roofs, projection from NVIDIA H100 80GB HBM3 efficiencies" in text
    assert "MXFP8 GEMMs at the bf16 GEMM's efficiency" in text
    rows = list(csv.DictReader(io.StringIO(projection_table(h100_run, "speedup", "csv", "b200"))))
    assert [r["M"] for r in rows] == ["65536", "131072"]
    assert rows[1]["NVIDIA H100 80GB HBM3 measured net"] == f"{6100 / MX_E2E_US:.3f}x"
    assert rows[1]["B200 Fwd GEMM 2Dx3D"] == "2.000x"
    assert rows[1]["Source"] == "projection from NVIDIA H100 80GB HBM3 efficiencies"
    breakdown = list(csv.DictReader(io.StringIO(projection_table(h100_run, "breakdown", "csv", "b200", M=65536))))
    assert len(breakdown) == 15 and breakdown[0]["Kernel"] == "quantize_dim0"
    assert breakdown[0]["B200 projected (us)"] == f"{250.0 * 3.35 / 8.0:.1f}"  # 500 us * 65536 / 131072
    assert breakdown[4]["Efficiency carried over"].endswith("(the bf16 GEMM's: no MX tensor cores)")


def test_a_card_with_mx_tensor_cores_carries_its_own_gemm_efficiency():
    run = synthetic_run(Ms=(131072,))  # a B200 run onto the B200: every time stays what it was
    proj = project(run, "b200")
    assert set(proj["carried_from"]) == {"own"}
    assert proj["projected_us"].to_numpy() == pytest.approx(proj["median_us"].to_numpy(), rel=1e-12)


def test_what_cannot_be_projected_is_refused():
    with pytest.raises(InputError, match="this is a model run"):
        project(synthetic_run(model=True), "b200")
    no_spec = synthetic_run()
    del no_spec.meta["hardware"]
    with pytest.raises(InputError, match="names none"):
        project(no_spec, "b200")
    with pytest.raises(InputError, match="--project shows the breakdown and speedup tables, not power"):
        projection_table(synthetic_run(), "power", "plain")
    with pytest.raises(InputError, match="unknown hardware 'tpu'"):
        project(synthetic_run(), "tpu")
