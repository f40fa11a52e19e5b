"""The native backend's SM100 guards (issues 16 and 23), without a B200: the double of native_double.py in front of
the torch calls, every guarded output held against the emulation expert by expert."""

from __future__ import annotations

import pytest
import torch
from mxkernels.gemm import native as gemm_native
from mxkernels.gemm import grouped_gemm as GG
from native_double import (
    SM90,
    UNWRITTEN,
    DeadContext,
    cuda_like,
    ends_of,
    fp8_case,
    install,
    mx_case,
    same_bits,
)
from native_double import SM100Double as Double


@pytest.fixture
def unprobed_sm100(monkeypatch):
    return install(monkeypatch, Double())


@pytest.fixture
def sm100(unprobed_sm100, monkeypatch):
    """``unprobed_sm100`` with native MXFP8's probe said to have passed, so that the guards are tested alone here
    (the probe, which runs them too, has test_native_probe.py)."""
    monkeypatch.setitem(gemm_native._PROBES, "cpu", gemm_native.Verdict(True, "passed (said so)"))
    return unprobed_sm100


# ---- the two scaled recipes, through one set of tests -----------------------------------------------------------

CASES = {"mxfp8": mx_case, "fp8_rowwise": fp8_case}
CALLS = {"mxfp8": GG.mxfp8_scaled_grouped_mm, "fp8_rowwise": GG.fp8_rowwise_scaled_grouped_mm}
SCALED = pytest.mark.parametrize("recipe", list(CASES))


def native(recipe, ops, offs):
    return CALLS[recipe](**ops, offs=cuda_like(offs), backend="native")


def emulated(recipe, ops, offs):
    return CALLS[recipe](**ops, offs=offs, backend="emulated")


def assert_experts(out, ref, sizes):
    """2D x 2D, expert by expert: an empty expert exactly +0.0 everywhere, every other one the emulation's bits."""
    for g, size in enumerate(sizes):
        if size == 0:
            assert (out[g].view(torch.int16) == 0).all(), f"expert {g} (empty) is not zero"
        else:
            assert same_bits(out[g], ref[g]), f"expert {g}"


def raw_call(double, recipe, ops, offs):
    """The double called as the guarded call calls it, without the guards."""
    G = offs.numel()
    if recipe == "mxfp8":
        sa, sb = ops["a_sb"].view(torch.float8_e8m0fnu), ops["b_sb"].view(torch.float8_e8m0fnu)
        if ops["b_q"].dim() == 3:
            return double.scaled_grouped_mm(ops["a_q"], ops["b_q"].transpose(-2, -1), sa, sb.reshape(G, -1),
                                            offs=offs, out_dtype=torch.bfloat16)  # fmt: skip
        return double.scaled_grouped_mm(ops["a_q"], ops["b_q"].t(), sa, sb, offs=offs, out_dtype=torch.bfloat16)
    if ops["b_q"].dim() == 3:
        return double.scaled_grouped_mm(ops["a_q"], ops["b_q"].transpose(-2, -1), ops["a_scale"], ops["b_scale"],
                                        offs=offs, out_dtype=torch.bfloat16)  # fmt: skip
    return double.scaled_grouped_mm(ops["a_q"], ops["b_q"].t(), ops["a_scale"].reshape(-1),
                                    ops["b_scale"].reshape(-1), offs=offs, out_dtype=torch.bfloat16)  # fmt: skip


@SCALED
def test_the_double_misbehaves_where_the_guards_must_act(sm100, recipe):
    """Unguarded, the double leaves an empty wgrad group unwritten, returns a few-rows forward unwritten and kills
    the context on unaligned wgrad groups: what the guarded tests below prove the guards repair or refuse."""
    ops, offs = CASES[recipe]("2d2d", [64, 0, 32])
    raw, ref = raw_call(sm100, recipe, ops, offs), emulated(recipe, ops, offs)
    assert same_bits(raw[0], ref[0]) and same_bits(raw[2], ref[2])
    assert not ref[1].any() and (raw[1].view(torch.int16) == UNWRITTEN).all()

    ops, offs = CASES[recipe]("2d3d", [1, 0, 2, 0])
    assert (raw_call(sm100, recipe, ops, offs).view(torch.int16) == UNWRITTEN).all()

    ops, _ = CASES[recipe]("2d2d", [64, 32])
    with pytest.raises(DeadContext):
        raw_call(sm100, recipe, ops, ends_of([40, 56]))  # 40 tokens: off both recipes' alignment
    assert sm100.dead


