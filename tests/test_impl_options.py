"""``--impl`` of the measuring commands: a registered name (``STAGE=NAME`` or ``NAME``) or ``module:function``,
recorded under that name; refused for a stage the run lacks; ``regress`` re-measures what its baseline recorded."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli import fake_gpu, synthetic_run

import mxbench
from mxbench.implementations import default
from mxbench.cli import cli
from mxbench.storage.results import save_run

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "plain_quantizer"
SHAPE = ("--K", 256, "--N", 128, "--G", 2, "--M", 512)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def theirs(monkeypatch):
    """A fresh process-wide registry with the plain quantizer registered as "theirs" (as its entry point would)."""
    monkeypatch.setattr(default, "_DEFAULT", None)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delitem(sys.modules, "plain_quantizer", raising=False)
    import plain_quantizer

    mxbench.register("quantize_a", plain_quantizer.quantize_a, name="theirs")
    return plain_quantizer


@pytest.mark.parametrize("text", ["quantize_a=theirs", "theirs"])
def test_roofline_takes_a_registered_name_and_runs_it_under_that_name(fake_gpu, theirs, text):
    result = invoke("roofline", *SHAPE, "--impl", text)
    assert result.exit_code == 0, result.output
    (impl,) = fake_gpu["options"].impls
    assert (impl.stage, impl.name, impl.fn) == ("quantize_a", "theirs", theirs.quantize_a)
    assert "check mxfp8/quantize_a [theirs]: PASS" in result.output


@pytest.mark.parametrize("text, message", [
    ("pad_a=theirs-pad", "the run has no stage mxfp8/pad_a"),  # balanced groups of 256: aligned, never padded
    ("quantize_a=nobody", "'nobody' is no implementation of mxfp8/quantize_a registered here (it has: mxkernels"),
    ("nobody", "no mxfp8 implementation named 'nobody' is registered here (registered: mxkernels:native"),
])  # fmt: skip
def test_roofline_refuses_an_impl_it_would_never_run(fake_gpu, theirs, text, message):
    mxbench.register("pad_a", lambda a, offs, *, alignment: (a, offs), name="theirs-pad")
    result = invoke("roofline", *SHAPE, "--impl", text)
    assert result.exit_code == 2, result.output
    assert message in result.output and "options" not in fake_gpu


def _baseline(tmp_path, impl: str) -> Path:
    run = synthetic_run()
    run.records[0] = dataclasses.replace(run.records[0], impl=impl)  # mxfp8 quantize_a ran `impl`
    path = tmp_path / "base.json"
    save_run(run, path)
    return path


def test_regress_refuses_a_baseline_implementation_not_registered_here(no_gpu_regress, theirs, tmp_path):
    result = invoke("regress", "--baseline", _baseline(tmp_path, "ghost"))
    assert result.exit_code == 2, result.output
    assert "the baseline ran mxfp8/quantize_a=ghost, which is not registered here" in result.output


@pytest.fixture
def no_gpu_regress(monkeypatch):
    """Fail loudly if regress would start measuring."""
    import mxbench.workloads.step.sweep

    monkeypatch.setattr(mxbench.workloads.step.sweep, "run_sweep", lambda *a, **k: pytest.fail("nothing may be measured"))


def test_regress_re_measures_the_implementation_its_baseline_recorded(monkeypatch, theirs, tmp_path):
    import mxbench.instruments.kit
    import mxbench.workloads.step.sweep
    from mxbench.clikit import common

    seen = {}

    def fake_sweep(points, *, options, instruments=None, progress=True):
        seen["impls"] = options.impls
        run = synthetic_run()
        run.records[0] = dataclasses.replace(run.records[0], impl="theirs")
        return run

    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(mxbench.instruments.kit.Instruments, "real", classmethod(lambda cls, *a, **k: None))
    monkeypatch.setattr(mxbench.workloads.step.sweep, "run_sweep", fake_sweep)
    result = invoke("regress", "--baseline", _baseline(tmp_path, "theirs"), "--rounds", 1)
    assert result.exit_code == 0, result.output
    assert [(i.stage, i.name) for i in seen["impls"]] == [("quantize_a", "theirs")]


def test_peers_with_impl_times_ours_beside_the_named_implementation_only(monkeypatch, theirs, tmp_path):
    import mxbench.workloads.peers.measure
    from mxbench.clikit import common

    seen = {}

    def fake_peers(M, N, K, G, *, registry=None, **kwargs):
        seen["registry"] = registry
        raise KeyboardInterrupt  # stop before any table: the registry is what this test is about

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(common, "detected_spec", lambda device=0: "h100-sxm")
    monkeypatch.setattr(common, "card_name", lambda device=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(mxbench.workloads.peers.measure, "run_peers", fake_peers)
    invoke("peers", *SHAPE, "--impl", "theirs")
    names = {(i.stage, i.name) for i in seen["registry"] if i.stage == "quantize_a"}
    assert names == {("quantize_a", "mxkernels"), ("quantize_a", "theirs")}  # no torchao, no torch.compile
