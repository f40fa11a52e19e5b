"""Specification of the "triton_fused" backend (kernels/gemm_fused.py): MXFP8 grouped GEMMs that dequantize the token
operand in the GEMM's load path.

The oracle is gemm_oracle's (operands quantized with ``format.quantize_reference``, blocked scales composed
from ``layouts.to_blocked``, fp32 references group by group). On CPU the kernels run under the interpreter on their
fp32 path (``FusedConfig.exact_fp32``): the same indexing, groups, scales and tile walk as the GPU's bf16 path, with
exact products and fp32 sums. Where every partial sum is exact in fp32 the result must equal the emulation's bit for
bit -- on the GPU too, which checks the in-register e4m3 -> bf16 conversion there. The SM90 build is checked by
cross-compilation: bf16 wgmma fed from registers, the conversion without F2F, 16-byte cp.async for the contraction.
"""

import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from crosscompile import compile_ptx
from kernel_helpers import offsets
from mxkernels.gemm import fused as gemm_fused
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.core.format import dequantize_reference, quantize_reference
from mxkernels.gemm.mx_triton import TileConfig
from mxkernels.layouts.scale_layout import to_blocked
from gemm_oracle import (  # the CUDA-graph replay test of the other Triton backends: test_gemm_mx_triton
    CASES,
    bounds,
    gpu_case,
    gpu_sizes,
    k_groups_blocked,
    m_groups_blocked,
    mx_2d2d,
    mx_2d3d,
    small_case,
    sqnr,
    valid,
)

FusedConfig = gemm_fused.FusedConfig


def fused(ops, sizes, device, config=None, out_dtype=torch.float32):
    return GG.mxfp8_scaled_grouped_mm(
        **ops, offs=offsets(sizes, device), backend="triton_fused", out_dtype=out_dtype, config=config
    )


def emulated(ops, sizes, device, out_dtype=torch.float32):
    return GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend="emulated", out_dtype=out_dtype)


def config(**fields):
    """The default launch here (the interpreter's small tiles on CPU) with ``fields`` changed."""
    return dataclasses.replace(gemm_fused.default_config("2d3d"), **fields)


# ---- against the fp32 oracle ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fuse_both", [False, True])
def test_matches_fp32_reference(device, poisoned_empty, case, fuse_both):
    # Uneven groups, an empty one, K and group sizes not multiples of 128, 23 rows past offs[-1] (2D x 3D).
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(1))
    out = fused(ops, sizes, device, config(fuse_both=fuse_both))
    assert out.shape == ref.shape and out.dtype == torch.float32
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-5, atol=1e-4)
    if case == "2d2d":
        assert not out[1].any()  # the empty group is written as zeros


def test_rows_past_the_last_group_are_never_written(device, poisoned_empty):
    (ops, _), sizes = small_case("2d3d", device, torch.Generator().manual_seed(2))
    out = fused(ops, sizes, device)
    assert (out[sum(sizes) :].view(torch.uint8) == 0xA5).all()  # conftest.POISON, untouched


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "fields",
    [
        # Tiles smaller than the operands, one program walking every tile (and every group) in turn.
        {"block_m": 16, "block_n": 32, "block_k": 32, "group_m": 2, "max_programs": 1},
        # A 128-wide step (one whole scale word) that overshoots every group and K; more programs than some tiles.
        {"block_m": 32, "block_n": 16, "block_k": 128, "max_programs": 5},
        # Both wgrad operands dequantized in the load path, bands of row tiles.
        {"block_m": 16, "block_n": 16, "block_k": 64, "group_m": 3, "max_programs": 2, "fuse_both": True},
    ],
)
def test_any_config_computes_the_same_function(device, case, fields):
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(7))
    out = fused(ops, sizes, device, config(**fields))
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-5, atol=1e-4)


