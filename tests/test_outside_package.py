"""The "Done when" of an outside team gating its CI on ``mxbench check``: a package of its own (a git repo, installed
with pip, registering through the ``mxbench.implementations`` entry point) whose planted wrong kernels each exit 1
with their finding, one test per class of fault (``tests/outside/outside_kernels.py``); its correct kernels exit 0;
a plugin that raises while registering, or exits at import, fails the run; and whatever an implementation does
(exit, raise, write to its inputs, hang) is one ERROR row naming it while the run goes on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxbench.implementations import default
from mxbench.cli import cli

sys.path.insert(0, str(Path(__file__).resolve().parent / "outside"))
from site_builder import build  # noqa: E402 -- tests/outside: the outside package and how it is installed

SMALL = ("--K", "64", "--N", "64", "--M", "256", "--G", "4")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """site folders: "good" holds the outside team's package; "broken" a plugin whose register raises and one that
    exits at import."""
    return build(tmp_path_factory.mktemp("outside"))


@pytest.fixture
def site(installed, monkeypatch):
    """Put a site folder on sys.path (entry points are found there) with a fresh process-wide registry."""

    def use(which: str) -> None:
        monkeypatch.syspath_prepend(str(installed[which]))
        for module in ("outside_kernels", "plain_quantizer", "outside_raising", "outside_exiting"):
            monkeypatch.delitem(sys.modules, module, raising=False)
        monkeypatch.setattr(default, "_DEFAULT", None)

    return use


def check(*args):
    return CliRunner().invoke(cli, ["check", *SMALL, *map(str, args)])


def lines(result, prefix):
    return [line for line in result.output.splitlines() if line.startswith(prefix)]


FAULTS = {
    # class: (stage, what the finding must name)
    "along-M": ("quantize_a_t", "at_q: "),
    "along-N": ("quantize_w_t", "wt_s: "),
    "unaligned-group": ("pad_a", "offs_p: "),
    "e4m3-subnormal-output": ("quantize_a", "a_q: "),
    "zero-block-scale": ("quantize_grad_out_t", "dyt_s: "),
    "subnormal-flush": ("quantize_w", "w_q: "),
    "floor-mode": ("quantize_grad_out", "[floor, "),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_planted_fault_exits_1_with_its_finding(site, fault):
    site("good")
    stage, named = FAULTS[fault]
    result = check("--name", f"outside-{fault}")
    assert result.exit_code == 1, result.output
    (row,) = [line for line in result.output.splitlines() if f" outside-{fault} " in line and "FAIL" in line]
    assert row.split()[0] == stage
    findings = lines(result, f"FAIL {stage} / outside-{fault}: ")
    assert findings and any(named in f for f in findings), result.output
    assert all("expected" in f and "got" in f for f in findings if "first at index" in f)


def test_the_correct_kernels_of_the_package_pass_in_both_modes(site):
    site("good")
    result = check("--name", "outside")
    assert result.exit_code == 0, result.output
    assert result.output.count(" PASS ") == 4 and "FAIL" not in result.output and "ERROR" not in result.output


def test_along_m_fault_names_every_differing_output_at_the_planted_block(site):
    """Both outputs differ where a block of fp32 subnormals was planted along M: both reported."""
    site("good")
    result = check("--name", "outside-along-M", "--mode", "rceil", "--format", "json")
    assert result.exit_code == 1
    (row,) = json.loads(result.output)["results"][:1]
    assert row["verdict"] == "FAIL" and row["where"] == "rceil, M=256 G=4"
    assert [f.split(":")[0] for f in row["findings"]] == ["at_q"]  # scale bytes stay right: only the data is flushed


@pytest.mark.parametrize("what, message", [
    ("system-exit", "SystemExit: 0"),
    ("raises", "RuntimeError: kernel launch failed: an error message over several lines"),
    ("input-mutation", "InputMutated: wrote to its input a"),
    ("hang", "Timeout: did not return within 2 s"),
])  # fmt: skip
def test_a_hostile_implementation_is_one_error_row_and_the_run_goes_on(site, what, message):
    site("good")
    result = check("--name", f"outside-{what},outside", "--stage", "quantize_a", "--mode", "rceil", "--timeout", 2)
    assert result.exit_code == 1, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("quantize_a ")]
    assert [r.split()[1:3] for r in rows] == [["outside", "PASS"], [f"outside-{what}", "ERROR"]]
    assert f"ERROR quantize_a / outside-{what}: [rceil, M=256 G=4] {message}" in result.output
    assert "Traceback" not in result.output


def test_verbose_prints_the_traceback_of_an_error(site):
    site("good")
    result = check("--name", "outside-raises", "--stage", "quantize_a", "--mode", "rceil", "--verbose")
    assert result.exit_code == 1 and "Traceback (most recent call last)" in result.output
    assert 'in raise_error\n    raise RuntimeError("kernel launch failed' in result.output


def test_plugins_that_raise_while_registering_or_exit_at_import_fail_the_run(site):
    site("broken")
    result = check("--stage", "rearrange_a", "--name", "mxkernels", "--mode", "rceil")
    assert result.exit_code == 1, result.output
    (row,) = [line.split()[:3] for line in result.output.splitlines() if line.startswith("rearrange_a ")]
    assert row == ["rearrange_a", "mxkernels", "PASS"]  # the run went on
    assert "ERROR plugin entry point outside-raising (outside_raising:register) did not load: ImportError: needs " \
           "libfoo.so" in result.output
    assert "ERROR plugin entry point outside-exiting (outside_exiting:register) did not load: SystemExit: no GPU, " \
           "bye" in result.output
    impls = CliRunner().invoke(cli, ["impls", "--stage", "quantize_a"])
    assert impls.exit_code == 1 and "not loaded: entry point outside-raising" in impls.output


def test_the_package_commit_is_recorded(site, installed):
    site("good")
    from mxbench.instruments.provenance import implementations_meta

    meta = implementations_meta({"outside": "outside_kernels"})["outside"]
    assert meta["distribution"] == "outside-kernels" and meta["version"] == "0.3.0"
    assert meta["commit"] == installed["commit"]  # from direct_url.json: the installed copy is no checkout


def test_a_plugin_that_does_not_load_stops_the_measuring_commands(site, tmp_path, monkeypatch):
    """roofline --impl (and regress, peers) would measure without it: exit 1 before anything is measured."""
    site("broken")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["roofline", *SMALL, "--impl", "quantize_a=mxkernels"])
    assert result.exit_code == 1, result.output
    assert "ERROR plugin entry point outside-raising (outside_raising:register) did not load" in result.output
    assert not (tmp_path / "results").exists()
