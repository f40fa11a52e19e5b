"""Native MXFP8's probe at first use (issues 16 and 23): the build's kernel image for the card, read from the real
``torch.__config__.show()`` texts of tests/fixtures (README there: where each came from), then the known-answer
GEMMs through the double of native_double.py."""

from __future__ import annotations

import re

import pytest
import torch
from mxkernels.gemm import emulated
from mxkernels.gemm import native as gemm_native
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.native_build import Code, Target, parse_targets, read_build
from native_double import SM100, TORCH_2_11_CU130, fixture_text, install, mx_case
from native_double import SM100Double as Double

CPU_2_13 = "torch-2.13.0+cpu-config.txt"
NO_GPU_2_6 = "torch-2.6.0+cu124-config-no-gpu.txt"


def torch_2_6_arch() -> dict[str, str]:
    """The real arch strings of torch 2.6.0+cu124 (fixtures/README.md): its gencode list and the string that
    ``torch.cuda.get_arch_list()`` splits."""
    lines = fixture_text("torch-2.6.0+cu124-arch.txt").splitlines()
    return dict(line.split("=", 1) for line in lines)


def torch_2_6_on_a_gpu() -> str:
    """torch 2.6.0+cu124's config text with its real gencode list on the "NVCC architecture flags" line, which torch
    prints only where it sees a GPU: the real no-GPU text with that line put where torch 2.11 prints it."""
    text = fixture_text(NO_GPU_2_6)
    line = f"  - NVCC architecture flags: {torch_2_6_arch()['nvcc_architecture_flags']}\n"
    at = text.index("  - Build settings:")
    return text[:at] + line + text[at:]


# ---- the build, from real config texts -------------------------------------------------------------------------


def test_torch_2_11_cu130_has_an_sm100_image():
    build = read_build(fixture_text(TORCH_2_11_CU130))
    # By hand from its gencode list: what torch.cuda.get_arch_list() returns on a GPU.
    assert [str(t) for t in build.targets] == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert build.version == "2.11.0"
    assert build.refusal(SM100) is None and build.runs_on(SM100) == (Target(Code.CUBIN, 10, 0, ""),)
    assert build.refusal((10, 3)) is None  # sm_100 code runs on a B300 too
    assert "torch 2.11.0 carries sm_100 for compute capability 10.0" in build.finding(SM100)


def test_a_cpu_build_is_refused_as_such():
    build = read_build(fixture_text(CPU_2_13))
    assert build.targets == () and build.version == "2.13.0"
    assert build.refusal(SM100) == ("torch 2.13.0 lists no CUDA targets (torch.__config__.show() has no NVCC "
                                    "architecture flags): a build without CUDA")  # fmt: skip


def test_torch_2_6_cu124_has_no_sm100_image():
    build = read_build(torch_2_6_on_a_gpu())
    assert build.version == "2.6.0"
    assert build.refusal(SM100) == (
        "torch 2.6.0 was compiled for sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90 (torch.__config__.show(), "
        "NVCC architecture flags): none runs on compute capability 10.0"
    )
    assert build.refusal((9, 0)) is None
    # Printed where no GPU is seen, the same build's text lists no targets at all.
    assert read_build(fixture_text(NO_GPU_2_6)).targets == ()


def test_the_gencode_targets_are_what_get_arch_list_returns():
    """torch 2.6.0+cu124's gencode list, parsed, against the string its ``torch.cuda.get_arch_list()`` splits (both
    taken from the wheel)."""
    arch = torch_2_6_arch()
    assert [str(t) for t in parse_targets(arch["nvcc_architecture_flags"])] == arch["cuda_arch_flags"].split()


@pytest.mark.parametrize(
    "target, cap, runs",
    [
        ("sm_100", (10, 0), True),
        ("sm_100", (10, 3), True),  # a cubin runs on later minors of its major
        ("sm_103", (10, 0), False),
        ("sm_100a", (10, 0), True),
        ("sm_100a", (10, 3), False),  # arch-specific: its own capability only
        ("sm_103a", (10, 3), True),
        ("sm_100f", (10, 3), True),  # family
        ("compute_100", (10, 0), True),
        ("compute_90", (10, 0), False),  # PTX of an older major: no SM100 code in it
        ("sm_90", (10, 0), False),
        ("sm_120", (10, 0), False),
    ],
)
def test_which_targets_run_on_a_card(target, cap, runs):
    (parsed,) = parse_targets(f"-gencode;arch=compute_100,code={target}")
    assert str(parsed) == target and parsed.runs_on(cap) == runs


def test_targets_are_read_from_every_code_of_a_gencode_flag():
    gencode = "-gencode;arch=compute_90,code=sm_90;-gencode;arch=compute_100a,code=[sm_100a,compute_100a]"
    targets = parse_targets(gencode)
    assert [str(t) for t in targets] == ["sm_90", "sm_100a", "compute_100a"]
    assert [t.code for t in targets] == [Code.CUBIN, Code.CUBIN, Code.PTX]


# ---- the probe through the double ------------------------------------------------------------------------------


class WrongAnswer(Double):
    """A kernel whose answers are off by a power of two, as a scale read from the wrong place would make them."""

    def scaled_grouped_mm(self, *args, **kwargs):
        return super().scaled_grouped_mm(*args, **kwargs) * 2