def test_one_group_and_unaligned_widths(device):
    gen = torch.Generator().manual_seed(3)
    # G = 1, N = 40 (no multiple of 16), K = 96 (three 32-blocks, no whole scale word).
    (ops, ref) = mx_2d3d(torch.randn(70, 96, generator=gen).to(device), torch.randn(1, 40, 96, generator=gen).to(device),
                         [70])  # fmt: skip
    torch.testing.assert_close(fused(ops, [70], device), ref, rtol=1e-5, atol=1e-4)
    # 2D x 2D: G = 1, N = 24 and K = 40 rows, 64 tokens.
    x, y = torch.randn(24, 64, generator=gen), torch.randn(40, 64, generator=gen)
    ops2, ref2 = mx_2d2d(x.to(device), y.to(device), [64])
    torch.testing.assert_close(fused(ops2, [64], device), ref2, rtol=1e-5, atol=1e-4)


# ---- exactness ------------------------------------------------------------------------------------------------------


def exact_operands(case, device, gen):
    """MX operands whose products and partial sums are all exact in fp32: data the integers -8..8 (all e4m3), scale
    bytes 127..129 (1, 2, 4), so every product is an integer of at most 1024 and every sum of at most 160 of them
    stays under 2**24. Returns (kwargs of mxfp8_scaled_grouped_mm, group sizes)."""

    def codes(shape):
        values = torch.randint(-8, 9, shape, generator=gen).float()
        return values.to(torch.float8_e4m3fn)

    def scales(shape):
        return torch.randint(127, 130, (*shape[:-1], shape[-1] // 32), generator=gen).to(torch.uint8)

    if case == "2d3d":
        sizes = [40, 0, 100, 37]
        a_q, a_s = codes((sum(sizes) + 5, 160)), scales((sum(sizes) + 5, 160))
        b_q, b_s = codes((4, 48, 160)), scales((4, 48, 160))
        ops = {"a_q": a_q, "a_sb": m_groups_blocked(a_s, sizes), "b_q": b_q,
               "b_sb": torch.stack([to_blocked(s) for s in b_s])}  # fmt: skip
    else:
        sizes = [160, 0, 96, 32]
        M = sum(sizes)
        a_q, a_s = codes((40, M)), scales((40, M))
        b_q, b_s = codes((72, M)), scales((72, M))
        ops = {"a_q": a_q, "a_sb": k_groups_blocked(a_s, sizes), "b_q": b_q, "b_sb": k_groups_blocked(b_s, sizes)}
    return {k: v.to(device) for k, v in ops.items()}, sizes


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fuse_both", [False, True])
def test_bit_exact_where_every_sum_is_exact(device, case, fuse_both):
    ops, sizes = exact_operands(case, device, torch.Generator().manual_seed(4))
    out = fused(ops, sizes, device, config(fuse_both=fuse_both))
    ref = emulated(ops, sizes, device)
    assert torch.equal(valid(out, sizes, case), valid(ref, sizes, case))


def test_extreme_scales(device):
    # Scale byte 0 (the subnormal 2**-127), zero blocks and scales near the top of the range, through the load path
    # (A). Quantized from data, so no product falls in the bf16 subnormal corner of gemm_dequant's doc.
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(64, 128, generator=gen)
    a[3] *= 2.0**-121
    a[4] = 0
    a[6] *= 2.0**100
    assert (quantize_reference(a)[1].view(torch.uint8)[3] == 0).all()
    ops, ref = mx_2d3d(a.to(device), torch.randn(2, 32, 128, generator=gen).to(device), [30, 34])
    out = fused(ops, [30, 34], device)
    assert not out[4].any() and out[3].abs().min() > 0
    # atol: row 3's products fall to fp32 subnormals (< 2**-126) where a weight is small, which the tensor cores may
    # flush; its sums are ~2**-115. Exact on CPU.
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=0 if device == "cpu" else 2.0**-118)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, inside the interpreter, on NaN products
@pytest.mark.parametrize("fuse_both", [False, True])
def test_nan_blocks_propagate(device, fuse_both):
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(64, 128, generator=gen)
    a[5, 40] = float("nan")  # block (5, 1) of the token operand: scale byte 255
    w = torch.randn(2, 32, 128, generator=gen)
    w[1, 7, 100] = float("nan")  # block (7, 3) of expert 1's weights
    ops, _ = mx_2d3d(a.to(device), w.to(device), [30, 34])
    out = fused(ops, [30, 34], device, config(fuse_both=fuse_both))
    expected = torch.zeros(64, 32, dtype=torch.bool)
    expected[5] = True
    expected[30:, 7] = True
    assert torch.equal(out.isnan().cpu(), expected)
    # 2D x 2D: a NaN block of either operand poisons its group's row / column of the output.
    x, y = torch.randn(24, 96, generator=gen), torch.randn(40, 96, generator=gen)
    x[2, 70] = float("nan")  # group 1 (tokens 64..95) of the N-side operand
    y[9, 10] = float("nan")  # group 0 of the K-side operand
    ops2, _ = mx_2d2d(x.to(device), y.to(device), [64, 32])
    out2 = fused(ops2, [64, 32], device, config(fuse_both=fuse_both))
    expected2 = torch.zeros(2, 24, 40, dtype=torch.bool)
    expected2[1, 2, :] = True
    expected2[0, :, 9] = True
    assert torch.equal(out2.isnan().cpu(), expected2)


# The output's one rounding to bf16: half an ulp (2**-8 relative) on the GPU; the interpreter's fp32 -> bf16 cast
# truncates, a whole ulp.
BF16_RTOL = 2**-8 if torch.cuda.is_available() else 2**-7


def test_bf16_output(device):
    (ops, ref), sizes = small_case("2d3d", device, torch.Generator().manual_seed(9))
    out = fused(ops, sizes, device, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(valid(out, sizes, "2d3d").float(), valid(ref, sizes, "2d3d"), rtol=BF16_RTOL, atol=1e-5)


# ---- the bf16 control ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_bf16_control_is_the_grouped_gemm_of_its_operands(device, case):
    gen = torch.Generator().manual_seed(10)
    sizes = [64, 0, 96]
    if case == "2d3d":
        a = torch.randn(sum(sizes) + 8, 96, generator=gen).bfloat16()
        b = torch.randn(3, 40, 96, generator=gen).bfloat16()
        ref = torch.zeros(a.shape[0], 40)
        for g, (s, e) in enumerate(bounds(sizes)):
            ref[s:e] = a[s:e].float() @ b[g].float().T
    else:
        a = torch.randn(24, sum(sizes), generator=gen).bfloat16()
        b = torch.randn(40, sum(sizes), generator=gen).bfloat16()
        ref = torch.stack([a[:, s:e].float() @ b[:, s:e].float().T for s, e in bounds(sizes)])
    out = gemm_fused.run_bf16_control(a.to(device), b.to(device), offsets(sizes, device))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(valid(out, sizes, case).float().cpu(), valid(ref, sizes, case), rtol=BF16_RTOL,
                               atol=1e-4)  # fmt: skip
    with pytest.raises(ValueError, match="a must be a contiguous bf16 tensor"):
        gemm_fused.run_bf16_control(a.float().to(device), b.to(device), offsets(sizes, device))


# ---- configuration (the fields' own checks: test_gemm_mx_triton.test_bad_launch_config_raises_value_error) -------


def test_config_type_follows_the_backend(device):
    (ops, _), sizes = small_case("2d3d", device, torch.Generator().manual_seed(11))
    with pytest.raises(ValueError, match="config must be a FusedConfig or None for backend 'triton_fused'"):
        fused(ops, sizes, device, config=TileConfig(32, 32))
    with pytest.raises(ValueError, match="config must be a TileConfig or None for backend 'triton_fp8'"):
        GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend="triton_fp8", config=FusedConfig(32, 32))
    with pytest.raises(ValueError, match="config must be a launch configuration"):
        GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend="emulated", config=(32, 32))


