"""Specification of the FP8 rowwise quantizers (kernels/fp8_rowwise.py, the column-direction kernels in
kernels/fp8_colwise.py).

The oracle: scale = amax / 448 per row along the next GEMM's contraction dim (amax floored at 2**-112),
q = e4m3(x * 448 / amax) rounded to nearest even (torch's own fp32 -> e4m3 cast), dequant = q * scale; a zero row
has zero data. The Triton kernels must be
bit-exact against the plain-torch references, which are checked here against hand-worked values first. CPU runs the
kernels under the interpreter on small shapes; the ``gpu`` tests repeat the checks at DeepSeek-V3 sizes.
"""

import pytest
import torch
from crosscompile import compile_ptx
from kernel_helpers import offsets
from mxkernels.quant import fp8_colwise as C
from mxkernels.quant import fp8_hold as H
from mxkernels.quant import fp8_rowwise as F
from mxkernels.core.cost import Cost

E4M3 = torch.float8_e4m3fn


def assert_same_bytes(q, ref):
    assert q.dtype == E4M3 and q.shape == ref.shape
    mismatch = (q.view(torch.uint8) != ref.view(torch.uint8)).sum().item()
    assert mismatch == 0, f"{mismatch} of {q.numel()} e4m3 bytes differ"


# ---- the reference against hand-worked values -------------------------------------------------------------------


def test_reference_hand_worked_rows():
    x = torch.tensor([[1.0, -2.0, 0.5, 4.0], [0.0, 0.0, 0.0, 0.0], [3.0, 1.0, -1.0, 0.0]])
    q, scale = F.quantize_fp8_rowwise_reference(x)
    # Row 0: amax 4, 448/4 = 112 exactly. Row 1: all zero (amax floored at 2**-112). Row 2: 448/3 = 149.33 rounds
    # to 144 (e4m3 step 16 in [128, 256)), -149.33 to -144.
    assert q.float().tolist() == [[112.0, -224.0, 56.0, 448.0], [0.0] * 4, [448.0, 144.0, -144.0, 0.0]]
    assert scale.tolist() == pytest.approx([4 / 448, 2**-112 / 448, 3 / 448], rel=1e-7)
    deq = F.dequantize_fp8_rowwise_reference(q, scale)
    assert deq[0].tolist() == pytest.approx([1.0, -2.0, 0.5, 4.0], rel=1e-6)
    assert deq[2, 0].item() == pytest.approx(3.0, rel=1e-6)


def test_reference_scale_is_correctly_rounded():
    # torch computes `448.0 / t` as t.reciprocal() * 448 (two roundings); the reference must not.
    amax = torch.tensor([0.375, 3.0, 7.0, 1e-3])
    _, scale = F.quantize_fp8_rowwise_reference(torch.stack([amax, torch.zeros(4)], dim=1))
    exact = [float(torch.tensor(a.item() / 448.0, dtype=torch.float64).float()) for a in amax]
    assert scale.tolist() == exact
    q, _ = F.quantize_fp8_rowwise_reference(torch.tensor([[0.375, 0.28125]]))
    # 0.28125 * fl(448 / 0.375) is exactly 336, a tie that goes to the even 320; 0.28125 * fl(448 * fl(1 / 0.375))
    # is 336.00003, which would round up to 352.
    assert q.float().tolist() == [[448.0, 320.0]]


def test_reference_tiny_rows_stay_finite():
    # Below amax ~ 2**-119, 448 / amax overflows fp32: the floor keeps such rows (and zeros in them) finite.
    x = torch.tensor([[2.0**-125, 0.0, -(2.0**-126)], [0.0, 0.0, 0.0]])
    q, scale = F.quantize_fp8_rowwise_reference(x)
    amax = 2.0**-112
    assert scale.tolist() == pytest.approx([amax / 448] * 2, rel=1e-7)
    # 2**-125 * 448 * 2**112 = 448 * 2**-13 = 0.0547 -> the e4m3 subnormal 28 * 2**-9; 224 * 2**-13 -> 14 * 2**-9.
    assert q.float().tolist() == [[28 * 2.0**-9, 0.0, -14 * 2.0**-9], [0.0, 0.0, 0.0]]


