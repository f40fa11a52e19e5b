"""The native backend's SM100 guards and its probe at first use (issue 16), without a B200.

No B200 is lent here, so ``gemm_native.ops`` -- the seam in front of ``torch._scaled_grouped_mm`` and
``torch._grouped_mm`` -- gets a double that misbehaves the ways a desk check of torch's and fbgemm's source says the
SM100 kernels do:

* a 2D x 2D group with no tokens is never written (torch allocates the output uninitialized);
* MXFP8 2D x 3D with fewer rows than experts returns the whole output unwritten (fbgemm's ``M /= G; if (M == 0)
  return output;``);
* offs the kernel cannot take (decreasing, past the operand, 2D x 2D sizes off its alignment) trip its device-side
  assert: the double raises and records a dead CUDA context.

Where it writes, the double writes the emulation's bf16 answer, so every guarded output is compared with the
``backend="emulated"`` reference. Offs are "CUDA-like": they say they are on the GPU (so nothing checks them on the
host) and fail the test if the host reads their values, as a CUDA-graph capture would.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from mxkernels import gemm_emulated, gemm_native
from mxkernels import grouped_gemm as GG
from mxkernels.format import BLOCK_SIZE, quantize_reference
from mxkernels.layouts import rearrange_3d_reference, rearrange_k_groups_reference, rearrange_m_groups_reference
from mxkernels.runtime import InputError

UNWRITTEN = 0x5A5A  # bf16 bits of ~1.5e16: what the double leaves where a kernel would leave memory unwritten
SM100, SM90 = (10, 0), (9, 0)


# ---- CUDA-like offs ------------------------------------------------------------------------------------------


class HostRead(AssertionError):
    pass


HOST_READS = frozenset({
    torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.nonzero, torch.Tensor.numpy, torch.Tensor.cpu, torch.nonzero,
    torch.Tensor.unique, torch.unique, torch.masked_select, torch.Tensor.masked_select,
})  # fmt: skip


class CudaLikeOffs(torch.Tensor):
    """int32 offs that report ``is_cuda`` (so no check reads them on the host) and raise ``HostRead`` on every way
    the host reads a tensor's values or sizes by its values. Kernels (the Triton interpreter, the double) read the
    storage, as a GPU kernel would."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.is_cuda.__get__:
            return True
        if func in HOST_READS:
            raise HostRead(f"{getattr(func, '__name__', func)} read CUDA offs on the host (a sync)")
        return super().__torch_function__(func, types, args, kwargs or {})


def cuda_like(offs: torch.Tensor) -> torch.Tensor:
    return offs.as_subclass(CudaLikeOffs)


def device_values(offs: torch.Tensor) -> list[int]:
    """The values of (CUDA-like) offs as a kernel sees them: read from storage, past the host-read trap."""
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.tolist(offs.as_subclass(torch.Tensor))


