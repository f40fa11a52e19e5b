"""The layer's forward with its weight stages on a second stream (``stages.overlap.weights_first``): which stages move
and in what order (hand-worked on named stand-ins), and the same y and gradients to the bit as the in-order layer,
on the CPU (where the side results stay NaN until the join, so a stage reading one before the join shows) and on the
GPU (a real second stream, a CUDA graph around it)."""

from types import SimpleNamespace

import pytest
import torch
from mxkernels.autograd.layer import layer_inputs, layer_outputs, moe_layer, weights_of
from mxkernels.stages import overlap
from mxkernels.stages.layer import LayerShape, layer_stages

SMALL = {"T": 36, "K": 64, "N": 64, "E": 4, "top_k": 2, "routing": "skewed"}


def stage(name, inputs, outputs, weights_only=False):
    return SimpleNamespace(name=name, inputs=inputs, outputs=outputs, weights_only=weights_only)


def test_weights_first_moves_the_weight_stages_that_can_start_with_the_pass():
    stages = [
        stage("router", ("x", "wr"), ("logits",)),
        stage("route", ("logits",), ("offs",)),
        stage("up.quantize_w", ("w13",), ("w13_q", "w13_s"), True),
        stage("up.rearrange_w", ("w13_s",), ("w13_sb",), True),  # reads the previous weight stage: moves with it
        stage("up.gemm", ("xs", "w13_q", "w13_sb", "offs"), ("h",)),
        stage("odd.quantize_w", ("w2", "offs"), ("w2_q",), True),  # reads a token stage's output: stays
        stage("down.quantize_w", ("w2",), ("w2_q2",), True),
    ]
    ordered, side = overlap.weights_first(stages, {"x", "wr", "w13", "w2"})
    assert [s.name for s in ordered] == ["up.quantize_w", "up.rearrange_w", "down.quantize_w", "router", "route",
                                         "up.gemm", "odd.quantize_w"]  # fmt: skip
    assert side == {"up.quantize_w", "up.rearrange_w", "down.quantize_w"}
    assert overlap.weights_first(stages[:2], {"x", "wr"}) == (stages[:2], frozenset())


@pytest.mark.parametrize("recipe, config", [("fp8_rowwise", {"fuse": True, "wgrad": "bf16"}),
                                            ("mxfp8", {"fuse": False, "wgrad": "recipe"})])  # fmt: skip
def test_overlapped_layer_is_bit_identical_to_the_layer_in_order(recipe, config, device):
    shape = LayerShape(**SMALL, shared=1, score_before=False)
    inputs = layer_inputs(shape, seed=3, device=device)
    stages = layer_stages(recipe, shape, **config)
    forward = [s for s in stages if s.pass_name == "forward"]
    assert sum(s.weights_only for s in forward) >= 2  # the gate/up and down weights' copies at least
    in_order = layer_outputs(recipe, inputs, shape, stages=stages, overlap_weights=False)
    overlapped = layer_outputs(recipe, inputs, shape, stages=stages)  # the default
    assert set(in_order) == set(overlapped)
    for name in in_order:
        assert torch.equal(in_order[name], overlapped[name]), name
        assert not in_order[name].isnan().any(), name


def test_a_stage_reading_a_weight_copy_before_the_join_shows(monkeypatch):
    # Planted: the main stream never joins the side before a stage reads its results (only at the pass's end): on
    # the CPU the GEMMs then read the NaN stand-ins, as on a GPU they would read copies not yet written.
    shape = LayerShape(**SMALL)
    inputs = layer_inputs(shape, seed=4)
    stages = layer_stages("fp8_rowwise", shape, fuse=True, wgrad="bf16")
    monkeypatch.setattr(overlap, "reads_side", lambda stage, pending: False)
    x = inputs["x"].detach().requires_grad_()
    y = moe_layer(x, weights_of(inputs, shape), shape, "fp8_rowwise", assign=inputs["assign"], stages=stages)
    assert y.isnan().any()


@pytest.mark.gpu
def test_gpu_overlapped_layer_in_a_cuda_graph_is_bit_identical():
    shape = LayerShape(T=4096, K=2048, N=768, E=64, top_k=4, routing="skewed")
    inputs = layer_inputs(shape, seed=6, device="cuda")
    stages = layer_stages("fp8_rowwise", shape, fuse=True, wgrad="bf16")
    in_order = layer_outputs("fp8_rowwise", inputs, shape, stages=stages, overlap_weights=False)
    x = inputs["x"].detach().requires_grad_()
    weights = {n: w.detach().requires_grad_() for n, w in weights_of(inputs, shape).items()}

    def step():
        y = moe_layer(x, weights, shape, "fp8_rowwise", assign=inputs["assign"], stages=stages)
        return torch.autograd.grad(y, [x, *weights.values()], inputs["dy"])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    expected = {"x": in_order["grad_x"], "wr": in_order["grad_wr"], "w2": in_order["grad_w2"],
                "w13": torch.cat([in_order["grad_w1"], in_order["grad_w3"]], dim=1)}  # fmt: skip
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for name, grad in zip(["x", *weights], grads, strict=True):
            assert torch.equal(grad, expected[name]), name