# ---- kernels against the reference (interpreter on CPU, compiled on GPU) ----------------------------------------


def e4m3_rounding_cases():
    """Every positive e4m3 value, the midpoints between neighbours (ties go to even) and a nudge either side, with
    both signs: rows whose amax is 448, so the kernel's scaled value is the input itself."""
    values = torch.arange(0, 127, dtype=torch.uint8).view(E4M3).float()
    mids = (values[:-1] + values[1:]) / 2
    nudges = torch.cat([mids * (1 + 2**-20), mids * (1 - 2**-20)])
    cases = torch.cat([values, mids, nudges])
    cases = torch.cat([cases, -cases])
    cases = torch.cat([cases, torch.zeros(-cases.numel() % 63)]).view(-1, 63)
    return torch.cat([torch.full((cases.shape[0], 1), 448.0), cases], dim=1)


def test_kernel_rounds_like_torch_cast(device):
    x = e4m3_rounding_cases().to(device)
    q, scale = F.quantize_fp8_rowwise(x)
    assert_same_bytes(q, x.to(E4M3))
    assert torch.equal(scale, torch.ones_like(scale))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rowwise_kernel_is_bit_exact(device, dtype):
    gen = torch.Generator().manual_seed(0)
    # Rows from 2**-130 (bf16 subnormals) to 2**30 in magnitude, a zero row, and a length that is no tile multiple.
    x = torch.randn(37, 200, generator=gen) * torch.logspace(-130, 30, 37, base=2.0)[:, None]
    x[5] = 0
    x = x.to(device=device, dtype=dtype)
    q, scale = F.quantize_fp8_rowwise(x)
    q_ref, scale_ref = F.quantize_fp8_rowwise_reference(x)
    assert_same_bytes(q, q_ref)
    assert torch.equal(scale, scale_ref)
    assert not q[5].float().any()


@pytest.mark.parametrize("along", ["K", "N"])
def test_3d_kernel_is_bit_exact(device, along):
    w = torch.randn(3, 40, 96, device=device).bfloat16()
    w[1, :, 7] = 0  # a zero column: along N it is a zero row of the transposed output
    q, scale = F.quantize_fp8_rowwise_3d(w, along=along)
    oracle = w if along == "K" else w.transpose(-2, -1)
    q_ref, scale_ref = F.quantize_fp8_rowwise_reference(oracle)
    assert q.shape == ((3, 40, 96) if along == "K" else (3, 96, 40))
    assert_same_bytes(q, q_ref)
    assert torch.equal(scale, scale_ref)


def test_k_groups_scales_per_group_and_column(device):
    sizes = [32, 0, 80, 48]
    x = torch.randn(176, 48, device=device).bfloat16()
    x[32:112, 5] *= 1000  # group 2's column 5 gets its own, larger scale
    offs = offsets(sizes, device)
    q, scale = F.quantize_fp8_rowwise_k_groups(x, offs)
    assert q.shape == (48, 176) and scale.shape == (4, 48)
    # Independent restatement of the contract: scale[g, r] = max over group g's rows of |x[:, r]| / 448.
    bounds = [(0, 32), (32, 32), (32, 112), (112, 160)]
    for g, (s, e) in enumerate(bounds):
        amax = x[s:e].float().abs().amax(0) if e > s else torch.full((48,), 2.0**-112, device=device)
        # tensor / tensor: on CUDA torch turns `t / 448.0` into `t * (1 / 448)`, a second rounding (1 ulp off)
        torch.testing.assert_close(scale[g], amax / torch.full_like(amax, 448.0), rtol=0, atol=0)
        if e > s:
            # Round to nearest: half a step, 2**-4 relative down to 2**-6, then half of 2**-9 (times the scale).
            xt = x[s:e].float().t()
            err = (q[:, s:e].float() * scale[g][:, None] - xt).abs()
            assert (err <= torch.maximum(xt.abs() * 2**-4, scale[g][:, None] * 2**-10)).all()
    q_ref, scale_ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
    assert_same_bytes(q[:, :160], q_ref[:, :160])  # columns past offs[-1] are not written
    assert torch.equal(scale, scale_ref)


