"""Model runs (what `roofline` and `layer` save on a machine without a GPU: no samples) in every reader: table, plot,
compare and history work on them and say, once, what a model run cannot show."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mxbench.cli import cli

NOTE = "compared against a model run (model, not measured): new/base ratios of the model's times only"
HISTORY_NOTE = "model runs (model, not measured): their times are the model's, with no samples"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.json"
    made = invoke("roofline", "--K", "7168", "--N", "2048", "--M", "16384", "--recipe", "bf16,mxfp8", "--out", path)
    assert made.exit_code == 0, made.output
    assert not any(r["samples_us"] for r in json.loads(path.read_text())["records"])
    return path


def at_commit(model, tmp_path, name: str, commit: str, when: str, scale: float):
    """The model run as if made at another commit, its model times scaled (a model that changed)."""
    payload = json.loads(model.read_text())
    payload["meta"].update(git_commit=commit, date=when)
    payload["meta"]["implementations"]["mxkernels"].update(commit=commit, git_commit_time=when)
    for r in payload["records"]:
        r["model_us"] *= scale
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(payload))
    return path


@pytest.mark.parametrize("fmt", ["plain", "markdown", "json"])
def test_compare_of_two_model_runs_says_once_there_are_no_statistics(model, fmt):
    result = invoke("compare", model, model, "--format", fmt)
    assert result.exit_code == 0, result.output
    if fmt == "json":
        report = json.loads(result.output)
        assert NOTE in report["note"] and report["counts"]["MODEL"] == len(report["stages"]) > 0
    else:
        assert result.output.count(NOTE) == 1 and result.output.count("every stage compared") == 1


def test_compare_of_measured_runs_has_no_model_note():
    from pathlib import Path

    run = Path(__file__).resolve().parent.parent / "results/baselines/nvidia-h200.json"
    result = invoke("compare", run, run)
    assert result.exit_code == 0 and NOTE not in result.output


def test_a_model_change_is_no_verdict_and_never_fails_the_gate(model, tmp_path):
    slower = at_commit(model, tmp_path, "slower", "b" * 40, "2030-01-01T00:00:00+00:00", 2.0)
    result = invoke("compare", model, slower, "--force", "--format", "json")
    report = json.loads(result.output)
    assert result.exit_code == 0 == report["exit_code"] and report["counts"]["SLOWER"] == 0
    assert {s["verdict"] for s in report["stages"]} == {"MODEL"} and report["geomean_ratio"] == pytest.approx(2.0)


def test_history_of_model_runs_over_two_commits(model, tmp_path):
    old = at_commit(model, tmp_path, "old", "a" * 40, "2029-01-01T00:00:00+00:00", 1.0)
    new = at_commit(model, tmp_path, "new", "b" * 40, "2030-01-01T00:00:00+00:00", 2.0)
    result = invoke("history", old, new, "--fail-on-latest", "--format", "plain")
    assert result.exit_code == 0, result.output
    assert "SLOWER x" not in result.output and result.output.count(HISTORY_NOTE) == 1
    assert "1: aaaaaaa" in result.output and "2: bbbbbbb" in result.output
    quantize = next(line for line in result.output.splitlines() if "quantize_a " in line and "mxfp8" in line)
    first, second = (float(x) for x in quantize.split()[-2:])
    assert second == pytest.approx(2 * first, rel=0.01)  # the model's times, each step its own


def test_table_of_a_model_run_names_what_it_cannot_show(model):
    result = invoke("table", model, "--kind", "power")
    assert result.exit_code == 0, result.output
    assert "- **Not shown:** a model run has no samples: no spread, no telemetry" in result.output
    refused = invoke("table", model, "--denominator", "measured")
    assert refused.exit_code == 2 and "a model run (model, not measured) ran on no card" in refused.output


def test_plot_of_a_model_run(model, tmp_path):
    result = invoke("plot", model, "--out", tmp_path / "figures")
    assert result.exit_code == 0, result.output
    drawn = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert "breakdown.png" in drawn and "net_speedup.png" in drawn
