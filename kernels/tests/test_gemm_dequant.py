"""Specification of the "triton_dequant" backend (kernels/mxkernels/gemm/dequant.py): exact dequantization of MXFP8
operands to bf16, then torch._grouped_mm. The dequantization is checked bit for bit against
``dequantize_reference`` (every e4m3 code times every e8m0 byte), the GEMM against gemm_oracle's fp32 reference;
the SM90 build by cross-compilation.
"""

import re

import pytest
import torch
from crosscompile import compile_ptx
from gemm_oracle import (
    CASES,
    CPU_SIZES,
    GPU_SHAPES,
    gpu_case,
    gpu_sizes,
    k_groups_blocked,
    m_groups_blocked,
    mx_operands,
    run_mx,
    small_case,
    sqnr,
    valid,
)
from kernel_helpers import offsets
from mxkernels.core.format import dequantize_reference
from mxkernels.gemm import dequant
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.layouts.scale_layout import to_blocked


BF16_MAX = (2 - 2**-7) * 2.0**127


def random_mx(shape, gen, finite_data):
    """Random e4m3 codes (all 256, or all but the NaNs) and scale bytes over the whole e8m0 range (0..255)."""
    codes = torch.randint(0, 256, shape, generator=gen).to(torch.uint8)
    if finite_data:
        codes[(codes & 0x7F) == 0x7F] = 0x7E
    scales = torch.randint(0, 256, (*shape[:-1], shape[-1] // 32), generator=gen).to(torch.uint8)
    return codes.view(torch.float8_e4m3fn), scales


def interpreted_subnormal(device, values):
    """Where the interpreter's fp32 -> bf16 cast (numpy, triton 3.9) goes wrong: bf16 subnormals come out as 0 or
    twice their value. The compiled ``cvt.rn.bf16x2.f32`` rounds them correctly; the GPU runs check them."""
    if device != "cpu":
        return torch.zeros_like(values, dtype=torch.bool)
    return (values != 0) & (values.abs() < 2.0**-126)


def assert_same_bf16(out, ref, skip):
    """Same NaN positions; every other element outside ``skip`` bit for bit (signed zeros and infinities too)."""
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan)
    compared = ~nan & ~skip
    assert torch.equal(out.view(torch.int16)[compared], ref.view(torch.int16)[compared])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, inside the interpreter: products that overflow
@pytest.mark.parametrize("layout", ["m_groups", "3d", "k_groups"])
def test_dequantize_blocked_is_bit_exact(device, layout):
    gen = torch.Generator().manual_seed(8)
    finite = device == "cpu"  # the interpreter reads e4m3 NaN (0x7F) as 480; the compiled cvt gives NaN
    if layout == "m_groups":
        sizes = CPU_SIZES["2d3d"]
        q, s = random_mx((sum(sizes) + 23, 160), gen, finite)
        blocked, offs = m_groups_blocked(s, sizes), offsets(sizes, device)
    elif layout == "3d":
        q, s = random_mx((3, 48, 160), gen, finite)
        blocked, offs = torch.stack([to_blocked(expert) for expert in s]), None
    else:
        sizes = CPU_SIZES["2d2d"]
        q, s = random_mx((40, sum(sizes) + 64), gen, finite)  # 64 columns past offs[-1]
        blocked, offs = k_groups_blocked(s, sizes), offsets(sizes, device)
    ref = dequantize_reference(q, s).to(torch.bfloat16)
    if layout == "m_groups":
        ref[sum(sizes) :] = 0
    elif layout == "k_groups":
        ref[:, sum(sizes) :] = 0
    out = dequant.dequantize_blocked(q.to(device), blocked.to(device), offs, layout=layout)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and out.is_contiguous()
    assert_same_bf16(out.cpu(), ref, interpreted_subnormal(device, dequantize_reference(q, s)))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, inside the interpreter: products that overflow
def test_mx_to_bf16_is_exact_but_in_the_subnormal_corner(device):
    # Every e4m3 code (columns) times every e8m0 byte (rows) through the kernel, against the exact fp64 product.
    codes = torch.arange(256).to(torch.uint8)
    q = codes.repeat(256, 1).view(torch.float8_e4m3fn)  # row e: all 256 codes = 8 blocks, all with scale byte e
    scales = torch.arange(256).to(torch.uint8)[:, None].expand(256, 8).contiguous()
    out = dequant.dequantize_blocked(q[None].to(device), to_blocked(scales)[None].to(device), layout="3d")[0]
    out = out.cpu().double()
    value = codes.view(torch.float8_e4m3fn).double()[None, :]
    byte = torch.arange(256)[:, None]
    exact = value * torch.exp2(byte.double() - 127)
    nan = (byte == 255) | value.isnan()
    overflow = ~nan & (exact.abs() > BF16_MAX)
    # bf16 keeps fp32's exponent range, and 4 significant bits fit its 8, so only the grid of bf16 subnormals
    # (multiples of 2**-133) can miss a product: v * 2**(e - 127) is on it iff v is a multiple of 2**(-6 - e), which
    # every e4m3 value (multiples of 2**-9) is from e = 3 on. Hand count of the positive codes off it: e = 0: 7
    # subnormals + 7 + 6 + 4 normals of exponents -6, -5, -4; e = 1: 6 + 6 + 4; e = 2: 4 + 4. Twice that with signs.
    off_grid = ~nan & (byte <= 2) & (torch.remainder(value, torch.exp2(-6.0 - byte.double())) != 0)
    assert off_grid.sum() == 2 * (24 + 16 + 8)
    # On CPU (interpreter): no e4m3 NaN codes (read as 480) and no bf16 subnormals (see interpreted_subnormal).
    checked = ~(value.isnan() if device == "cpu" else torch.zeros_like(nan)) & ~interpreted_subnormal(device, exact)
    checked = checked.expand_as(out)
    assert torch.equal(out.isnan()[checked], nan.expand_as(out)[checked])
    assert torch.equal(out.isinf()[checked], overflow[checked])
    assert torch.equal(out[overflow & checked].sign(), exact[overflow & checked].sign())
    same = checked & ~nan & ~overflow & ~off_grid
    assert torch.equal(out[same], exact[same])
    # The corner rounds once, to the nearest bf16 subnormal: off by at most half its 2**-133 spacing.
    corner = off_grid & checked
    err = (out - exact)[corner]
    assert (err != 0).all() and (err.abs() <= 2.0**-134).all()
    assert (torch.remainder(out[corner], 2.0**-133) == 0).all()


@pytest.mark.parametrize("case", CASES)
def test_triton_dequant_matches_fp32_reference(device, case):
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(9))
    out = run_mx(ops, sizes, device, "triton_dequant")
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    # Exact bf16 operands and fp32 accumulation: what is left is the bf16 rounding of the output (half an ulp).
    torch.testing.assert_close(valid(out, sizes, case).float(), valid(ref, sizes, case), rtol=2**-8, atol=1e-5)
    if case == "2d2d":
        assert not out[1].any()


