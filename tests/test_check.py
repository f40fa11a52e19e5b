"""Stage specs, the implementation registry and ``check``: every implementation against the stage's oracle.

The oracle of each stage is its plain-torch reference; mxkernels' own kernels must pass every rule on the checks'
adversarial inputs, a plain-torch quantizer written from the MX spec alone (the README's example) must pass, and one
wrong byte must fail, named by index, input, expected and got.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from helpers import with_flipped_bits
from mxkernels.core.comparison import BitExact, MinSQNR
from mxkernels.core.names import Recipe
from mxkernels.stages.pipeline import step_stages
from mxkernels.core.runtime import InputError
from mxkernels.stages.step_specs import all_specs, get_spec, specs_of

from mxbench.implementations import check as C
from mxbench.implementations.default import builtin_registry, load_entry_points
from mxbench.implementations.registry import Deviation, Implementation, Registry, parse_impl

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "plain_quantizer"
SMALL = {"M": 512, "N": 128, "K": 256, "G": 2}
# Where the checks run: the GPU when there is one (as `mxbench check` does), else the CPU under the interpreter.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def plain(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    sys.modules.pop("plain_quantizer", None)
    import plain_quantizer

    return plain_quantizer


def run(impls, recipe="mxfp8", mode="rceil", **shape):
    shape = {**SMALL, **shape}
    by_stage = {}
    for i in impls:
        by_stage.setdefault(i.stage, []).append(i)
    results = C.check_step(recipe, shape["M"], shape["N"], shape["K"], shape["G"], by_stage, mode=mode, device=DEVICE)
    return C.merged(results)  # one row per implementation: its worst verdict over the scenarios


# ---- the rules -------------------------------------------------------------------------------------------------


def test_bit_exact_names_the_first_differing_element():
    expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).to(torch.float8_e4m3fn)
    got = expected.clone()
    got.view(torch.uint8)[1, 0] ^= 1
    m = BitExact().compare("q", got, expected)
    assert m.index == (1, 0) and "1 of 4 elements differ" in m.message
    assert m.expected.startswith("3.0 (byte 0x44)") and "byte 0x45" in m.got
    assert BitExact().compare("q", expected.clone(), expected) is None


def test_bit_exact_tells_signed_zeros_and_nan_payloads_apart_but_not_layouts():
    expected = torch.tensor([0.0, float("nan")])
    assert BitExact().compare("x", torch.tensor([-0.0, float("nan")]), expected).index == (0,)
    square = torch.arange(6.0).reshape(2, 3)
    assert BitExact().compare("x", square.t().contiguous().t(), square) is None  # column-major, same values
    assert "shape" in BitExact().compare("x", square.t(), square).message
    assert "dtype" in BitExact().compare("x", square.double(), square).message


def test_sqnr_rule_requires_the_oracles_nan_pattern_and_a_floor():
    ref = torch.linspace(-1, 1, 100)
    noisy = ref + 1e-4 * torch.sin(torch.arange(100.0))  # ~80 dB
    assert MinSQNR(60).compare("y", noisy, ref) is None
    assert "SQNR" in MinSQNR(90).compare("y", noisy, ref).message
    ref_nan = ref.clone()
    ref_nan[5] = float("nan")
    assert MinSQNR(60).compare("y", ref, ref_nan).index == (5,)


def test_every_stage_declares_a_contract_an_oracle_and_a_rule():
    specs = all_specs()
    assert {r for r, _ in specs} == set(Recipe)
    assert get_spec("mxfp8", "quantize_a").signature() == "quantize_a(a, *, mode) -> (a_q, a_s)"
    assert get_spec("mxfp8", "pad_a").signature() == "pad_a(a, offs, *, alignment) -> (a_p, offs_p)"
    for spec in specs.values():
        assert isinstance(spec.rule, MinSQNR if spec.category == "gemm" else BitExact), spec.key
        assert callable(spec.oracle) and callable(spec.impl) and spec.inputs and spec.outputs
    assert [s.name for s in specs_of("bf16")][:3] == ["gemm_fwd", "gemm_dgrad", "gemm_wgrad"]
    with pytest.raises(InputError, match="no stage 'gemm'"):
        get_spec("mxfp8", "gemm")


# ---- mxkernels against the oracles ---------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", [Recipe.FP8_ROWWISE, Recipe.BF16])
def test_mxkernels_passes_every_stage_on_adversarial_inputs(recipe):
    """At small sizes (three experts: one empty, two unaligned). MXFP8: `mxbench check` at its defaults, in
    test_cli_registry's clean-install test."""
    registry = builtin_registry()
    ours = [i for i in registry if i.recipe == recipe and i.name == "mxkernels"]
    results = run(ours, recipe, M=256, N=64, K=128, G=3)
    assert {r.stage for r in results} == {s.name for s in specs_of(recipe)}
    assert [r for r in results if r.verdict != C.Verdict.PASS] == []