def test_default_configs():
    for case in CASES:
        assert isinstance(gemm_fused.default_config(case), FusedConfig)
    assert gemm_fused.default_config("2d3d").exact_fp32 == (not torch.cuda.is_available())
    with pytest.raises(ValueError, match="case must be"):
        gemm_fused.default_config("3d3d")


def test_registered_but_withheld_on_gpus(monkeypatch):
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    assert "triton_fused" not in GG.available_backends("mxfp8", "cuda")
    assert GG.backend_unavailable("mxfp8", "triton_fused", torch.device("cuda")) == gemm_fused.FUSED_WITHHELD
    with pytest.raises(RuntimeError, match="withheld"):
        GG._resolve_backend("mxfp8", "triton_fused", torch.device("cuda"))
    assert "triton_fused" in GG.BACKENDS["mxfp8"] and GG.CONFIG_TYPES["mxfp8"]["triton_fused"] is FusedConfig


# ---- cross-compilation: what the kernels become on SM90 -----------------------------------------------------------

_COMMON = {"offs_ptr": "*i32", "out_ptr": "*bf16"}
_BUILDS = {
    "2d3d": ("_fused_2d3d_kernel",
             {"a_ptr": "*fp8e4nv", "sa_ptr": "*u8", "b_ptr": "*bf16", **_COMMON, "M": "i32", "N": "i32", "K": "i32",
              "G": "i32", "PROGRAMS": "i32"},
             {"A_KIND": 0}, ("M", "N", "K")),
    "2d2d": ("_fused_2d2d_kernel",
             {"x_ptr": "*fp8e4nv", "sx_ptr": "*u8", "y_ptr": "*bf16", "sy_ptr": "*u8", **_COMMON, "M": "i32",
              "Y_ROWS": "i32", "X_ROWS": "i32", "G": "i32", "PROGRAMS": "i32"},
             {"X_KIND": 0, "Y_KIND": 1}, ("M", "Y_ROWS", "X_ROWS")),
}  # fmt: skip