def plain(offs: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return offs.as_subclass(torch.Tensor).clone()


# ---- the double ----------------------------------------------------------------------------------------------


def unwritten(*shape) -> torch.Tensor:
    return torch.full(shape, UNWRITTEN, dtype=torch.int16).view(torch.bfloat16)


def bounds(ends):
    return list(zip([0, *ends[:-1]], ends))


class DeadContext(RuntimeError):
    pass


class SM100Double:
    """torch's native grouped GEMMs as the SM100 kernels are reported to behave (module doc)."""

    def __init__(self, config: str = "USE_CUDA=1, USE_MSLK=ON, USE_ROCM=OFF"):
        self.config = config
        self.offs_seen: list[list[int]] = []
        self.dead = False

    def build_config(self) -> str:
        return self.config

    def _kernel_reads(self, offs, total, multiple=1, exempt_last=False):
        """The kernel's device-side asserts on offs: a failure kills the CUDA context."""
        ends = device_values(offs)
        self.offs_seen.append(ends)
        for g, (start, end) in enumerate(bounds(ends)):
            aligned = (end - start) % multiple == 0 or (exempt_last and g == len(ends) - 1)
            if end < start or end > total or not aligned:
                self.dead = True
                raise DeadContext(f"device-side assert triggered (group {g}: [{start}, {end}) of {total})")
        return ends

    def scaled_grouped_mm(self, a, b, scale_a, scale_b, *, offs, out_dtype):
        G = offs.numel()
        if b.dim() == 3:  # 2D x 3D: a (M, K), b (G, K, N), a transposed view of (G, N, K)
            M, N = a.shape[0], b.shape[2]
            ends = self._kernel_reads(offs, M)
            out = unwritten(M, N)
            if M // G == 0:
                return out  # fbgemm: "normalized jagged dim for heuristics", then an early return
            b_sb = scale_b.view(torch.uint8).reshape(G, -1, scale_a.shape[1])
            ref = gemm_emulated.run_mxfp8(a, scale_a, b.transpose(-2, -1), b_sb, plain(offs), torch.bfloat16)
            for start, end in bounds(ends):
                out[start:end] = ref[start:end]
            return out
        # 2D x 2D: a (N, M), b (M, K), a transposed view of (K, M)
        ends = self._kernel_reads(offs, a.shape[1], BLOCK_SIZE)
        out = unwritten(G, a.shape[0], b.shape[1])
        ref = gemm_emulated.run_mxfp8(a, scale_a, b.t(), scale_b, plain(offs), torch.bfloat16)
        for g, (start, end) in enumerate(bounds(ends)):
            if end > start:  # only non-empty groups get a problem set up
                out[g] = ref[g]
        return out

    def grouped_mm(self, a, b, *, offs):
        G = offs.numel()
        if b.dim() == 3:
            ends = self._kernel_reads(offs, a.shape[0], 8 if a.stride(-1) != 1 else 1, exempt_last=True)
            out = unwritten(a.shape[0], b.shape[2])
            ref = gemm_emulated.grouped_matmul_fp32(a, b, plain(offs), torch.bfloat16)
            for start, end in bounds(ends):
                out[start:end] = ref[start:end]
            return out
        moves = a.stride(-1) == 1 or b.stride(-1) != 1
        ends = self._kernel_reads(offs, a.shape[1], 8 if moves else 1, exempt_last=True)
        out = unwritten(G, a.shape[0], b.shape[1])
        ref = gemm_emulated.grouped_matmul_fp32(a, b, plain(offs), torch.bfloat16)
        for g, (start, end) in enumerate(bounds(ends)):
            if end > start:  # a K = 0 group keeps whatever the accumulator held (pytorch#172439)
                out[g] = ref[g]
        return out


@pytest.fixture
def unprobed_sm100(monkeypatch):
    """A compute capability 10.x device (``grouped_gemm`` asks ``gemm_native.capability`` too) whose torch calls are
    the double, not yet probed, with a fresh count of malformed offs."""
    double = SM100Double()
    monkeypatch.setattr(gemm_native, "ops", double)
    monkeypatch.setattr(gemm_native, "capability", lambda device: SM100)
    monkeypatch.setattr(gemm_native, "_PROBES", {})
    monkeypatch.setattr(gemm_native, "_BAD_OFFS", {})
    return double


@pytest.fixture
def sm100(unprobed_sm100):
    """``unprobed_sm100`` after native MXFP8's probe at first use, which a right kernel passes."""
    assert GG.backend_unavailable("mxfp8", "native", torch.device("cpu")) is None
    unprobed_sm100.offs_seen.clear()
    return unprobed_sm100


# ---- operands ------------------------------------------------------------------------------------------------


def ends_of(sizes) -> torch.Tensor:
    return torch.tensor(list(itertools.accumulate(sizes)), dtype=torch.int32)


def mx_case(case, sizes, seed=0, rows=None, K=64, N=48, R=40):
    """MXFP8 operands of ``mxfp8_scaled_grouped_mm`` (blocked scales from the plain-torch references) and offs.
    2D x 3D: a (rows or sum(sizes), K) @ w (G, N, K); 2D x 2D: x (N, M) and y (R, M), M = sum(sizes)."""
    gen = torch.Generator().manual_seed(seed)
    offs, G = ends_of(sizes), len(sizes)
    if case == "2d3d":
        a_q, a_s = quantize_reference(torch.randn(sum(sizes) if rows is None else rows, K, generator=gen))
        w_q, w_s = quantize_reference(torch.randn(G, N, K, generator=gen))
        ops = {"a_q": a_q, "a_sb": rearrange_m_groups_reference(a_s, offs), "b_q": w_q,
               "b_sb": rearrange_3d_reference(w_s)}  # fmt: skip
    else:
        M = sum(sizes)
        x_q, x_s = quantize_reference(torch.randn(N, M, generator=gen))
        y_q, y_s = quantize_reference(torch.randn(R, M, generator=gen))
        ops = {"a_q": x_q, "a_sb": rearrange_k_groups_reference(x_s, offs), "b_q": y_q,
               "b_sb": rearrange_k_groups_reference(y_s, offs)}  # fmt: skip
    return ops, offs


def emulated(ops, offs):
    return GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="emulated")