def test_the_inputs_hold_an_empty_group_unaligned_groups_and_the_adversarial_blocks():
    inputs, sizes = C.check_inputs("mxfp8", 512, 128, 256, 3, device="cpu")
    assert sizes[0] == 0 and sum(sizes) == 512 and any(s % 32 for s in sizes)
    a = inputs["a"].float()
    assert torch.isnan(a).any() and torch.isinf(a).any() and (a.abs() == 448).any()
    assert ((a != 0) & (a.abs() < 2.0**-126)).any()  # fp32 subnormals
    finite, _ = C.check_inputs("fp8_rowwise", 512, 128, 256, 3, device="cpu")
    assert torch.isfinite(finite["a"].float()).all()


@pytest.mark.parametrize(
    "M, G, alignment, sizes",
    [
        (32, 4, 32, [0, 32, 0, 0]),  # 32 rows for 4 experts: 1 block over 3 experts
        (48, 5, 16, [0, 16, 16, 16, 0]),
        (160, 3, 32, [0, 96, 64]),  # 5 blocks over 2 experts, the extra one to the first
        (64, 1, 32, [64]),
    ],
)
def test_aligned_groups_for_the_unpadded_step(M, G, alignment, sizes):
    assert C.check_group_sizes(M, G, alignment, aligned=True) == sizes
    with pytest.raises(InputError, match="multiple of 32, got 40"):
        C.check_group_sizes(40, G, 32, aligned=True)


def test_the_unpadded_check_gives_the_gemms_fewer_rows_than_experts():
    """`mxbench check --no-pad --G 64 --M 32`: the step has no pad stages, and its forward GEMM gets a (32, K) for
    64 experts."""
    registry = builtin_registry()
    impls = {s: [registry.get("mxfp8", s, "mxkernels")] for s in ("gemm_fwd", "gemm_wgrad")}
    results = C.check_step("mxfp8", 32, 128, 64, 64, impls, pad=False)
    assert [(r.stage, r.verdict) for r in results] == [("gemm_fwd", "PASS"), ("gemm_wgrad", "PASS")]
    stages = {s.name: s for s in step_stages("mxfp8", 32, 128, 64, 64, pad=False)}
    assert "pad_a" not in stages and stages["gemm_fwd"].shapes[0] == (32, 64)


@pytest.mark.parametrize(
    "M, G, pad, alignment, expected",
    [
        (512, 4, True, 32, [(512, 4, True), (3, 4, True)]),  # padded: G-1 tokens, whatever the alignment
        (32, 64, False, 16, [(32, 64, False), (16, 64, False)]),  # unpadded: one aligned block, fewer than G
        (32, 64, False, 32, [(32, 64, False)]),  # M is that block already
        (512, 4, False, 32, [(512, 4, False)]),  # no aligned split has fewer rows than 4 experts
    ],
)
def test_the_scenarios_of_the_padded_and_the_unpadded_step(M, G, pad, alignment, expected):
    found = C.scenarios(M, G, pad, alignment)
    assert [(s.M, s.G, s.pad) for s in found] == expected
    assert all(("aligned, unpadded" in s.label()) != s.pad for s in found)


def test_the_unpadded_check_refuses_unaligned_tokens_and_pad_stages_in_its_terms():
    registry = builtin_registry()
    gemm = {"gemm_fwd": [registry.get("mxfp8", "gemm_fwd", "mxkernels")]}
    with pytest.raises(InputError, match=r"aligned token groups \(--no-pad\) need M a multiple of 32, got 40"):
        C.check_step("mxfp8", 40, 128, 64, 4, gemm, pad=False)
    pad = {"pad_a": [registry.get("mxfp8", "pad_a", "mxkernels")]}
    with pytest.raises(InputError, match=r"has no stage pad_a in the step without padding \(--no-pad\)"):
        C.check_step("mxfp8", 64, 128, 64, 4, pad, pad=False)


# ---- outside implementations --------------------------------------------------------------------------------


