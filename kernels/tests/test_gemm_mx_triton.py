"""Specification of the "triton" and "triton_fp8" backends (kernels/mxkernels/gemm/mx_triton.py): MXFP8 grouped GEMMs
through ``tl.dot_scaled`` or fp8 ``tl.dot``, against gemm_oracle's fp32 reference on CPU (the interpreter), their
launch configurations, and what they compile to on SM100 and SM90 (cross-compilation). The ``gpu`` tests check rows
of any alignment and CUDA-graph replay of every Triton backend.
"""

import itertools
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import triton
from crosscompile import compile_ptx
from gemm_oracle import (
    CASES,
    TRITON_BACKENDS,
    gpu_case,
    gpu_sizes,
    mx_2d3d,
    mx_operands,
    run_mx,
    small_case,
    sqnr,
    valid,
)
from kernel_helpers import offsets
from mxkernels.core.format import quantize_reference
from mxkernels.gemm import fp8_triton, fused
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm import mx_triton

# ---- against the fp32 oracle on CPU ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_triton_backends_match_fp32_reference(device, backend, case):
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(1))
    out = run_mx(ops, sizes, device, backend, out_dtype=torch.float32)
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-5, atol=1e-4)
    if case == "2d2d":
        assert not out[1].any()


@pytest.mark.parametrize("case", CASES)
def test_triton_fp8_any_tile_config_computes_the_same_function(device, case):
    # Tiles smaller than the operands, partial edge tiles, and in 2D x 2D a band order whose last band is short.
    (ops, ref), sizes = small_case(case, device, torch.Generator().manual_seed(7))
    config = mx_triton.TileConfig(16, 32, num_warps=4, num_stages=2, group_m=2)
    out = run_mx(ops, sizes, device, "triton_fp8", out_dtype=torch.float32, config=config)
    torch.testing.assert_close(valid(out, sizes, case), valid(ref, sizes, case), rtol=1e-5, atol=1e-4)


SHARED_TILE_CHECKS = [  # core.runtime.check_tile_config, in every tiled GEMM launch
    ({"block_m": 48}, "block_m must be a power of two"),
    ({"block_n": 8}, "block_n must be a power of two"),
    ({"num_warps": 2}, "num_warps must be 4 or 8"),
    ({"num_stages": 0}, "num_stages must be a positive int"),
    ({"group_m": 0}, "group_m must be a positive int"),
]


@pytest.mark.parametrize(
    "kind, fields, error",
    [
        *[(kind, *check) for kind in (mx_triton.TileConfig, fused.FusedConfig) for check in SHARED_TILE_CHECKS],
        (mx_triton.TileConfig, {"maxnreg": 16}, "maxnreg must be None or an int in"),
        (mx_triton.TileConfig, {"maxnreg": 256}, "maxnreg must be None or an int in"),
        (fused.FusedConfig, {"maxnreg": 16}, "maxnreg must be an int from 24 to 255"),
        (fused.FusedConfig, {"block_k": 256}, "block_k must be 32, 64 or 128"),
        (fused.FusedConfig, {"programs_per_sm": 0}, "programs_per_sm must be a positive int"),
        (fused.FusedConfig, {"max_programs": 0}, "max_programs must be a positive int"),
        (fused.FusedConfig, {"fuse_both": 1}, "fuse_both must be a bool"),
        (fused.FusedConfig, {"exact_fp32": "yes"}, "exact_fp32 must be a bool"),
        *[(fp8_triton.Fp8Config, *check) for check in SHARED_TILE_CHECKS],
        (fp8_triton.Fp8Config, {"block_k": 48}, "block_k must be a power of two"),
        (fp8_triton.Fp8Config, {"programs_per_sm": 0}, "programs_per_sm must be a positive int"),
        (fp8_triton.Fp8Config, {"max_programs": 0}, "max_programs must be a positive int"),
        (fp8_triton.Fp8Config, {"promote": 256}, "promote must be an int from 1 to 128"),
    ],
)  # fmt: skip
def test_bad_launch_config_raises_value_error(kind, fields, error):
    with pytest.raises(ValueError, match=error):
        kind(**{"block_m": 64, "block_n": 64, **fields})


def test_config_must_be_a_tile_config(device):
    with pytest.raises(ValueError, match="config must be a TileConfig"):
        GG.mxfp8_scaled_grouped_mm(**mx_operands(device), backend="triton_fp8", config=(64, 64))


def test_default_configs_exist_for_every_triton_kernel():
    for case, backend in itertools.product(CASES, TRITON_BACKENDS):
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
    out = run_mx(ops, [30, 34], device, backend, out_dtype=torch.float32)
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
    out = run_mx(ops, [30, 34], device, backend, out_dtype=torch.float32)
    expected_nan = torch.zeros(64, 32, dtype=torch.bool)
    expected_nan[5] = True
    expected_nan[30:, 7] = True
    assert torch.equal(out.isnan().cpu(), expected_nan)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4, equal_nan=True)


# ---- cross-compilation: what the kernels become on SM100 and SM90 ------------------------------------------------

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


# ---- GPU ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_gpu_triton_rows_need_no_alignment(exact_fp32_matmul, backend):
    sizes = gpu_sizes(3001, 4, 1)
    ops, ref = gpu_case("2d3d", 3001, 1024, 512, 4, sizes)
    out = run_mx(ops, sizes, "cuda", backend, out_dtype=torch.float32)
    # "triton" accumulates in fp32 (seen on an H200: over 100 dB). "triton_fp8" sums each 32-wide chunk in the fp8
    # wgmma accumulator, which keeps fewer mantissa bits than fp32 (DeepGEMM measures about 14 on Hopper, whence
    # its promotion of partial sums; 20 * log10(2**14) = 84 dB): seen 86.8 dB on an H200, so 80 dB.
    assert sqnr(out[: sum(sizes)], ref[: sum(sizes)]) >= (100 if backend == "triton" else 80)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
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
    eager = run_mx(new_ops, new_sizes, "cuda", backend)
    assert torch.equal(valid(out, new_sizes, case), valid(eager, new_sizes, case))
