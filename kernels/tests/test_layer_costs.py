"""The MoE layer's movement stages declare DRAM bytes (``core.cost``): at Qwen3-30B-A3B (K 2048, N 768, 128
experts, top-8, 16384 tokens), the byte counts of every gather and combine, worked by hand from the layer's
tensors. A token routed to top_k experts is gathered top_k times; its row comes from DRAM once, the other
top_k - 1 reads are ``bytes_reread`` (L2's to serve), never ``bytes_read``."""

import pytest
from mxkernels.core.cost import Cost
from mxkernels.stages.layer import LayerShape, layer_stages

T, K, N, E, TOP_K = 16384, 2048, 768, 128, 8
S = T * TOP_K  # routed copies
BF16, INDEX, WEIGHT, FP32 = 2, 4, 4, 4


def _stages(recipe, score_before, fuse=False):
    shape = LayerShape(T, K, N, E, TOP_K, score_before=score_before)
    return shape.rows(recipe), {s.name: s.cost for s in layer_stages(recipe, shape, fuse=fuse)}


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "fp8_rowwise"])
@pytest.mark.parametrize("score_before", [True, False])
def test_movement_stages_count_each_row_once(recipe, score_before):
    rows, cost = _stages(recipe, score_before)
    row = K * BF16
    reread = (S - T) * row  # the top_k - 1 further gathers of every token row
    # permute: x's T rows once, the index of every padded row (and its weight when the scores go first), write all
    assert cost["permute"] == Cost(T * row + rows * (INDEX + WEIGHT * score_before), rows * row, bytes_reread=reread)
    # combine: the S copy rows of the expert outputs, each a row of its own (dest is one-to-one); T rows out
    assert cost["combine"] == Cost(S * (row + INDEX + WEIGHT * (not score_before)), T * row)
    # combine_grad: dy's T rows once into every padded row, as the permute
    assert cost["combine_grad"] == Cost(T * row + rows * (INDEX + WEIGHT * (not score_before)), rows * row,
                                        bytes_reread=reread)  # fmt: skip
    # permute_grad: the S copy rows of grad_xs, each its own; T rows out
    assert cost["permute_grad"] == Cost(S * (row + INDEX + WEIGHT * score_before), T * row)
    # the score gradient: per copy its own row and two indices, the T token rows (x or dy) once; an fp32 a copy
    score_grad = "permute_score_grad" if score_before else "combine_score_grad"
    assert cost[score_grad] == Cost(S * (row + 2 * INDEX) + T * row, S * FP32, bytes_reread=reread)


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_fused_gathers_read_each_token_row_once(recipe):
    rows, cost = _stages(recipe, True, fuse=True)
    for name in ("permute_quantize", "combine_grad_quantize"):
        weighted = name == "permute_quantize"
        assert cost[name].bytes_read == T * K * BF16 + rows * (INDEX + WEIGHT * weighted), name
        assert cost[name].bytes_reread == (S - T) * K * BF16, name