def test_a_plain_torch_quantizer_written_from_the_spec_passes_in_both_modes(plain):
    for mode in ("rceil", "floor"):
        (result,) = run([parse_impl("quantize_a=plain_quantizer:quantize_a")], mode=mode)
        assert result.verdict == C.Verdict.PASS, result.finding()


def test_one_flipped_byte_fails_naming_index_input_expected_and_got(plain, monkeypatch):
    monkeypatch.setattr(plain, "flipped", with_flipped_bits(plain.quantize_a, (40, 100), 0x01), raising=False)
    (result,) = run([parse_impl("quantize_a=plain_quantizer:flipped")])
    assert result.verdict == C.Verdict.FAIL
    assert result.mismatch.index == (40, 100) and result.mismatch.output == "a_q"
    text = result.finding()
    assert "input a[40, 100] = " in text and "expected" in text and "got" in text
    assert C.exit_code([result]) == 1


def test_a_raising_or_misshapen_implementation_is_an_error_or_a_failure():
    boom = Implementation(Recipe.MXFP8, "rearrange_w", "boom", lambda s: 1 / 0)
    single = Implementation(Recipe.MXFP8, "quantize_a", "single", lambda a, *, mode: a)
    results = run([boom, single])
    verdicts = {r.impl: r for r in results}
    assert verdicts["boom"].verdict == C.Verdict.ERROR and "ZeroDivisionError" in verdicts["boom"].detail
    assert verdicts["single"].verdict == C.Verdict.FAIL and "tuple of 2" in verdicts["single"].detail


def test_a_wrong_gemm_fails_its_sqnr_floor():
    spec = get_spec("mxfp8", "gemm_fwd")

    def scaled(*args):
        (out,) = spec.oracle(*args)
        return (out * 1.01,)

    (result,) = run([Implementation(Recipe.MXFP8, "gemm_fwd", "scaled", scaled)])
    assert result.verdict == C.Verdict.FAIL and "SQNR" in result.detail


def test_a_declared_deviation_is_reported_not_failed():
    """Differences only inside blocks of scale byte 0 or 255 are the implementation's declared deviation."""
    spec = get_spec("mxfp8", "quantize_a")

    def flush_special_blocks(a, *, mode):
        q, s = spec.oracle(a, mode=mode)
        special = torch.isin(s.view(torch.uint8), torch.tensor([0, 255], dtype=torch.uint8, device=s.device))
        q = torch.where(special.repeat_interleave(32, -1), torch.zeros_like(q.view(torch.uint8)), q.view(torch.uint8))
        return q.view(torch.float8_e4m3fn), s

    deviant = Deviation("flushes special blocks", (0, 255))
    honest = Implementation(Recipe.MXFP8, "quantize_a", "honest", flush_special_blocks)
    declared = Implementation(Recipe.MXFP8, "quantize_a", "declared", flush_special_blocks, deviation=deviant)
    verdicts = {r.impl: r.verdict for r in run([honest, declared])}
    assert verdicts == {"honest": C.Verdict.FAIL, "declared": C.Verdict.DEVIATES}


def test_unavailable_implementations_are_skipped_and_nothing_checked_is_unusable():
    away = Implementation(Recipe.MXFP8, "quantize_a", "away", lambda a, *, mode: None, available=lambda d: "gone")
    (result,) = run([away])
    assert result.verdict == C.Verdict.SKIP and result.detail == "gone"
    with pytest.raises(InputError, match="nothing was checked: quantize_a/away: gone"):
        C.exit_code([result])


# ---- the registry ---------------------------------------------------------------------------------------------


def test_builtin_registry_lists_mxkernels_torchao_and_compiled_peers():
    registry = builtin_registry()
    names = [i.name for i in registry.of("mxfp8", "quantize_a")]
    assert names == ["mxkernels", "torchao", "torch.compile"]
    assert "mxkernels:triton_dequant" in [i.name for i in registry.of("mxfp8", "gemm_fwd")]
    cpu = torch.device("cpu")
    assert registry.get("mxfp8", "quantize_a", "torch.compile").unavailable(cpu)
    torchao = registry.get("mxfp8", "quantize_a", "torchao").unavailable(cpu)
    assert torchao and ("not installed" in torchao or "CUDA" in torchao)
    native = registry.get("mxfp8", "gemm_fwd", "mxkernels:native").unavailable(cpu)
    assert native and "CUDA" in native


