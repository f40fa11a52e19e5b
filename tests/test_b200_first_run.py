"""The first-run commands of docs/b200.md, run as written (narrowed to the native implementation: the Triton ones run
in the interpreter here) against the double of native_double.py on a faked compute capability 10.x: they pass the
guarded native backend, print what the probe decided and why, put every guard in front of it, and fail when a guard
is taken away."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from mxkernels.gemm import native as gemm_native
from mxkernels.stages.step_specs import padding_alignment
from native_double import SM100, SM100Double, install

from mxbench.implementations import check as C
from mxbench.implementations import default
from mxbench.cli import cli

DOC = Path(__file__).resolve().parent.parent / "docs" / "b200.md"
NATIVE_RUNS = {"mxfp8": "run_mxfp8", "fp8_rowwise": "run_fp8_rowwise", "bf16": "run_bf16"}


def first_run_block() -> list[str]:
    """The commands of the code block under "The first thing to run"."""
    section = DOC.read_text().split("## The first thing to run", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def check_commands() -> list[list[str]]:
    return [shlex.split(line)[2:] for line in first_run_block() if line.startswith("mxbench check")]


def recipe_of(args: list[str]) -> str:
    return args[args.index("--recipe") + 1] if "--recipe" in args else "mxfp8"


@pytest.fixture
def sm100(monkeypatch):
    monkeypatch.setattr(default, "_DEFAULT", None)
    return install(monkeypatch, SM100Double())


@pytest.fixture
def seen(sm100, monkeypatch):
    """What reached the native calls -- (recipe, case, rows, G, group sizes) -- and the token-group sizes each check
    built, recorded on the way in (the guards' work is not looked at); after the probe, whose own calls would
    count otherwise."""
    assert gemm_native.verdict("mxfp8", SM100, torch.device("cpu")).available
    record = {"native": [], "groups": []}
    for recipe, name in NATIVE_RUNS.items():
        real = getattr(gemm_native, name)

        def spy(*args, _recipe=recipe, _real=real, **kwargs):
            a, b, offs = (args[0], args[1], args[2]) if _recipe == "bf16" else (args[0], args[2], args[4])
            ends = offs.tolist()
            sizes = [e - s for s, e in zip([0, *ends[:-1]], ends)]
            case = "2d3d" if b.dim() == 3 else "2d2d"
            record["native"].append((_recipe, case, a.shape[0], len(ends), sizes))
            return _real(*args, **kwargs)

        monkeypatch.setattr(gemm_native, name, spy)
    real_inputs = C.check_inputs

    def inputs(recipe, *args, **kwargs):
        env, sizes = real_inputs(recipe, *args, **kwargs)
        record["groups"].append((recipe, sizes))
        return env, sizes

    monkeypatch.setattr(C, "check_inputs", inputs)
    return record


def run(args: list[str]):
    name = "mxkernels:native" if recipe_of(args) == "mxfp8" else "mxkernels"
    return CliRunner().invoke(cli, ["check", *args, "--name", name])


def test_the_first_run_commands_pass_print_the_probes_verdict_and_guard_each_native_call(sm100, seen):
    """One run of the commands (each runs the interpreter's check of every stage): what they print, and what reached
    the native calls on the way (``seen``)."""
    assert "make test-gpu" in first_run_block()
    commands = check_commands()
    assert {recipe_of(args) for args in commands} == set(NATIVE_RUNS)
    outputs = []
    for args in commands:
        result = run(args)
        outputs.append(result.output)
        assert result.exit_code == 0, (args, result.output)
        lines = result.output.splitlines()
        assert [line.split()[:3] for line in lines if "PASS" in line] == [
            [stage, "mxkernels:native" if recipe_of(args) == "mxfp8" else "mxkernels", "PASS"]
            for stage in ("gemm_fwd", "gemm_dgrad", "gemm_wgrad")
        ], result.output
        assert lines[0].startswith(f"native {recipe_of(args)} on cpu: available: ")
    mxfp8 = outputs[0].splitlines()[0]  # the first command's, as run above (the probe ran at its first use, in seen)
    assert mxfp8.startswith("native mxfp8 on cpu: available: native MXFP8 passed its probe at first use: torch "
                            "2.11.0 carries sm_100 for compute capability 10.0")  # fmt: skip
    for recipe in NATIVE_RUNS:
        calls = [call for call in seen["native"] if call[0] == recipe]
        assert any(case == "2d2d" and 0 in sizes for _, case, _, _, sizes in calls), f"{recipe}: no empty expert"
        assert any(case == "2d3d" and rows < G for _, case, rows, G, _ in calls), f"{recipe}: rows >= experts"
        groups = [sizes for r, sizes in seen["groups"] if r == recipe]
        alignment = padding_alignment(recipe)
        assert any(size % alignment for sizes in groups for size in sizes), f"{recipe}: no unaligned group"
    # Malformed offs never come out of the padded step: the GPU tests that `make test-gpu` runs hand them to the card.
    from test_native_guards import test_gpu_bf16_guards_on_the_card, test_gpu_guards_on_the_card

    for test in (test_gpu_guards_on_the_card, test_gpu_bf16_guards_on_the_card):
        assert "gpu" in {mark.name for mark in test.pytestmark}


GUARDS_TAKEN_AWAY = {
    "empty experts left unwritten": ("fix_output", lambda out, checked, zero_empty: out, "gemm_wgrad"),
    "fewer rows than experts left to the kernel": ("rows_for_every_expert", lambda x, G: x, "gemm_fwd"),
}


@pytest.mark.parametrize("guard, stub, stage", GUARDS_TAKEN_AWAY.values(), ids=GUARDS_TAKEN_AWAY.keys())
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise"])
def test_the_first_run_commands_fail_without_a_guard(sm100, monkeypatch, guard, stub, stage, recipe):
    """Without a guard the double's garbage (~1.5e16 where the oracle has 0, or an unwritten forward) reaches the
    output: the commands fail it, however large the other experts are. (bf16 has no fewer-rows guard. MXFP8's probe,
    run first here while the guard is there, would refuse native without it: test_native_probe.py.)"""
    assert gemm_native.verdict("mxfp8", SM100, torch.device("cpu")).available
    monkeypatch.setattr(gemm_native, guard, stub)
    failed = set()
    for args in (a for a in check_commands() if recipe_of(a) == recipe):
        result = run(args)
        failed |= {line.split()[1] for line in result.output.splitlines() if line.startswith("FAIL ")}
    assert stage in failed