def native(ops, offs):
    return GG.mxfp8_scaled_grouped_mm(**ops, offs=cuda_like(offs), backend="native")


def same_bits(x, y):
    return torch.equal(x.view(torch.int16), y.view(torch.int16))


# ---- the double is wrong where the guards must act -----------------------------------------------------------


def test_the_double_misbehaves_where_the_guards_must_act(sm100):
    """Unguarded, the double leaves an empty wgrad group unwritten, returns a few-rows forward unwritten and kills
    the context on unaligned wgrad groups: what the guarded tests below prove the guards repair or refuse."""
    ops, offs = mx_case("2d2d", [64, 0, 32])
    sa, sb = ops["a_sb"].view(torch.float8_e8m0fnu), ops["b_sb"].view(torch.float8_e8m0fnu)
    raw = sm100.scaled_grouped_mm(ops["a_q"], ops["b_q"].t(), sa, sb, offs=offs, out_dtype=torch.bfloat16)
    ref = emulated(ops, offs)
    assert same_bits(raw[0], ref[0]) and same_bits(raw[2], ref[2])
    assert not ref[1].any() and (raw[1] != 0).all()

    ops, offs = mx_case("2d3d", [1, 0, 2, 0])
    G = offs.numel()
    raw = sm100.scaled_grouped_mm(ops["a_q"], ops["b_q"].transpose(-2, -1), ops["a_sb"].view(torch.float8_e8m0fnu),
                                  ops["b_sb"].view(torch.float8_e8m0fnu).reshape(G, -1), offs=offs,
                                  out_dtype=torch.bfloat16)  # fmt: skip
    assert (raw.view(torch.int16) == UNWRITTEN).all()

    ops, offs = mx_case("2d2d", [64, 32])
    with pytest.raises(DeadContext):
        sm100.scaled_grouped_mm(ops["a_q"], ops["b_q"].t(), ops["a_sb"].view(torch.float8_e8m0fnu),
                                ops["b_sb"].view(torch.float8_e8m0fnu), offs=ends_of([48, 48]),
                                out_dtype=torch.bfloat16)  # fmt: skip
    assert sm100.dead


# ---- MXFP8 -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[0, 64, 0, 96, 0], [32, 0, 0, 32], [0, 0, 0]])
def test_mxfp8_wgrad_empty_groups_are_zero(sm100, sizes):
    ops, offs = mx_case("2d2d", sizes)
    out = native(ops, offs)
    assert same_bits(out, emulated(ops, offs))
    assert all(not out[g].any() for g, size in enumerate(sizes) if size == 0)
    assert not sm100.dead


@pytest.mark.parametrize("rows, sizes", [(1, [1, 0, 0, 0]), (3, [1, 0, 2, 0, 0]), (3, [0, 0, 2, 0]), (2, [0, 0])])
def test_mxfp8_forward_with_fewer_rows_than_experts(sm100, rows, sizes):
    """rows < G goes around fbgemm's early return; rows == G (the last case) never met it."""
    ops, offs = mx_case("2d3d", sizes, rows=rows)
    out = native(ops, offs)
    valid = int(offs[-1])
    assert out.shape == (rows, 48)
    assert same_bits(out[:valid], emulated(ops, offs)[:valid])
    assert not sm100.dead
    gemm_native.raise_if_bad_offsets("cpu")  # nothing to report


WGRAD_MALFORMED = {
    "unaligned": [48, 16, 64],  # sizes 48, 16: an MX block would straddle two experts
    "decreasing": [64, 32, 128],
    "past the end": [64, 64, 160],
    "negative": [-32, 64, 128],
}


