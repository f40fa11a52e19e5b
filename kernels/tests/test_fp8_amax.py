"""Specification of the FP8 rowwise quantizers that share one amax pass (kernels/fp8_amax.py).

The oracle: the first quantizer's outputs are ``quantize_fp8_rowwise``'s, plus amax[g, c] = max |x[m, c]| over
group g's rows (0 for an empty group, rows past offs[-1] in no group); the second quantizer's are
``quantize_fp8_rowwise_k_groups`` / ``quantize_fp8_rowwise_3d(along="N")``'s with the scales taken from the amax
given. Checked against hand-worked values, the plain-torch references and the unfused kernels, byte for byte; the
``gpu`` test repeats it at DeepSeek-V3 width.
"""

import pytest
import torch
from kernel_helpers import offsets
from mxkernels.quant import fp8_amax as A
from mxkernels.quant import fp8_rowwise as F
from mxkernels.autograd.projection import fp8_rowwise_grouped_mm
from mxkernels.core.cost import Cost
from mxkernels.core.errors import InputError
from mxkernels.stages.pipeline import make_inputs, run_stages, step_stages

E4M3 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def assert_same(got, ref):
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        assert g.shape == r.shape and g.dtype == r.dtype, (i, g.shape, r.shape, g.dtype, r.dtype)
        g, r = (g.view(torch.uint8), r.view(torch.uint8)) if g.dtype == E4M3 else (g, r)
        assert torch.equal(g, r), f"output {i}: {(g != r).sum().item()} of {g.numel()} elements differ"


def test_column_amax_reference_hand_worked():
    x = torch.tensor([[1.0, -3.0], [-2.0, 0.5], [0.25, 7.0], [-9.0, 1.0]])
    # Groups: rows 0-1, none, row 2; row 3 is past the last end and in no group.
    amax = A.column_amax_reference(x, torch.tensor([2, 2, 3], dtype=torch.int32))
    assert amax.tolist() == [[2.0, 3.0], [0.0, 0.0], [0.25, 7.0]]


def test_from_amax_reference_scales_from_the_amax_given():
    x = torch.tensor([[1.0, 2.0], [-0.5, 1.0]])
    amax = torch.tensor([[2.0, 4.0]])  # twice x's own amax in both columns
    q, scale = A.quantize_fp8_rowwise_k_groups_from_amax_reference(x, amax, torch.tensor([2], dtype=torch.int32))
    # Column 0: 448 / 2 = 224: 1 -> 224, -0.5 -> -112. Column 1: 448 / 4 = 112: 2 -> 224, 1 -> 112.
    assert q.float().tolist() == [[224.0, -112.0], [224.0, 112.0]]
    assert scale[0].tolist() == pytest.approx([2 / 448, 4 / 448], rel=1e-7)


# Group sizes: empty groups (first, middle, last), sizes off 16 and off the step, rows past offs[-1].
GROUPS = [
    ([0, 40, 0, 23, 65], 140),
    ([128], 128),
    ([1, 1, 1, 97, 0], 100),
    ([16, 16, 32, 0], 70),
]


@pytest.mark.parametrize("sizes,M", GROUPS)
@pytest.mark.parametrize("config", [A.AmaxRowsConfig(1, 1), A.AmaxRowsConfig(8, 2, block_rows=2), None])
def test_with_amax_matches_reference_and_rowwise(device, sizes, M, config):
    gen = torch.Generator().manual_seed(M)
    x = (torch.randn(M, 96, generator=gen) * 3).to(BF16).to(device)
    offs = offsets(sizes, device)
    got = A.quantize_fp8_rowwise_with_amax(x, offs, config=config)
    assert_same(got, A.quantize_fp8_rowwise_with_amax_reference(x, offs))
    assert_same(got[:2], F.quantize_fp8_rowwise(x))


def test_wide_rows_take_the_wide_default(device):
    # 4100 columns: 8192-wide steps, the launch WIDE_ROWS_CONFIG names (its register cap applies on GPUs only).
    x = (torch.randn(20, 4100, generator=torch.Generator().manual_seed(5)) * 2).to(BF16).to(device)
    offs = offsets([8, 0, 12], device)
    assert_same(A.quantize_fp8_rowwise_with_amax(x, offs), A.quantize_fp8_rowwise_with_amax_reference(x, offs))