@pytest.fixture(scope="module")
def ptx():
    """The SM90 PTX of each kernel at the default tiles (built concurrently: each is a subprocess)."""

    def build(case):
        kernel, signature, kinds, dims = _BUILDS[case]
        config = gemm_fused._DEFAULT_CONFIGS[case]
        constexprs = {**kinds, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                      "BLOCK_G": 8, "GROUP_M": config.group_m, "EXACT_FP32": False}  # fmt: skip
        signature = {**signature, **{c: "constexpr" for c in constexprs}}
        aligned = tuple(n for n in signature if n.endswith("_ptr")) + dims
        return compile_ptx("mxkernels.gemm.fused", kernel, signature, constexprs, 90, aligned=aligned)

    with ThreadPoolExecutor(max_workers=len(_BUILDS)) as pool:
        return dict(zip(_BUILDS, pool.map(build, _BUILDS)))


@pytest.mark.parametrize("case", CASES)
def test_bf16_wgmma_with_the_a_operand_in_registers(ptx, case):
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)\.f32\.bf16\.bf16 \{[^}]*\}, (\S+)", ptx[case])
    assert mma and {shape for shape, _ in mma} == {"m64n256k16"}
    assert all(a.startswith("{") for _, a in mma)  # A as a register list, not a shared-memory descriptor


@pytest.mark.parametrize("case", CASES)
def test_each_tile_waits_for_every_warp_before_its_first_async_copy(ptx, case):
    # The previous tile's epilogue reads shared memory that the next tile's cp.async stages overwrite (the race
    # ``_tile_barrier`` closes): on the path from the tile loop's header to its first cp.async, a CTA-wide barrier.
    header = re.search(r"^\$L__BB\d+_\d+:\s*// =>This Loop Header: Depth=1$", ptx[case], re.MULTILINE)
    assert header, "no outer loop found"
    body = ptx[case][header.end():]
    first_copy = body.index("cp.async.")
    assert re.search(r"\b(bar|barrier)\.sync(\.aligned)?\s+0;", body[:first_copy])


@pytest.mark.parametrize("case", CASES)
def test_dequantization_needs_no_f2f_conversion(ptx, case):
    assert "cvt.rn.f16x2.e4m3x2" in ptx[case]
    assert "cvt.bf16.f16" not in ptx[case] and "cvt.f32.f16" not in ptx[case]


@pytest.mark.parametrize("case", CASES)
def test_contraction_streams_through_cp_async(ptx, case):
    sizes = re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]+\], \[[^]]+\], (0x[0-9a-f]+)", ptx[case])
    assert sizes and min(int(size, 16) for size in sizes) >= 8
    assert "0x10" in sizes  # the bf16 operand in 16-byte vectors


