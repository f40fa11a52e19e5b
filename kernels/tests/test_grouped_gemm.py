"""Specification of the grouped GEMMs (kernels/grouped_gemm.py and its backends, kernels/gemm_*.py).

The oracle is built here, independently of the code under test: operands quantized with
``format.quantize_reference``, per-group blocked scales composed from ``layouts.to_blocked`` following the layouts
of docs/architecture.md, and an fp32 reference computed group by group from ``dequantize_reference``. On CPU the
Triton backends run under the interpreter on small shapes (the interpreter's ``tl.dot_scaled`` and fp8 ``tl.dot``
compute in fp32); the sm_100 / sm_90 builds are checked by cross-compilation. The ``gpu`` tests check every backend
at DeepSeek-V3 sizes, and CUDA-graph capture.
"""

import itertools
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import triton
from crosscompile import compile_ptx
from kernel_helpers import offsets
from mxkernels.gemm import dequant
from mxkernels.gemm import fused
from mxkernels.gemm import native as gemm_native
from mxkernels.gemm import mx_triton
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.core.cost import Cost, ceil_to
from mxkernels.core.format import dequantize_reference, quantize_reference
from mxkernels.layouts.scale_layout import blocked_3d_shape, m_groups_shape, to_blocked

TRITON_BACKENDS = ["triton", "triton_fp8"]


# ---- the oracle -------------------------------------------------------------------------------------------------


def bounds(sizes):
    ends = list(itertools.accumulate(sizes))
    return list(zip([0, *ends[:-1]], ends))


def m_groups_blocked(scales, sizes):
    """Group g's blocked image starts at row sum_{j<g} ceil128(size_j) of a (128 * (ceil(M/128) + G), ceil4(C))
    zero buffer."""
    M, C = scales.shape
    out = torch.zeros(128 * (-(-M // 128) + len(sizes)), ceil_to(C, 4), dtype=torch.uint8, device=scales.device)
    row = 0
    for start, end in bounds(sizes):
        image = to_blocked(scales[start:end]).view(torch.uint8)
        out[row : row + image.shape[0]] = image
        row += image.shape[0]
    return out


def k_groups_blocked(scales, sizes):
    """Complete blocked images (ceil128(R) x ceil4(size_g / 32)) back to back from byte 0 of a
    (ceil128(R), M/32 + 4G) zero buffer."""
    R, cols = scales.shape
    out = torch.zeros(ceil_to(R, 128), cols + 4 * len(sizes), dtype=torch.uint8, device=scales.device)
    flat, pos = out.view(-1), 0
    for start, end in bounds(sizes):
        image = to_blocked(scales[:, start // 32 : end // 32]).view(torch.uint8).reshape(-1)
        flat[pos : pos + image.numel()] = image
        pos += image.numel()
    return out


def mx_2d3d(a, w, sizes):
    """Operands of out = a @ w_g^T: a (M, K), w (G, N, K) -> (kwargs of mxfp8_scaled_grouped_mm, fp32 reference)."""
    a_q, a_s = quantize_reference(a)
    w_q, w_s = quantize_reference(w)
    ref = torch.zeros(a.shape[0], w.shape[1], device=a.device)
    for g, (s, e) in enumerate(bounds(sizes)):
        ref[s:e] = dequantize_reference(a_q[s:e], a_s[s:e]) @ dequantize_reference(w_q[g], w_s[g]).T
    ops = {
        "a_q": a_q,
        "a_sb": m_groups_blocked(a_s, sizes),
        "b_q": w_q,
        "b_sb": torch.stack([to_blocked(s) for s in w_s]),
    }
    return ops, ref


def mx_2d2d(x, y, sizes):
    """Operands of out[g] = x[:, g] @ y[:, g]^T: x (N, M), y (K, M) -> (kwargs, fp32 reference (G, N, K))."""
    x_q, x_s = quantize_reference(x)
    y_q, y_s = quantize_reference(y)
    ref = torch.zeros(len(sizes), x.shape[0], y.shape[0], device=x.device)
    for g, (s, e) in enumerate(bounds(sizes)):
        cols = slice(s // 32, e // 32)
        ref[g] = dequantize_reference(x_q[:, s:e], x_s[:, cols]) @ dequantize_reference(y_q[:, s:e], y_s[:, cols]).T
    ops = {"a_q": x_q, "a_sb": k_groups_blocked(x_s, sizes), "b_q": y_q, "b_sb": k_groups_blocked(y_s, sizes)}
    return ops, ref


def sqnr(x, ref):
    x, ref = x.double(), ref.double()
    return (10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum())).item()


def hp_reference(a, b, sizes):
    """fp32 torch._grouped_mm of the unquantized operands."""
    if b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], device=a.device)
        for g, (s, e) in enumerate(bounds(sizes)):
            out[s:e] = a[s:e].float() @ b[g].float()
        return out
    return torch.stack([a[:, s:e].float() @ b[s:e].float() for s, e in bounds(sizes)])


# 2D x 3D: K = 160 is one whole 128-wide scale word and one 32-wide chunk more. 2D x 2D: group sizes of one word
# and one to three chunks, a chunk alone, and an empty group.
CPU_SIZES = {"2d3d": [40, 0, 100, 37], "2d2d": [160, 0, 96, 32]}


def small_case(case, device, gen):
    sizes = CPU_SIZES[case]
    if case == "2d3d":
        a = torch.randn(sum(sizes) + 23, 160, generator=gen).to(device)  # 23 rows past offs[-1]
        return mx_2d3d(a, torch.randn(4, 48, 160, generator=gen).to(device), sizes), sizes
    M = sum(sizes)
    return mx_2d2d(
        torch.randn(40, M, generator=gen).to(device), torch.randn(72, M, generator=gen).to(device), sizes
    ), sizes


def valid(out, sizes, case):
    return out[: sum(sizes)] if case == "2d3d" else out


# ---- backends against the fp32 oracle on CPU ---------------------------------------------------------------------


@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
def test_emulated_matches_fp32_reference(device, case):
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(0))
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend="emulated", out_dtype=torch.float32)
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-6, atol=1e-5)
    if case == "2d2d":
        assert not out[1].any()  # the empty group


