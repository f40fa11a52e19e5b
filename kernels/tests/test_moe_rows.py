"""The MoE layer's row movements (``moe_rows``): the Triton kernels against the plain-torch references on random
data of odd sizes, padding (-1) entries, top_k 1 to 8, with and without weights, special values, every output byte
written (poisoned allocations); argument checks before any launch; costs."""

import pytest
import torch
from kernel_helpers import assert_bits_equal
from mxkernels.moe import moe_rows as mr
from mxkernels.core.cost import Cost
from mxkernels.core.errors import InputError
from mxkernels.moe.moe_rows import RowsMoveConfig

SMALL = RowsMoveConfig(block_rows=4, block_bytes=64, num_warps=1)  # several column tiles and a ragged last one
# The GPU when there is one (the lead's GPU session runs this file), else CPU under the interpreter.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rows(T, D, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, D, generator=g) * scale).bfloat16().to(DEV)


def indices(n, lo, hi, seed=0):
    return torch.randint(lo, hi, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32).to(DEV)


def weights(n, seed=0):
    return (torch.randn(n, generator=torch.Generator().manual_seed(seed + 1)) * 2).to(DEV)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("T,D,R,config", [(37, 70, 53, None), (5, 33, 9, SMALL), (1, 1, 3, None), (16, 96, 40, SMALL)])
def test_gather_weighted_matches_reference(poisoned_empty, weighted, T, D, R, config):
    x = rows(T, D)
    src = indices(R, -1, T, seed=R)
    src[::4] = -1  # padding slots for sure
    w = weights(R) if weighted else None
    assert_bits_equal(mr.gather_weighted(x, src, w, config=config), mr.gather_weighted_reference(x, src, w))


def test_gather_specials():
    # NaN payloads and -0 copy bit for bit; a padding row is +0 whatever its weight (NaN, -inf, negative); a
    # weighted -0 stays -0; a product that overflows bf16 rounds to inf. (A weighted NaN's bits are not compared:
    # torch's CPU and CUDA casts write different NaNs.)
    x = torch.tensor([[float("nan"), -0.0, 3.0e38, -1.0], [1.0, 2.0, -3.0, 0.5]], dtype=torch.bfloat16, device=DEV)
    x.view(torch.int16)[0, 0] = 0x7FC5  # a NaN with a payload
    src = torch.tensor([0, -1, 1, -1, 0], dtype=torch.int32, device=DEV)
    w = torch.tensor([2.0, float("nan"), -0.5, -3.0, 1.0], device=DEV)
    assert_bits_equal(mr.gather_weighted(x, src), mr.gather_weighted_reference(x, src))
    x[0, 0] = 7.0
    out = mr.gather_weighted(x, src, w)
    assert_bits_equal(out, mr.gather_weighted_reference(x, src, w))
    assert torch.equal(out.view(torch.int16)[1], torch.zeros(4, dtype=torch.int16, device=DEV))