def test_registry_refuses_unknown_stages_and_duplicate_names():
    registry = Registry()
    registry.register("quantize_a", lambda a, *, mode: (a, a), name="mine")
    with pytest.raises(InputError, match="already has"):
        registry.register("quantize_a", lambda a, *, mode: (a, a), name="mine")
    with pytest.raises(InputError, match="no stage"):
        registry.register("quantize_z", lambda a: a, name="mine")
    assert registry.get("mxfp8", "quantize_a", "mine").kernel.startswith("test_registry_refuses")


@pytest.mark.parametrize(
    "text, message",
    [
        ("quantize_a", "STAGE=module:function"),
        ("quantize_a=nomodule_xyz:fn", "cannot import"),
        ("quantize_a=math:nope", "has no 'nope'"),
        ("quantize_a=math", "module:function"),
        ("quantize_q=math:sqrt", "no stage"),
        ("int4/quantize_a=math:sqrt", "unknown recipe"),
        ("quantize_a=math:pi", "not callable"),
    ],
)
def test_bad_impl_options_are_input_errors(text, message):
    with pytest.raises(InputError, match=message):
        parse_impl(text)


def test_entry_points_register_and_a_broken_one_is_noted(monkeypatch, plain):
    class EP:
        def __init__(self, name, value, target):
            self.name, self.value, self.target = name, value, target

        def load(self):
            if isinstance(self.target, Exception):
                raise self.target
            return self.target

    eps = [EP("plain", "plain_quantizer:register", plain.register), EP("bad", "bad:register", ImportError("no bad"))]
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: eps if group == "mxbench.implementations" else [])
    registry = Registry()
    load_entry_points(registry)
    impl = registry.get("mxfp8", "quantize_a", "plain_quantizer")
    assert impl.fn is plain.quantize_a and impl.origin == "entry point plain"
    assert registry.load_errors == [("entry point bad (bad:register)", "ImportError: no bad")]


def test_per_expert_sqnr_catches_garbage_in_an_empty_expert_under_a_loud_one():
    expected = torch.zeros(2, 4, 4)
    expected[1] = 1e30
    got = expected.clone()
    got[0, 2, 3] = 1e16  # an expert the oracle leaves empty, written with garbage
    assert MinSQNR(60).compare("grad_w", got, expected) is None  # one SQNR over everything misses it
    m = MinSQNR(60, per_slice=True).compare("grad_w", got, expected)
    assert m.index == (0, 2, 3) and "all zero" in m.message
    quiet = torch.ones(2, 4, 4)
    quiet[1] = 1e30
    noisy = quiet.clone()
    noisy[0] *= 1.01  # 40 dB in the small expert
    assert "slice 0" in MinSQNR(60, per_slice=True).compare("grad_w", noisy, quiet).message


# ---- oracles independent of the implementations -----------------------------------------------------------------


@pytest.mark.parametrize("recipe, backend_fn", [("mxfp8", "run_mxfp8"), ("fp8_rowwise", "run_fp8_rowwise")])
def test_a_wrong_emulated_backend_fails_against_the_fp64_oracle(monkeypatch, recipe, backend_fn):
    """The GEMM oracles are fp64 products of the dequantized operands, not a backend: the emulated backend (what
    mxkernels runs on a CPU) planted 1% off fails every GEMM stage instead of passing against itself."""
    from mxkernels.gemm import emulated as gemm_emulated

    right = getattr(gemm_emulated, backend_fn)
    monkeypatch.setattr(gemm_emulated, backend_fn, lambda *args, **kwargs: right(*args, **kwargs) * 1.01)
    ours = [i for i in builtin_registry() if i.recipe == recipe and i.name == "mxkernels"]
    gemms = [i for i in ours if i.stage.startswith("gemm")]
    results = run(gemms, recipe, M=128, K=64, N=64)
    assert [(r.stage, r.verdict) for r in results] == [(s, C.Verdict.FAIL) for s in ("gemm_fwd", "gemm_dgrad",
                                                                                      "gemm_wgrad")]  # fmt: skip
    assert all("SQNR" in r.detail for r in results)
    monkeypatch.setattr(gemm_emulated, backend_fn, right)
    assert {r.verdict for r in run(gemms, recipe, M=128, K=64, N=64)} == {C.Verdict.PASS}


