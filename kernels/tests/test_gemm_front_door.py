"""Specification of the grouped GEMMs' front door (kernels/mxkernels/gemm/grouped_gemm.py ``grouped_mm``): unquantized
bf16 operands in, each recipe on each backend against an fp32 GEMM of the same operands; its input checks, the
default backend on a CPU, and the hand-counted costs (``grouped_mm_cost``).
"""

import pytest
import torch
from gemm_oracle import CASES, front_door_inputs, gpu_bf16_case, gpu_sizes, hp_reference, sqnr, valid
from kernel_helpers import offsets
from mxkernels.core.cost import Cost
from mxkernels.gemm import grouped_gemm as GG

FRONT_DOOR = [
    ("bf16", "native", 40),
    ("bf16", "emulated", 40),
    ("fp8_rowwise", "emulated", 25),
    ("mxfp8", "emulated", 25),
    ("mxfp8", "triton", 25),
    ("mxfp8", "triton_fp8", 25),
    ("mxfp8", "triton_dequant", 25),
    ("mxfp8", "triton_fused", 25),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("recipe,backend,min_db", FRONT_DOOR)
def test_front_door_against_unquantized_fp32(device, recipe, backend, min_db, case):
    a, b, sizes = front_door_inputs(case, device)
    result = GG.grouped_mm(a, b, offsets(sizes, device), recipe=recipe, backend=backend)
    assert result.backend == backend and result.out.dtype == torch.bfloat16
    ref = hp_reference(a, b, sizes)
    assert result.out.shape == ref.shape
    assert sqnr(valid(result.out, sizes, case), valid(ref, sizes, case)) >= min_db


@pytest.mark.parametrize("case", CASES)
def test_front_door_triton_agrees_with_emulated(device, case):
    a, b, sizes = front_door_inputs(case, device)
    offs = offsets(sizes, device)
    emulated = GG.grouped_mm(a, b, offs, recipe="mxfp8", backend="emulated").out
    triton_out = GG.grouped_mm(a, b, offs, recipe="mxfp8", backend="triton_fp8").out
    assert sqnr(valid(triton_out, sizes, case), valid(emulated, sizes, case)) >= 40


def test_default_backends_on_cpu():
    assert GG.default_backend("bf16", "cpu") == "native"
    assert GG.default_backend("fp8_rowwise", "cpu") == "emulated"
    assert GG.default_backend("mxfp8", "cpu") == "emulated"


def test_bad_front_door_input_raises_value_error(device):
    a, b, sizes = front_door_inputs("2d3d", device)
    offs = offsets(sizes, device)
    with pytest.raises(ValueError, match="recipe must be one of"):
        GG.grouped_mm(a, b, offs, recipe="fp4")
    with pytest.raises(ValueError, match="a must have dtype bfloat16"):
        GG.grouped_mm(a.float(), b.float(), offs, recipe="bf16")
    with pytest.raises(ValueError, match="agree on K"):
        GG.grouped_mm(a[:, :64], b, offs)
    with pytest.raises(ValueError, match="agree on M"):
        GG.grouped_mm(a.t(), a[:10], offs)
    with pytest.raises(ValueError, match="a_scale must have shape"):
        q = torch.zeros(8, 32, dtype=torch.float8_e4m3fn, device=device)
        GG.fp8_rowwise_scaled_grouped_mm(q, torch.ones(4, device=device), q[None], torch.ones(1, 8, device=device),
                                  offsets([8], device))  # fmt: skip


# ---- costs -------------------------------------------------------------------------------------------------------


def test_costs_are_hand_counts():
    M, N, K, G = 256, 64, 128, 2
    flops = 2 * 256 * 64 * 128
    assert GG.grouped_mm_cost(M, N, K, G, "bf16") == Cost((256 * 128 + 2 * 64 * 128) * 2, 256 * 64 * 2, flops, "bf16")
    # fp8 rowwise: one fp32 scale per row of a (256) and per expert row of b (2 * 64)
    assert GG.grouped_mm_cost(M, N, K, G, "fp8_rowwise") == Cost(49152 + 4 * 384, 32768, flops, "fp8")
    # mxfp8: a's M-groups buffer (128 * (2 + 2), 4) and b's (2, 128, 4) blocked scales
    assert GG.grouped_mm_cost(M, N, K, G, "mxfp8") == Cost(49152 + 2048 + 1024, 32768, flops, "mxfp8")
    # 2d2d: a (64, 256), b (256, 128) -> (2, 64, 128)
    assert GG.grouped_mm_cost(M, N, K, G, "bf16", "2d2d") == Cost((64 * 256 + 256 * 128) * 2, 2 * 64 * 128 * 2, flops,
                                                                  "bf16")  # fmt: skip
    assert GG.grouped_mm_cost(M, N, K, G, "fp8_rowwise", "2d2d").bytes_read == 49152 + 4 * 2 * (64 + 128)
    # K-groups buffers (128, 256/32 + 4*2) for a's 64 rows and b's 128 rows
    assert GG.grouped_mm_cost(M, N, K, G, "mxfp8", "2d2d").bytes_read == 49152 + 2 * 128 * 16
    with pytest.raises(ValueError, match="multiple of 32"):
        GG.grouped_mm_cost(M, N, 100, G, "mxfp8")
    with pytest.raises(ValueError, match="case"):
        GG.grouped_mm_cost(M, N, K, G, "bf16", "3d3d")


# ---- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_recipes_against_bf16(case):
    M, K, N, G = 16384, 7168, 2048, 8
    sizes = gpu_sizes(M, G, 32)
    offs = offsets(sizes, "cuda")
    a, b = gpu_bf16_case(case, M, K, N, G, seed=1)
    bf16 = GG.grouped_mm(a, b, offs, recipe="bf16")
    assert bf16.backend == "native"
    for recipe in ("mxfp8", "fp8_rowwise"):
        for backend in GG.available_backends(recipe, "cuda"):
            out = GG.grouped_mm(a, b, offs, recipe=recipe, backend=backend).out
            db = sqnr(valid(out, sizes, case), valid(bf16.out, sizes, case))
            print(f"{recipe} {case} {backend}: {db:.1f} dB vs bf16")
            assert db >= 25, (recipe, backend)