@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_triton_backends_match_fp32_reference(device, backend, case):
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(1))
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend=backend, out_dtype=torch.float32)
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-5, atol=1e-4)
    if case == "2d2d":
        assert not out[1].any()


@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
def test_triton_fp8_any_tile_config_computes_the_same_function(device, case):
    # Tiles smaller than the operands, partial edge tiles, and in 2D x 2D a band order whose last band is short.
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(7))
    config = mx_triton.TileConfig(16, 32, num_warps=4, num_stages=2, group_m=2)
    out = GG.mxfp8_scaled_grouped_mm(
        **ops, offs=offsets(sizes, device), backend="triton_fp8", out_dtype=torch.float32, config=config
    )
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "kind, fields, error",
    [
        *[(kind, fields, error) for kind in (mx_triton.TileConfig, fused.FusedConfig) for fields, error in [
            ({"block_m": 48}, "block_m must be a power of two"),
            ({"block_n": 8}, "block_n must be a power of two"),
            ({"num_warps": 2}, "num_warps must be 4 or 8"),
            ({"num_stages": 0}, "num_stages must be a positive int"),
            ({"group_m": 0}, "group_m must be a positive int"),
        ]],
        (mx_triton.TileConfig, {"maxnreg": 16}, "maxnreg must be None or an int in"),
        (mx_triton.TileConfig, {"maxnreg": 256}, "maxnreg must be None or an int in"),
        (fused.FusedConfig, {"maxnreg": 16}, "maxnreg must be an int from 24 to 255"),
        (fused.FusedConfig, {"block_k": 256}, "block_k must be 32, 64 or 128"),
        (fused.FusedConfig, {"programs_per_sm": 0}, "programs_per_sm must be a positive int"),
        (fused.FusedConfig, {"max_programs": 0}, "max_programs must be a positive int"),
        (fused.FusedConfig, {"fuse_both": 1}, "fuse_both must be a bool"),
        (fused.FusedConfig, {"exact_fp32": "yes"}, "exact_fp32 must be a bool"),
    ],
)  # fmt: skip
def test_bad_launch_config_raises_value_error(kind, fields, error):
    with pytest.raises(ValueError, match=error):
        kind(**{"block_m": 64, "block_n": 64, **fields})