def test_k_groups_reads_a_transposed_view(device):
    a = torch.randn(40, 192, device=device).bfloat16()  # (N, M): the wgrad operand as grad_out.t()
    offs = offsets([64, 96, 32], device)
    q, scale = F.quantize_fp8_rowwise_k_groups(a.t(), offs)
    q_ref, scale_ref = F.quantize_fp8_rowwise_k_groups_reference(a.t().contiguous(), offs)
    assert_same_bytes(q, q_ref)
    assert torch.equal(scale, scale_ref)


# ---- launch configurations: one read or two, strips, chunks, alignment ------------------------------------------

ROWS_CONFIGS = {
    "single pass, 2 rows": F.Fp8RowwiseConfig(2, 256, num_warps=2),  # K = 200 fits one 256-wide step
    "single pass, even": F.Fp8RowwiseConfig(1, 512, num_warps=4),
    "two passes": F.Fp8RowwiseConfig(4, 64, num_warps=2),  # 200 = 3 x 64 + 8: a partial last step
}


@pytest.mark.parametrize("name", list(ROWS_CONFIGS))
@pytest.mark.parametrize("K", [200, 256])
def test_rowwise_one_read_or_two_is_bit_exact(device, name, K, poisoned_empty):
    """Rows that fit one step are read once (the single-pass path), longer ones in two passes; K not a power of two
    (masked columns) and K = 256 (the unmasked path where the tile divides x) give the reference's bytes."""
    gen = torch.Generator().manual_seed(K)
    x = (torch.randn(12, K, generator=gen) * torch.logspace(-20, 20, 12, base=2.0)[:, None]).to(device).bfloat16()
    x[3] = 0
    q, scale = F.quantize_fp8_rowwise(x, config=ROWS_CONFIGS[name])
    q_ref, scale_ref = F.quantize_fp8_rowwise_reference(x)
    assert_same_bytes(q, q_ref)
    assert torch.equal(scale, scale_ref)


def test_default_rows_launch_reads_once_up_to_the_register_limit():
    for K in (2048, 7168, F.SINGLE_PASS_MAX):
        config = F.default_rowwise_config(K)
        assert not F._takes_two_passes(config, K) and config.block_rows * config.block_cols >= F.ROWS_TILE
    assert F._takes_two_passes(F.default_rowwise_config(F.SINGLE_PASS_MAX + 32), F.SINGLE_PASS_MAX + 32)
    assert F._takes_two_passes(F.TWO_PASS_ROWS_CONFIG, 7168)


