"""Measured ceilings: the streaming kernels (interpreter on CPU), best-of, storage per card and power limit, the
peaks they give, and (GPU) the measurement itself."""

import json

import pytest
import torch

from mxbench.instruments import ceilings as ceil
from mxbench.instruments import hardware
from mxbench.instruments.ceiling_store import Ceilings, load_ceilings, measured_peaks, save_ceilings
from mxbench.instruments.ceilings import GemmPoint, measure_ceilings
from mxbench.instruments.timing import Timing

CARD = "NVIDIA H100 80GB HBM3"


def ceilings(power_limit_w=700.0, copy=2.95, r2w1=3.0, read=3.05, bf16=780.0, fp8=1350.0, **meta):
    return Ceilings(CARD, power_limit_w, copy, r2w1, read, max(copy, r2w1, read), bf16, fp8, dict(meta))


def bf16_source(n, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 4).to(torch.bfloat16).to(device)


class TestStreamingKernels:
    # 1000 elements: a short last tile at every tile size below
    @pytest.mark.parametrize("tile", [64, 256])
    def test_copy_is_exact(self, device, tile):
        src = bf16_source(1000, device)
        dst = torch.full_like(src, float("nan"))
        assert torch.equal(ceil.stream_convert(src, dst, tile), src)

    def test_cast_of_e4m3_values_to_fp8_is_exact(self, device):
        # every finite e4m3 value (bf16 holds them exactly) cast back to e4m3 unchanged; the rounding itself is the
        # hardware cvt, checked bit for bit against torch on the GPU (the interpreter misrounds carries)
        codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8).repeat(4)
        e4m3 = codes.view(torch.float8_e4m3fn)
        out = torch.empty(len(codes), dtype=torch.float8_e4m3fn, device=device)
        ceil.stream_convert(e4m3.to(torch.bfloat16).to(device), out, 128)
        assert torch.equal(out.view(torch.uint8).cpu(), codes)

    @pytest.mark.parametrize("tile", [64, 256])
    def test_tile_sums(self, device, tile):
        src = bf16_source(1000, device)
        sums = ceil.stream_tile_sums(src, torch.empty(-(-1000 // tile), device=device), tile)
        x = torch.nn.functional.pad(src.float(), (0, len(sums) * tile - 1000))  # the short tile's zeros
        torch.testing.assert_close(sums, x.view(-1, tile).sum(1), rtol=1e-5, atol=1e-4)

    @pytest.mark.parametrize("call, name", [
        (lambda d: ceil.stream_convert(torch.zeros(64, device=d), torch.zeros(64, device=d)), "src"),
        (lambda d: ceil.stream_convert(bf16_source(64, d), torch.zeros(64, device=d)), "dst"),
        (lambda d: ceil.stream_convert(bf16_source(64, d), bf16_source(32, d)), "dst"),
        (lambda d: ceil.stream_convert(bf16_source(64, d), bf16_source(64, d), tile=48), "tile"),
        (lambda d: ceil.stream_tile_sums(bf16_source(64, d), torch.zeros(3, device=d), tile=32), "sums"),
    ])  # fmt: skip
    def test_bad_arguments_are_named(self, device, call, name):
        with pytest.raises(ValueError, match=name):
            call(device)

    def test_candidates_move_the_bytes_they_claim(self, device):
        src = bf16_source(1024, device)
        kinds = ceil.bandwidth_candidates(src, tiles=(64, 128))
        assert {k: list(c) for k, c in kinds.items()} == {
            "copy": ["triton tile=64", "triton tile=128", "torch copy_"],
            "read2write1": ["triton tile=64", "triton tile=128", "torch copy_ (cast)"],
            "read": ["triton tile=64", "triton tile=128", "torch sum"],
        }
        # 1024 bf16 = 2048 B: copy reads and writes them; the cast writes 1 B per element; a sum writes 4 B per tile
        assert kinds["copy"]["triton tile=64"][1] == kinds["copy"]["torch copy_"][1] == 2 * 2048
        assert kinds["read2write1"]["triton tile=128"][1] == 2048 + 1024
        assert kinds["read"]["triton tile=64"][1] == 2048 + 4 * 16
        assert kinds["read"]["torch sum"][1] == 2048
        for candidates in kinds.values():
            for fn, _ in candidates.values():
                fn()


MEASURED = {
    "copy": {"triton tile=8192": 4.1, "triton tile=16384": 4.3, "torch copy_": 2.7},
    "read2write1": {"triton tile=8192": 4.2, "torch copy_ (cast)": 3.3},
    "read": {"triton tile=32768": 4.4, "torch sum": 4.5},
}


class TestBestOf:
    def test_each_kind_keeps_its_fastest_candidate_and_bandwidth_is_the_best_kind(self):
        best, winners = ceil.best_bandwidths(MEASURED)
        assert best == {"copy_tbps": 4.3, "read2write1_tbps": 4.2, "read_tbps": 4.5, "bandwidth_tbps": 4.5}
        assert winners == {"copy": "triton tile=16384", "read2write1": "triton tile=8192", "read": "torch sum"}

    @pytest.mark.parametrize("measured", [{"copy": {"a": 1.0}}, {**MEASURED, "read": {}}])
    def test_every_kind_needs_a_candidate(self, measured):
        with pytest.raises(ValueError, match="measured"):
            ceil.best_bandwidths(measured)


class TestStorage:
    def test_round_trip(self, tmp_path):
        c = ceilings(note="first")
        path = save_ceilings(c, tmp_path)
        assert path == tmp_path / "nvidia-h100-80gb-hbm3" / "ceilings.json"
        assert load_ceilings(tmp_path, CARD, 700.0) == c

    def test_round_trip_with_the_shapes_that_gave_the_gemm_ceilings(self, tmp_path):
        c = Ceilings(CARD, 700.0, 2.9, 3.0, 3.1, 3.1, 790.0, 1400.0, {}, bf16_shape="deepseek-v3 M=65536 balanced "
                     "gemm_wgrad 2D x 2D", fp8_shape="matmul 8192x8192x8192")  # fmt: skip
        save_ceilings(c, tmp_path)
        assert load_ceilings(tmp_path, CARD, 700.0) == c

    def test_an_entry_stored_before_the_shape_fields_still_loads(self, tmp_path):
        path = tmp_path / "nvidia-h100-80gb-hbm3" / "ceilings.json"
        path.parent.mkdir()
        old = {"card": CARD, "power_limit_w": 700.0, "copy_tbps": 2.9, "read2write1_tbps": 3.0, "read_tbps": 3.1,
               "bandwidth_tbps": 3.1, "bf16_tflops": 672.2, "fp8_tflops": 1284.2, "meta": {"gemm_n": 8192}}  # fmt: skip
        path.write_text(json.dumps({"schema": 1, "card": CARD, "entries": [old]}))
        c = load_ceilings(tmp_path, CARD)
        assert (c.bf16_tflops, c.bf16_shape, c.fp8_shape) == (672.2, None, None)
        assert measured_peaks(c)["bf16"].label == f"measured bf16 GEMM ceiling 672.2 TFLOP/s ({CARD}, 700 W)"

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

    def test_gemm_labels_name_the_shape_that_gave_them(self):
        c = Ceilings(CARD, 700.0, 2.9, 3.0, 3.1, 3.1, 790.0, 1400.0, {}, bf16_shape="llama4-scout M=32768 skewed "
                     "gemm_fwd 2D x 3D", fp8_shape="matmul 8192x8192x8192")  # fmt: skip
        peaks = measured_peaks(c)
        assert peaks["bf16"].label == (f"measured bf16 GEMM ceiling 790 TFLOP/s ({CARD}, 700 W; llama4-scout M=32768 "
                                       "skewed gemm_fwd 2D x 3D)")  # fmt: skip
        assert peaks["fp8"].label.endswith("; matmul 8192x8192x8192)")

    def test_no_fp8_ceiling_no_fp8_peak_and_unknown_limit(self):
        peaks = measured_peaks(ceilings(None, fp8=None))
        assert set(peaks) == {"bandwidth", "bf16"}
        assert "limit unknown" in peaks["bandwidth"].label

    @pytest.mark.parametrize("kwargs, name", [
        ({"size_bytes": 1000}, "size_bytes"), ({"size_bytes": 2**20 + 2}, "size_bytes"), ({"gemm_n": 100}, "gemm_n"),
        ({"tiles": ()}, "tiles"), ({"tiles": (16384, 3000)}, "tile"),
    ])  # fmt: skip
    def test_bad_sizes_are_named(self, kwargs, name):
        with pytest.raises(ValueError, match=name):
            measure_ceilings(**kwargs)


GEMMS = {
    "bf16": {"matmul 64x64x64": 650.0, "deepseek-v3 M=65536 balanced gemm_wgrad 2D x 2D": 698.0},
    "fp8": {"matmul 64x64x64": 1280.0, "deepseek-v3 M=131072 balanced gemm_fwd 2D x 3D": 1050.0},
}

# A step small enough for the CPU: K = 64, N = 32, G = 2 at M = 64 tokens.
TINY = GemmPoint("tiny", K=64, N=32, G=2, M=64)


class TestGemmCeilings:
    def test_each_kind_keeps_its_fastest_shape(self):
        best, shapes = ceil.best_gemms(GEMMS)
        assert best == {"bf16_tflops": 698.0, "fp8_tflops": 1280.0}
        assert shapes == {"bf16_shape": "deepseek-v3 M=65536 balanced gemm_wgrad 2D x 2D",
                          "fp8_shape": "matmul 64x64x64"}  # fmt: skip

    def test_no_fp8_candidate_no_fp8_ceiling(self):
        best, shapes = ceil.best_gemms({"bf16": GEMMS["bf16"], "fp8": {}})
        assert best["fp8_tflops"] is None and shapes["fp8_shape"] is None

    def test_a_bf16_candidate_is_required(self):
        with pytest.raises(ValueError, match="bf16"):
            ceil.best_gemms({"bf16": {}, "fp8": GEMMS["fp8"]})

    def test_points_are_the_presets_token_counts_and_group_kinds(self):
        points = ceil.gemm_points()
        assert len(points) == len(ceil.GEMM_PRESETS) * len(ceil.GEMM_TOKENS) * len(ceil.GEMM_GROUPS)
        assert GemmPoint("deepseek-v3", 7168, 2048, 8, 131072, "skewed") in points
        assert GemmPoint("llama4-scout", 5120, 8192, 8, 16384, "balanced") in points
        assert points[0].label == "deepseek-v3 M=16384 balanced"
        with pytest.raises(ValueError, match="unknown preset"):
            ceil.gemm_points(presets=("gpt-5",))

    def test_grouped_candidates_are_the_steps_own_gemms(self, device):
        # The bf16 step's GEMMs (torch._grouped_mm) and the FP8 rowwise step's (here on its emulated backend).
        candidates = list(ceil.grouped_candidates(TINY, device=device, fp8_backend="emulated"))
        names = [f"tiny M=64 balanced {stage} {case}" for stage, case in
                 (("gemm_fwd", "2D x 3D"), ("gemm_dgrad", "2D x 3D"), ("gemm_wgrad", "2D x 2D"))]  # fmt: skip
        assert [(c.kind, c.name) for c in candidates] == [("bf16", n) for n in names] + [("fp8", n) for n in names]
        assert {c.flops for c in candidates} == {2 * 64 * 32 * 64}
        for c in candidates:
            c.call()
        assert all(c.kind == "bf16" for c in ceil.grouped_candidates(TINY, device=device, fp8_backend=None))

    def test_measure_times_every_candidate_with_time_fn(self, monkeypatch, device):
        times = iter([4.0, 2.0, 8.0, 1.0])
        calls = []

        def fake_time_fn(fn):
            calls.append(fn)
            fn()
            return Timing([next(times)], "graph-cold", calls_per_replay=1)

        monkeypatch.setattr("mxbench.instruments.timing.time_fn", fake_time_fn)
        square, _ = ceil.square_candidates(32, device=device)
        bf16_square = [c for c in square if c.kind == "bf16"]
        grouped = [c for c in ceil.grouped_candidates(TINY, device=device, fp8_backend=None)]
        measured = ceil.measure_gemms([*bf16_square, *grouped])
        assert len(calls) == 4 and measured["fp8"] == {}
        flops = 2 * 64 * 32 * 64
        assert measured["bf16"] == {
            "matmul 32x32x32": 2 * 32**3 / 4.0 / 1e6,
            "tiny M=64 balanced gemm_fwd 2D x 3D": flops / 2.0 / 1e6,
            "tiny M=64 balanced gemm_dgrad 2D x 3D": flops / 8.0 / 1e6,
            "tiny M=64 balanced gemm_wgrad 2D x 2D": flops / 1.0 / 1e6,
        }
        assert ceil.best_gemms(measured)[1]["bf16_shape"] == "tiny M=64 balanced gemm_wgrad 2D x 2D"


@pytest.mark.gpu
def test_measured_ceilings_are_plausible(tmp_path):
    spec = hardware.detect()
    if spec is None:
        pytest.skip(f"no spec for {torch.cuda.get_device_name(0)!r}")
    c = measure_ceilings(size_bytes=2**30, points=[GemmPoint("deepseek-v3", 7168, 2048, 8, 16384)])
    assert c.card == torch.cuda.get_device_name(0)
    gemms = c.meta["gemm_candidates_tflops"]
    assert len(gemms["bf16"]) == 4 and c.bf16_tflops == gemms["bf16"][c.bf16_shape] == max(gemms["bf16"].values())
    assert c.bandwidth_tbps == max(c.copy_tbps, c.read2write1_tbps, c.read_tbps)
    for kind, field in (("copy", "copy_tbps"), ("read2write1", "read2write1_tbps"), ("read", "read_tbps")):
        candidates = c.meta["bandwidth_candidates_tbps"][kind]
        assert getattr(c, field) == candidates[c.meta["bandwidth_best"][kind]] == max(candidates.values())
    # the kernels stream at least as fast as torch's ops (torch's copy_ runs on the copy engines in a graph)
    assert c.copy_tbps > 1.2 * c.meta["bandwidth_candidates_tbps"]["copy"]["torch copy_"]
    assert c.meta["copy_engine_candidates"] == ["copy: torch copy_"]
    assert 0.5 * spec.hbm_tbps < c.bandwidth_tbps < spec.hbm_tbps
    assert 0.5 * spec.bf16_tflops < c.bf16_tflops < spec.bf16_tflops
    if spec.fp8_tflops is not None:
        assert 0.4 * spec.fp8_tflops < c.fp8_tflops < spec.fp8_tflops
    assert c.power_limit_w is None or c.power_limit_w > 0
    save_ceilings(c, tmp_path)
    assert load_ceilings(tmp_path, c.card, c.power_limit_w) == c


@pytest.mark.gpu
def test_kernels_cast_like_torch_with_16_byte_accesses():
    src = torch.randn(2**20, device="cuda", dtype=torch.bfloat16) * 64
    fp8 = torch.empty(src.shape, dtype=torch.float8_e4m3fn, device="cuda")
    ceil.stream_convert(src, fp8)
    assert torch.equal(fp8.view(torch.uint8), src.to(torch.float8_e4m3fn).view(torch.uint8))
    # the PTX Triton built for these (16-byte aligned, 16-divisible) arguments: 128-bit loads and stores
    same = torch.empty_like(src)
    sums = torch.empty(src.numel() // 16384, device="cuda")
    for kernel, out in ((ceil._convert_kernel, same), (ceil._convert_kernel, fp8), (ceil._tile_sum_kernel, sums)):
        compiled = kernel[(len(sums),)](src, out, src.numel(), TILE=16384, num_warps=ceil.NUM_WARPS)
        assert "ld.global.v4" in compiled.asm["ptx"]
        if out is not sums:
            assert "st.global.v4" in compiled.asm["ptx"]
