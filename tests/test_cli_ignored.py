"""An option the chosen mode ignores is refused, a recipe the chosen card cannot run is refused up front, a list that
repeats a value is folded with a note, and every output path is checked before any work (issue 26, items 3 and 6)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mxbench.cli import cli
from mxbench.workloads.ep import launch, worker

TINY_EP = ["--K", "64", "--N", "64", "--experts", "2", "--tokens", "32"]
ROOFLINE = ["roofline", "--K", "256", "--N", "128", "--M", "1024"]
LAYER = ["layer", "--K", "64", "--N", "64", "--tokens", "64", "--experts", "2"]
RUN = "results/nvidia-h200/roofline-deepseek-v3.json"


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    monkeypatch.setattr(worker, "run_worker", lambda *a, **k: pytest.fail("the run started"))


@pytest.mark.parametrize("args, option", [
    (["ep", "--check", *TINY_EP, "--plot-file", "x.jpg"], "--plot-file"),
    (["ep", "--check", *TINY_EP, "--samples", "5"], "--samples"),
    (["ep", "--check", *TINY_EP, "--timing", "events"], "--timing"),
    (["ep", "--nproc", "2", "--check", *TINY_EP, "--results-dir", "r"], "--results-dir"),
    ([*ROOFLINE, "--samples", "5"], "--samples"),
    ([*ROOFLINE, "--warm-l2"], "--warm-l2"),
    ([*LAYER, "--samples", "5"], "--samples"),
    (["check", "--layer", "--no-pad"], "--pad"),
    (["check", "--layer", "--name", "mxkernels"], "--name"),
    (["history", RUN, "--checkout", "."], "--checkout"),
])  # fmt: skip
def test_an_option_the_mode_ignores_is_refused_naming_it(args, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path) if args[0] != "history" else None
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and f"'{option}" in result.output and "drop it" in result.output, result.output
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("command", [ROOFLINE, LAYER])
def test_recipes_the_hardware_cannot_run_are_refused_up_front(command, tmp_path):
    result = CliRunner().invoke(cli, [*command, "--hardware", "a100-sxm-80gb", "--recipe", "mxfp8,fp8_rowwise",
                                      "--out", str(tmp_path / "a.json")])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "A100" in result.output and "cannot run mxfp8, fp8_rowwise" in result.output and "for --recipe:" in result.output
    assert not (tmp_path / "a.json").exists()
    bf16 = CliRunner().invoke(cli, [*ROOFLINE, "--hardware", "a100-sxm-80gb", "--recipe", "bf16", "--out",
                                    str(tmp_path / "b.json")])  # fmt: skip
    assert bf16.exit_code == 0, bf16.output


def test_ep_strategies_and_check_lists_fold_repeats_with_a_note(monkeypatch):
    got = {}
    monkeypatch.setattr(worker, "run_worker", lambda strategies, *a, **k: got.setdefault("s", strategies) and 0)
    result = CliRunner().invoke(cli, ["ep", "--check", *TINY_EP, "--strategy", "bf16,mxfp8,bf16"])
    assert "'--strategy' gives bf16 more than once: taken once" in result.output
    assert got["s"] == ["bf16", "mxfp8"]


def test_the_same_results_file_twice_is_read_once_with_a_note():
    once = CliRunner().invoke(cli, ["history", RUN, "--format", "csv"])
    twice = CliRunner().invoke(cli, ["history", RUN, RUN, "--format", "csv"])
    assert once.exit_code == twice.exit_code == 0, twice.output
    assert f"note: RESULTS names {RUN} more than once: read once" in twice.output
    assert twice.output.replace(f"note: RESULTS names {RUN} more than once: read once\n", "") == once.output


@pytest.mark.parametrize("args, option", [
    ([*ROOFLINE, "--out", "/proc/r.json"], "--out /proc/r.json"),
    ([*ROOFLINE, "--plot-file", "/proc/h.png"], "--plot-file /proc/h.png"),
    ([*LAYER, "--out", "/proc/l.json"], "--out /proc/l.json"),
    ([*LAYER, "--plot-file", "/proc/h.png"], "--plot-file /proc/h.png"),
    (["plot", RUN, "--out", "/proc/h.png"], "--out /proc/h.png"),
    (["history", RUN, "--plot", "/proc/h.png"], "--plot /proc/h.png"),
    (["ep", "--nproc", "2", *TINY_EP, "--out", "/proc/e.json"], "--out /proc/e.json"),
    (["ep", "--check", *TINY_EP, "--out", "/proc/e.json"], "--out /proc/e.json"),
    (["ep", *TINY_EP, "--plot-file", "/proc/h.png"], "--plot-file /proc/h.png"),
    (["ep", *TINY_EP, "--results-dir", "/proc/r"], "--results-dir /proc/r"),
    (["regress", "--baseline", RUN, "--out", "/proc/r.json"], "--out /proc/r.json"),
    (["peers", "--K", "64", "--N", "64", "--out", "/proc/p.json"], "--out /proc/p.json"),
    (["ceilings", "--out-dir", "/proc/c"], "--out-dir /proc/c"),
])  # fmt: skip
def test_every_output_path_is_checked_for_writability_before_any_work(args, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path) if args[0] not in ("plot", "history", "regress") else None
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and option in result.output and "cannot write" in result.output, result.output


def test_an_output_under_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(cli, [*ROOFLINE, "--out", str(tmp_path / "afile" / "r.json")])
    assert result.exit_code == 2 and "is a file, not a folder" in result.output, result.output
