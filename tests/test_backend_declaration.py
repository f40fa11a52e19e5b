"""A grouped-GEMM backend is a declaration (``mxkernels.gemm.backend``): a throwaway one, declared here and registered
at run time, is dispatched to, listed by ``mxbench impls``, checked by ``mxbench check`` and taken by ``mxbench
roofline --backend`` like the built-in ones, for every recipe it serves; a wrong one fails the check."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from kernel_helpers import offsets
from mxkernels.core.errors import InputError
from mxkernels.core.names import Recipe
from mxkernels.gemm import backends
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm.backend import FIRST, Arch, Backend, always_available
from mxkernels.gemm.mx_triton import TileConfig
from mxkernels.reference import gemm as reference
from mxkernels.stages.step_specs import specs_of
from test_cli import fake_gpu  # the fixture (a GPU run without a GPU), used by name

from mxbench.cli import cli
from mxbench.clikit import common
from mxbench.implementations import default as registry

NAME = "plain_torch"
IMPL = f"mxkernels:{NAME}"
SMALL = ("--K", "256", "--N", "128", "--G", "2", "--M", "512")
GEMMS = ("gemm_fwd", "gemm_dgrad", "gemm_wgrad")


def _largest_group_negated(out: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The planted fault: one group's output wrong (the largest group's, so never an empty one)."""
    sizes = offs.diff(prepend=offs.new_zeros(1))
    g = int(sizes.argmax())
    if out.dim() == 3:  # 2D x 2D: (G, N, K), one matrix per group
        out[g] = -out[g]
    else:  # 2D x 3D: group g is rows [offs[g-1], offs[g])
        out[int(offs[g]) - int(sizes[g]) : int(offs[g])] *= -1
    return out


def throwaway(wrong: bool = False, **fields) -> Backend:
    """Every recipe computed by the plain-torch references (fp64, rounded once); ``wrong``: with the planted fault."""
    fault = _largest_group_negated if wrong else lambda out, offs: out

    def scaled(ref):
        return lambda a_q, a_s, b_q, b_s, offs, out_dtype, **_: fault(ref(a_q, a_s, b_q, b_s, offs, out_dtype), offs)

    run = {Recipe.MXFP8: scaled(reference.mxfp8_reference), Recipe.FP8_ROWWISE: scaled(reference.fp8_rowwise_reference),
           Recipe.BF16: lambda a, b, offs: fault(reference.bf16_reference(a, b, offs), offs)}  # fmt: skip
    return Backend(NAME, run=run, unavailable=always_available, **fields)


@pytest.fixture
def register(monkeypatch):
    """Registers a backend for one test (the harness's process-wide registry is rebuilt on its next use, so it reads
    the declarations as they are then); whatever it registered is taken back after the test."""
    added = []
    monkeypatch.setattr(registry, "_DEFAULT", None)

    def add(backend: Backend, replacing: Backend | None = None) -> Backend:
        if replacing is not None:
            backends.unregister_backend(replacing)
            registry._DEFAULT = None
        added.append(backends.register_backend(backend))
        return backend

    yield add
    for backend in added:
        if backend in backends.DECLARED:
            backends.unregister_backend(backend)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---- the kernel package ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", GG.RECIPES)
def test_a_registered_backend_is_declared_available_and_dispatched_to(register, recipe):
    assert NAME not in GG.BACKENDS[recipe]
    good = register(throwaway())
    assert GG.BACKENDS[recipe][-1] == NAME and NAME in GG.available_backends(recipe, "cpu")
    assert GG.backend_unavailable(recipe, NAME, torch.device("cpu")) is None
    assert GG.default_backend(recipe, "cpu") != NAME  # it ranks nowhere first: the defaults stay
    sizes = [48, 0, 80]
    a, b = torch.randn(sum(sizes), 64).bfloat16(), torch.randn(len(sizes), 64, 32).bfloat16()
    offs = offsets(sizes, "cpu")
    ours = GG.grouped_mm(a, b, offs, recipe=recipe, backend=NAME)
    assert ours.backend == NAME
    emulated = GG.grouped_mm(a, b, offs, recipe=recipe, backend="emulated").out
    torch.testing.assert_close(ours.out.float(), emulated.float(), rtol=1e-2, atol=1e-2)
    register(throwaway(wrong=True), replacing=good)
    assert not torch.allclose(GG.grouped_mm(a, b, offs, recipe=recipe, backend=NAME).out.float(), emulated.float(),
                              rtol=1e-2, atol=1e-2)  # fmt: skip


