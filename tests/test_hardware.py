"""Hardware specs against the datasheets, card detection from real device names, peaks and their labels."""

import pytest
import torch

from mxbench.instruments import hardware
from mxbench.instruments.hardware import Peak

REQUIRED = ["b200", "gb200", "b300", "h100-sxm", "h100-pcie", "h200", "a100-sxm-80gb", "mi300x", "mi355x"]
NUMBERS = ["hbm_tbps", "bf16_tflops", "fp8_tflops", "mxfp8_tflops", "sms", "l2_mb", "tdp_w"]
GIB = 2**30


@pytest.fixture(scope="module")
def specs():
    return hardware.load_specs()


class TestTable:
    def test_every_required_card_is_present(self, specs):
        assert set(REQUIRED) <= set(specs)

    def test_every_number_has_a_source(self, specs):
        for spec in specs.values():
            for name in NUMBERS:
                if getattr(spec, name) is not None:
                    assert spec.sources.get(name), f"{spec.key}.{name} has no source"

    @pytest.mark.parametrize("key, hbm, bf16, fp8, mxfp8, sms", [
        # reference/benchmarking.md section A (dense figures)
        ("b200", 8.0, 2250, 4500, 4500, 148),
        ("gb200", 8.0, 2500, 5000, 5000, 148),
        ("b300", 8.0, 2250, 4500, 4500, 160),
        ("h100-sxm", 3.35, 989, 1979, None, 132),
        ("h100-pcie", 2.0, 756, 1513, None, 114),
        ("h200", 4.8, 989, 1979, None, 132),
        ("a100-sxm-80gb", 2.039, 312, None, None, 108),
        ("mi300x", 5.3, 1307.4, 2614.9, None, 304),
        ("mi355x", 8.0, 2500, 5000, 5000, 256),
    ])  # fmt: skip
    def test_numbers_match_the_datasheets(self, specs, key, hbm, bf16, fp8, mxfp8, sms):
        s = specs[key]
        assert (s.hbm_tbps, s.bf16_tflops, s.fp8_tflops, s.mxfp8_tflops, s.sms) == (hbm, bf16, fp8, mxfp8, sms)

    @pytest.mark.parametrize("key, precision, ridge", [
        # ridge points (FLOP per byte) given in reference/benchmarking.md section A
        ("h100-sxm", "bf16", 295), ("h100-sxm", "fp8", 591), ("mi355x", "fp8", 625),
    ])  # fmt: skip
    def test_ridge_points(self, specs, key, precision, ridge):
        s = specs[key]
        assert getattr(s, f"{precision}_tflops") / s.hbm_tbps == pytest.approx(ridge, rel=0.005)

    @pytest.mark.parametrize("key, l2_bytes", [
        # L2_cache_size that torch reports on the card: H100 SXM 52428800, H200 62914560 (2026-11-26)
        ("h100-sxm", 52_428_800), ("h200", 62_914_560),
    ])  # fmt: skip
    def test_l2_is_what_the_card_reports(self, specs, key, l2_bytes):
        assert specs[key].l2_mb * 2**20 == l2_bytes

    def test_b200_records_both_bandwidth_figures(self, specs):
        b200 = specs["b200"]
        assert b200.hbm_tbps == 8.0
        assert "7.67" in b200.notes

    def test_dense_not_sparse(self, specs):
        # Dense FP8 is twice dense BF16 on every FP8 card, and MX runs at the FP8 rate where it exists
        for s in specs.values():
            if s.fp8_tflops is not None:
                assert s.fp8_tflops == pytest.approx(2 * s.bf16_tflops, rel=0.01)
            if s.mxfp8_tflops is not None:
                assert s.mxfp8_tflops == s.fp8_tflops

    def test_a_number_without_a_source_is_refused(self):
        entry = {"name": "X", "hbm_tbps": 1.0, "bf16_tflops": 1.0, "sms": 1, "l2_mb": 1.0, "tdp_w": 1.0,
                 "sources": {"hbm_tbps": "a", "bf16_tflops": "b", "sms": "c", "l2_mb": "d"}}  # fmt: skip
        with pytest.raises(ValueError, match="tdp_w"):
            hardware._spec_from_toml("x", entry)


class TestLookup:
    @pytest.mark.parametrize("name, key", [
        ("b200", "b200"), ("B200", "b200"), ("h100", "h100-sxm"), ("H100", "h100-sxm"),
        ("h100-sxm", "h100-sxm"), ("H100 SXM", "h100-sxm"), ("h100_sxm", "h100-sxm"), ("H100 PCIe", "h100-pcie"),
        ("h200", "h200"), ("a100", "a100-sxm-80gb"), ("MI300X", "mi300x"),
    ])  # fmt: skip
    def test_keys_and_aliases(self, name, key):
        assert hardware.get_spec(name).key == key

    def test_unknown_key_lists_the_valid_ones(self):
        with pytest.raises(ValueError, match=r"valid keys: .*b200.*h100-sxm"):
            hardware.get_spec("rtx-9090")