@pytest.mark.parametrize("ends", WGRAD_MALFORMED.values(), ids=WGRAD_MALFORMED.keys())
def test_mxfp8_malformed_wgrad_offs_never_reach_the_kernel(sm100, ends):
    ops, good = mx_case("2d2d", [64, 0, 64])
    bad = torch.tensor(ends, dtype=torch.int32)
    out = native(ops, bad)  # no host read (CudaLikeOffs), no exception: the check is on the device
    assert not sm100.dead and sm100.offs_seen == [[0, 0, 0]]  # the kernel ran with every group empty
    assert out.shape == (3, 48, 40) and out.isnan().all()
    with pytest.raises(InputError, match="offs: 1 native grouped GEMM call.*multiples of 32"):
        gemm_native.raise_if_bad_offsets("cpu")
    gemm_native.raise_if_bad_offsets("cpu")  # the count was reset
    assert same_bits(native(ops, good), emulated(ops, good))  # and the next good call is untouched
    gemm_native.raise_if_bad_offsets("cpu")


def test_mxfp8_malformed_forward_offs_never_reach_the_kernel(sm100):
    ops, good = mx_case("2d3d", [40, 0, 24])
    for ends in ([40, 20, 64], [40, 40, 65]):
        out = native(ops, torch.tensor(ends, dtype=torch.int32))
        assert out.isnan().all()
    assert not sm100.dead and sm100.offs_seen == [[0, 0, 0]] * 2
    with pytest.raises(InputError, match="offs: 2 native grouped GEMM calls?"):
        gemm_native.raise_if_bad_offsets("cpu")
    assert same_bits(native(ops, good)[:64], emulated(ops, good)[:64])


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


@pytest.mark.parametrize("sizes", [[0, 16, 0, 24], [8, 0, 0]])
def test_bf16_wgrad_empty_groups_are_zero(sm100, sizes):
    a, b = bf16_operands("2d2d", sizes)
    offs = ends_of(sizes)
    for a_view in (a, a.t().contiguous().t()):  # K contiguous, and a transposed view (no TMA rule along K for a)
        out = GG.grouped_mm(a_view, b, cuda_like(offs), recipe="bf16", backend="native").out
        assert same_bits(out, GG.grouped_mm(a_view, b, offs, recipe="bf16", backend="emulated").out)
        assert all(not out[g].any() for g, size in enumerate(sizes) if size == 0)
    assert not sm100.dead


def test_bf16_alignment_is_torchs_rule_checked_on_the_device(sm100):
    """torch asserts 16-byte groups (8 bf16) along a contiguous contraction dim, the last group excepted: the guard
    lets that last group through and refuses any other off the rule."""
    a, b = bf16_operands("2d2d", [16, 8, 13])
    ok = ends_of([16, 8, 13])
    out = GG.grouped_mm(a, b, cuda_like(ok), recipe="bf16", backend="native").out
    assert same_bits(out, GG.grouped_mm(a, b, ok, recipe="bf16", backend="emulated").out)
    out = GG.grouped_mm(a, b, cuda_like(ends_of([12, 12, 13])), recipe="bf16", backend="native").out
    assert out.isnan().all() and not sm100.dead
    with pytest.raises(InputError, match="16 bytes"):
        gemm_native.raise_if_bad_offsets("cpu")


def test_bf16_forward_is_guarded_for_bounds_only(sm100):
    sizes = [5, 0, 11]
    a, b = bf16_operands("2d3d", sizes)
    offs = ends_of(sizes)
    out = GG.grouped_mm(a, b, cuda_like(offs), recipe="bf16", backend="native").out
    ref = GG.grouped_mm(a, b, offs, recipe="bf16", backend="emulated").out
    assert same_bits(out[:16], ref[:16])  # rows of no group are unspecified
    out = GG.grouped_mm(a, b, cuda_like(ends_of([5, 0, 30])), recipe="bf16", backend="native").out  # 25 rows
    assert out.isnan().all() and not sm100.dead