# Strips kernel launches small enough that the test shapes take several chunks per group, several strips per
# group of strips and several pass-2 steps, with each way of streaming pass 2, the two-launch split, and the old
# two-pass kernel.
COLWISE_CONFIGS = {
    "default": None,
    "prefetch": C.ColwiseConfig(strip_cols=8, chunk_rows=32, step_rows=16, group_cols=16, num_warps=2),
    "no prefetch": C.ColwiseConfig(strip_cols=16, chunk_rows=16, step_rows=32, group_cols=32, prefetch=False),
    "pipelined": C.ColwiseConfig(strip_cols=8, chunk_rows=64, step_rows=16, group_cols=8, prefetch=False,
                                 num_stages=2),
    "split": C.ColwiseConfig(strip_cols=16, chunk_rows=32, step_rows=32, group_cols=64, split=True),
    "two-pass kernel": C.TWO_PASS_COLWISE_CONFIG,
    "walk, prefetch": C.WalkConfig(strip_cols=8, step_rows=16, num_warps=2),  # 4 "SMs" on CPU: programs walk
    "walk, pipelined": C.WalkConfig(strip_cols=16, step_rows=32, prefetch=False, num_stages=2, programs_per_sm=2),
    # Holding: strips of up to 64 rows held (the others, and unaligned ones, walk in 16-row steps); all held.
    "hold, some walk": H.HoldConfig(strip_cols=8, hold_rows=64, step_rows=16, num_warps=2),
    "hold": H.HoldConfig(strip_cols=16, hold_rows=256, step_rows=32, num_warps=4, programs_per_sm=1),
}  # fmt: skip
# Group sizes: empty groups first, inside and last; sizes on and off 16-row boundaries (the vector and the byte
# stores of pass 2); a group of many chunks; offs[-1] < M (the rows after belong to no group).
K_GROUP_SIZES = [[0, 48, 0, 96, 16, 0], [37, 0, 128, 5, 30], [200]]


@pytest.mark.parametrize("name", list(COLWISE_CONFIGS))
def test_k_groups_launches_are_bit_exact(device, name, poisoned_empty):
    gen = torch.Generator().manual_seed(1)
    for sizes in K_GROUP_SIZES:
        x = torch.randn(210, 40, generator=gen) * torch.logspace(-10, 10, 40, base=2.0)
        x = x.to(device).bfloat16()
        offs = offsets(sizes, device)
        q, scale = F.quantize_fp8_rowwise_k_groups(x, offs, config=COLWISE_CONFIGS[name])
        q_ref, scale_ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
        end = sum(sizes)
        assert_same_bytes(q[:, :end], q_ref[:, :end])
        assert torch.equal(scale, scale_ref), sizes


@pytest.mark.parametrize("name", list(COLWISE_CONFIGS))
@pytest.mark.parametrize("N", [48, 40])
def test_3d_along_n_launches_are_bit_exact(device, name, N, poisoned_empty):
    """N on a 16-row boundary (vector stores) and not (byte stores); K = 24, not a multiple of every strip."""
    w = (torch.randn(3, N, 24) * torch.logspace(-8, 8, 24, base=2.0)).to(device).bfloat16()
    w[1, :, 5] = 0
    q, scale = F.quantize_fp8_rowwise_3d(w, along="N", config=COLWISE_CONFIGS[name])
    q_ref, scale_ref = F.quantize_fp8_rowwise_reference(w.transpose(-2, -1))
    assert_same_bytes(q, q_ref)
    assert torch.equal(scale, scale_ref)


def test_launch_configs_check_their_fields(device):
    with pytest.raises(ValueError, match="strip_cols"):
        C.ColwiseConfig(strip_cols=12, chunk_rows=32, step_rows=32, group_cols=24)
    with pytest.raises(ValueError, match="group_cols"):
        C.ColwiseConfig(strip_cols=16, chunk_rows=32, step_rows=32, group_cols=24)
    with pytest.raises(ValueError, match="num_stages"):
        C.ColwiseConfig(strip_cols=16, chunk_rows=32, step_rows=32, group_cols=32, num_stages=5)
    with pytest.raises(ValueError, match="split"):
        C.ColwiseConfig(strip_cols=16, chunk_rows=32, step_rows=32, group_cols=32, split=1)
    with pytest.raises(ValueError, match="config"):
        F.quantize_fp8_rowwise(torch.ones(4, 4, device=device), config=C.COLWISE_CONFIG)
    with pytest.raises(ValueError, match="block_cols"):
        C.TwoPassColwiseConfig(64, 48)
    # The two-pass colwise kernel has its own config: the rows kernel's, with the same fields, names no column kernel.
    with pytest.raises(ValueError, match="TwoPassColwiseConfig or None"):
        F.quantize_fp8_rowwise_3d(torch.ones(1, 4, 4, device=device), along="N", config=F.Fp8RowwiseConfig(64, 64))
    with pytest.raises(ValueError, match="config"):
        F.quantize_fp8_rowwise_3d(torch.ones(1, 4, 4, device=device), along="K", config=C.TWO_PASS_COLWISE_CONFIG)


