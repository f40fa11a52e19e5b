"""Specification of the "native" backend of the MXFP8 and FP8 rowwise grouped GEMMs (torch._scaled_grouped_mm,
kernels/mxkernels/gemm/native.py): where it is refused, before any launch, and its shape and dtype rules; on the GPU,
FP8 rowwise expert by expert against the emulated backend. (The device-side guards: test_native_guards.py.)
"""

import pytest
import torch
from gemm_oracle import (
    CASES,
    bounds,
    front_door_inputs,
    gpu_bf16_case,
    gpu_sizes,
    mx_operands,
    run_mx,
    small_case,
    sqnr,
)
from kernel_helpers import offsets
from mxkernels.gemm import grouped_gemm as GG


def test_native_mxfp8_is_refused_on_sm90(monkeypatch, device, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    (ops, _), sizes = small_case("2d3d", device, torch.Generator().manual_seed(4))
    with pytest.raises(RuntimeError, match=r"compute capability 10\.x .*SM90"):
        run_mx(ops, sizes, device, "native")
    a, b, sizes = front_door_inputs("2d3d", device)
    with pytest.raises(RuntimeError, match=r"compute capability 10\.x"):
        GG.grouped_mm(a, b, offsets(sizes, device), recipe="mxfp8", backend="native")


def test_native_fp8_rowwise_shape_rules(monkeypatch, device, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    e4m3 = torch.float8_e4m3fn
    a_q, b_q = torch.zeros(64, 40, device=device, dtype=e4m3), torch.zeros(2, 32, 40, device=device, dtype=e4m3)
    scales = torch.ones(64, device=device), torch.ones(2, 32, device=device)
    with pytest.raises(ValueError, match=r"contraction dim \(40\) must be a multiple of 16"):
        GG.fp8_rowwise_scaled_grouped_mm(a_q, scales[0], b_q, scales[1], offsets([32, 32], device), backend="native")


def test_native_mxfp8_output_is_bf16_only(monkeypatch, device, native_probe_passes, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (10, 0))
    with pytest.raises(ValueError, match="out_dtype"):
        GG.mxfp8_scaled_grouped_mm(**mx_operands(device), backend="native", out_dtype=torch.float32)


# ---- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_native_fp8_rowwise_matches_emulated(case):
    if "native" not in GG.available_backends("fp8_rowwise", "cuda"):
        pytest.skip("torch._scaled_grouped_mm FP8 rowwise runs on SM90 / SM100 only")
    M, K, N, G = 16384, 7168, 2048, 8
    sizes = gpu_sizes(M, G, 32)
    offs = offsets(sizes, "cuda")
    a, b = gpu_bf16_case(case, M, K, N, G, seed=2, grad_view=False)
    native = GG.grouped_mm(a, b, offs, recipe="fp8_rowwise", backend="native").out
    emulated = GG.grouped_mm(a, b, offs, recipe="fp8_rowwise", backend="emulated").out
    # Expert by expert (group 1 is empty): one SQNR over all of them would hide one expert gone wrong.
    for g, (start, end) in enumerate(bounds(sizes)):
        got, want = (native[start:end], emulated[start:end]) if case == "2d3d" else (native[g], emulated[g])
        if end == start and case == "2d2d":
            assert not got.view(torch.int16).any(), f"expert {g} (empty) is not exactly zero"
        elif end > start:
            assert sqnr(got, want) >= 40, f"expert {g}"


@pytest.mark.gpu
def test_gpu_native_mxfp8_is_refused_below_sm100():
    if torch.cuda.get_device_capability()[0] == 10:
        pytest.skip("SM100 runs native MXFP8")
    assert "native" not in GG.available_backends("mxfp8", "cuda")
    ops = mx_operands("cuda")
    with pytest.raises(RuntimeError, match=r"compute capability 10\.x"):
        GG.mxfp8_scaled_grouped_mm(**ops, backend="native")
    torch.cuda.synchronize()  # the context is still alive