@SCALED
@pytest.mark.parametrize("sizes", [[0, 64, 0, 96, 0], [32, 0, 0, 32], [0, 0, 0]])
def test_wgrad_empty_experts_are_exactly_zero(sm100, recipe, sizes):
    ops, offs = CASES[recipe]("2d2d", sizes)
    assert_experts(native(recipe, ops, offs), emulated(recipe, ops, offs), sizes)
    assert not sm100.dead


@SCALED
@pytest.mark.parametrize("rows, sizes", [(1, [1, 0, 0, 0]), (3, [1, 0, 2, 0, 0]), (3, [0, 0, 2, 0]), (2, [0, 0])])
def test_forward_with_fewer_rows_than_experts(sm100, recipe, rows, sizes):
    """rows < G goes around fbgemm's early return; rows == G (the last case) never met it."""
    ops, offs = CASES[recipe]("2d3d", sizes, rows=rows)
    out = native(recipe, ops, offs)
    valid = int(offs[-1])
    assert out.shape == (rows, 48)
    assert same_bits(out[:valid], emulated(recipe, ops, offs)[:valid])
    assert not sm100.dead
    (call,) = sm100.calls
    assert call[2] >= call[3]  # the kernel got at least G rows


WGRAD_MALFORMED = {
    "unaligned": [40, 56, 128],  # a 40-token group: an MX block across two experts, and TMA off 16 bytes
    "decreasing": [64, 32, 128],
    "past the end": [64, 64, 160],
    "negative": [-32, 64, 128],
}


@SCALED
@pytest.mark.parametrize("ends", WGRAD_MALFORMED.values(), ids=WGRAD_MALFORMED.keys())
def test_malformed_wgrad_offs_never_reach_the_kernel(sm100, recipe, ends):
    ops, good = CASES[recipe]("2d2d", [64, 0, 64])
    out = native(recipe, ops, torch.tensor(ends, dtype=torch.int32))  # no host read, no exception: on the device
    assert not sm100.dead and sm100.offs_seen == [[0, 0, 0]]  # the kernel ran with every group empty
    assert out.shape == (3, 48, ops["b_q"].shape[0]) and out.isnan().all()
    assert_experts(native(recipe, ops, good), emulated(recipe, ops, good), [64, 0, 64])  # the next call is right


@SCALED
def test_malformed_forward_offs_never_reach_the_kernel(sm100, recipe):
    ops, good = CASES[recipe]("2d3d", [40, 0, 24])
    for ends in ([40, 20, 64], [40, 40, 65]):
        assert native(recipe, ops, torch.tensor(ends, dtype=torch.int32)).isnan().all()
    assert not sm100.dead and sm100.offs_seen == [[0, 0, 0]] * 2
    assert same_bits(native(recipe, ops, good)[:64], emulated(recipe, ops, good)[:64])


def test_fp8_rowwise_wgrad_alignment_is_torchs_rule(sm100):
    """torch asserts 16-byte groups (16 e4m3) along the contiguous contraction dim, the last group excepted: the
    guard lets that last group through and refuses any other off the rule."""
    ops, _ = fp8_case("2d2d", [16, 32, 16])  # M = 64: the contraction dim must be a multiple of 16
    ok = ends_of([16, 32, 13])  # the last 3 tokens in no group
    assert_experts(native("fp8_rowwise", ops, ok), emulated("fp8_rowwise", ops, ok), [16, 32, 13])
    assert native("fp8_rowwise", ops, ends_of([8, 40, 13])).isnan().all() and not sm100.dead


# ---- bf16, and triton_dequant, which multiplies with the same torch._grouped_mm -------------------------------


