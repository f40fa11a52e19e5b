"""Specification of the "triton" FP8 rowwise backend (kernels/gemm_fp8_rowwise.py).

The oracle is ``gemm_reference.fp8_rowwise_reference`` (dequantize in fp64, multiply group by group), written apart
from the kernel. On CPU the kernels run under the interpreter at small sizes with ragged, empty, tiny and unaligned
groups; small integer-valued operands make every product and partial sum exact in fp32, so there the kernel must
equal the oracle bit for bit (fp32 output). On the GPU (marker ``gpu``) it is held against the oracle at DeepSeek-V3
and Llama 4 Scout sizes with an SQNR at least torch's own kernel's on the same inputs, and captured in a CUDA graph.
The SM90 build is checked by cross-compilation: e4m3 wgmma and TMA loads.
"""

import dataclasses
import re

import pytest
import torch
from crosscompile import compile_ptx
from kernel_helpers import offsets
from mxkernels.gemm import fp8_triton as F
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.reference.gemm import fp8_rowwise_reference
from mxkernels.core.runtime import InputError

E4M3 = torch.float8_e4m3fn


def _ints(gen, *shape, device="cpu"):
    """e4m3 tensor of small integers (-4..4): products and their sums stay exact in fp32."""
    return torch.randint(-4, 5, shape, generator=gen).to(device=device, dtype=torch.float32).to(E4M3)


def _pow2(gen, *shape, device="cpu"):
    """fp32 scales that are powers of two, so the scaled sums stay exact."""
    return (2.0 ** torch.randint(-3, 4, shape, generator=gen).float()).to(device)


def case_2d3d(sizes, N, K, device="cpu", seed=0, extra_rows=0):
    gen = torch.Generator().manual_seed(seed)
    M = sum(sizes) + extra_rows
    return (_ints(gen, M, K, device=device), _pow2(gen, M, device=device), _ints(gen, len(sizes), N, K, device=device),
            _pow2(gen, len(sizes), N, device=device), offsets(sizes, device))  # fmt: skip


def case_2d2d(sizes, N, K, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    M = sum(sizes)
    return (_ints(gen, N, M, device=device), _pow2(gen, len(sizes), N, device=device), _ints(gen, K, M, device=device),
            _pow2(gen, len(sizes), K, device=device), offsets(sizes, device))  # fmt: skip


def ours(ops, config=None, out_dtype=torch.float32):
    return GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="triton", out_dtype=out_dtype, config=config)


def assert_matches(out, ops, rows=None):
    ref = fp8_rowwise_reference(*ops, out_dtype=torch.float32)
    sl = slice(None) if rows is None else slice(0, rows)
    torch.testing.assert_close(out[sl], ref[sl], rtol=0, atol=0)


def small(**fields):
    return dataclasses.replace(F.default_config("2d3d"), **fields)


# ---- against the oracle, under the interpreter ---------------------------------------------------------------------


def test_the_fast_backend_is_the_same_kernel_and_contract():
    """"triton_fast" differs only in its default configs on the GPU (no promotion): same contract, same results
    wherever the sums are exact (here, and under the interpreter, which has no reduced-precision accumulator)."""
    ops = case_2d3d([40, 0, 72], N=48, K=96)
    out = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="triton_fast", out_dtype=torch.float32)
    assert_matches(out, ops, rows=112)
    ops2 = case_2d2d([48, 0, 32], N=32, K=48)
    assert_matches(GG.fp8_rowwise_scaled_grouped_mm(*ops2, backend="triton_fast", out_dtype=torch.float32), ops2)
    assert all(c.promote is None for c in F.FAST_CONFIGS.values())
    assert all(c.promote == c.block_k for c in F._DEFAULT_CONFIGS.values())


@pytest.mark.parametrize("sizes", [[40, 0, 72, 1], [0, 0, 16], [3], [33, 31, 0, 0, 64]])
def test_2d3d_ragged_empty_tiny_groups(sizes):
    ops = case_2d3d(sizes, N=48, K=96, extra_rows=5)  # rows past offs[-1] are not the kernel's to write
    assert_matches(ours(ops), ops, rows=sum(sizes))


@pytest.mark.parametrize("sizes", [[48, 0, 80], [40, 24, 32], [7, 0, 50, 39], [0, 0, 0]])
def test_2d2d_ragged_empty_and_unaligned_groups(sizes):
    """Group starts off a multiple of 16 take the masked loads; partial last steps never read the next group."""
    ops = case_2d2d(sizes, N=48, K=40)
    out = ours(ops)
    assert_matches(out, ops)
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.equal(out[g], torch.zeros_like(out[g]))