def test_config_must_be_a_tile_config(device):
    with pytest.raises(ValueError, match="config must be a TileConfig"):
        GG.mxfp8_scaled_grouped_mm(**mx_operands(device), backend="triton_fp8", config=(64, 64))


def test_default_configs_exist_for_every_triton_kernel():
    for case, backend in itertools.product(("2d3d", "2d2d"), TRITON_BACKENDS):
        assert isinstance(mx_triton.default_config(case, backend), mx_triton.TileConfig)
    with pytest.raises(ValueError, match="no Triton MXFP8 kernel"):
        mx_triton.default_config("2d3d", "emulated")


def old_sm90_scale_decoder(device, backend):
    """triton <= 3.8 decodes scale byte 0 (2**-127) as 0 where ``tl.dot_scaled`` is emulated (SM90)."""
    if backend != "triton" or device != "cuda" or torch.cuda.get_device_capability()[0] != 9:
        return False
    return tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 9)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_triton_backends_decode_extreme_scales(device, backend):
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(64, 128, generator=gen)
    a[3] *= 2.0**-121  # amax / 448 < 2**-127: scale byte 0, the subnormal 2**-127
    a[4] = 0  # all-zero blocks: byte 0 and zero data
    a[6] *= 2.0**100  # large scales
    a_s = quantize_reference(a)[1].view(torch.uint8)
    assert (a_s[3] == 0).all() and (a_s[4] == 0).all() and (a_s[6] > 200).all()
    ops, ref = mx_2d3d(a.to(device), torch.randn(2, 32, 128, generator=gen).to(device), [30, 34])
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets([30, 34], device), backend=backend, out_dtype=torch.float32)
    assert not out[4].any()
    if old_sm90_scale_decoder(device, backend):
        assert not out[3].any()  # the documented limitation: byte-0 blocks contribute nothing
        out, ref = out[4:], ref[4:]
    assert out[3].abs().min() > 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, inside the interpreter, on NaN products
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_triton_backends_propagate_nan_blocks(device, backend):
    if device == "cpu" and backend == "triton_fp8":
        pytest.skip("the interpreter's fp8 tl.dot reads e4m3 NaN (0x7F) as 480; compiled wgmma propagates it")
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(64, 128, generator=gen)
    a[5, 40] = float("nan")  # block (5, 1): scale byte 255 and NaN data
    w = torch.randn(2, 32, 128, generator=gen)
    w[1, 7, 100] = float("nan")  # block (7, 3) of expert 1
    ops, ref = mx_2d3d(a.to(device), w.to(device), [30, 34])
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets([30, 34], device), backend=backend, out_dtype=torch.float32)
    expected_nan = torch.zeros(64, 32, dtype=torch.bool)
    expected_nan[5] = True
    expected_nan[30:, 7] = True
    assert torch.equal(out.isnan().cpu(), expected_nan)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4, equal_nan=True)


# ---- "triton_dequant": exact dequantization to bf16, then torch._grouped_mm -------------------------------------

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


@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
def test_triton_dequant_matches_fp32_reference(device, case):
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(9))
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend="triton_dequant")
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


# ---- the front door ----------------------------------------------------------------------------------------------

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