def test_with_amax_fp32_input_and_zero_rows(device):
    x = torch.randn(48, 80, generator=torch.Generator().manual_seed(1)).to(device)
    x[16:32] = 0.0  # a whole group of zeros: amax 0, the scale of the floor downstream
    offs = offsets([16, 16, 16], device)
    got = A.quantize_fp8_rowwise_with_amax(x, offs, config=A.AmaxRowsConfig(2, 1, block_rows=4))
    assert_same(got, A.quantize_fp8_rowwise_with_amax_reference(x, offs))
    assert got[2][1].abs().max().item() == 0.0


@pytest.mark.parametrize("config", [A.AmaxRowsConfig(1, 1), A.AmaxRowsConfig(16, 1, block_rows=8)])
def test_3d_with_amax_then_from_amax(device, config):
    w = (torch.randn(3, 40, 64, generator=torch.Generator().manual_seed(2)) * 0.1).to(BF16).to(device)
    first = A.quantize_fp8_rowwise_3d_with_amax(w, config=config)
    assert_same(first, A.quantize_fp8_rowwise_3d_with_amax_reference(w))
    assert_same(first[:2], F.quantize_fp8_rowwise_3d(w, along="K"))
    second = A.quantize_fp8_rowwise_3d_from_amax(w, first[2])
    assert_same(second, F.quantize_fp8_rowwise_3d(w, along="N"))
    assert_same(second, A.quantize_fp8_rowwise_3d_from_amax_reference(w, first[2]))


def test_3d_with_amax_of_no_experts(device):
    # No experts: the three outputs, empty and shaped as for any G (the rows kernel's groups 0 means "no table").
    q, scale, amax = A.quantize_fp8_rowwise_3d_with_amax(torch.zeros(0, 40, 64, dtype=BF16, device=device))
    assert (q.shape, q.dtype, scale.shape, amax.shape, amax.dtype) == ((0, 40, 64), E4M3, (0, 40), (0, 64),
                                                                        torch.float32)  # fmt: skip
    assert_same(A.quantize_fp8_rowwise_3d_from_amax(torch.zeros(0, 40, 64, dtype=BF16, device=device), amax),
                F.quantize_fp8_rowwise_3d(torch.zeros(0, 40, 64, dtype=BF16, device=device), along="N"))  # fmt: skip


@pytest.mark.parametrize("sizes,M", GROUPS)
def test_k_groups_from_amax_matches_unfused(device, sizes, M):
    x = (torch.randn(M, 48, generator=torch.Generator().manual_seed(3))).to(BF16).to(device)
    offs = offsets(sizes, device)
    _, _, amax = A.quantize_fp8_rowwise_with_amax(x, offs)
    got = A.quantize_fp8_rowwise_k_groups_from_amax(x, amax, offs)
    ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
    end = sum(sizes)  # columns of q past offs[-1] are unspecified
    assert_same((got[0][:, :end], got[1]), (ref[0][:, :end], ref[1]))


def test_k_groups_from_amax_honours_the_amax_given(device):
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(4)).to(BF16).to(device)
    offs = offsets([32, 32], device)
    amax = A.column_amax_reference(x, offs) * 4  # not x's own: the contract scales from what it is given
    got = A.quantize_fp8_rowwise_k_groups_from_amax(x, amax, offs)
    assert_same(got, A.quantize_fp8_rowwise_k_groups_from_amax_reference(x, amax, offs))
    assert not torch.equal(got[1], F.quantize_fp8_rowwise_k_groups(x, offs)[1])


def test_bad_inputs_are_refused(device):
    x = torch.randn(32, 16, device=device).to(BF16)
    offs = offsets([16, 16], device)
    amax = torch.zeros(2, 16, device=device)
    with pytest.raises(InputError, match="amax"):
        A.quantize_fp8_rowwise_k_groups_from_amax(x, amax[:1], offs)
    with pytest.raises(InputError, match="amax"):
        A.quantize_fp8_rowwise_k_groups_from_amax(x, amax.to(BF16), offs)
    with pytest.raises(InputError, match="config"):
        A.quantize_fp8_rowwise_with_amax(x, offs, config=F.Fp8RowwiseConfig(1, 16))
    with pytest.raises(InputError, match="longer than"):
        A.quantize_fp8_rowwise_with_amax(torch.zeros(1, A.MAX_COLS + 32, device=device, dtype=BF16),
                                         offsets([1], device))  # fmt: skip
    with pytest.raises(InputError, match="programs_per_sm"):
        A.AmaxRowsConfig(0)
    with pytest.raises(InputError, match="max_registers"):
        A.AmaxRowsConfig(2, 8, max_registers=300)
    with pytest.raises(InputError, match="up to"):
        step_stages("fp8_rowwise", 64, 128, A.MAX_COLS + 32, 2, fuse_scales=True)