# ---- GPU -------------------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def unwithheld(request, monkeypatch):
    """The backend is withheld from users on GPUs (``gemm_fused.FUSED_WITHHELD``); its own tests still run it there, all
    but the one that checks the withholding."""
    if request.node.originalname != "test_registered_but_withheld_on_gpus":
        monkeypatch.setattr(gemm_fused, "FUSED_WITHHELD", None)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fuse_both", [False, True])
def test_gpu_bit_exact_where_every_sum_is_exact(case, fuse_both):
    # On the GPU the operands go through the bf16 conversion of gemm_fused and the wgmma: still bit for bit.
    ops, sizes = exact_operands(case, "cuda", torch.Generator().manual_seed(12))
    out = fused(ops, sizes, "cuda", dataclasses.replace(gemm_fused.default_config(case), fuse_both=fuse_both))
    assert torch.equal(valid(out, sizes, case), valid(emulated(ops, sizes, "cuda"), sizes, case))


@pytest.mark.gpu
def test_gpu_every_code_and_scale_byte():
    # Every finite e4m3 code times every scale byte whose products are finite and normal (bytes 10..246: the smallest,
    # 2**-9 * 2**-117, is fp32's and bf16's smallest normal; lower bytes reach the bf16 subnormal corner, and the tensor
    # cores may flush fp32 subnormals), through the load path's conversion: row r of A holds all codes with scale byte
    # 10 + r, and B picks contraction element j for output column j (a one-hot row of 1.0, code 0x38): out = A exactly.
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    byte = torch.arange(10, 247, dtype=torch.uint8)
    K = 256
    a_q = torch.zeros(len(byte), K, dtype=torch.uint8)
    a_q[:, : len(codes)] = codes
    a_s = byte[:, None].expand(len(byte), K // 32).contiguous()
    b_q = torch.zeros(1, K, K, dtype=torch.uint8)
    b_q[0, torch.arange(K), torch.arange(K)] = 0x38
    b_s = torch.full((1, K, K // 32), 127, dtype=torch.uint8)
    sizes = [len(byte)]
    ops = {"a_q": a_q.view(torch.float8_e4m3fn), "a_sb": m_groups_blocked(a_s, sizes),
           "b_q": b_q.view(torch.float8_e4m3fn), "b_sb": torch.stack([to_blocked(s) for s in b_s])}  # fmt: skip
    out = fused({k: v.cuda() for k, v in ops.items()}, sizes, "cuda").cpu()
    assert torch.equal(out, dequantize_reference(a_q.view(torch.float8_e4m3fn), a_s.view(torch.float8_e8m0fnu)))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_matches_emulated_at_deepseek_v3_width(case):
    torch.backends.cuda.matmul.allow_tf32 = False
    M, K, N, G = 16384, 7168, 2048, 8
    sizes = gpu_sizes(M, G, 32)
    ops, _ = gpu_case(case, M, K, N, G, sizes, seed=5)
    offs = offsets(sizes, "cuda")
    ref = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="emulated", out_dtype=torch.float32)
    for fuse_both in (False, True):
        config = dataclasses.replace(gemm_fused.default_config(case), fuse_both=fuse_both)
        out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="triton_fused", out_dtype=torch.float32,
                                         config=config)  # fmt: skip
        # Exact bf16 operands and fp32 sums in another order (~100 dB over 7168 to 16384 terms): far over the ~50 dB
        # that bf16 operands or a bf16 output would give.
        assert sqnr(valid(out, sizes, case), valid(ref, sizes, case)) >= 90
    # bf16 output, twice: every element the reference rounded to bf16 (within one bf16 ulp, 2**-8 relative; an SQNR
    # floor would not see a few wrong 8-row slabs, the race once seen at four stages), the same in both runs.
    config = gemm_fused.default_config(case)
    outs = [GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="triton_fused", config=config) for _ in range(2)]
    want = valid(ref, sizes, case)
    # (plus 1e-4 of the RMS where sums cancel: the fp32 sums' order moves those by ~1e-6 of it, 127 dB above)
    bound = want.abs() * 2**-8 + 1e-4 * want.pow(2).mean().sqrt()
    for out in outs:
        err = (valid(out, sizes, case).float() - want).abs()
        assert (err <= bound).all(), f"{int((err > bound).sum())} elements off"
    assert torch.equal(outs[0], outs[1])