def bf16_operands(case, sizes, seed=1, N=24, K=40):
    """torch._grouped_mm operands, b a transposed view as a model holds it (2D x 3D: a (M, K) @ (G, K, N);
    2D x 2D: a (N, M) @ b (M, K))."""
    gen = torch.Generator().manual_seed(seed)
    M = sum(sizes)
    if case == "2d3d":
        a = torch.randn(M + 8, K, generator=gen).bfloat16()
        return a, torch.randn(len(sizes), N, K, generator=gen).bfloat16().transpose(-2, -1)
    return torch.randn(N, M, generator=gen).bfloat16(), torch.randn(K, M, generator=gen).bfloat16().t()


def bf16(a, b, offs, backend):
    return GG.grouped_mm(a, b, offs, recipe="bf16", backend=backend).out


@pytest.mark.parametrize("sizes", [[0, 16, 0, 24], [8, 0, 0]])
def test_bf16_wgrad_empty_groups_are_zero(sm100, sizes):
    a, b = bf16_operands("2d2d", sizes)
    offs = ends_of(sizes)
    for a_view in (a, a.t().contiguous().t()):  # K contiguous, and a transposed view (no TMA rule along K for a)
        assert_experts(bf16(a_view, b, cuda_like(offs), "native"), bf16(a_view, b, offs, "emulated"), sizes)
    assert not sm100.dead


def test_bf16_alignment_is_torchs_rule_checked_on_the_device(sm100):
    """torch asserts 16-byte groups (8 bf16) along a contiguous contraction dim, the last group excepted: the guard
    lets that last group through and refuses any other off the rule."""
    a, b = bf16_operands("2d2d", [16, 8, 13])
    ok = ends_of([16, 8, 13])
    assert same_bits(bf16(a, b, cuda_like(ok), "native"), bf16(a, b, ok, "emulated"))
    assert bf16(a, b, cuda_like(ends_of([12, 12, 13])), "native").isnan().all() and not sm100.dead


def test_bf16_forward_is_guarded_for_bounds_only(sm100):
    sizes = [5, 0, 11]
    a, b = bf16_operands("2d3d", sizes)
    offs = ends_of(sizes)
    assert same_bits(bf16(a, b, cuda_like(offs), "native")[:16], bf16(a, b, offs, "emulated")[:16])  # rows past: any
    assert bf16(a, b, cuda_like(ends_of([5, 0, 30])), "native").isnan().all() and not sm100.dead  # 25 rows


@pytest.mark.parametrize("recipe", ["bf16", "fp8_rowwise"])
def test_sm90_is_left_alone(unprobed_sm100, monkeypatch, recipe):
    """The guards of the calls that run on SM90 too are for 10.x: on SM90 torch gets offs as they are and nothing
    runs after it."""
    monkeypatch.setattr(gemm_native, "capability", lambda device: SM90)
    for guard in ("checked_offsets", "fix_output", "rows_for_every_expert"):
        monkeypatch.setattr(gemm_native, guard, None)  # calling one would raise
    if recipe == "bf16":
        a, b = bf16_operands("2d2d", [16, 0, 8])
        out = bf16(a, b, ends_of([16, 0, 8]), "native")
    else:
        ops, offs = fp8_case("2d2d", [16, 0, 16])
        out = GG.fp8_rowwise_scaled_grouped_mm(**ops, offs=offs, backend="native")
    assert (out[1].view(torch.int16) == UNWRITTEN).all()  # the double's garbage, as on a B200 without the guards


def test_triton_dequant_wgrad_empty_groups_are_zero(sm100):
    ops, offs = mx_case("2d2d", [0, 64, 0, 32])
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=cuda_like(offs), backend="triton_dequant")
    # Exact bf16 operands, the same fp32 products and sums (the double multiplies like the emulation).
    assert_experts(out, emulated("mxfp8", ops, offs), [0, 64, 0, 32])


# ---- the guards on a B200 (make test-gpu, one of docs/b200.md's first-run commands) -----------------------------


def _gpu_sm100():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip("the SM100 guards act on compute capability 10.x only")


def _on_gpu(ops):
    return {name: t.cuda() for name, t in ops.items()}