def test_costs_hand_worked():
    # (1024, 256) bf16 in 4 groups: read 512 KiB; write 256 KiB e4m3 + 4 KiB row scales + the 4 KiB table.
    assert A.with_amax_cost(1024, 256, 4, BF16) == Cost(524288, 262144 + 4096 + 4096)
    assert A.with_amax_cost(1024, 256, 4, BF16).bytes == F.quantize_fp8_rowwise_cost(1024, 256, BF16).bytes + 4096
    # The second: read the input and the table once, write the transposed e4m3 and one scale per group column.
    assert A.from_amax_cost(1024, 256, 4, BF16) == Cost(524288 + 4096, 262144 + 4096)


def test_fused_step_equals_the_unfused_step():
    sizes = [0, 40, 23, 65]
    M, N, K, G = sum(sizes), 64, 96, 4
    inputs = make_inputs(M, N, K, G, sizes, device="cpu")
    plain = run_stages(step_stages("fp8_rowwise", M, N, K, G, pad=True, backend="emulated"), dict(inputs))
    fused_stages = step_stages("fp8_rowwise", M, N, K, G, pad=True, backend="emulated", fuse_scales=True)
    fused = run_stages(fused_stages, dict(inputs))
    names = [s.name for s in fused_stages]
    assert "quantize_a_t_from_amax" in names and "quantize_a_t" not in names
    for key in ("a_q", "a_s", "w_q", "w_s", "dy_q", "dy_s", "wt_q", "wt_s", "dyt_s", "at_s", "out", "grad_a", "grad_w"):
        assert_same((fused[key],), (plain[key],))
    # The second quantizers read their tensor once: where the unfused k_groups default reads twice (DeepSeek-V3's
    # 8 groups of 16384 rows, split strips) the fused step moves fewer bytes. Where groups are short enough for the
    # holding kernel (these: ~32 rows), the unfused step reads once too, and the fused one adds its amax tables.
    step_bytes = lambda *shape, **kw: sum(s.cost.bytes for s in step_stages("fp8_rowwise", *shape, pad=True, **kw))
    assert step_bytes(131072, 2048, 7168, 8, fuse_scales=True) < step_bytes(131072, 2048, 7168, 8)
    assert sum(s.cost.bytes for s in fused_stages) > step_bytes(M, N, K, G)


def test_autograd_drop_in_with_fused_scales():
    sizes = [32, 0, 48]
    M, N, K, G = sum(sizes), 32, 64, 3
    t = make_inputs(M, N, K, G, sizes, device="cpu")
    grads = []
    for fuse in (False, True):
        a = t["a"].clone().requires_grad_()
        b_t = t["w"].transpose(-2, -1).clone().requires_grad_()
        out = fp8_rowwise_grouped_mm(a, b_t, t["offs"], fuse_scales=fuse)
        grads.append((out, *torch.autograd.grad(out, (a, b_t), t["grad_out"])))
    for plain, fused in zip(*grads, strict=True):
        assert torch.equal(plain, fused)


@pytest.mark.gpu
def test_gpu_shared_amax_bit_exact_at_deepseek_width():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16384, 7168, device="cuda", generator=gen).bfloat16()
    offs = offsets([2048, 0, 1024, 4096, 16, 3072, 2048, 4064], "cuda")  # 16 rows past the last end
    q, scale, amax = A.quantize_fp8_rowwise_with_amax(x, offs)
    assert_same((q, scale), F.quantize_fp8_rowwise(x))
    assert_same((amax,), (A.column_amax_reference(x, offs),))
    got = A.quantize_fp8_rowwise_k_groups_from_amax(x, amax, offs)
    ref = F.quantize_fp8_rowwise_k_groups(x, offs)
    assert_same((got[0][:, :16368], got[1]), (ref[0][:, :16368], ref[1]))

    w = (torch.randn(8, 2048, 7168, device="cuda", generator=gen) * 7168**-0.5).bfloat16()
    q, scale, amax = A.quantize_fp8_rowwise_3d_with_amax(w)
    assert_same((q, scale), F.quantize_fp8_rowwise_3d(w, along="K"))
    assert_same(A.quantize_fp8_rowwise_3d_from_amax(w, amax), F.quantize_fp8_rowwise_3d(w, along="N"))
