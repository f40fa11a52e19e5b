"""Specification of the MXFP8 grouped GEMM's dispatch (kernels/mxkernels/gemm/grouped_gemm.py): which backend runs on
which compute capability, the refusals and operand checks that come before any launch, and the emulated backend, the
reference every other backend is checked against, against gemm_oracle's fp32 reference. On the GPU every available
backend is checked against the emulated one at DeepSeek-V3 sizes.
"""

import json

import pytest
import torch
from gemm_oracle import (
    CASES,
    GPU_SHAPES,
    front_door_inputs,
    gpu_case,
    gpu_sizes,
    mx_operands,
    run_mx,
    small_case,
    sqnr,
    valid,
)
from kernel_helpers import offsets
from mxkernels.core.runtime import InputError
from mxkernels.gemm import fp8_triton, fp8_ws, fused, mx_triton
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.backend import GemmCase
from mxkernels.gemm.shape_classes import GemmShape


def test_the_case_is_an_enum_equal_to_the_strings_stored_runs_hold():
    # Tuning files and runs hold "2d3d" / "2d2d": they must still load, compare and write the same JSON.
    assert [GemmCase("2d3d"), GemmCase("2d2d")] == [GemmCase.A2D_B3D, GemmCase.A2D_B2D] == ["2d3d", "2d2d"]
    assert json.loads(json.dumps({"case": GemmCase.A2D_B2D})) == {"case": "2d2d"}
    assert GemmShape("2d2d", 64, 32, 16, 2).case is GemmCase.A2D_B2D  # a string at the seam becomes a member
    for bad in ("3d3d", "2D3D", None, 3):
        with pytest.raises(InputError, match="case must be '2d3d' or '2d2d'"):
            GemmCase.parse(bad)
    for default_config in (fused.default_config, fp8_triton.default_config, fp8_ws.default_config):
        assert default_config("2d2d") == default_config(GemmCase.A2D_B2D)
        with pytest.raises(InputError, match="case must be"):  # on the interpreter too, whose launch is fixed
            default_config("3d3d")
    assert mx_triton.default_config("2d3d", "triton") == mx_triton.default_config(GemmCase.A2D_B3D, "triton")


@pytest.mark.parametrize("case", CASES)
def test_the_operands_say_the_case(device, case):
    (ops, _), sizes = small_case(case, device, torch.Generator().manual_seed(0))
    got = GG._check_quantized(ops["a_q"], ops["b_q"], offsets(sizes, device))[0]
    assert got is {"2d3d": GemmCase.A2D_B3D, "2d2d": GemmCase.A2D_B2D}[case] is GemmCase.of_b(ops["b_q"])


@pytest.mark.parametrize("case", CASES)
def test_emulated_matches_fp32_reference(device, case):
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(0))
    out = run_mx(ops, sizes, device, "emulated", out_dtype=torch.float32)
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-6, atol=1e-5)
    if case == "2d2d":
        assert not out[1].any()  # the empty group


@pytest.mark.parametrize(
    "cap,expected",
    [
        ((10, 0), {"bf16": ["native", "emulated"], "fp8_rowwise": ["native", "triton", "triton_fast", "emulated"],
                   "mxfp8": ["native", "triton", "triton_dequant", "triton_fp8", "emulated"]}),
        ((9, 0), {"bf16": ["native", "emulated"],
                  "fp8_rowwise": ["triton_ws", "native", "triton", "triton_fast", "emulated"],
                  "mxfp8": ["triton_dequant", "triton_fp8", "triton", "emulated"]}),
        ((8, 9), {"fp8_rowwise": ["emulated"],
                  "mxfp8": ["triton_fp8", "triton_dequant", "triton", "emulated"]}),
        ((8, 0), {"fp8_rowwise": ["emulated"], "mxfp8": ["emulated"]}),
    ],
)  # fmt: skip
def test_available_backends_by_compute_capability(monkeypatch, native_probe_passes, cap, expected):
    monkeypatch.setattr(GG, "_capability", lambda device: cap)
    for recipe, backends in expected.items():
        assert GG.available_backends(recipe, "cuda") == backends


def test_fp8_is_refused_without_fp8_tensor_cores(monkeypatch, device, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (8, 0))
    a, b, sizes = front_door_inputs("2d3d", device)
    with pytest.raises(RuntimeError, match="9.0 and 10.x"):
        GG.grouped_mm(a, b, offsets(sizes, device), recipe="fp8_rowwise", backend="native")
    with pytest.raises(RuntimeError, match="8.9"):
        GG.grouped_mm(a, b, offsets(sizes, device), recipe="mxfp8", backend="triton")


@pytest.mark.parametrize(
    "change,error",
    [
        (lambda o: {"a_q": o["a_q"].to(torch.bfloat16)}, "a_q must have dtype"),
        (lambda o: {"b_q": o["b_q"][:, :, :32].contiguous()}, "must share K"),
        (lambda o: {"offs": o["offs"][:1]}, "one group end per expert"),
        (lambda o: {"a_sb": o["a_sb"][:128]}, r"a_sb must have shape \(384, 4\)"),
        (lambda o: {"b_sb": o["b_sb"].reshape(2, -1)}, "b_sb must be 3D"),
        (lambda o: {"a_q": o["a_q"][:, :48].contiguous(), "b_q": o["b_q"][:, :, :48].contiguous()}, "multiple of 32"),
        (lambda o: {"offs": o["offs"].long()}, "offs must have dtype"),
        (lambda o: {"offs": offsets([40, 40], o["offs"].device)}, "non-decreasing group ends within"),
        (lambda o: {"out_dtype": torch.float16}, "out_dtype"),
        (lambda o: {"backend": "cutlass"}, "backend for recipe 'mxfp8' must be one of"),
    ],
)  # fmt: skip
def test_bad_mxfp8_operands_raise_value_error(device, change, error):
    ops = mx_operands(device)
    with pytest.raises(ValueError, match=error):
        GG.mxfp8_scaled_grouped_mm(**{**ops, **change(ops)})


def test_wgrad_groups_must_hold_whole_mx_blocks(device):
    if device == "cuda":  # GPU offs are checked on the device, without a sync (test_native_guards)
        pytest.skip("checks host offs; on a GPU the emulated reference would index past a group's scales")
    (ops, _), _ = small_case("2d2d", device, torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match="group 0 holds 48 rows, not a multiple of 32"):
        run_mx(ops, [48, 48, 64, 32], device, "emulated")


# ---- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("M,K,N,G", GPU_SHAPES)
def test_gpu_every_mxfp8_backend_matches_emulated(exact_fp32_matmul, case, M, K, N, G):
    sizes = gpu_sizes(M, G, 32)
    ops, ref = gpu_case(case, M, K, N, G, sizes)
    offs = offsets(sizes, "cuda")
    emulated = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="emulated")
    assert sqnr(valid(emulated, sizes, case), valid(ref, sizes, case)) >= 40  # bf16 rounding of the fp32 result
    for backend in GG.available_backends("mxfp8", "cuda"):
        out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend=backend)
        db = sqnr(valid(out, sizes, case), valid(emulated, sizes, case))
        print(f"mxfp8 {case} M={M} K={K} N={N} G={G} {backend}: {db:.1f} dB vs emulated")
        assert db >= 40, backend
        if case == "2d2d":
            assert not out[1].any(), backend  # the empty group
