"""Specification of the router gate's token gradient (kernels/mxkernels/moe/gate_grad.py) and of the router stage
that runs it (``router.router_gate_grad``: grad_x by ``token_grad``, grad_wr by ``torch.mm``).

The oracle is ``token_grad_reference`` (fp64, rounded once). Under the interpreter small integer-valued operands
make every product and partial sum exact in fp32, so the kernel must equal the oracle bit for bit: with and without
the added grad_x_in, E under 16 (padded) and over, T and K off the tiles, several row blocks a program, strided
operands, and every output element written (poisoned allocations). Cross-compiled for SM90 (the GPU's tensor-core
path, E = 8 and 128). On the GPU (marker ``gpu``): the layers' shapes against the fp64 oracle, at least as close as
``torch.addmm``, exact on integers, and captured in a CUDA graph.
"""

import pytest
import torch
from crosscompile import compile_ptx
from mxkernels.core.runtime import InputError
from mxkernels.moe import gate_grad as GR
from mxkernels.moe import router


def _ints(gen, *shape, device="cpu"):
    return torch.randint(-4, 5, shape, generator=gen).to(device=device, dtype=torch.bfloat16)


def _operands(T, E, K, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return _ints(gen, T, E, device=device), _ints(gen, E, K, device=device), _ints(gen, T, K, device=device)


# (T, E, K): E under 16 (padded to 16), at 16, over 16 and not a power of two; T and K off the 16 x 32 tiles.
SHAPES = [(300, 8, 80), (77, 3, 48), (130, 20, 32), (64, 130, 40), (1, 1, 16), (50, 16, 100)]


@pytest.mark.parametrize("T,E,K", SHAPES)
@pytest.mark.parametrize("add", [True, False], ids=["adds", "alone"])
def test_exact_on_integers_with_shapes_off_the_tiles(T, E, K, add, poisoned_empty):
    g, w, x_in = _operands(T, E, K)
    x_in = x_in if add else None
    assert torch.equal(GR.token_grad(g, w, x_in), GR.token_grad_reference(g, w, x_in))


def test_rounds_once_like_addmm():
    """An exact fp32 sum that bf16 cannot hold rounds once, to nearest even: 256 + 1 (from the product) + 0.5 (added)
    is 257.5 -> 258; rounding the product first (257 -> 256) and then adding would give 256."""
    g = torch.tensor([[1.0, 1.0]], dtype=torch.bfloat16)
    w = torch.tensor([[256.0], [1.0]], dtype=torch.bfloat16)
    x_in = torch.tensor([[0.5]], dtype=torch.bfloat16)
    assert GR.token_grad(g, w, x_in).item() == 258.0
    assert GR.token_grad_reference(g, w, x_in).item() == 258.0


def test_several_row_blocks_a_program_and_one():
    """The interpreter launch (16-row blocks, one program an SM's worth along T) walks many row blocks a program;
    a launch with more programs than row blocks gives each at most one."""
    g, w, x_in = _operands(700, 8, 64, seed=1)
    block_e, slices, along_t = GR._launch(700, 8, 64, GR._INTERPRETER_CONFIG, g.device)
    assert (block_e, slices) == (16, 2) and along_t < GR.triton.cdiv(700, 16)
    assert torch.equal(GR.token_grad(g, w, x_in), GR.token_grad_reference(g, w, x_in))
    many = GR.TokenGradConfig(block_t=16, block_k=32, num_stages=1, programs_per_sm=10_000)
    assert GR._launch(700, 8, 64, many, g.device)[2] == GR.triton.cdiv(700, 16)
    assert torch.equal(GR.token_grad(g, w, x_in, config=many), GR.token_grad_reference(g, w, x_in))


def test_strided_operands():
    """grad_logits as a transposed (E, T) buffer, wr as every other column of a wider one, grad_x_in transposed."""
    g, w, x_in = _operands(200, 8, 96, seed=2)
    w_wide = torch.zeros(8, 192, dtype=torch.bfloat16)
    w_wide[:, ::2] = w
    got = GR.token_grad(g.t().contiguous().t(), w_wide[:, ::2], x_in.t().contiguous().t())
    assert torch.equal(got, GR.token_grad_reference(g, w, x_in))


def test_no_tokens_no_columns_no_experts():
    g, w, x_in = _operands(0, 8, 32)
    assert GR.token_grad(g, w, x_in).shape == (0, 32)
    g, w, x_in = _operands(40, 8, 0)
    assert GR.token_grad(g, w, x_in).shape == (40, 0)
    g, w, x_in = _operands(40, 0, 32)
    assert torch.equal(GR.token_grad(g, w, x_in), x_in) and torch.equal(GR.token_grad(g, w), torch.zeros(40, 32).bfloat16())


def test_bad_input_is_refused_before_any_launch():
    g, w, x_in = _operands(40, 8, 32)
    with pytest.raises(InputError, match="wr must be"):
        GR.token_grad(g, w[:7])
    with pytest.raises(InputError, match="grad_x_in must be"):
        GR.token_grad(g, w, x_in[:39])
    with pytest.raises(InputError, match="grad_logits must have dtype"):
        GR.token_grad(g.float(), w)
    with pytest.raises(InputError, match="at most 256"):
        GR.token_grad(torch.zeros(4, 257, dtype=torch.bfloat16), torch.zeros(257, 16, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="TokenGradConfig"):
        GR.token_grad(g, w, config="fast")
    with pytest.raises(InputError, match="block_t"):
        GR.TokenGradConfig(block_t=24)


def test_the_router_stage_runs_it_and_torchs_mm_and_matches_its_oracle(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    T, E, K = 96, 8, 64
    g, x, wr, other, more = _ints(gen, T, E), _ints(gen, T, K), _ints(gen, E, K), _ints(gen, T, K), _ints(gen, T, K)
    calls = []
    monkeypatch.setattr(router, "token_grad", lambda *a: calls.append(a) or GR.token_grad(*a))
    got = router.router_gate_grad(g, x, wr, other, more)
    assert len(calls) == 1 and calls[0][0] is g and calls[0][1] is wr and calls[0][2] is other
    want = router.router_gate_grad_reference(g, x, wr, other, more)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    got = router.router_gate_grad(g, x, wr)  # no other path: grad_x is the product alone
    assert torch.equal(got[0], GR.token_grad_reference(g, wr)) and torch.equal(got[1], want[1])


def test_cost_counts_each_tensor_once():
    cost = GR.token_grad_cost(131072, 7168, 8, add=True)
    assert (cost.bytes_read, cost.bytes_written) == (131072 * 8 * 2 + 8 * 7168 * 2 + 131072 * 7168 * 2,
                                                     131072 * 7168 * 2)  # fmt: skip
    assert cost.flops == 2 * 131072 * 8 * 7168
    assert GR.token_grad_cost(131072, 7168, 8, add=False).bytes_read == 131072 * 8 * 2 + 8 * 7168 * 2


@pytest.mark.parametrize("E,has_add", [(8, True), (128, False)])
def test_cross_compiles_for_sm90_with_the_tensor_core(E, has_add):
    signature = {n: "*bf16" for n in ("g_ptr", "w_ptr", "add_ptr", "out_ptr")}
    signature |= {n: "i32" for n in ("T", "E", "K", "s_gt", "s_ge", "s_we", "s_wk", "s_at", "s_ak", "s_ot", "s_ok")}
    constexprs = {"HAS_ADD": has_add, "BLOCK_T": 64, "BLOCK_E": max(E, 16), "BLOCK_K": 128, "STAGES": 3, "EXACT": False}
    signature |= {n: "constexpr" for n in constexprs}
    aligned = ("g_ptr", "w_ptr", "add_ptr", "out_ptr", "K", "s_we", "s_at", "s_ot")
    ptx = compile_ptx("mxkernels.moe.gate_grad", "_token_grad_kernel", signature, constexprs, cc=90, aligned=aligned,
                      options={"num_warps": 4})  # fmt: skip
    assert ".entry _token_grad_kernel" in ptx and ("mma" in ptx) and "st.global" in ptx
    assert ("cvt.rn.bf16" in ptx) or ("cvt.rn.bf16x2" in ptx)  # one rounding, to nearest even


# ---- on the GPU ----------------------------------------------------------------------------------------------------


def _sqnr(x, ref):
    x, ref = x.double(), ref.double()
    return (10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum())).item()


@pytest.mark.gpu
@pytest.mark.parametrize("T,E,K", [(131072, 8, 7168), (16384, 128, 2048), (32768, 128, 2880), (16384, 64, 2048),
                                   (4096, 256, 7168), (1000, 3, 130)],
                         ids=["deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v2-lite", "256-experts",
                              "ragged"])  # fmt: skip
def test_gpu_layer_shapes_at_least_as_close_as_addmm_exact_on_integers_and_graph_captured(T, E, K):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    gen = torch.Generator(device="cuda").manual_seed(0)
    g = (torch.randn(T, E, device="cuda", generator=gen) * 1e-3).bfloat16()
    wr = (torch.randn(E, K, device="cuda", generator=gen) * 0.02).bfloat16()
    x_in = (torch.randn(T, K, device="cuda", generator=gen) * 1e-5).bfloat16()
    ref = g.double() @ wr.double() + x_in.double()
    ours = GR.token_grad(g, wr, x_in)
    assert _sqnr(ours, ref) >= _sqnr(torch.addmm(x_in, g, wr), ref) - 0.05
    gi, wi, xi = _operands(min(T, 16384), E, K, seed=4, device="cuda")
    assert torch.equal(GR.token_grad(gi, wi, xi), GR.token_grad_reference(gi, wi, xi))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = GR.token_grad(g, wr, x_in)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, ours)