def front_door_inputs(case, device):
    gen = torch.Generator().manual_seed(3)
    sizes = [64, 0, 96]
    M = sum(sizes)
    a = torch.randn(M + 32, 128, generator=gen).to(device, torch.bfloat16)
    if case == "2d3d":
        w = torch.randn(3, 64, 128, generator=gen).to(device, torch.bfloat16)
        return a, w.transpose(-2, -1), sizes  # b (G, K, N): a transposed view of the weights, as a model holds it
    grad_out = torch.randn(M, 64, generator=gen).to(device, torch.bfloat16)
    return grad_out.t(), a[:M], sizes  # (N, M) as a transposed view, (M, K)


@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
@pytest.mark.parametrize("recipe,backend,min_db", FRONT_DOOR)
def test_front_door_against_unquantized_fp32(device, recipe, backend, min_db, case):
    a, b, sizes = front_door_inputs(case, device)
    result = GG.grouped_mm(a, b, offsets(sizes, device), recipe=recipe, backend=backend)
    assert result.backend == backend and result.out.dtype == torch.bfloat16
    ref = hp_reference(a, b, sizes)
    assert result.out.shape == ref.shape
    assert sqnr(valid(result.out, sizes, case), valid(ref, sizes, case)) >= min_db


@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
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


# ---- which backend runs where, and refusals before any launch ---------------------------------------------------


@pytest.fixture
def native_probe_passes(monkeypatch):
    """On 10.x native MXFP8 is available only once its probe at first use passed (no B200 here: say it did)."""
    monkeypatch.setattr(gemm_native, "probe_mxfp8", lambda device: gemm_native.Verdict(True, "passed (said so)"))
    monkeypatch.setattr(gemm_native, "_PROBES", {})


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


@pytest.fixture
def no_torch_scaled_grouped_mm(monkeypatch):
    """Fail if anything reaches torch._scaled_grouped_mm: refusals must come before any launch."""

    def launched(*args, **kwargs):
        raise AssertionError("torch._scaled_grouped_mm was called")

    monkeypatch.setattr(torch, "_scaled_grouped_mm", launched)


def test_native_mxfp8_is_refused_on_sm90(monkeypatch, device, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    (ops, _), sizes = small_case("2d3d", device, torch.Generator().manual_seed(4))
    with pytest.raises(RuntimeError, match=r"compute capability 10\.x .*SM90"):
        GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, device), backend="native")
    a, b, sizes = front_door_inputs("2d3d", device)
    with pytest.raises(RuntimeError, match=r"compute capability 10\.x"):
        GG.grouped_mm(a, b, offsets(sizes, device), recipe="mxfp8", backend="native")


def test_fp8_is_refused_without_fp8_tensor_cores(monkeypatch, device, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (8, 0))
    a, b, sizes = front_door_inputs("2d3d", device)
    with pytest.raises(RuntimeError, match="9.0 and 10.x"):
        GG.grouped_mm(a, b, offsets(sizes, device), recipe="fp8_rowwise", backend="native")
    with pytest.raises(RuntimeError, match="8.9"):
        GG.grouped_mm(a, b, offsets(sizes, device), recipe="mxfp8", backend="triton")