def test_2d2d_empty_group_is_zero_whatever_its_scales_hold():
    ops = list(case_2d2d([32, 0, 32], N=32, K=32))
    ops[1][1] = float("inf")  # an empty group's scales are whatever the quantizer left: inf * 0 would be NaN
    ops[3][1] = float("nan")
    out = ours(ops)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert_matches(out[[0, 2]], [ops[0], ops[1][[0, 2]], ops[2], ops[3][[0, 2]], offsets([32, 32])])


def test_several_tiles_and_groups_per_program_and_bf16_output():
    """A grid of 2 programs walks every tile of every group; bf16 output is the fp32 result rounded once."""
    ops = case_2d3d([64, 0, 96, 32], N=96, K=64, seed=3)
    out = ours(ops, config=small(max_programs=2), out_dtype=torch.bfloat16)
    ref = fp8_rowwise_reference(*ops, out_dtype=torch.float32).bfloat16()
    assert torch.equal(out, ref)


# ---- what the checks above catch -----------------------------------------------------------------------------------


def test_the_oracle_comparison_catches_planted_faults():
    """Each fault a kernel could make changes the output the tests above compare (so they would fail)."""
    ops = case_2d3d([40, 0, 72], N=32, K=64)
    good = fp8_rowwise_reference(*ops, out_dtype=torch.float32)
    a_q, sa, b_q, sb, offs = ops
    faults = {
        "b scale ignored": fp8_rowwise_reference(a_q, sa, b_q, torch.ones_like(sb), offs, out_dtype=torch.float32),
        "a scale ignored": fp8_rowwise_reference(a_q, torch.ones_like(sa), b_q, sb, offs, out_dtype=torch.float32),
        "group boundary one row late": fp8_rowwise_reference(*ops[:4], offsets([41, 0, 71]), out_dtype=torch.float32),
        "weights of the next group": fp8_rowwise_reference(a_q, sa, b_q.roll(1, 0), sb.roll(1, 0), offs,
                                                           out_dtype=torch.float32),  # fmt: skip
    }
    for name, wrong in faults.items():
        with pytest.raises(AssertionError):
            torch.testing.assert_close(wrong[:112], good[:112], rtol=0, atol=0, msg=name)
    ops2 = case_2d2d([40, 24, 32], N=32, K=32)
    good2 = fp8_rowwise_reference(*ops2, out_dtype=torch.float32)
    # a 2D x 2D kernel that reads the next group's columns in a partial step: groups [40 + 8 | 24 + 8 | 32]
    late = fp8_rowwise_reference(*ops2[:4], offsets([48, 24, 24]), out_dtype=torch.float32)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(late, good2, rtol=0, atol=0)


# ---- argument checks -----------------------------------------------------------------------------------------------


def test_config_type_and_tma_stride_are_checked():
    ops = case_2d3d([16, 16], N=32, K=32)
    with pytest.raises(InputError, match="Fp8Config"):
        GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="triton", config=object())
    odd = case_2d3d([16, 16], N=32, K=40)
    odd = (odd[0][:, :24].contiguous(), odd[1], odd[2][:, :, :24].contiguous(), odd[3], odd[4])
    with pytest.raises(InputError, match="multiple of 16"):
        GG.fp8_rowwise_scaled_grouped_mm(*odd, backend="triton")
    with pytest.raises(InputError, match="num_warps"):
        F.Fp8Config(num_warps=2)


def test_cpu_default_stays_the_emulation():
    """The interpreter runs the kernel for tests only: without a GPU the default backend is the fast emulation."""
    assert GG.default_backend("fp8_rowwise", "cpu") == "emulated"
    assert "triton" in GG.available_backends("fp8_rowwise", "cpu")


