"""Specification of the router's weight gradient split along the tokens (kernels/mxkernels/moe/gate_grad.py).

The oracle is ``gate_weight_grad_reference`` (fp64, rounded once). Under the interpreter small integer-valued
operands make every product and partial sum exact in fp32, so the kernel must equal the oracle bit for bit, with
token counts that end inside a step, E and K off the tiles, one split and several, strided operands, and every
output element written (poisoned allocations). On the GPU (marker ``gpu``): the layers' shapes against the fp64
oracle, at least as close as torch's ``mm``, and captured in a CUDA graph.
"""

import pytest
import torch
from mxkernels.core.runtime import InputError
from mxkernels.moe import gate_grad as GR
from mxkernels.moe import router


def _ints(gen, *shape, device="cpu"):
    return torch.randint(-4, 5, shape, generator=gen).to(device=device, dtype=torch.bfloat16)


def _operands(T, E, K, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return _ints(gen, T, E, device=device), _ints(gen, T, K, device=device)


@pytest.mark.parametrize("T,E,K", [(300, 8, 80), (77, 3, 48), (130, 20, 32), (64, 130, 40), (1, 1, 16)])
def test_exact_on_integers_with_shapes_off_the_tiles(T, E, K, poisoned_empty):
    g, x = _operands(T, E, K)
    assert torch.equal(GR.gate_weight_grad(g, x), GR.gate_weight_grad_reference(g, x))


@pytest.mark.parametrize("max_splits", [1, 2, None], ids=["one-split", "two", "many"])
def test_one_split_or_many_give_the_same_sums(max_splits, poisoned_empty):
    g, x = _operands(300, 8, 80, seed=1)
    config = GR.GateGradConfig(block_t=16, block_k=32, num_warps=4, num_stages=1, programs_per_sm=2,
                               max_splits=max_splits)  # fmt: skip
    splits = GR._launch(300, 8, 80, config, x.device)[1]
    assert splits == (max_splits or splits) and (max_splits is not None or splits > 2)
    assert torch.equal(GR.gate_weight_grad(g, x, config=config), GR.gate_weight_grad_reference(g, x))


def test_strided_operands():
    """grad_logits as a transposed (E, T) buffer, x as every other column of a wider one."""
    g, x = _operands(200, 8, 96, seed=2)
    g_t = g.t().contiguous().t()
    x_wide = torch.zeros(200, 192, dtype=torch.bfloat16)
    x_wide[:, ::2] = x
    assert torch.equal(GR.gate_weight_grad(g_t, x_wide[:, ::2]), GR.gate_weight_grad_reference(g, x))


def test_no_tokens_and_empty_outputs():
    g, x = _operands(0, 8, 32)
    assert torch.equal(GR.gate_weight_grad(g, x), torch.zeros(8, 32, dtype=torch.bfloat16))
    g, x = _operands(40, 0, 32)
    assert GR.gate_weight_grad(g, x).shape == (0, 32)


def test_bad_input_is_refused_before_any_launch():
    g, x = _operands(40, 8, 32)
    with pytest.raises(InputError, match="x must be"):
        GR.gate_weight_grad(g, x[:39])
    with pytest.raises(InputError, match="grad_logits must have dtype"):
        GR.gate_weight_grad(g.float(), x)
    with pytest.raises(InputError, match="GateGradConfig"):
        GR.gate_weight_grad(g, x, config="fast")
    with pytest.raises(InputError, match="block_t"):
        GR.GateGradConfig(block_t=24)


def test_the_router_stage_uses_it_and_matches_its_oracle(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    T, E, K = 96, 8, 64
    g, x, wr, other = _ints(gen, T, E), _ints(gen, T, K), _ints(gen, E, K), _ints(gen, T, K)
    calls = []
    monkeypatch.setattr(router, "gate_weight_grad", lambda *a: calls.append(a) or GR.gate_weight_grad(*a))
    got = router.router_gate_grad(g, x, wr, other)
    assert len(calls) == 1 and calls[0][0] is g and calls[0][1] is x
    want = router.router_gate_grad_reference(g, x, wr, other)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_cost_counts_each_input_once():
    cost = GR.gate_weight_grad_cost(131072, 7168, 8)
    assert (cost.bytes_read, cost.bytes_written) == (131072 * 8 * 2 + 131072 * 7168 * 2, 8 * 7168 * 2)
    assert cost.flops == 2 * 131072 * 8 * 7168


# ---- on the GPU ----------------------------------------------------------------------------------------------------


def _sqnr(x, ref):
    x, ref = x.double(), ref.double()
    return (10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum())).item()


@pytest.mark.gpu
@pytest.mark.parametrize("T,E,K", [(131072, 8, 7168), (16384, 128, 2048), (32768, 128, 2880), (8192, 384, 7168)],
                         ids=["deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b", "kimi-k2-like"])  # fmt: skip
def test_gpu_layer_shapes_at_least_as_close_as_torchs_mm_and_graph_captured(T, E, K):
    gen = torch.Generator(device="cuda").manual_seed(0)
    g = (torch.randn(T, E, device="cuda", generator=gen) * 1e-3).bfloat16()
    x = torch.randn(T, K, device="cuda", generator=gen).bfloat16()
    ref = g.double().t() @ x.double()
    ours = GR.gate_weight_grad(g, x)
    assert _sqnr(ours, ref) >= _sqnr(torch.mm(g.t(), x), ref) - 0.05
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = GR.gate_weight_grad(g, x)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, ours)  # deterministic: the partials summed in split order

