"""The GPU scripts behind the gate (``scripts/measure_aa_spread.py``, ``scripts/regress_outside_slowdown.py``): their
CPU parts here, the whole of them on a GPU (``-m gpu``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_compare import rec, run, samples

from mxbench.gate.compare import compare_runs
from mxbench.gate.report import json_report

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_aa_spread_summarises_each_categorys_ci_excursions(tmp_path):
    aa = _script("measure_aa_spread")
    base = run(rec(samples(100, 0.01)), rec(samples(10, 0.02, seed=3), "quantize", "quantize_a"))
    new = run(rec(samples(101, 0.01, seed=5)), rec(samples(10.3, 0.02, seed=6), "quantize", "quantize_a"))
    cmp = compare_runs(base, new)
    report = tmp_path / "aa.json"
    report.write_text(json_report(cmp, "base", "new"))
    table = aa.spread([report, report])
    gemm, quantize = cmp.matches
    assert table["gemm"]["stages"] == 2 and table["quantize"]["stages"] == 2
    want = 100 * max(abs(gemm.ci[0] - 1), abs(gemm.ci[1] - 1))
    assert table["gemm"]["max_ci_excursion_pct"] == pytest.approx(want)
    assert table["quantize"]["max_abs_change_us"] == pytest.approx(abs(quantize.new_us - quantize.base_us))
    assert table["quantize"]["verdicts"] == {quantize.verdict: 2}
    assert "| quantize | 2 |" in aa.markdown(table, "test")


def test_the_slowdown_script_checks_the_outside_kernel_then_needs_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("with a GPU the gpu test below runs the whole script")
    done = subprocess.run([sys.executable, str(SCRIPTS / "regress_outside_slowdown.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env={"CUDA_VISIBLE_DEVICES": "",
                                                                            "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "rc=0 mxbench check --name outside-timed" in done.stdout and "quantize_a  outside-timed" in (
        tmp_path / "check.log").read_text()


@pytest.mark.gpu
def test_regress_fails_on_a_planted_ten_percent_slowdown_of_an_outside_kernel(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "regress_outside_slowdown.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
