"""The MoE layer's kernels and fused stages on a GPU at DeepSeek-V3-like sizes (M = 16384 rows, K = 7168, N = 2048,
8 groups), against the plain-torch references evaluated on the GPU and the unfused chains.

    pytest -q -m gpu tests/test_moe_layer_gpu.py

Claims checked: gather_weighted, combine_rows bit-exact to their references; swiglu and swiglu_backward within the
nearly-exact rule, and bit-exact (libdevice expf is torch's CUDA exp; no FMA contraction) in a test of its own, so a
failure there alone says the GPU's exp or contraction differs, not that the kernel is wrong; row_dot to rounding;
every fused stage bit-identical to its chain (q rows past offs[-1] are written by neither, so not compared); the
fused stages capturable in a CUDA graph (no host sync)."""

import pytest
import torch
from kernel_helpers import assert_bits_equal, assert_nearly_exact, capture
from mxkernels.quant import fp8_amax
from mxkernels.moe import moe_rows
from mxkernels.quant import quantize_blocked
from mxkernels.moe import swiglu
from mxkernels.moe import moe_fused as mf

pytestmark = pytest.mark.gpu

M, K, N, G = 16384, 7168, 2048, 8
TOKENS = 4096
ENDS = [1024, 3072, 3072, 6144, 9000, 12288, 14000, 16000]  # an empty group; 384 rows past the last end


def rand(*shape, scale=1.0, seed=0):
    g = torch.Generator("cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()


def gather_args(weighted, seed=0):
    g = torch.Generator("cuda").manual_seed(seed)
    x = rand(TOKENS, K, scale=4.0, seed=seed)
    src = torch.randint(-1, TOKENS, (M,), generator=g, device="cuda", dtype=torch.int32)
    w = torch.rand(M, generator=g, device="cuda") if weighted else None
    return x, src, w


def fused_inputs():
    h1, h3 = swiglu.split_halves(rand(M, 2 * N, scale=3.0, seed=1))
    return rand(M, N, scale=2.0, seed=2), h1, h3


def offs():
    return torch.tensor(ENDS, dtype=torch.int32, device="cuda")


def assert_chain(fused, chain):
    """Every output bit-identical; e4m3 data (index 1) only in rows < offs[-1] (the rest is written by neither)."""
    assert len(fused) == len(chain)
    for i, (a, b) in enumerate(zip(fused, chain)):
        if i == 1:
            a, b = a[: ENDS[-1]], b[: ENDS[-1]]
        assert_bits_equal(a, b)


@pytest.mark.parametrize("weighted", [False, True])
def test_gather_weighted(weighted):
    x, src, w = gather_args(weighted)
    assert_bits_equal(moe_rows.gather_weighted(x, src, w), moe_rows.gather_weighted_reference(x, src, w))


@pytest.mark.parametrize("top_k", [1, 4, 8])
@pytest.mark.parametrize("weighted", [False, True])
def test_combine_rows(top_k, weighted):
    g = torch.Generator("cuda").manual_seed(top_k)
    y = rand(M, K, seed=top_k)
    dest = torch.randint(0, M, (M // top_k * top_k,), generator=g, device="cuda", dtype=torch.int32)
    w = torch.rand(dest.numel(), generator=g, device="cuda") if weighted else None
    assert_bits_equal(moe_rows.combine_rows(y, dest, w, top_k), moe_rows.combine_rows_reference(y, dest, w, top_k))


def test_row_dot():
    a, b = rand(M, K, seed=3), rand(TOKENS, K, seed=4)
    g = torch.Generator("cuda").manual_seed(5)
    ar = torch.randint(0, M, (M,), generator=g, device="cuda", dtype=torch.int32)
    br = torch.randint(0, TOKENS, (M,), generator=g, device="cuda", dtype=torch.int32)
    got, want = moe_rows.row_dot(a, ar, b, br), moe_rows.row_dot_reference(a, ar, b, br)
    bound = (a.index_select(0, ar.long()).float() * b.index_select(0, br.long()).float()).abs().sum(1)
    assert torch.all((got - want).abs() <= bound * 2**-18)


@pytest.mark.parametrize("exact", [False, True], ids=["nearly", "bit_exact"])
def test_swiglu(exact):
    grad, h1, h3 = fused_inputs()
    check = assert_bits_equal if exact else assert_nearly_exact
    check(swiglu.swiglu(h1, h3), swiglu.swiglu_reference(h1, h3))
    for packed in (True, False):
        for a, b in zip(swiglu.swiglu_backward(grad, h1, h3, packed=packed),
                        swiglu.swiglu_backward_reference(grad, h1, h3, packed=packed)):  # fmt: skip
            check(a, b)


@pytest.mark.parametrize("weighted", [False, True])
def test_gather_quantize(weighted):
    x, src, w = gather_args(weighted)
    xs = moe_rows.gather_weighted(x, src, w)
    assert_chain(mf.gather_quantize_mxfp8(x, src, w, offs()), (xs, *quantize_blocked.quantize_dim0_blocked(xs, offs())))
    assert_chain(mf.gather_quantize_fp8(x, src, w, offs()), (xs, *fp8_amax.quantize_fp8_rowwise_with_amax(xs, offs())))


def test_swiglu_quantize():
    _, h1, h3 = fused_inputs()
    act = swiglu.swiglu(h1, h3)
    assert_chain(mf.swiglu_quantize_mxfp8(h1, h3, offs()), (act, *quantize_blocked.quantize_dim0_blocked(act, offs())))
    assert_chain(mf.swiglu_quantize_fp8(h1, h3, offs()), (act, *fp8_amax.quantize_fp8_rowwise_with_amax(act, offs())))


@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_swiglu_backward_quantize(mode):
    grad, h1, h3 = fused_inputs()
    (gh,) = swiglu.swiglu_backward(grad, h1, h3, packed=True)
    assert_chain(mf.swiglu_backward_quantize_mxfp8(grad, h1, h3, offs(), mode),
                 (gh, *quantize_blocked.quantize_dim0_blocked(gh, offs(), mode)))  # fmt: skip
    assert_chain(mf.swiglu_backward_quantize_fp8(grad, h1, h3, offs()),
                 (gh, *fp8_amax.quantize_fp8_rowwise_with_amax(gh, offs())))  # fmt: skip


def test_fused_stages_capture_in_a_graph():
    x, src, w = gather_args(True)
    grad, h1, h3 = fused_inputs()
    o = offs()
    for fn, want in [
        (lambda: mf.gather_quantize_mxfp8(x, src, w, o)[2], mf.gather_quantize_mxfp8(x, src, w, o)[2]),
        (lambda: mf.swiglu_backward_quantize_fp8(grad, h1, h3, o)[3],
         mf.swiglu_backward_quantize_fp8(grad, h1, h3, o)[3]),
    ]:  # fmt: skip
        out, graph = capture(fn)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert_bits_equal(out, want)