class Raising(Double):
    def scaled_grouped_mm(self, *args, **kwargs):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device")


PROBE_FAILURES = {
    "a CPU build": (lambda: Double(fixture_text(CPU_2_13)), r"torch 2\.13\.0 lists no CUDA targets"),
    "a build without sm_100": (
        lambda: Double(torch_2_6_on_a_gpu()),
        r"torch 2\.6\.0 was compiled for sm_50, .*, sm_90 .*: none runs on compute capability 10\.0",
    ),
    "the GEMM raises": (
        Raising,
        (r"torch 2\.11\.0 carries sm_100 .*, but the known-answer MXFP8 grouped GEMM \(2D x 3D\) raised on cpu: "
         r"RuntimeError: CUDA error: no kernel image"),
    ),
    "a wrong answer": (WrongAnswer, r"\(2D x 3D\) on cpu got \d+ of \d+ outputs wrong"),
}


@pytest.mark.parametrize("make, reason", PROBE_FAILURES.values(), ids=PROBE_FAILURES.keys())
def test_a_failed_probe_makes_native_unavailable_with_its_reason(monkeypatch, make, reason):
    from mxbench.implementations.check import native_line
    from mxbench.implementations.default import builtin_registry

    install(monkeypatch, make())
    cpu = torch.device("cpu")
    why = GG.backend_unavailable("mxfp8", "native", cpu)
    assert why is not None and why.startswith("native MXFP8 failed its probe at first use: ")
    assert re.search(reason, why), why
    assert "native" not in GG.available_backends("mxfp8", cpu) and GG.default_backend("mxfp8", cpu) == "triton"
    ops, offs = mx_case("2d3d", [32, 32])
    with pytest.raises(RuntimeError, match="failed its probe"):
        GG.mxfp8_scaled_grouped_mm(**ops, offs=offs, backend="native")
    # What the registry, and so `mxbench check`, reads for the mxkernels:native rows, and the line check prints.
    assert builtin_registry().get("mxfp8", "gemm_fwd", "mxkernels:native").unavailable(cpu) == why
    assert native_line("mxfp8", cpu) == f"native mxfp8 on cpu: unavailable: {why}"


def test_the_real_torch_2_11_build_passes_the_probe_once_per_device(monkeypatch):
    """The build every committed GPU run used, which the old probe refused (it carries MSLK only as -DUSE_MSLK in
    CXX_FLAGS): native is the default, and the reason names what was found."""
    double = install(monkeypatch, Double(fixture_text(TORCH_2_11_CU130)))
    calls = []
    real = double.scaled_grouped_mm
    monkeypatch.setattr(double, "scaled_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    cpu = torch.device("cpu")
    assert GG.default_backend("mxfp8", cpu) == "native"
    assert len(calls) == 3  # the three known-answer GEMMs
    assert GG.backend_unavailable("mxfp8", "native", cpu) is None and len(calls) == 3
    found = gemm_native.verdict("mxfp8", SM100, cpu)
    assert found.available and found.reason.startswith(
        "native MXFP8 passed its probe at first use: torch 2.11.0 carries sm_100 for compute capability 10.0 "
        "(of sm_75, sm_80, sm_86, sm_90, sm_100, sm_120), and the known-answer MXFP8 grouped GEMMs on cpu"
    )
    assert len(calls) == 3 and not double.dead


def test_the_known_answer_cases_are_exact_and_cover_every_guard():
    for name, (operands, offs, rows) in gemm_native._known_answer_cases().items():
        fp32 = emulated.run_mxfp8(*operands, offs, torch.float32)[:rows]
        assert torch.equal(fp32.bfloat16().float(), fp32), name  # exact in bf16: no rounding to disagree on
        assert fp32.any(), name
    cases = gemm_native._known_answer_cases()
    assert (cases["2D x 2D"][1].diff() == 0).any() and (cases["2D x 3D"][1].diff() == 0).any()  # empty groups
    a_q, *_ = cases["2D x 3D, fewer rows than experts"][0]
    assert a_q.shape[0] < cases["2D x 3D, fewer rows than experts"][1].numel()


@pytest.mark.parametrize("guard, stub, case", [
    ("fix_output", lambda out, checked, zero_empty: out, r"\(2D x 2D\)"),
    ("rows_for_every_expert", lambda x, G: x, r"\(2D x 3D, fewer rows than experts\)"),
])  # fmt: skip
def test_the_probe_refuses_native_without_a_guard(monkeypatch, guard, stub, case):
    """The known-answer GEMMs put the SM100 kernels' misbehaviour in front of the guards: without one, the
    double's unwritten output makes the probe fail on the case that needs it."""
    install(monkeypatch, Double())
    monkeypatch.setattr(gemm_native, guard, stub)
    why = GG.backend_unavailable("mxfp8", "native", torch.device("cpu"))
    assert why is not None and re.search(case + r" on cpu got \d+ of \d+ outputs wrong", why), why


def test_the_probe_waits_outside_cuda_graph_capture(monkeypatch):
    double = install(monkeypatch, Double())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    why = gemm_native.unavailable("mxfp8", SM100, torch.device("cuda", 0))
    assert "before CUDA-graph capture" in why
    assert double.offs_seen == [] and gemm_native._PROBES == {}  # nothing launched, nothing cached