@pytest.mark.parametrize("top_k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("weighted", [False, True])
def test_combine_rows_matches_reference(poisoned_empty, top_k, weighted):
    T, R, D = 7, 23, 45
    y = rows(R, D, seed=top_k, scale=4.0)
    dest = indices(T * top_k, 0, R, seed=top_k)
    w = weights(T * top_k, seed=top_k) if weighted else None
    for config in (None, SMALL):
        got = mr.combine_rows(y, dest, w, top_k, config=config)
        assert_bits_equal(got, mr.combine_rows_reference(y, dest, w, top_k))


def test_combine_rows_sums_in_order_from_the_first_term():
    # fp32 addition is not associative: (2**24 + 1) + 1 != 2**24 + (1 + 1) would show an order change; bf16 can't
    # hold 2**24 + 1, so use weights. And -0 + -0 is -0 (a sum started from +0 would give +0).
    y = torch.tensor([[1.0, -0.0], [1.0, -0.0], [1.0, -0.0]], dtype=torch.bfloat16, device=DEV)
    dest = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
    w = torch.tensor([2.0**24, 1.0, 1.0], device=DEV)
    out = mr.combine_rows(y, dest, w, 3)
    assert_bits_equal(out, mr.combine_rows_reference(y, dest, w, 3))
    assert out[0, 0].item() == 2.0**24 and out.view(torch.int16)[0, 1].item() == -32768


def test_row_dot_matches_reference(poisoned_empty):
    a, b = rows(13, 300, seed=1), rows(9, 300, seed=2)
    ar, br = indices(21, 0, 13, seed=3), indices(21, 0, 9, seed=4)
    want = mr.row_dot_reference(a, ar, b, br)
    for config in (None, SMALL):
        got = mr.row_dot(a, ar, b, br, config=config)
        # Only the order of the fp32 sum differs: within a few ulp of the sum of |products|.
        bound = (a.index_select(0, ar.long()).float() * b.index_select(0, br.long()).float()).abs().sum(1)
        assert torch.all((got - want).abs() <= bound * 2**-20)
    assert mr.row_dot(a, ar[:0], b, br[:0]).shape == (0,)


def test_empty_outputs():
    x = rows(4, 8)
    assert mr.gather_weighted(x, indices(0, 0, 4)).shape == (0, 8)
    assert mr.combine_rows(x[:, :0], indices(6, 0, 4), None, 2).shape == (3, 0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, i: mr.gather_weighted(x.float(), i), "x must have dtype bfloat16"),
        (lambda x, i: mr.gather_weighted(x, i.long()), "src must have dtype int32"),
        (lambda x, i: mr.gather_weighted(x, i, torch.ones(3, device=DEV)), "weight must hold one value per entry"),
        (lambda x, i: mr.gather_weighted(x, i, torch.ones(4, dtype=torch.float64, device=DEV)), "must have dtype"),
        (lambda x, i: mr.gather_weighted(x, i, config=(8, 4096, 8)), "config"),
        (lambda x, i: mr.combine_rows(x, i, None, 3), "top_k must be a positive int dividing"),
        (lambda x, i: mr.combine_rows(x, i, None, True), "top_k must be a positive int dividing"),
        (lambda x, i: mr.row_dot(x, i, x[:, :3].contiguous(), i), "must share D"),
        (lambda x, i: RowsMoveConfig(block_rows=3), "RowsMoveConfig.block_rows"),
    ],
)
def test_bad_input_is_named_before_launch(call, match):
    with pytest.raises(InputError, match=match):
        call(rows(4, 8), indices(4, 0, 4))


def test_costs():
    assert mr.gather_weighted_cost(10, 64, 8, weighted=True) == Cost(8 * 64 * 2 + 10 * 8, 10 * 64 * 2)
    assert mr.combine_rows_cost(4, 64, 2, weighted=False) == Cost(4 * 2 * (128 + 4), 4 * 128)
    assert mr.row_dot_cost(5, 64) == Cost(5 * (256 + 8), 20)


def test_costs_count_a_source_row_once_from_dram():
    """8 copies of 4 tokens (top-2) into 10 padded rows of 64: each token's row is read once from DRAM (4 * 128
    bytes), its second copy is a re-read (4 * 128); the index and weights of all 10 rows; 10 rows written."""
    assert mr.gather_weighted_cost(10, 64, 8, weighted=True, sources=4) == Cost(
        4 * 128 + 10 * (4 + 4), 10 * 128, bytes_reread=4 * 128)
    # more sources than copies (tokens some copy skips): never more rows than the copies read
    assert mr.gather_weighted_cost(10, 64, 8, weighted=False, sources=20) == Cost(8 * 128 + 10 * 4, 10 * 128)
    # row_dot of 8 pairs (a copy's own row, its token's row among 4): 8 a rows, 4 b rows, 2 indices a pair
    assert mr.row_dot_cost(8, 64, b_sources=4) == Cost(8 * 128 + 4 * 128 + 8 * 8, 8 * 4, bytes_reread=4 * 128)