# ---- the SM90 build ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("configs", [F._DEFAULT_CONFIGS, F.FAST_CONFIGS], ids=["default", "fast"])
@pytest.mark.parametrize("case", ["2d3d", "2d2d"])
def test_sm90_build_uses_e4m3_wgmma_and_tma(case, configs):
    c = configs[case]
    desc = lambda rows: f"tensordesc<fp8e4nv[{rows}, {c.block_k}]>"
    if case == "2d3d":
        sig = {"a_desc": desc(c.block_m), "b_desc": desc(c.block_n), "sa_ptr": "*fp32", "sb_ptr": "*fp32",
               "offs_ptr": "*i32", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "G": "i32", "PROGRAMS": "i32"}
        kernel = "_fp8_2d3d_kernel"
    else:
        sig = {"x_desc": desc(c.block_m), "y_desc": desc(c.block_n), "x_ptr": "*fp8e4nv", "y_ptr": "*fp8e4nv",
               "sx_ptr": "*fp32", "sy_ptr": "*fp32", "offs_ptr": "*i32", "out_ptr": "*bf16", "M": "i32",
               "X_ROWS": "i32", "Y_ROWS": "i32", "G": "i32", "PROGRAMS": "i32"}  # fmt: skip
        kernel = "_fp8_2d2d_kernel"
    constexprs = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "BLOCK_G": 8, "GROUP_M": c.group_m,
                  "STAGES": c.num_stages, "PROMOTE": c.promote}  # fmt: skip
    sig.update(dict.fromkeys(constexprs, "constexpr"))
    ptx = compile_ptx("mxkernels.gemm.fp8_triton", kernel, sig, constexprs, 90, aligned=("out_ptr",),
                      options={"num_warps": c.num_warps, "num_stages": c.num_stages})  # fmt: skip
    assert re.search(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx), "the main loop must be an e4m3 wgmma"
    assert "cp.async.bulk.tensor" in ptx, "the operand tiles must come through TMA"


# ---- on the GPU ----------------------------------------------------------------------------------------------------


def _sqnr(x, ref):
    x, ref = x.double(), ref.double()
    return (10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum())).item()


def _gpu_operands(pass_, K, N, sizes, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = sum(sizes)
    offs = offsets(sizes, "cuda")
    rand = lambda *shape: torch.randn(*shape, device="cuda", generator=gen)
    if pass_ == "fwd":
        a, b = rand(rows, K).bfloat16(), (rand(len(sizes), N, K) * K**-0.5).bfloat16().transpose(-2, -1)
    else:  # wgrad
        a, b = (rand(rows, N) * 1e-2).bfloat16().t(), rand(rows, K).bfloat16()
    return (*GG._quantize_fp8_rowwise(a, b, offs), offs)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "triton_ws"])
@pytest.mark.parametrize("model", [(7168, 2048), (5120, 8192)], ids=["deepseek-v3", "llama4-scout"])
@pytest.mark.parametrize("pass_", ["fwd", "wgrad"])
def test_gpu_model_sizes_at_least_torchs_sqnr(model, pass_, backend):
    if why := GG.backend_unavailable("fp8_rowwise", backend, torch.device("cuda")):
        pytest.skip(why)
    K, N = model
    sizes = [4096, 0, 8192, 1, 3584, 16, 4096, 2048]  # 22033 rows: ragged, one empty, tiny ones
    if pass_ == "wgrad":
        sizes = [s // 16 * 16 for s in sizes]  # torch's kernel needs 16-aligned contraction groups
    ops = _gpu_operands(pass_, K, N, sizes)
    ref = fp8_rowwise_reference(*ops, out_dtype=torch.float32)
    out = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend=backend)
    theirs = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="native")
    rows = slice(0, sum(sizes)) if pass_ == "fwd" else slice(None)
    assert _sqnr(out[rows], ref[rows]) >= _sqnr(theirs[rows], ref[rows]) - 0.01
    if pass_ == "wgrad":
        assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.gpu
def test_gpu_exact_on_integers_and_graph_capturable():
    ops = case_2d3d([300, 0, 517, 1, 1230], N=256, K=512, device="cuda")
    assert_matches(ours(ops), ops, rows=2048)
    ops2 = case_2d2d([304, 0, 512, 16, 1232], N=256, K=384, device="cuda")
    out = torch.empty(0)
    graph = torch.cuda.CUDAGraph()
    ours(ops2)  # compile outside the capture
    with torch.cuda.graph(graph):
        out = ours(ops2)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, ops2)


def test_the_end_to_end_step_runs_the_backend_it_is_given(monkeypatch):
    """The forward+backward a run times must use the run's backend in all three GEMMs, as its stages do (it once
    dropped it for FP8 rowwise and timed torch's kernel whatever the run asked for)."""
    from mxkernels.autograd import projection

    used = []
    real = GG.fp8_rowwise_scaled_grouped_mm

    def spy(*args, backend=None, **kwargs):
        used.append(backend)
        return real(*args, backend=backend, **kwargs)

    monkeypatch.setattr(GG, "fp8_rowwise_scaled_grouped_mm", spy)
    step = projection.end_to_end("fp8_rowwise", 64, 32, 64, 2, [32, 32], backend="triton", device="cpu")
    step()
    assert len(used) == 3 and set(used) == {"triton"}, used