def test_bf16_on_sm90_is_left_alone(unprobed_sm100, monkeypatch):
    """The guards are for 10.x: on SM90 torch._grouped_mm gets offs as they are and nothing runs after it."""
    monkeypatch.setattr(gemm_native, "capability", lambda device: SM90)
    monkeypatch.setattr(gemm_native, "checked_offsets", None)  # calling it would raise
    monkeypatch.setattr(gemm_native, "fix_output", None)
    a, b = bf16_operands("2d2d", [16, 0, 8])
    out = GG.grouped_mm(a, b, ends_of([16, 0, 8]), recipe="bf16", backend="native").out
    assert (out[1].view(torch.int16) == UNWRITTEN).all()  # the double's garbage, as on a B200 without the guards


def test_triton_dequant_wgrad_empty_groups_are_zero(sm100):
    ops, offs = mx_case("2d2d", [0, 64, 0, 32])
    out = GG.mxfp8_scaled_grouped_mm(**ops, offs=cuda_like(offs), backend="triton_dequant")
    assert not out[0].any() and not out[2].any()
    # Exact bf16 operands, the same fp32 products and sums (the double multiplies like the emulation).
    assert same_bits(out, emulated(ops, offs))


# ---- what `mxbench check` makes of it ----------------------------------------------------------------------------


def first_run_check():
    """`mxbench check --stage gemm_fwd,gemm_dgrad,gemm_wgrad` of mxkernels:native, as a B200 user runs it first
    (docs/b200.md): an empty group, unaligned groups padded, adversarial MX blocks."""
    from mxbench import check as C
    from mxbench.registry import builtin_registry

    registry = builtin_registry()
    impls = {s: [registry.get("mxfp8", s, "mxkernels:native")] for s in ("gemm_fwd", "gemm_dgrad", "gemm_wgrad")}
    return {r.stage: (r.verdict, r.finding()) for r in C.check_step("mxfp8", 512, 128, 256, 2, impls)}


def test_the_first_run_check_passes_the_guarded_native_backend(sm100):
    results = first_run_check()
    assert {stage: verdict for stage, (verdict, _) in results.items()} == dict.fromkeys(results, "PASS"), results
    assert set(results) == {"gemm_fwd", "gemm_dgrad", "gemm_wgrad"}


def test_the_first_run_check_catches_an_unwritten_empty_group(sm100, monkeypatch):
    """Without the empty-group guard the wgrad of the check's empty group is the double's garbage (~1.5e16 where
    the oracle has 0): the per-expert rule of the 2D x 2D GEMMs fails it, however large the other experts are."""
    monkeypatch.setattr(gemm_native, "fix_output", lambda out, checked, zero_empty: out)
    assert first_run_check()["gemm_wgrad"][0] == "FAIL"


# ---- the probe at first use ------------------------------------------------------------------------------------


class WrongAnswer(SM100Double):
    """A kernel whose answers are off by a power of two, as a scale read from the wrong place would make them."""

    def scaled_grouped_mm(self, a, b, scale_a, scale_b, *, offs, out_dtype):
        out = super().scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=out_dtype)
        return out * 2


class Raising(SM100Double):
    def scaled_grouped_mm(self, *args, **kwargs):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")


PROBE_FAILURES = {
    "no MX kernels in the build": (SM100Double("USE_CUDA=1, USE_ROCM=OFF"), "neither USE_FBGEMM_GENAI nor USE_MSLK"),
    "MX kernels off": (SM100Double("USE_FBGEMM_GENAI=OFF, USE_MSLK=0"), "neither USE_FBGEMM_GENAI nor USE_MSLK"),
    "the GEMM raises": (Raising(), "raised on cpu: RuntimeError: CUDA error: no kernel image"),
    "a wrong answer": (WrongAnswer(), r"\(2D x 3D\) on cpu got \d+ of \d+ outputs wrong"),
}


@pytest.mark.parametrize("double, reason", PROBE_FAILURES.values(), ids=PROBE_FAILURES.keys())
def test_a_failed_probe_makes_native_unavailable_with_its_reason(unprobed_sm100, monkeypatch, double, reason):
    from mxbench.registry import builtin_registry

    monkeypatch.setattr(gemm_native, "ops", double)
    cpu = torch.device("cpu")
    why = GG.backend_unavailable("mxfp8", "native", cpu)
    assert why is not None and why.startswith("native MXFP8 failed its probe at first use: ")
    assert re.search(reason, why)
    assert "native" not in GG.available_backends("mxfp8", cpu) and GG.default_backend("mxfp8", cpu) == "triton"
    ops, offs = mx_case("2d3d", [32, 32])
    with pytest.raises(RuntimeError, match="failed its probe"):
        GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="native")
    # What the registry, and so `mxbench check`, reads for the mxkernels:native rows.
    impl = builtin_registry().get("mxfp8", "gemm_fwd", "mxkernels:native")
    assert impl.unavailable(cpu) == why


