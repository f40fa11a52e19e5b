"""Numbers past what the kernels honour are refused before any work, and a list that repeats a value measures it
once and says so (issue 26's bounds and duplicates, for the shapes and lists every command shares)."""

import json

import pytest
from click.testing import CliRunner

from mxbench.cli import cli


@pytest.mark.parametrize("args, message", [
    (["--K", str(2**40), "--N", "2048"], "K must be at most 1048576"),
    (["--K", "7168", "--N", str(2**21)], "N must be at most 1048576"),
    (["--K", "7168", "--N", "2048", "--M", str(2**40)], "group ends are int32"),
    (["--K", "7168", "--N", "2048", "--M", "99999999999999999999"], "past int64 (2**63)"),  # refused as it is parsed
])  # fmt: skip
def test_roofline_refuses_sizes_past_the_kernels_bounds(args, message, tmp_path):
    out = tmp_path / "run.json"
    result = CliRunner().invoke(cli, ["roofline", *args, "--out", str(out)])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()


def test_layer_refuses_more_routed_rows_than_int32_indexes(tmp_path):
    result = CliRunner().invoke(cli, ["layer", "--K", "64", "--N", "64", "--tokens", str(2**24), "--experts", "256",
                                      "--top-k", "200", "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert result.exit_code == 2 and "below 2**31" in result.output, result.output


def test_a_repeated_value_is_measured_once_with_a_note(tmp_path):
    out = tmp_path / "run.json"
    result = CliRunner().invoke(cli, ["roofline", "--K", "256", "--N", "128", "--M", "1024,1024,2048", "--recipe",
                                      "mxfp8,mxfp8", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "'--M' gives 1024 more than once: taken once" in result.output
    assert "'--recipe' gives mxfp8 more than once" in result.output
    points = {(r["point"]["M"], r["point"]["recipe"]) for r in json.loads(out.read_text())["records"]}
    assert points == {(1024, "mxfp8"), (2048, "mxfp8"), (1024, "bf16"), (2048, "bf16")}
    stages = [r for r in json.loads(out.read_text())["records"] if r["point"]["M"] == 1024 and r["stage"] == "gemm_fwd"
              and r["point"]["recipe"] == "mxfp8"]  # fmt: skip
    assert len(stages) == 1


def test_an_output_name_past_the_file_systems_limit_is_refused_before_any_work(tmp_path):
    out = tmp_path / ("r" * 300 + ".json")
    result = CliRunner().invoke(cli, ["roofline", "--K", "256", "--N", "128", "--M", "1024", "--out", str(out)])
    assert result.exit_code == 2 and "past the file system's limit" in result.output, result.output
    plot = CliRunner().invoke(cli, ["layer", "--K", "64", "--N", "64", "--out", str(tmp_path / "ok.json"),
                                    "--plot-file", str(tmp_path / ("p" * 300 + ".png"))])  # fmt: skip
    assert plot.exit_code == 2 and "--plot-file" in plot.output and not (tmp_path / "ok.json").exists()


def test_history_plot_to_an_unwritable_place_is_refused_before_any_work():
    result = CliRunner().invoke(cli, ["history", "results/nvidia-h200", "--plot", "/proc/h.png"])
    assert result.exit_code == 2 and "--plot /proc/h.png" in result.output, result.output


TINY_EP = ["--K", "64", "--N", "64", "--experts", "2", "--tokens", "32"]


@pytest.mark.parametrize("args, message", [
    (["check", "--seed", str(2**64)], "'--seed'"),
    (["check", "--seed", str(2**63)], "0<=x<2**63"),
    (["ep", "--check", *TINY_EP, "--seed", str(2**64)], "'--seed'"),
    (["check", "--M", str(2**40)], "1<=x<=2147483647"),
    (["check", "--M", "99999999999999999999"], "1<=x<=2147483647"),
    (["check", "--M", str(2**30), "--K", str(2**20)], "past the 288 GB of the largest card known"),
    (["check", "--K", "0"], "K must be a positive multiple of 32, got 0"),
    (["check", "--N", "0"], "N must be a positive multiple of 32, got 0"),
    (["check", "--K", "1099511627776"], "K must be at most 1048576"),
    (["check", "--K", str(2**62)], "K must be at most 1048576"),
    (["check", "--K", str(2**63)], "'--K': 9223372036854775808 is past int64 (2**63)"),
    (["ep", "--check", "--K", "1099511627776", "--N", "64"], "K must be at most 1048576"),
    (["ep", "--check", "--K", "64", "--N", "64", "--tokens", str(2**62)], "tokens x top-k"),
    (["ep", "--check", "--K", "64", "--N", "64", "--tokens", "99999999999999999999"], "past int64"),
    (["ep", "--check", "--K", str(2**20), "--N", str(2**20), "--experts", "512", "--tokens", "32"],
     "one rank's tensors"),
    (["layer", "--K", str(2**20), "--N", str(2**20), "--experts", "512", "--tokens", "32"], "the layer's bf16"),
    (["roofline", "--K", str(2**20), "--N", "128", "--M", str(2**30)], "past the 288 GB"),
    (["roofline", "--K", "256", "--N", "128", "--M", "1024", "--power-limit", "nan"], "'nan' is not a finite number"),
    (["roofline", "--K", "256", "--N", "128", "--M", "1024", "--power-limit", "inf"], "'inf' is not a finite number"),
    (["roofline", "--K", "256", "--N", "128", "--M", "1024", "--power-limit", "-5"], "positive and finite"),
    (["roofline", "--K", "256", "--N", "128", "--M", "1024", "--power-limit-watts", "nan"], "not a finite number"),
])  # fmt: skip
def test_numbers_past_what_the_kernels_and_devices_honour_exit_2_before_any_work(args, message, tmp_path, monkeypatch):
    from mxbench.workloads.ep import launch, worker

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    monkeypatch.setattr(worker, "run_worker", lambda *a, **k: pytest.fail("the run started"))
    monkeypatch.chdir(tmp_path)  # a default output path lands here, and must not be written
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert not list(tmp_path.rglob("*.json"))


def test_the_largest_seed_torch_takes_runs(tmp_path):
    result = CliRunner().invoke(cli, ["check", "--stage", "quantize_a", "--name", "mxkernels", "--mode", "rceil",
                                      "--seed", str(2**63 - 1), "--M", "64", "--K", "64", "--N", "64",
                                      "--G", "2"])  # fmt: skip
    assert result.exit_code == 0, result.output


def test_ep_generator_seeds_stay_in_torchs_range_and_keep_small_seeds():
    from mxbench.workloads.ep.inputs import _generator

    assert _generator(2**63 - 1, 1).initial_seed() == ((2**63 - 1) * 1_000_003 + 1) % 2**63
    assert _generator(7, 1).initial_seed() == 7 * 1_000_003 + 1  # the seeds of every earlier run are unchanged