# ---- costs and errors ----------------------------------------------------------------------------------------


def test_costs_are_hand_counts():
    assert F.quantize_fp8_rowwise_cost(16, 64, torch.bfloat16) == Cost(16 * 64 * 2, 16 * 64 + 16 * 4)
    assert F.quantize_fp8_rowwise_3d_cost(2, 8, 32, torch.float32, "K") == Cost(2 * 8 * 32 * 4, 512 + 2 * 8 * 4)
    assert F.quantize_fp8_rowwise_3d_cost(2, 8, 32, torch.bfloat16, "N") == Cost(2 * 8 * 32 * 2, 512 + 2 * 32 * 4)
    # k_groups by default with groups of ~43 rows: the holding kernel, one read (fine-grained groups held whole)
    assert F.quantize_fp8_rowwise_k_groups_cost(128, 24, 3, torch.bfloat16) == Cost(
        128 * 24 * 2, 128 * 24 + 3 * 24 * 4
    )
    # with groups of 16384 rows (split: a group's column needs all its rows, read again from device memory): two reads
    assert F.quantize_fp8_rowwise_k_groups_cost(131072, 24, 8, torch.bfloat16) == Cost(
        2 * 131072 * 24 * 2, 131072 * 24 + 8 * 24 * 4
    )


def test_costs_count_a_second_read_from_device_memory():
    # Two passes over rows longer than a step, the split strips launch and the two-pass colwise kernel read twice.
    two_pass = F.Fp8RowwiseConfig(4, 32)
    assert F.quantize_fp8_rowwise_cost(16, 64, torch.bfloat16, two_pass) == Cost(2 * 16 * 64 * 2, 16 * 64 + 16 * 4)
    split = C.ColwiseConfig(strip_cols=16, chunk_rows=32, step_rows=32, group_cols=32, split=True)
    for config in (split, C.TWO_PASS_COLWISE_CONFIG):
        assert F.quantize_fp8_rowwise_k_groups_cost(128, 24, 3, torch.bfloat16, config) == Cost(
            2 * 128 * 24 * 2, 128 * 24 + 3 * 24 * 4
        )
        assert F.quantize_fp8_rowwise_3d_cost(2, 8, 32, torch.bfloat16, "N", config).bytes_read == 2 * 2 * 8 * 32 * 2
    # DeepSeek-V3 A (131072, 7168) bf16, 8 groups: the one-launch strips read once, the default (split) twice.
    assert F.quantize_fp8_rowwise_k_groups_cost(131072, 7168, 8, torch.bfloat16, C.COLWISE_CONFIG) == Cost(
        1_879_048_192, 939_524_096 + 4 * 8 * 7168
    )
    assert F.quantize_fp8_rowwise_k_groups_cost(131072, 7168, 8, torch.bfloat16).bytes_read == 2 * 1_879_048_192


