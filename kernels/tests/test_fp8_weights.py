"""Specification of both FP8 rowwise copies of the experts' weights from one launch (kernels/quant/fp8_weights.py).

The oracle: the first two outputs are ``quantize_fp8_rowwise_3d(w, along="K")``'s, the last two ``(w, along="N")``'s,
each checked byte for byte against the plain-torch reference and against those unfused kernels. The shapes put N off
the rows items' span, the chunks and 16 rows, K off a power of two and off the strips; the planted values put a
column's amax in an expert's last row and a row's in its last column. The ``gpu`` tests repeat it at Qwen3-30B-A3B's
and gpt-oss-120b's weights, several times (a chunk item that reads the amax table before its expert's rows items
are all counted differs from run to run).
"""

import pytest
import torch
from mxkernels.core.errors import InputError
from mxkernels.quant import fp8_rowwise as F
from mxkernels.quant import fp8_weights as W

BF16 = torch.bfloat16
B = W.BothConfig
SMALL = B(row_span=16, chunk_rows=16, strip_cols=16, step_rows=16)


def assert_same(got, ref):
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        assert g.shape == r.shape and g.dtype == r.dtype, (i, g.shape, r.shape, g.dtype, r.dtype)
        g, r = (g.view(torch.uint8), r.view(torch.uint8)) if g.dtype.itemsize == 1 else (g, r)
        assert torch.equal(g, r), f"output {i}: {(g != r).sum().item()} of {g.numel()} elements differ"


def weights(shape, seed, dtype=BF16, device="cpu"):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.5
    G, N, K = shape
    # Each expert's largest |value| in its last row (a column's amax) and its last column (a row's), and one
    # all-zero column (the amax floor).
    w[:, N - 1, K // 3] = torch.arange(1, G + 1) * 7.0
    w[:, N // 2, K - 1] = -torch.arange(1, G + 1) * 5.0
    w[:, :, K // 2] = 0.0
    return w.to(dtype).to(device)


def test_reference_is_both_unfused_references_hand_worked():
    w = torch.tensor([[[1.0, -4.0], [2.0, 0.5]]])  # one expert, N = K = 2
    qk, sk, qn, sn = W.quantize_fp8_rowwise_3d_both_reference(w)
    # Along K (rows): amax 4 and 2 -> scales 4/448, 2/448; along N (columns): amax 2 and 4.
    assert sk[0].tolist() == pytest.approx([4 / 448, 2 / 448], rel=1e-7)
    assert qk.float().tolist() == [[[112.0, -448.0], [448.0, 112.0]]]
    assert sn[0].tolist() == pytest.approx([2 / 448, 4 / 448], rel=1e-7)
    assert qn.float().tolist() == [[[224.0, 448.0], [-448.0, 56.0]]]


@pytest.mark.parametrize(
    "shape,config",
    [
        ((3, 40, 24), SMALL),  # N off the span and chunk, K off the strip and a power of two
        ((2, 33, 70), B(row_span=8, chunk_rows=16, strip_cols=16, step_rows=16, lag=2)),  # N off 16 rows, lag 2
        ((4, 96, 48), B(row_span=32, block_rows=8, chunk_rows=32, strip_cols=32, step_rows=16, lag=0)),  # lag 0
        ((2, 64, 128), None),  # every tile divides (the unmasked rows), the default launch
    ],
)
def test_both_match_reference_and_unfused(device, shape, config):
    w = weights(shape, sum(shape), device=device)
    got = W.quantize_fp8_rowwise_3d_both(w, config=config)
    assert_same(got, W.quantize_fp8_rowwise_3d_both_reference(w))
    assert_same(got, (*F.quantize_fp8_rowwise_3d(w, along="K"), *F.quantize_fp8_rowwise_3d(w, along="N")))


def test_fp32_input_and_empty_weights(device):
    w = weights((2, 20, 40), 5, torch.float32, device)
    assert_same(W.quantize_fp8_rowwise_3d_both(w, config=SMALL), W.quantize_fp8_rowwise_3d_both_reference(w))
    empty = W.quantize_fp8_rowwise_3d_both(torch.zeros(0, 16, 32, dtype=BF16, device=device))
    assert [tuple(t.shape) for t in empty] == [(0, 16, 32), (0, 16), (0, 32, 16), (0, 32)]


def test_refusals_before_any_launch():
    w = torch.zeros(2, 16, 32, dtype=BF16)
    with pytest.raises(InputError, match="longer than"):
        W.quantize_fp8_rowwise_3d_both(torch.zeros(1, 1, W.MAX_COLS + 1, dtype=BF16))
    with pytest.raises(InputError, match="experts"):
        W.quantize_fp8_rowwise_3d_both(torch.zeros(1025, 1, 16, dtype=BF16))
    with pytest.raises(InputError):
        W.quantize_fp8_rowwise_3d_both(w.to(torch.float16))
    with pytest.raises(InputError):
        W.quantize_fp8_rowwise_3d_both(w, config=F.Fp8RowwiseConfig(4, 32))
    for bad in ({"row_span": 48}, {"block_rows": 128, "row_span": 64}, {"lag": 9}, {"prefetch": 1}, {"num_warps": 3}):
        with pytest.raises(InputError):
            B(**bad)


def test_fits_l2_hand_worked():
    # (lag + 1) experts x N x K x (2 bytes read + 2 written) against half the L2.
    assert W.fits_l2(1536, 2048, BF16, 60 * 2**20, B(lag=1))  # 2 x 12.6 MB = 25.2 MB <= 30 MB
    assert not W.fits_l2(5760, 2880, BF16, 60 * 2**20, B(lag=1))  # 132.7 MB
    assert not W.fits_l2(1536, 2048, BF16, 60 * 2**20, B(lag=2))  # 37.7 MB
    assert W.fits_l2(1536, 2048, BF16, 60 * 2**20, B(lag=0))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 1536, 2048), (128, 2048, 768), (16, 2880, 2880)])
def test_gpu_both_bit_exact_at_fine_grained_weights(shape):
    w = weights(shape, 1, device="cuda")
    ref = W.quantize_fp8_rowwise_3d_both_reference(w)
    for config in (None, B(lag=0), None, None):
        assert_same(W.quantize_fp8_rowwise_3d_both(w, config=config), ref)
