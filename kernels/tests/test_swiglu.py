"""SwiGLU forward and backward (``swiglu``): the Triton kernels against the plain-torch references on random data of
odd sizes, h1/h3 as views of one (M, 2N) output or separate tensors, packed and split gradients, every output byte
written (poisoned allocations); argument checks; costs. Under the interpreter exp is numpy's, not torch's: outputs
must be bit-exact but for rare 1-ulp differences (``helpers.assert_nearly_exact``)."""

import pytest
import torch
from kernel_helpers import assert_nearly_exact
from mxkernels.moe import swiglu as sw
from mxkernels.core.cost import Cost
from mxkernels.core.errors import InputError
from mxkernels.moe.moe_rows import RowsMoveConfig

SMALL = RowsMoveConfig(block_rows=4, block_bytes=32, num_warps=1)
# The GPU when there is one (the lead's GPU session runs this file), else CPU under the interpreter.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def halves(M, N, seed=0, fused=True, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    if fused:
        return sw.split_halves((torch.randn(M, 2 * N, generator=g) * scale).bfloat16().to(DEV))
    return tuple((torch.randn(M, N, generator=g) * scale).bfloat16().to(DEV) for _ in range(2))


@pytest.mark.parametrize("M,N", [(29, 45), (1, 1), (64, 96)])
@pytest.mark.parametrize("fused", [True, False])
def test_swiglu_matches_reference(poisoned_empty, M, N, fused):
    h1, h3 = halves(M, N, seed=M + N, fused=fused)
    for config in (None, SMALL):
        assert_nearly_exact(sw.swiglu(h1, h3, config=config), sw.swiglu_reference(h1, h3))


@pytest.mark.parametrize("M,N", [(29, 45), (3, 130)])
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("fused", [True, False])
def test_swiglu_backward_matches_reference(poisoned_empty, M, N, packed, fused):
    h1, h3 = halves(M, N, seed=N, fused=fused)
    g = (torch.randn(M, N, generator=torch.Generator().manual_seed(7)) * 2).bfloat16().to(DEV)
    want = sw.swiglu_backward_reference(g, h1, h3, packed=packed)
    for config in (None, SMALL):
        got = sw.swiglu_backward(g, h1, h3, packed=packed, config=config)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_nearly_exact(a, b)


def test_dense_sweep_is_bit_exact_but_for_rare_ulps():
    # Every bf16 h1 of magnitude 2**-8 to 64, both signs, 32 times over against random h3 and g (115k elements):
    # bit-exact here (numpy's exp agrees with torch's on all of them); an fp32 error of a few ulp (an approximate
    # division, an extra rounding) changes ~0.1% of the bf16 outputs, more than the 1e-4 allowed.
    b = torch.arange(0, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    a = b[(b.float().abs() >= 2**-8) & (b.float().abs() < 64)]
    h1 = torch.cat([a, -a]).repeat(32).view(-1, 256).to(DEV)
    g = torch.Generator().manual_seed(0)
    h3, grad = (torch.randn(2, *h1.shape, generator=g) * 2).bfloat16().to(DEV)
    assert_nearly_exact(sw.swiglu(h1, h3), sw.swiglu_reference(h1, h3), min_exact=0.9999)
    for got, want in zip(sw.swiglu_backward(grad, h1, h3), sw.swiglu_backward_reference(grad, h1, h3)):
        assert_nearly_exact(got, want, min_exact=0.9999)


def test_specials():
    # Large |h1| (exp overflows to inf: sigmoid 0 -> -0 products), zeros, infinities and NaN.
    v = torch.tensor([[-100.0, 100.0, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30]], device=DEV)
    h1, h3 = v.bfloat16(), torch.full_like(v, -2.0).bfloat16()
    assert_nearly_exact(sw.swiglu(h1, h3), sw.swiglu_reference(h1, h3), min_exact=1.0)
    g = torch.full_like(v, 0.5).bfloat16()
    for a, b in zip(sw.swiglu_backward(g, h1, h3), sw.swiglu_backward_reference(g, h1, h3)):
        assert_nearly_exact(a, b, min_exact=1.0)


def test_empty():
    h1, h3 = halves(0, 8)
    assert sw.swiglu(h1, h3).shape == (0, 8)
    assert sw.swiglu_backward(h1, h1, h3)[0].shape == (0, 16)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda h1, h3, g: sw.swiglu(h1.float(), h3), "h1 must have dtype bfloat16"),
        (lambda h1, h3, g: sw.swiglu(h1, h3[:, :3]), "one shape"),
        (lambda h1, h3, g: sw.swiglu(h1.t(), h3.t()), "row-major"),
        (lambda h1, h3, g: sw.swiglu_backward(g[:2], h1, h3), "grad_act must be"),
        (lambda h1, h3, g: sw.swiglu_backward(g, h1, h3, packed=1), "packed must be a bool"),
        (lambda h1, h3, g: sw.swiglu(h1, h3, config=SMALL.__dict__), "config"),
    ],
)
def test_bad_input_is_named_before_launch(call, match):
    h1, h3 = halves(4, 8)
    with pytest.raises(InputError, match=match):
        call(h1, h3, torch.zeros(4, 8, dtype=torch.bfloat16, device=DEV))


def test_costs():
    assert sw.swiglu_cost(3, 8) == Cost(2 * 24 * 2, 24 * 2)
    assert sw.swiglu_backward_cost(3, 8) == Cost(3 * 24 * 2, 2 * 24 * 2)