class TestDetection:
    @pytest.mark.parametrize("device_name, memory_gib, key", [
        ("NVIDIA H100 80GB HBM3", 79.6, "h100-sxm"),
        ("NVIDIA H100", 79.6, "h100-sxm"),
        ("NVIDIA H100 PCIe", 79.6, "h100-pcie"),
        ("NVIDIA H100 NVL", 93.6, None),
        ("NVIDIA H200", 139.8, "h200"),
        ("NVIDIA H200 NVL", 139.8, None),
        ("NVIDIA GH200 480GB", 94.5, None),
        ("NVIDIA B200", 178.4, "b200"),
        ("NVIDIA GB200", 184.0, "gb200"),
        ("NVIDIA B300 SXM6 AC", 268.0, "b300"),
        ("NVIDIA GB300", 277.0, "gb300"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", 39.4, None),
        ("AMD Instinct MI300X", 191.5, "mi300x"),
        ("NVIDIA GeForce RTX 4090", 23.6, None),
    ])  # fmt: skip
    def test_device_names(self, specs, device_name, memory_gib, key):
        spec = hardware.match_spec(device_name, int(memory_gib * GIB), specs)
        assert (spec.key if spec else None) == key

    def test_unknown_memory_size_matches_by_name(self, specs):
        assert hardware.match_spec("NVIDIA H100 80GB HBM3", None, specs).key == "h100-sxm"

    @pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
    def test_no_cuda(self):
        assert hardware.detect() is None
        assert hardware.device_properties()["name"] is None


class TestBusBandwidth:
    def test_h100_sxm(self):
        # 5120-bit HBM3 at 2619 MHz, double data rate: the 3.35 TB/s datasheet figure
        assert hardware.bus_bandwidth_tbps(5120, 2_619_000) == pytest.approx(3.352, abs=1e-3)

    def test_b200_cuda13_bus(self):
        # pytorch/ao#4002: 7680/8 bytes x 3996 MHz x 2 = 7.672 TB/s
        assert hardware.bus_bandwidth_tbps(7680, 3_996_000) == pytest.approx(7.672, abs=1e-3)


class TestPeaks:
    def test_datasheet_peaks_name_their_source(self):
        peaks = hardware.datasheet_peaks(hardware.get_spec("h100-sxm"))
        assert set(peaks) == {"bandwidth", "bf16", "fp8"}  # no MX tensor cores on Hopper
        assert peaks["bandwidth"] == Peak(3.35, "TB/s", "H100 SXM datasheet 3.35 TB/s")
        assert peaks["bf16"].value == 989 and peaks["bf16"].unit == "TFLOP/s"
        assert "datasheet" in peaks["fp8"].label and "1979" in peaks["fp8"].label

    def test_blackwell_has_an_mxfp8_peak(self):
        peaks = hardware.datasheet_peaks(hardware.get_spec("b200"))
        assert peaks["mxfp8"].value == 4500 and "B200 datasheet" in peaks["mxfp8"].label

    def test_a100_has_no_fp8_peak(self):
        assert set(hardware.datasheet_peaks(hardware.get_spec("a100"))) == {"bandwidth", "bf16"}

    @pytest.mark.parametrize("value, unit, name", [(1.0, "GB/s", "unit"), (0.0, "TB/s", "value")])
    def test_bad_peak(self, value, unit, name):
        with pytest.raises(ValueError, match=name):
            Peak(value, unit, "x")


class TestCardSlug:
    @pytest.mark.parametrize("card, slug", [
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"), ("H100 SXM", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb"), ("nvidia-h100-80gb-hbm3", "nvidia-h100-80gb-hbm3"),
    ])  # fmt: skip
    def test_slugs(self, card, slug):
        assert hardware.card_slug(card) == slug

    def test_empty_slug_is_refused(self):
        with pytest.raises(ValueError, match="card"):
            hardware.card_slug("  ")


@pytest.mark.gpu
class TestOnGPU:
    def test_device_properties_agree_with_the_detected_spec(self):
        props = hardware.device_properties()
        spec = hardware.detect()
        assert props["name"] == torch.cuda.get_device_name(0)
        assert spec is not None, f"no spec matches {props['name']!r}"
        assert props["sms"] == spec.sms
        assert props["l2_bytes"] / 2**20 == pytest.approx(spec.l2_mb, rel=0.05)
        if props["bandwidth_tbps"] is not None:
            assert props["bandwidth_tbps"] == pytest.approx(spec.hbm_tbps, rel=0.1)
        assert props["compute_capability"] == "{}.{}".format(*torch.cuda.get_device_capability(0))