def test_a_passing_probe_runs_once_per_device_and_makes_native_the_default(unprobed_sm100, monkeypatch):
    calls = []
    real = unprobed_sm100.scaled_grouped_mm
    monkeypatch.setattr(unprobed_sm100, "scaled_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    cpu = torch.device("cpu")
    assert GG.default_backend("mxfp8", cpu) == "native"
    probe_calls = len(calls)
    assert probe_calls == 3  # the three known-answer GEMMs
    assert GG.backend_unavailable("mxfp8", "native", cpu) is None and len(calls) == probe_calls
    assert not unprobed_sm100.dead


def test_the_known_answer_cases_are_exact_and_cover_every_guard():
    for name, (operands, offs, rows) in gemm_native._known_answer_cases().items():
        fp32 = gemm_emulated.run_mxfp8(*operands, offs, torch.float32)[:rows]
        assert torch.equal(fp32.bfloat16().float(), fp32), name  # exact in bf16: no rounding to disagree on
        assert fp32.any(), name
    cases = gemm_native._known_answer_cases()
    assert (cases["2D x 2D"][1].diff() == 0).any() and (cases["2D x 3D"][1].diff() == 0).any()  # empty groups
    a_q, *_ = cases["2D x 3D, fewer rows than experts"][0]
    assert a_q.shape[0] < cases["2D x 3D, fewer rows than experts"][1].numel()


def test_the_probe_waits_outside_cuda_graph_capture(unprobed_sm100, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    why = gemm_native.unavailable("mxfp8", SM100, torch.device("cuda", 0))
    assert "before CUDA-graph capture" in why
    assert unprobed_sm100.offs_seen == [] and gemm_native._PROBES == {}  # nothing launched, nothing cached


@pytest.mark.parametrize(
    "config, flag",
    [
        ("Build settings: BLAS_INFO=mkl, USE_CUDA=ON, USE_FBGEMM_GENAI=ON, USE_ROCM=OFF", "USE_FBGEMM_GENAI"),
        ("USE_FBGEMM_GENAI=OFF, USE_MSLK=ON", "USE_MSLK"),
        ("USE_MSLK=1", "USE_MSLK"),
        ("... USE_MSLK, ...", "USE_MSLK"),
        ("USE_FBGEMM_GENAI=OFF, USE_MSLK=OFF", None),
        ("USE_FBGEMM=ON, USE_MSLKX=ON", None),
        (torch.__config__.show(), None),  # this CPU build
    ],
)
def test_the_build_probe_reads_torch_config(config, flag):
    assert gemm_native.mx_build_flag(config) == flag


# ---- the guard kernels build for the cards they guard ------------------------------------------------------------


@pytest.mark.parametrize("cc", [100, 90])
def test_the_guard_kernels_cross_compile(cc):
    from crosscompile import compile_ptx

    compile_ptx("mxkernels.gemm_native", "_check_offs_kernel",
                {"offs_ptr": "*i32", "checked_ptr": "*i32", "bad_count_ptr": "*i32", "G": "i32", "total": "i32",
                 "multiple": "i32", "EXEMPT_LAST": "constexpr", "BLOCK_G": "constexpr"},
                {"EXEMPT_LAST": True, "BLOCK_G": 8}, cc)  # fmt: skip
    ptx = compile_ptx("mxkernels.gemm_native", "_fix_output_kernel",
                      {"out_ptr": "*i16", "checked_ptr": "*i32", "G": "i32", "group_numel": "i64",
                       "ZERO_EMPTY": "constexpr", "BLOCK": "constexpr"},
                      {"ZERO_EMPTY": True, "BLOCK": 4096}, cc, aligned=("out_ptr", "checked_ptr", "group_numel"))  # fmt: skip
    assert "st.global.v4.b32" in ptx  # the fill streams 16-byte stores
