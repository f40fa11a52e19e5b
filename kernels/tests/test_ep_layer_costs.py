"""The expert-parallel layer's (and step's) row gathers declare DRAM bytes (``core.cost``), worked by hand on one
small rank: T = 4 tokens of K = 32 (a bf16 row is 64 bytes), top-2, so S = 8 copies gathered from 4 token rows.
Each token row comes from DRAM once; its second read is ``bytes_reread`` (L2's to serve), never ``bytes_read``."""

import pytest
from mxkernels.core.cost import Cost
from mxkernels.stages import ep_layer, ep_stages

T, K, N, E, TOP_K, WORLD = 4, 32, 32, 2, 2, 2
S = T * TOP_K  # 8 copies this rank sends
ROW = K * 2  # 64 bytes: one bf16 token row
INDEX = WEIGHT = FP32 = 4
EVEN = ((2, 2), (2, 2))  # 2 copies to each local expert of each rank; as many received


def _ep(top_k=TOP_K):
    return ep_stages.EPShape(T=T, K=K, N=N, E=E, top_k=top_k, rank=0, world=WORLD, send_counts=EVEN,
                             recv_counts=EVEN)  # fmt: skip


def _layer(score_before):
    shape = ep_layer.EPLayerShape(_ep(), score_before=score_before)
    return {s.name: s.cost for s in ep_layer.ep_layer_stages("bf16", shape)}


@pytest.mark.parametrize("score_before", [True, False])
def test_layer_token_sorts_read_each_token_row_once(score_before):
    cost = _layer(score_before)
    # sort_tokens: x's 4 rows (256 bytes) once, token_of's 8 int32 (32), row_w's 8 fp32 (32) when it scores;
    # writes the 8 copies (512); the second copy of each of the 4 tokens re-reads its row (256)
    scored = 32 if score_before else 0
    assert cost["sort_tokens"] == Cost(256 + 32 + scored, 512, bytes_reread=256)
    # sort_grad: dy's 4 rows once, the same index, row_w when the scores come last
    assert cost["sort_grad"] == Cost(256 + 32 + (32 - scored), 512, bytes_reread=256)


@pytest.mark.parametrize("score_before", [True, False])
def test_layer_score_gradient_reads_each_token_row_once(score_before):
    name = "permute_score_grad" if score_before else "combine_score_grad"
    cost = _layer(score_before)[name]
    # the 8 copies' own rows (512) and two int32 indices each (64), the 4 token rows (x or dy) once (256);
    # one fp32 per copy out (32); each token row's second read is a re-read (256)
    assert cost == Cost(512 + 64 + 256, 32, bytes_reread=256)


def test_layer_one_to_one_gathers_reread_nothing():
    cost = _layer(True)
    # the scores sorted: 8 fp32 and 8 int32 read, 8 fp32 written; every score read once (order is a permutation)
    assert cost["sort_scores"] == Cost(8 * 4 + 8 * 4, 8 * 4)
    # the combine: the 8 received copies (each its own row) with index and score (score_before=False only), 4 out
    assert cost["unsort_combine"] == Cost(8 * (ROW + INDEX), 4 * ROW)
    assert all(c.bytes_reread == 0 for n, c in cost.items() if n not in ("sort_tokens", "sort_grad",
                                                                      "permute_score_grad"))  # fmt: skip


def test_step_token_sort_reads_each_token_row_once():
    cost = {s.name: s.cost for s in ep_stages.ep_step_stages("bf16", _ep())}
    # x's 4 rows once, token_of's 8 int32; the 8 copies written; 4 re-reads
    assert cost["sort_tokens"] == Cost(256 + 32, 512, bytes_reread=256)
    # the gradient's sort is by ``order`` over dy's 8 copy rows (N = 32 wide, 64 bytes): a permutation, no re-read
    assert cost["sort_grad"] == Cost(8 * (64 + INDEX), 8 * 64)


def test_step_quantized_token_sort_reads_each_token_row_once():
    cost = {s.name: s.cost for s in ep_stages.ep_step_stages("mxfp8_a2a", _ep())}
    # the rows are quantized before the sort (T rows), then sorted as e4m3 rows of 32 bytes and one e8m0 scale a
    # row: each of the 4 tokens once (4 * 33), two int32 indices per copy (one per tensor, 8 * 2 * 4); 8 copies
    # written (8 * 33); 4 re-reads (4 * 33)
    assert cost["sort_tokens"] == Cost(4 * 33 + 8 * 2 * INDEX, 8 * 33, bytes_reread=4 * 33)
