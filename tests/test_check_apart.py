"""``check`` runs each outside implementation in a child process of its own (issue 34, item 5): one that exits, kills
itself, raises, hangs past the time limit or breaks its CUDA context is one ERROR row naming what happened, the other
rows still run, and this process (its CUDA context on a GPU) is untouched. mxkernels' own run in this process."""

from __future__ import annotations

import time

import hostile_impls
import pytest
import torch
from click.testing import CliRunner

from mxbench.cli import cli
from mxbench.implementations import apart
from mxbench.implementations.check import Verdict, check_step, merged
from mxbench.implementations.default import builtin_registry
from mxbench.implementations.registry import Implementation

HAS_CUDA = torch.cuda.is_available()
SHAPE = ("mxfp8", 64, 64, 64, 2)


def outside(name: str) -> Implementation:
    return Implementation("mxfp8", "quantize_a", f"hostile_impls:{name}", getattr(hostile_impls, name),
                          origin="--impl")  # fmt: skip


def test_each_hostile_implementation_is_its_own_error_row_and_the_others_still_run(device):
    ours = builtin_registry().get("mxfp8", "quantize_a", "mxkernels")
    names = ("correct", "exits_3", "kills_itself", "raises", "hangs", "wrong")
    start = time.monotonic()
    results = check_step(*SHAPE, {"quantize_a": [ours, *map(outside, names)]}, modes=["rceil", "floor"],
                         device=device, timeout_s=3.0)  # fmt: skip
    rows = {r.impl: r for r in merged(results)}
    assert list(rows) == ["mxkernels", *(f"hostile_impls:{n}" for n in names)]  # in the order given
    verdicts = {name: rows[name].verdict for name in rows}
    assert verdicts == {"mxkernels": Verdict.PASS, "hostile_impls:correct": Verdict.PASS,
                        "hostile_impls:exits_3": Verdict.ERROR, "hostile_impls:kills_itself": Verdict.ERROR,
                        "hostile_impls:raises": Verdict.ERROR, "hostile_impls:hangs": Verdict.ERROR,
                        "hostile_impls:wrong": Verdict.FAIL}  # fmt: skip
    assert "exited with code 3" in rows["hostile_impls:exits_3"].detail
    assert "killed by signal 9 (SIGKILL)" in rows["hostile_impls:kills_itself"].detail
    assert "RuntimeError: planted failure" in rows["hostile_impls:raises"].detail
    assert "did not return within 3 s" in rows["hostile_impls:hangs"].detail
    assert "a_q" in rows["hostile_impls:wrong"].detail
    # the process that died is one row at the scenario it died in; the correct one ran every scenario
    assert rows["hostile_impls:exits_3"].where == "rceil, M=64 G=2"
    assert sum(r.impl == "hostile_impls:correct" for r in results) == 4  # 2 modes x 2 scenarios
    assert time.monotonic() - start < 600  # the hang was ended, not waited out


def test_our_implementations_never_start_a_process(monkeypatch, device):
    def refused(*args, **kwargs):
        raise AssertionError("a built-in implementation was sent to a child process")

    monkeypatch.setattr("mxbench.implementations.check.run_apart", refused)
    ours = builtin_registry().get("mxfp8", "quantize_a", "mxkernels")
    assert [r.verdict for r in check_step(*SHAPE, {"quantize_a": [ours]}, device=device)] == [Verdict.PASS] * 2


def test_an_implementation_that_cannot_be_pickled_is_checked_here(device):
    local = Implementation("mxfp8", "quantize_a", "lambda", lambda a, *, mode: hostile_impls.correct(a, mode=mode),
                           origin="python")  # fmt: skip
    assert apart.picklable(local) is not None
    assert {r.verdict for r in check_step(*SHAPE, {"quantize_a": [local]}, device=device)} == {Verdict.PASS}


@pytest.mark.parametrize("name, exit_code, text", [
    ("kills_itself", 1, "killed by signal 9 (SIGKILL)"),
    ("exits_3", 1, "exited with code 3"),
    ("correct", 0, "PASS"),
])  # fmt: skip
def test_check_names_the_ending_and_its_exit_code_stays_meaningful(name, exit_code, text):
    result = CliRunner().invoke(cli, ["check", "--impl", f"quantize_a=hostile_impls:{name}", "--name",
                                      f"mxkernels,hostile_impls:{name}", "--stage", "quantize_a", "--K", "64",
                                      "--N", "64", "--G", "2", "--M", "64", "--mode", "rceil"])  # fmt: skip
    assert result.exit_code == exit_code, result.output
    assert text in result.output
    assert "mxkernels" in result.output and "PASS" in result.output  # our row still ran


def test_how_a_child_ended_in_words():
    assert apart.ended(-9) == "its process was killed by signal 9 (SIGKILL)"
    assert apart.ended(-11).endswith("(SIGSEGV)")
    assert apart.ended(3).startswith("its process exited with code 3")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_a_broken_cuda_context_stays_in_its_child():
    ours = builtin_registry().get("mxfp8", "quantize_a", "mxkernels")
    results = check_step(*SHAPE, {"quantize_a": [outside("breaks_cuda"), ours]}, device="cuda", timeout_s=60.0)
    rows = {r.impl: r for r in merged(results)}
    assert rows["hostile_impls:breaks_cuda"].verdict == Verdict.ERROR, rows
    assert rows["mxkernels"].verdict == Verdict.PASS, rows
    assert torch.ones(4, device="cuda").sum().item() == 4.0  # this process's context is clean