@pytest.mark.gpu
@SCALED
def test_gpu_guards_on_the_card(recipe):
    """Every guard on the card, through the real torch call: empty experts exactly zero, fewer rows than experts
    right, malformed offs NaN with the CUDA context alive (the next call runs and is right)."""
    _gpu_sm100()
    if "native" not in GG.available_backends(recipe, "cuda"):
        pytest.skip(GG.backend_unavailable(recipe, "native", torch.device("cuda")))
    sizes = [0, 64, 0, 96, 0]
    ops, offs = CASES[recipe]("2d2d", sizes)
    ref = emulated(recipe, ops, offs)
    out = CALLS[recipe](**_on_gpu(ops), offs=offs.cuda(), backend="native").cpu()
    for g, size in enumerate(sizes):
        assert (out[g].view(torch.int16) == 0).all() if size == 0 else out[g].isfinite().all(), g
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=1e-2)  # another summation order
    ops, offs = CASES[recipe]("2d3d", [1, 0, 2, 0], rows=3)
    out = CALLS[recipe](**_on_gpu(ops), offs=offs.cuda(), backend="native").cpu()
    torch.testing.assert_close(out.float(), emulated(recipe, ops, offs).float(), rtol=2e-2, atol=1e-2)
    ops, good = CASES[recipe]("2d2d", [64, 0, 64])
    for ends in WGRAD_MALFORMED.values():
        bad = torch.tensor(ends, dtype=torch.int32).cuda()
        assert CALLS[recipe](**_on_gpu(ops), offs=bad, backend="native").isnan().all().item(), ends
    torch.cuda.synchronize()  # a device-side assert would surface here
    out = CALLS[recipe](**_on_gpu(ops), offs=good.cuda(), backend="native").cpu()
    torch.testing.assert_close(out.float(), emulated(recipe, ops, good).float(), rtol=2e-2, atol=1e-2)


@pytest.mark.gpu
def test_gpu_bf16_guards_on_the_card():
    """bf16 torch._grouped_mm's guards on the card: empty experts exactly zero, malformed offs NaN with the CUDA
    context alive."""
    _gpu_sm100()
    sizes = [0, 16, 0, 24]
    a, b = bf16_operands("2d2d", sizes)
    offs = ends_of(sizes)
    out = bf16(a.cuda(), b.cuda(), offs.cuda(), "native").cpu()
    assert not out[0].view(torch.int16).any() and not out[2].view(torch.int16).any()
    torch.testing.assert_close(out.float(), bf16(a, b, offs, "emulated").float(), rtol=2e-2, atol=1e-2)
    for ends in ([12, 12, 12, 40], [16, 8, 8, 40], [0, 16, 16, 41]):  # unaligned, decreasing, past the end
        assert bf16(a.cuda(), b.cuda(), torch.tensor(ends, dtype=torch.int32).cuda(), "native").isnan().all().item()
    torch.cuda.synchronize()  # a device-side assert would surface here
    torch.testing.assert_close(bf16(a.cuda(), b.cuda(), offs.cuda(), "native").cpu().float(),
                               bf16(a, b, offs, "emulated").float(), rtol=2e-2, atol=1e-2)  # fmt: skip


# ---- the guard kernels build for the cards they guard ------------------------------------------------------------


@pytest.mark.parametrize("cc", [100, 90])
def test_the_guard_kernels_cross_compile(cc):
    from crosscompile import compile_ptx

    compile_ptx("mxkernels.gemm.native", "_check_offs_kernel",
                {"offs_ptr": "*i32", "checked_ptr": "*i32", "G": "i32", "total": "i32", "multiple": "i32",
                 "EXEMPT_LAST": "constexpr", "BLOCK_G": "constexpr"},
                {"EXEMPT_LAST": True, "BLOCK_G": 8}, cc)  # fmt: skip
    ptx = compile_ptx("mxkernels.gemm.native", "_fix_output_kernel",
                      {"out_ptr": "*i16", "checked_ptr": "*i32", "G": "i32", "group_numel": "i64",
                       "ZERO_EMPTY": "constexpr", "BLOCK": "constexpr"},
                      {"ZERO_EMPTY": True, "BLOCK": 4096}, cc, aligned=("out_ptr", "checked_ptr", "group_numel"))  # fmt: skip
    assert "st.global.v4.b32" in ptx  # the fill streams 16-byte stores