def test_native_fp8_rowwise_shape_rules(monkeypatch, device, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    e4m3 = torch.float8_e4m3fn
    a_q, b_q = torch.zeros(64, 40, device=device, dtype=e4m3), torch.zeros(2, 32, 40, device=device, dtype=e4m3)
    scales = torch.ones(64, device=device), torch.ones(2, 32, device=device)
    with pytest.raises(ValueError, match=r"contraction dim \(40\) must be a multiple of 16"):
        GG.fp8_rowwise_scaled_grouped_mm(a_q, scales[0], b_q, scales[1], offsets([32, 32], device), backend="native")


def mx_operands(device, K=64, N=32, G=2, M=64):
    e4m3 = torch.float8_e4m3fn
    return {
        "a_q": torch.zeros(M, K, dtype=e4m3, device=device),
        "a_sb": torch.zeros(m_groups_shape(M, K // 32, G), dtype=torch.uint8, device=device),
        "b_q": torch.zeros(G, N, K, dtype=e4m3, device=device),
        "b_sb": torch.zeros(blocked_3d_shape(G, N, K // 32), dtype=torch.uint8, device=device),
        "offs": offsets([M // 2, M // 2], device),
    }


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
        GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets([48, 48, 64, 32], device), backend="emulated")


def test_native_mxfp8_output_is_bf16_only(monkeypatch, device, native_probe_passes, no_torch_scaled_grouped_mm):
    monkeypatch.setattr(GG, "_capability", lambda device: (10, 0))
    with pytest.raises(ValueError, match="out_dtype"):
        GG.mxfp8_scaled_grouped_mm(**mx_operands(device), backend="native", out_dtype=torch.float32)


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


# ---- cross-compilation: what the kernels become on SM100 and SM90 --------------------------------------------

_SIGNATURE = {
    **{p: "*fp8e4nv" for p in ("a_ptr", "b_ptr")},
    **{p: "*i32" for p in ("sa_ptr", "sb_ptr", "offs_ptr")},
    "out_ptr": "*bf16",
    **{d: "i32" for d in "MNKG"},
    **{c: "constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_G", "FP8_DOT")},
}
_BUILDS = {  # (kernel, FP8_DOT, cc)
    "dot_scaled_sm100": ("_mx_2d3d_kernel", False, 100),
    "dot_scaled_sm90": ("_mx_2d3d_kernel", False, 90),
    "fp8_dot_sm90": ("_mx_2d3d_kernel", True, 90),
    "fp8_dot_2d2d_sm90": ("_mx_2d2d_kernel", True, 90),
}


@pytest.fixture(scope="module")
def ptx():
    """The PTX of each build (compiled concurrently: each is a subprocess)."""

    def build(spec):
        kernel, fp8_dot, cc = spec
        constexprs = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_G": 8, "FP8_DOT": fp8_dot}
        signature = dict(_SIGNATURE)
        if kernel == "_mx_2d2d_kernel":
            constexprs["GROUP_M"], signature["GROUP_M"] = 8, "constexpr"
        # Pointers and sizes aligned as the launcher specializes real DeepSeek-V3 arguments (G = 8 is not).
        aligned = ("a_ptr", "b_ptr", "sa_ptr", "sb_ptr", "offs_ptr", "out_ptr", "M", "N", "K")
        return compile_ptx("mxkernels.gemm.mx_triton", kernel, signature, constexprs, cc, aligned=aligned)

    with ThreadPoolExecutor(max_workers=len(_BUILDS)) as pool:
        return dict(zip(_BUILDS, pool.map(build, _BUILDS.values())))


def mma_instructions(ptx_text):
    return set(re.findall(r"\b((?:tcgen05\.mma|wgmma\.mma_async|mma\.sync)[\w.:]*)", ptx_text))


def test_dot_scaled_uses_block_scaled_mma_on_sm100(ptx):
    # triton 3.9: tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32
    (mma,) = mma_instructions(ptx["dot_scaled_sm100"])
    assert mma.startswith("tcgen05.mma") and "kind::mxf8f6f4" in mma and ".block_scale" in mma


def test_dot_scaled_upcasts_to_bf16_wgmma_on_sm90(ptx):
    (mma,) = mma_instructions(ptx["dot_scaled_sm90"])
    assert mma.startswith("wgmma.mma_async") and mma.endswith(".f32.bf16.bf16")


@pytest.mark.parametrize("build", ["fp8_dot_sm90", "fp8_dot_2d2d_sm90"])
def test_fp8_dot_uses_fp8_wgmma_on_sm90(ptx, build):
    (mma,) = mma_instructions(ptx[build])
    assert mma.startswith("wgmma.mma_async") and mma.endswith("k32.f32.e4m3.e4m3")


@pytest.mark.parametrize("build", ["fp8_dot_sm90", "fp8_dot_2d2d_sm90"])
def test_fp8_dot_streams_operands_with_vector_cp_async_on_sm90(ptx, build):
    # The contraction tiles must go global -> shared in 8- and 16-byte cp.async (software-pipelined). In 2D x 2D
    # the group's start column is data-dependent: when its alignment is lost (triton 3.6 drops tl.multiple_of on a
    # reduction), the loads fall back to ld.global.b8 with no pipelining, a 4x slowdown.
    sizes = re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]+\], \[[^]]+\], (0x[0-9a-f]+)", ptx[build])
    assert sizes and min(int(size, 16) for size in sizes) >= 8
    assert not re.search(r"ld\.global(?:\.\w+)*\.b8\b", ptx[build])


# ---- GPU -----------------------------------------------------------------------------------------------------


@pytest.fixture
def exact_fp32_matmul(monkeypatch):
    """The fp32 references must not run on TF32 tensor cores."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def gpu_sizes(M, G, multiple):
    """G group sizes summing to M, multiples of ``multiple``, uneven, group 1 empty."""
    weights = torch.tensor([3.0, 0.0, 1.0, 5.0, 0.5, 2.0, 1.5, 4.0][:G])
    sizes = (weights / weights.sum() * M / multiple).floor().long() * multiple
    sizes[-1] += M - sizes.sum()
    return sizes.tolist()


def gpu_case(case, M, K, N, G, sizes, seed=0):
    """MX operands and fp32 reference of a 2D x 3D (a (M, K), w (G, N, K)) or 2D x 2D (x (N, M), y (K, M)) GEMM."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if case == "2d3d":
        a = torch.randn(M, K, device="cuda", generator=gen)
        return mx_2d3d(a, torch.randn(G, N, K, device="cuda", generator=gen) * K**-0.5, sizes)
    x = torch.randn(N, M, device="cuda", generator=gen) * 1e-2
    return mx_2d2d(x, torch.randn(K, M, device="cuda", generator=gen), sizes)


GPU_SHAPES = [  # (M, K, N, G): moderate, then DeepSeek-V3 (K = 7168, N = 2048, G = 8)
    (4096, 1024, 512, 4),
    (16384, 7168, 2048, 8),
    (131072, 7168, 2048, 8),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
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


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_gpu_triton_rows_need_no_alignment(exact_fp32_matmul, backend):
    sizes = gpu_sizes(3001, 4, 1)
    ops, ref = gpu_case("2d3d", 3001, 1024, 512, 4, sizes)
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offsets(sizes, "cuda"), backend=backend, out_dtype=torch.float32)
    # "triton" accumulates in fp32 (seen on an H200: over 100 dB). "triton_fp8" sums each 32-wide chunk in the fp8
    # wgmma accumulator, which keeps fewer mantissa bits than fp32 (DeepGEMM measures about 14 on Hopper, whence
    # its promotion of partial sums; 20 * log10(2**14) = 84 dB): seen 86.8 dB on an H200, so 80 dB.
    assert sqnr(out[: sum(sizes)], ref[: sum(sizes)]) >= (100 if backend == "triton" else 80)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
def test_gpu_recipes_against_bf16(case):
    gen = torch.Generator(device="cuda").manual_seed(1)
    M, K, N, G = 16384, 7168, 2048, 8
    sizes = gpu_sizes(M, G, 32)
    offs = offsets(sizes, "cuda")
    if case == "2d3d":
        a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        b = (torch.randn(G, N, K, device="cuda", generator=gen) * K**-0.5).bfloat16().transpose(-2, -1)
    else:
        a = (torch.randn(M, N, device="cuda", generator=gen) * 1e-2).bfloat16().t()
        b = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
    bf16 = GG.grouped_mm(a, b, offs, recipe="bf16")
    assert bf16.backend == "native"
    for recipe in ("mxfp8", "fp8_rowwise"):
        for backend in GG.available_backends(recipe, "cuda"):
            out = GG.grouped_mm(a, b, offs, recipe=recipe, backend=backend).out
            db = sqnr(valid(out, sizes, case), valid(bf16.out, sizes, case))
            print(f"{recipe} {case} {backend}: {db:.1f} dB vs bf16")
            assert db >= 25, (recipe, backend)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
def test_gpu_native_fp8_rowwise_matches_emulated(case):
    if "native" not in GG.available_backends("fp8_rowwise", "cuda"):
        pytest.skip("torch._scaled_grouped_mm FP8 rowwise runs on SM90 / SM100 only")
    gen = torch.Generator(device="cuda").manual_seed(2)
    M, K, N, G = 16384, 7168, 2048, 8
    sizes = gpu_sizes(M, G, 32)
    offs = offsets(sizes, "cuda")
    if case == "2d3d":
        a = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        b = (torch.randn(G, N, K, device="cuda", generator=gen) * K**-0.5).bfloat16().transpose(-2, -1)
    else:
        a = (torch.randn(N, M, device="cuda", generator=gen) * 1e-2).bfloat16()
        b = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
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
@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
@pytest.mark.parametrize("backend", [*TRITON_BACKENDS, "triton_dequant"])  # triton_fused: test_gemm_fused
def test_gpu_triton_backends_replay_in_a_cuda_graph(case, backend):
    M, K, N, G = 8192, 2048, 1024, 8
    sizes = gpu_sizes(M, G, 32)
    ops, _ = gpu_case(case, M, K, N, G, sizes, seed=3)
    offs = offsets(sizes, "cuda")
    GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend=backend)  # compiles: never inside a capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend=backend)
    # A new routing and new data, written into the captured tensors: the replay must find the new groups.
    new_sizes = sizes[::-1]
    new_ops, _ = gpu_case(case, M, K, N, G, new_sizes, seed=4)
    for name, value in new_ops.items():
        ops[name].copy_(value)
    offs.copy_(offsets(new_sizes, "cuda"))
    graph.replay()
    eager = GG.mxfp8_scaled_grouped_mm(**new_ops, offs=offsets(new_sizes, "cuda"), backend=backend)
    assert torch.equal(valid(out, new_sizes, case), valid(eager, new_sizes, case))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
@pytest.mark.parametrize("M,K,N,G", GPU_SHAPES[:2])
def test_gpu_triton_dequant_matches_emulated(exact_fp32_matmul, case, M, K, N, G):
    # Both compute the MX products exactly and sum them in fp32, in different orders; the bf16 output rounding
    # (about 2**-9 relative) dominates: expect some 50 dB against the fp32 emulation, far over 40.
    sizes = gpu_sizes(M, G, 32)
    ops, _ = gpu_case(case, M, K, N, G, sizes, seed=5)
    offs = offsets(sizes, "cuda")
    emulated = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="emulated", out_dtype=torch.float32)
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="triton_dequant")
    db = sqnr(valid(out, sizes, case), valid(emulated, sizes, case))
    print(f"triton_dequant {case} M={M} K={K} N={N} G={G}: {db:.1f} dB vs fp32 emulated")
    assert db >= 40


@pytest.mark.gpu
def test_gpu_native_mxfp8_is_refused_below_sm100():
    if torch.cuda.get_device_capability()[0] == 10:
        pytest.skip("SM100 runs native MXFP8")
    assert "native" not in GG.available_backends("mxfp8", "cuda")
    ops = mx_operands("cuda")
    with pytest.raises(RuntimeError, match=r"compute capability 10\.x"):
        GG.mxfp8_scaled_grouped_mm(**ops, backend="native")
    torch.cuda.synchronize()  # the context is still alive