def test_triton_dequant_writes_bf16_only(device):
    with pytest.raises(ValueError, match="out_dtype"):
        GG.mxfp8_scaled_grouped_mm(**mx_operands(device), backend="triton_dequant", out_dtype=torch.float32)


@pytest.mark.parametrize(
    "change,error",
    [
        ({"layout": "rows"}, "layout must be one of"),
        ({"q": torch.zeros(64, 64, dtype=torch.bfloat16)}, "q must have dtype"),
        ({"q": torch.zeros(64, 48, dtype=torch.float8_e4m3fn)}, "multiple of 32"),
        ({"scales": torch.zeros(256, 4, dtype=torch.uint8)}, r"scales must have shape \(384, 4\)"),
        ({"offs": None}, "offs must be a torch.Tensor"),
        ({"layout": "3d"}, "q must be 3D"),
    ],
)  # fmt: skip
def test_bad_dequantize_input_raises_value_error(device, change, error):
    ops = mx_operands(device)
    args = {"q": ops["a_q"], "scales": ops["a_sb"], "offs": ops["offs"], "layout": "m_groups", **change}
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with pytest.raises(ValueError, match=error):
        dequant.dequantize_blocked(**args)


@pytest.mark.parametrize("layout", ["m_groups", "k_groups"])
def test_dequantize_moves_16_byte_vectors_on_sm90(layout):
    signature = {
        **{p: t for p, t in (("q_ptr", "*fp8e4nv"), ("s_ptr", "*u8"), ("offs_ptr", "*i32"), ("out_ptr", "*bf16"))},
        **{d: "i32" for d in ("R", "C", "G", "N_ROWS")},
        **{c: "constexpr" for c in ("LAYOUT", "BLOCK_R", "BLOCK_B", "BLOCK_G")},
    }
    constexprs = {"LAYOUT": dequant.DEQUANT_LAYOUTS.index(layout), "BLOCK_R": 16, "BLOCK_B": 16, "BLOCK_G": 8}
    ptx = compile_ptx("mxkernels.gemm.dequant", "_dequant_kernel", signature, constexprs, 90,
                      aligned=("q_ptr", "s_ptr", "offs_ptr", "out_ptr", "R", "C"))  # fmt: skip
    assert set(re.findall(r"st\.global[\w.]*", ptx)) == {"st.global.v4.b32"}
    assert "ld.global.v4.b32" in ptx  # the e4m3 data, 16 codes a load
    assert "cvt.rn.bf16x2.f32" in ptx  # the single rounding, two elements at a time


# ---- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("M,K,N,G", GPU_SHAPES[:2])
def test_gpu_triton_dequant_matches_emulated(exact_fp32_matmul, case, M, K, N, G):
    # Both compute the MX products exactly and sum them in fp32, in different orders; the bf16 output rounding
    # (about 2**-9 relative) dominates: expect some 50 dB against the fp32 emulation, far over 40.
    sizes = gpu_sizes(M, G, 32)
    ops, _ = gpu_case(case, M, K, N, G, sizes, seed=5)
    emulated = run_mx(ops, sizes, "cuda", "emulated", out_dtype=torch.float32)
    out = run_mx(ops, sizes, "cuda", "triton_dequant")
    db = sqnr(valid(out, sizes, case), valid(emulated, sizes, case))
    print(f"triton_dequant {case} M={M} K={K} N={N} G={G}: {db:.1f} dB vs fp32 emulated")
    assert db >= 40