def test_the_fp64_gemm_oracle_matches_an_fp64_product_of_the_dequantized_operands():
    """2D x 3D: out = dequant(a) @ dequant(w)^T per group, summed in fp64 and rounded once to bf16."""
    from mxkernels.core.format import dequantize_reference, quantize_reference
    from mxkernels.layouts.scale_layout import rearrange_3d_reference, rearrange_m_groups_reference

    gen = torch.Generator().manual_seed(3)
    a, w = torch.randn(40, 64, generator=gen), torch.randn(2, 16, 64, generator=gen)
    offs = torch.tensor([7, 40], dtype=torch.int32)
    (a_q, a_s), (w_q, w_s) = quantize_reference(a), quantize_reference(w)
    (out,) = get_spec("mxfp8", "gemm_fwd").oracle(a_q, rearrange_m_groups_reference(a_s, offs), w_q,
                                                   rearrange_3d_reference(w_s), offs)  # fmt: skip
    da, dw = dequantize_reference(a_q, a_s).double(), dequantize_reference(w_q, w_s).double()
    want = torch.cat([da[:7] @ dw[0].t(), da[7:] @ dw[1].t()]).to(torch.bfloat16)
    assert torch.equal(out, want)


def test_torchaos_3d_rearrange_adapter_returns_the_contracts_shape(monkeypatch):
    """torchao returns each expert's blocked image flattened; the adapter views it in the contract's shape."""
    import types

    from mxkernels.layouts.scale_layout import rearrange_3d_reference

    from mxbench.implementations import builtin as implementations

    fake = types.SimpleNamespace(triton_mx_block_rearrange_per_group_3d=lambda s: rearrange_3d_reference(s).flatten(1))
    monkeypatch.setattr(implementations, "_ao", lambda module, name: getattr(fake, name))
    scales = torch.randint(0, 255, (2, 130, 6), dtype=torch.uint8).view(torch.float8_e8m0fnu)
    spec = get_spec("mxfp8", "rearrange_w")
    assert spec.mismatches(implementations._ao_3d(scales), spec.oracle(scales), [scales]) == []


def test_inputs_plant_special_blocks_along_every_blocking_dim():
    """A zero block and a block of fp32 subnormals (scale 2**-127) along K and along M of a, along K and N of w."""
    inputs, sizes = C.check_inputs("mxfp8", 512, 64, 64, 4, device="cpu")
    a, w = inputs["a"].float(), inputs["w"].float()
    first = sum(sizes[: next(g for g, s in enumerate(sizes) if s)])

    def blocks(x):  # (rows, cols) -> (rows, cols/32, 32) along the last dim
        return x.reshape(x.shape[0], -1, 32)

    def has(x, special):
        return bool(((blocks(x) == special).all(-1)).any())

    zero, tiny = torch.zeros(32), torch.arange(1, 33) * 2.0**-133
    for x in (a, a[first:].t().contiguous()[:, :64], w[0], w[0].t().contiguous(), w[-1], w[-1].t().contiguous()):
        assert has(x, zero) and has(x, tiny)


def test_check_stages_runs_any_table_of_specs_in_order():
    """A pipeline of made-up declarations (as a new layer adds): each stage's inputs are the oracle's outputs of the
    stages before it; implementations are registered against that table and checked by the same machinery."""
    from helpers import fake_stage

    double = fake_stage("forward", "double", "x2", "pad", inputs=("x",), outputs=("y",), fn=lambda x: (x * 2,))
    square = fake_stage("forward", "square", "sq", "pad", inputs=("y",), outputs=("z",), fn=lambda y: (y * y,))
    table = {s.spec.key: s.spec for s in (double, square)}
    registry = Registry(spec_of=lambda recipe, name: table[Recipe(recipe), name])
    right = registry.add(Implementation(Recipe.MXFP8, "square", "right", lambda y: (y * y,)))
    wrong = registry.add(Implementation(Recipe.MXFP8, "square", "cubes", lambda y: (y * y * y,)))
    env = {"x": torch.tensor([1.0, 2.0, 3.0])}
    results = C.check_stages([double, square], env, {square.spec.key: [right, wrong]})
    assert [(r.impl, r.verdict) for r in results] == [("right", C.Verdict.PASS), ("cubes", C.Verdict.FAIL)]
    assert results[1].mismatch.index == (0,) and results[1].mismatch.expected == "4.0"  # on y = 2x, not x
    with pytest.raises(KeyError):
        registry.add(Implementation(Recipe.MXFP8, "quantize_a", "elsewhere", lambda a, *, mode: (a, a)))