def test_its_declaration_sets_its_rank_config_and_out_dtypes(register, monkeypatch):
    register(throwaway(preference={Arch.SM90: FIRST}, out_dtypes=(torch.float32,)))
    assert GG.default_backend("mxfp8", "cpu") == "emulated"
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    assert GG.default_backend("mxfp8", "cuda") == NAME  # first on SM90, where it outranks triton_dequant
    assert GG.available_backends("fp8_rowwise", "cuda")[:2] == ["triton_ws", NAME]  # declared after triton_ws
    monkeypatch.undo()  # the CPU again (operands are checked on their device)
    ops = GG.quantize_mxfp8_operands(torch.randn(64, 64), torch.randn(2, 64, 32), offsets([32, 32], "cpu"))
    out = GG.mxfp8_scaled_grouped_mm(*ops, offsets([32, 32], "cpu"), backend=NAME, out_dtype=torch.float32,
                                     config=TileConfig(32, 32))  # another backend's launch: ignored  # fmt: skip
    assert out.dtype == torch.float32
    with pytest.raises(InputError, match=f"out_dtype must be one of .* for backend '{NAME}'"):
        GG.mxfp8_scaled_grouped_mm(*ops, offsets([32, 32], "cpu"), backend=NAME)
    with pytest.raises(InputError, match="config must be a launch configuration"):
        GG.mxfp8_scaled_grouped_mm(*ops, offsets([32, 32], "cpu"), backend=NAME, out_dtype=torch.float32, config=1)


def test_a_name_taken_in_a_recipe_is_refused_and_an_undeclared_one_is_bad_input(register):
    with pytest.raises(InputError, match="'triton' already serves fp8_rowwise, mxfp8"):
        register(Backend("triton", run=throwaway().run, unavailable=always_available))
    bf16 = register(Backend("triton", run={Recipe.BF16: throwaway().run[Recipe.BF16]}, unavailable=always_available))
    assert GG.BACKENDS["bf16"] == ("native", "emulated", "triton")  # a name is one kernel family within a recipe
    assert backends.find("mxfp8", "triton") is not bf16
    with pytest.raises(InputError, match="must be an identifier"):
        Backend("two words", run=throwaway().run, unavailable=always_available)
    with pytest.raises(InputError, match=f"must be one of .*; got '{NAME}'"):
        GG.backend_unavailable("mxfp8", NAME, torch.device("cpu"))


# ---- the harness ---------------------------------------------------------------------------------------------------


def test_mxbench_impls_lists_it_for_every_gemm_stage_of_every_recipe(register):
    register(throwaway())
    result = invoke("impls", "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = {(r[0], r[1]): r[5] for r in (line.split(",", 6) for line in result.output.splitlines()[1:]) if r[3] == IMPL}
    assert rows == {(str(recipe), stage): "yes" for recipe in Recipe for stage in GEMMS}


@pytest.mark.parametrize("recipe", GG.RECIPES)
def test_mxbench_check_passes_it_and_fails_it_planted_wrong(register, recipe):
    assert {s.name for s in specs_of(recipe) if s.name.startswith("gemm_")} == set(GEMMS)
    args = ("check", "--recipe", recipe, "--stage", ",".join(GEMMS), "--name", IMPL, *SMALL)
    good = register(throwaway())
    passed = invoke(*args)
    assert passed.exit_code == 0, passed.output
    assert [line.split()[:3] for line in passed.output.splitlines() if IMPL in line] == [
        [stage, IMPL, "PASS"] for stage in GEMMS
    ], passed.output
    register(throwaway(wrong=True), replacing=good)
    failed = invoke(*args)
    assert failed.exit_code == 1, failed.output
    assert [line.split()[:3] for line in failed.output.splitlines() if line.startswith(GEMMS)] == [
        [stage, IMPL, "FAIL"] for stage in GEMMS
    ], failed.output


def test_mxbench_roofline_takes_it_as_the_backend(register, fake_gpu):
    refused = invoke("roofline", *SMALL, "--recipe", "bf16,mxfp8", "--backend", NAME)
    assert refused.exit_code == 2 and "mxfp8's backends are native, " in refused.output, refused.output
    register(throwaway())
    result = invoke("roofline", *SMALL, "--recipe", "bf16,mxfp8", "--backend", NAME)
    assert result.exit_code == 0, result.output
    assert fake_gpu["options"].backend == NAME


def test_without_a_gpu_roofline_accepts_its_name_and_refuses_only_what_it_does_for_every_backend(register, monkeypatch):
    """The model prices no backend (every ``--backend`` is refused there), so what the CPU path shows is that the name
    passes the check an undeclared one fails."""
    monkeypatch.setattr(common, "has_gpu", lambda: False)
    register(throwaway())
    for backend in (NAME, "native"):
        result = invoke("roofline", *SMALL, "--recipe", "fp8_rowwise", "--backend", backend)
        assert result.exit_code == 2 and "backends are timed on a GPU" in result.output, result.output
    result = invoke("roofline", *SMALL, "--recipe", "fp8_rowwise", "--backend", "nobody")
    assert result.exit_code == 2 and f"triton_ws, emulated, {NAME}; got 'nobody'" in result.output, result.output
