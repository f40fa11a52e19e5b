"""Measured ceilings: storage per card and power limit, the peaks they give, and (GPU) the measurement itself."""

import json

import pytest
import torch

from mxbench import hardware
from mxbench.ceilings import Ceilings, load_ceilings, measure_ceilings, measured_peaks, save_ceilings

CARD = "NVIDIA H100 80GB HBM3"


def ceilings(power_limit_w=700.0, copy=2.95, r2w1=3.0, read=3.05, bf16=780.0, fp8=1350.0, **meta):
    return Ceilings(CARD, power_limit_w, copy, r2w1, read, max(copy, r2w1, read), bf16, fp8, dict(meta))


class TestStorage:
    def test_round_trip(self, tmp_path):
        c = ceilings(note="first")
        path = save_ceilings(c, tmp_path)
        assert path == tmp_path / "nvidia-h100-80gb-hbm3" / "ceilings.json"
        assert load_ceilings(tmp_path, CARD, 700.0) == c

    def test_entries_merge_by_power_limit(self, tmp_path):
        save_ceilings(ceilings(700.0, bf16=780.0), tmp_path)
        save_ceilings(ceilings(500.0, bf16=690.0), tmp_path)
        save_ceilings(ceilings(700.0, bf16=790.0), tmp_path)  # re-measured: replaces the 700 W entry
        stored = json.loads((tmp_path / "nvidia-h100-80gb-hbm3" / "ceilings.json").read_text())
        assert [(e["power_limit_w"], e["bf16_tflops"]) for e in stored["entries"]] == [(500.0, 690.0), (700.0, 790.0)]
        assert load_ceilings(tmp_path, CARD, 500.0).bf16_tflops == 690.0
        assert load_ceilings(tmp_path, CARD, 500.3).bf16_tflops == 690.0  # NVML's milliwatts
        assert load_ceilings(tmp_path, CARD, 600.0) is None

    def test_no_limit_asked_gives_the_uncapped_entry(self, tmp_path):
        save_ceilings(ceilings(500.0), tmp_path)
        save_ceilings(ceilings(700.0), tmp_path)
        save_ceilings(ceilings(None), tmp_path)
        assert load_ceilings(tmp_path, CARD).power_limit_w == 700.0

    def test_only_an_unknown_limit_stored(self, tmp_path):
        save_ceilings(ceilings(None), tmp_path)
        assert load_ceilings(tmp_path, CARD).power_limit_w is None
        assert load_ceilings(tmp_path, CARD, 700.0) is None

    def test_card_by_slug_and_missing_card(self, tmp_path):
        save_ceilings(ceilings(), tmp_path)
        assert load_ceilings(tmp_path, "nvidia-h100-80gb-hbm3") is not None
        assert load_ceilings(tmp_path, "NVIDIA B200") is None

    def test_a_foreign_file_is_a_clear_error(self, tmp_path):
        path = tmp_path / "nvidia-h100-80gb-hbm3" / "ceilings.json"
        path.parent.mkdir()
        path.write_text('{"schema": 99, "entries": []}')
        with pytest.raises(ValueError, match="not an mxbench ceilings file"):
            load_ceilings(tmp_path, CARD)


class TestPeaks:
    def test_labels_name_the_kernel_card_and_limit(self):
        peaks = measured_peaks(ceilings(700.0, copy=2.95, r2w1=2.9, read=2.8))
        assert peaks["bandwidth"] == hardware.Peak(2.95, "TB/s", f"measured copy ceiling 2.95 TB/s ({CARD}, 700 W)")
        assert peaks["bf16"].value == 780.0 and peaks["bf16"].unit == "TFLOP/s"
        assert peaks["bf16"].label.startswith("measured bf16 GEMM ceiling") and "700 W" in peaks["bf16"].label
        assert "measured fp8 GEMM ceiling" in peaks["fp8"].label

    def test_bandwidth_peak_is_the_best_kernel(self):
        peaks = measured_peaks(ceilings(copy=2.8, r2w1=2.9, read=3.1))
        assert peaks["bandwidth"].value == 3.1 and "measured read ceiling" in peaks["bandwidth"].label

    def test_no_fp8_ceiling_no_fp8_peak_and_unknown_limit(self):
        peaks = measured_peaks(ceilings(None, fp8=None))
        assert set(peaks) == {"bandwidth", "bf16"}
        assert "limit unknown" in peaks["bandwidth"].label

    @pytest.mark.parametrize("kwargs, name", [({"size_bytes": 1000}, "size_bytes"), ({"gemm_n": 100}, "gemm_n")])
    def test_bad_sizes_are_named(self, kwargs, name):
        with pytest.raises(ValueError, match=name):
            measure_ceilings(**kwargs)


@pytest.mark.gpu
def test_measured_ceilings_are_plausible(tmp_path):
    spec = hardware.detect()
    if spec is None:
        pytest.skip(f"no spec for {torch.cuda.get_device_name(0)!r}")
    c = measure_ceilings(size_bytes=2**30)
    assert c.card == torch.cuda.get_device_name(0)
    assert c.bandwidth_tbps == max(c.copy_tbps, c.read2write1_tbps, c.read_tbps)
    assert 0.5 * spec.hbm_tbps < c.bandwidth_tbps < spec.hbm_tbps
    assert 0.5 * spec.bf16_tflops < c.bf16_tflops < spec.bf16_tflops
    if spec.fp8_tflops is not None:
        assert 0.4 * spec.fp8_tflops < c.fp8_tflops < spec.fp8_tflops
    assert c.power_limit_w is None or c.power_limit_w > 0
    save_ceilings(c, tmp_path)
    assert load_ceilings(tmp_path, c.card, c.power_limit_w) == c