def test_bad_input_names_the_argument(device):
    with pytest.raises(ValueError, match="x must have dtype"):
        F.quantize_fp8_rowwise(torch.ones(4, 4, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="x must be contiguous"):
        F.quantize_fp8_rowwise(torch.ones(8, 8, device=device)[:, :4])
    with pytest.raises(ValueError, match="x must be 2D"):
        F.quantize_fp8_rowwise(torch.ones(4, device=device))
    with pytest.raises(ValueError, match="along"):
        F.quantize_fp8_rowwise_3d(torch.ones(1, 4, 4, device=device), along="M")
    with pytest.raises(ValueError, match="w must be 3D"):
        F.quantize_fp8_rowwise_3d(torch.ones(4, 4, device=device))
    with pytest.raises(ValueError, match="offs must have dtype"):
        F.quantize_fp8_rowwise_k_groups(torch.ones(4, 4, device=device), torch.tensor([4], device=device))
    if device == "cpu":  # CUDA offsets are never read on the host
        with pytest.raises(ValueError, match="non-decreasing group ends within"):
            F.quantize_fp8_rowwise_k_groups(torch.ones(4, 4), torch.tensor([3, 2], dtype=torch.int32))


# ---- cross-compilation (no GPU needed) ------------------------------------------------------------------------

_ROWWISE_SIG = {"x_ptr": "*bf16", "q_ptr": "*u8", "scale_ptr": "*fp32", "rows": "i32", "cols": "i32",
                **{c: "constexpr" for c in ("BLOCK_R", "BLOCK_C", "SINGLE", "EVEN", "EXACT")}}  # fmt: skip
_STRIPS_SIG = {"x_ptr": "*bf16", "offs_ptr": "*i32", "q_ptr": "*u8", "scale_ptr": "*fp32", "work_ptr": "*i32",
               **{a: "i32" for a in ("rows", "cols", "G", "stride_xg", "stride_xm", "stride_xc", "stride_qg",
                                     "stride_qc")},
               **{c: "constexpr" for c in ("HAS_OFFS", "CHUNK", "STRIP", "STEP", "GROUP", "PHASE", "STAGES",
                                           "PREFETCH", "BLOCK_G", "EXACT")}}  # fmt: skip


@pytest.mark.parametrize("cc", [90, 100])
def test_rows_kernel_reads_a_row_once_in_16_byte_vectors(cc):
    """A 7168-long row in one 8192-wide step: one load per element (16-byte vectors, masked past 7168), one store."""
    constexprs = {"BLOCK_R": 1, "BLOCK_C": 8192, "SINGLE": True, "EVEN": False, "EXACT": False}
    ptx = compile_ptx("mxkernels.quant.fp8_rowwise", "_rowwise_kernel", _ROWWISE_SIG, constexprs, cc,
                      ("x_ptr", "q_ptr", "cols"))  # fmt: skip
    # 16 bytes in, 8 bytes of it out: twice the loads of the stores, none of them scalar.
    assert ptx.count("ld.global.v4.b32") == 2 * ptx.count("st.global.v4.b32") > 0 and "ld.global.b16" not in ptx
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx


@pytest.mark.parametrize("cc", [90, 100])
def test_strips_kernel_orders_its_count_after_the_amaxes(cc):
    """The one-launch strips kernel: each amax atomic returns (it is waited for, not fire-and-forget), the count is
    an acq_rel atomic, the pass-2 amax is read back with an atomic, and the aligned pass 2 stores 16-byte vectors."""
    constexprs = {"HAS_OFFS": True, "CHUNK": 512, "STRIP": 16, "STEP": 512, "GROUP": 4, "PHASE": 0, "STAGES": 1,
                  "PREFETCH": True, "BLOCK_G": 8, "EXACT": False, "stride_xc": 1}  # fmt: skip
    signature = {**_STRIPS_SIG, "stride_xc": "constexpr"}
    # What the launcher sees at DeepSeek-V3 sizes: 16-divisible pointers, sizes and strides (0 included).
    aligned = (
        "x_ptr",
        "q_ptr",
        "scale_ptr",
        "work_ptr",
        "rows",
        "cols",
        "stride_xg",
        "stride_xm",
        "stride_qg",
        "stride_qc",
    )
    ptx = compile_ptx("mxkernels.quant.fp8_colwise", "_strips_kernel", signature, constexprs, cc, aligned)
    assert "atom.global.gpu.relaxed.max.s32" in ptx and "red.global" not in ptx
    assert "atom.global.gpu.acq_rel.add.u32" in ptx and "atom.global.gpu.relaxed.add.u32" in ptx
    assert "st.global.v4.b32" in ptx


# ---- GPU: DeepSeek-V3 sizes ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_quantizers_bit_exact_at_deepseek_shapes():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16384, 7168, device="cuda", generator=gen).bfloat16()
    q, scale = F.quantize_fp8_rowwise(x)
    q_ref, scale_ref = F.quantize_fp8_rowwise_reference(x)
    assert_same_bytes(q, q_ref)
    assert torch.equal(scale, scale_ref)

    w = (torch.randn(8, 2048, 7168, device="cuda", generator=gen) * 7168**-0.5).bfloat16()
    for along, oracle in (("K", w), ("N", w.transpose(-2, -1))):
        q, scale = F.quantize_fp8_rowwise_3d(w, along=along)
        q_ref, scale_ref = F.quantize_fp8_rowwise_reference(oracle)
        assert_same_bytes(q, q_ref)
        assert torch.equal(scale, scale_ref)

    offs = offsets([2048, 0, 1024, 4096, 16, 3072, 2048, 4080], "cuda")
    q, scale = F.quantize_fp8_rowwise_k_groups(x, offs)
    q_ref, scale_ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
    assert_same_bytes(q, q_ref)
    assert torch.equal(scale, scale_ref)


# ---- the holding kernel at fine-grained widths (issue 32) --------------------------------------------------------


@pytest.mark.parametrize("R", [2880, 40])
def test_k_groups_default_holds_tiny_and_empty_groups_at_odd_widths(device, R, poisoned_empty):
    """The default (holding) launch at widths no power-of-two strip of 128+ divides (2880 = 45 x 64; 40), with empty
    groups first, inside and last, groups on 16-row boundaries (held: 16, 32, 48 rows), a 1-row group off them
    (walked), and rows past offs[-1]."""
    gen = torch.Generator().manual_seed(7)
    sizes = [0, 16, 0, 32, 48, 1, 0]
    x = (torch.randn(112, R, generator=gen) * torch.logspace(-12, 12, R, base=2.0)).to(device).bfloat16()
    offs = offsets(sizes, device)
    assert isinstance(H.k_groups_config(112, len(sizes)), H.HoldConfig)
    q, scale = F.quantize_fp8_rowwise_k_groups(x, offs)
    q_ref, scale_ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
    assert_same_bytes(q[:, : sum(sizes)], q_ref[:, : sum(sizes)])
    assert torch.equal(scale, scale_ref)


def test_hold_defaults_pick_by_rows():
    """Holding where a strip of 32+ columns of the rows fits 16 warps x 64 elements; else the old launches."""
    assert H.along_n_config(1536) is C.ALONG_N_CONFIG and H.along_n_config(2048) is C.ALONG_N_CONFIG
    assert H.along_n_config(768) == H.HoldConfig(32, 1024, num_warps=16, programs_per_sm=1)
    assert H.along_n_config(40) == H.HoldConfig(64, 64, num_warps=4, programs_per_sm=2)
    # the wider classes and the fine-grained k_groups take the launches their table rows name (measured: perf-log)
    assert H.along_n_config(2880) is H.ALONG_N_DEFAULTS[2][1] and H.along_n_config(7168) is H.ALONG_N_DEFAULTS[3][1]
    assert H.k_groups_config(131072, 128) is H.K_GROUPS_DEFAULTS[1][1]  # 1024 a group
    assert H.k_groups_config(131072, 64) is C.K_GROUPS_CONFIG  # 2048 rows a group: 16-column strips, not held
    assert H.k_groups_config(131072, 8) is C.K_GROUPS_CONFIG  # 16384 rows a group: split strips
    with pytest.raises(ValueError, match="hold_rows"):
        H.HoldConfig(16, 1000)


# In the kernel's parameter order: ``aligned`` names are placed by their index in this dict.
_HOLD_SIG = {"x_ptr": "*bf16", "xw_ptr": "*i32", "offs_ptr": "*i32", "q_ptr": "*u8", "scale_ptr": "*fp32",
             **{a: "i32" for a in ("rows", "cols", "G", "PROGRAMS", "stride_xg", "stride_xm")}, "stride_xc": "constexpr",
             **{a: "i32" for a in ("stride_wg", "stride_wm", "stride_qg", "stride_qc")},
             **{c: "constexpr" for c in ("HAS_OFFS", "STRIP", "HOLD", "STEP", "PACKED", "PREFETCH", "PERSISTENT", "EXACT")}}  # fmt: skip


@pytest.mark.parametrize("has_offs", [True, False], ids=["k_groups", "3d"])
def test_hold_kernel_compiles_to_16_byte_loads_and_stores(has_offs):
    """The holding kernel at the Qwen3-30B-A3B default (16 x 2048, 16 warps) for sm_90: the held strip is loaded in
    16-byte vectors (no 2-byte loads) and stored transposed in 16-byte vectors, with the e4m3 hardware cast."""
    constexprs = {"HAS_OFFS": has_offs, "STRIP": 16, "HOLD": 2048, "STEP": 256, "EXACT": False, "stride_xc": 1,
                  "PACKED": False, "PREFETCH": False, "PERSISTENT": True}
    aligned = ("x_ptr", "xw_ptr", "q_ptr", "scale_ptr", "rows", "cols", "stride_xg", "stride_xm", "stride_wg",
               "stride_wm", "stride_qg", "stride_qc")
    ptx = compile_ptx("mxkernels.quant.fp8_hold", "_hold_kernel", _HOLD_SIG, constexprs, 90, aligned,
                      {"num_warps": 16})  # fmt: skip
    assert "ld.global.v4.b32" in ptx and "ld.global.b16" not in ptx
    assert "st.global.v4.b32" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx


@pytest.mark.gpu
def test_gpu_hold_defaults_bit_exact_at_fine_grained_shapes(poisoned_empty):
    """The holding defaults at Qwen3-30B-A3B's weights and groups (128 experts; 1024-row groups, ragged ones with
    empty, tiny, unaligned and over-long groups that walk) and gpt-oss-120b's odd width (2880), poisoned outputs."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    for shape in ((128, 1536, 2048), (128, 2048, 768), (128, 768, 2048)):
        w = (torch.randn(shape, device="cuda", generator=gen) * shape[2] ** -0.5).bfloat16()
        held = H.HoldConfig(16, 2048, num_warps=16, programs_per_sm=1) if shape[1] > 1024 else None
        assert held is not None or isinstance(H.along_n_config(shape[1]), H.HoldConfig)
        q, scale = F.quantize_fp8_rowwise_3d(w, along="N", config=held)
        q_ref, scale_ref = F.quantize_fp8_rowwise_reference(w.transpose(-2, -1))
        assert_same_bytes(q, q_ref)
        assert torch.equal(scale, scale_ref)
    ragged = [1024] * 120 + [0, 1, 16, 37, 2000, 4096, 0, 1024]  # 128 groups; the 2000 and 4096 walk
    for R, sizes in ((2880, [1024] * 128), (768, ragged)):
        M = max(sum(sizes), 131072)
        x = torch.randn(M, R, device="cuda", generator=gen).bfloat16()
        offs = offsets(sizes, "cuda")
        assert isinstance(H.k_groups_config(M, len(sizes)), H.HoldConfig)
        q, scale = F.quantize_fp8_rowwise_k_groups(x, offs)
        q_ref, scale_ref = F.quantize_fp8_rowwise_k_groups_reference(x, offs)
        end = sum(sizes)
        assert_same_bytes(q[:, :end], q_ref[:, :end])
        assert torch.equal(scale, scale_ref)
