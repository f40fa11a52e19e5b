"""Bad input is refused before any work (exit 2, one line naming the option or file, no traceback); Ctrl-C keeps
what was measured (exit 130); without a GPU the model run is saved where --help says and `make baseline` /
`make regress` refuse."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import FakeGPU

from mxbench.cli import cli

from mxbench.clikit import common
from mxbench.instruments.kit import Instruments
from mxbench.storage.results import load_run, save_run

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SHAPE = ("--K", "256", "--N", "128", "--G", "2", "--M", "512")


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result, wanted: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: ") and wanted in line, line


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """roofline on a fake GPU: the real sweep (saving, Ctrl-C) over FakeGPU instruments; nothing may be built
    unless a test says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(common, "detected_spec", lambda device=0: "h100-sxm")
    monkeypatch.setattr(common, "card_name", lambda device=0: "Fake GPU")

    def untouched(n):
        raise AssertionError("a point was measured before the bad input was refused")

    fake = FakeGPU(on_point=untouched)
    monkeypatch.setattr(Instruments, "real", classmethod(lambda cls, *a, **k: fake.instruments()))
    return fake


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "has_gpu", lambda: False)


# ----------------------------------------------------------------------------------------------- output paths


@pytest.mark.parametrize(
    "args, wanted",
    [
        (["--out", "/sys/x.json"], "--out /sys/x.json: cannot write in /sys (Permission denied)"),
        (["--out", "/proc/version/x.json"], "--out /proc/version/x.json: /proc/version is a file, not a folder"),
        (["--out", "run.csv"], ("--out run.csv: a results file is JSON (its CSV is written beside it); give a name "
                                "ending in .json, e.g. run.json")),
        (["--plot-file", "/proc/version/x"], "--plot-file /proc/version/x: /proc/version is a file, not a folder"),
        (["--plot-file", "/sys/plots"], "--plot-file /sys/plots: cannot write in /sys"),
        (["--plot-file", "fig.jpg"], ("--plot-file fig.jpg: figures are written as .png, .svg, .pdf or into a "
                                      "folder; give a name ending in .png, or a folder")),
    ],
)  # fmt: skip
def test_unwritable_outputs_are_refused_before_the_first_point(fake_gpu, args, wanted):
    one_line_error(invoke("roofline", *SHAPE, *args), wanted)


def test_an_existing_folder_as_out_is_refused(fake_gpu, tmp_path):
    (tmp_path / "taken.json").mkdir()
    result = invoke("roofline", *SHAPE, "--out", tmp_path / "taken.json")  # click's own check of the option
    assert result.exit_code == 2 and "Invalid value for '--out'" in result.output and "is a directory" in result.output


def test_the_model_checks_its_outputs_too(no_gpu):
    one_line_error(invoke("roofline", *SHAPE, "--out", "/sys/x.json"), "--out /sys/x.json: cannot write in /sys")


@pytest.mark.parametrize(
    "out, wanted",
    [
        ("x.jpg", "--out x.jpg: figures are written as .png, .svg, .pdf or into a folder"),
        ("/sys/plots", "--out /sys/plots: cannot write in /sys"),
        ("/proc/version/plots", "/proc/version is a file, not a folder"),
    ],
)
def test_plot_out_must_be_an_image_or_a_writable_folder(tmp_path, monkeypatch, out, wanted):
    from test_cli import synthetic_run

    monkeypatch.chdir(tmp_path)
    save_run(synthetic_run(), tmp_path / "run.json")
    one_line_error(invoke("plot", tmp_path / "run.json", "--out", out), wanted)
    assert not (tmp_path / "x.jpg").exists()  # not turned into a folder named x.jpg


def test_plot_out_png_and_folder_still_draw(tmp_path):
    from test_cli import synthetic_run

    save_run(synthetic_run(), tmp_path / "run.json")
    sheet = invoke("plot", tmp_path / "run.json", "--out", tmp_path / "sheet.png")
    assert sheet.exit_code == 0 and (tmp_path / "sheet.png").read_bytes().startswith(b"\x89PNG")


def test_peers_and_ceilings_check_their_outputs_first(no_gpu):
    one_line_error(invoke("peers", *SHAPE, "--out", "/sys/p.json"), "--out /sys/p.json: cannot write in /sys")
    one_line_error(invoke("ceilings", "--out-dir", "/sys/c"), "--out-dir /sys/c: cannot write in /sys")


# ------------------------------------------------------------------------------------------- seeds and power


@pytest.mark.parametrize("command", [["roofline", *SHAPE], ["peers", *SHAPE]])
def test_a_negative_seed_names_seed(no_gpu, command):
    result = invoke(*command, "--seed", -1)
    assert result.exit_code == 2 and "Invalid value for '--seed': -1 is not in the range" in result.output
    assert "Traceback" not in result.output


def test_without_a_gpu_a_limit_above_every_known_card_is_refused(no_gpu):
    import tomllib

    specs = tomllib.loads((REPO / "mxbench/data/hardware.toml").read_text())
    top = max(s["tdp_w"] for s in specs.values())
    one_line_error(invoke("roofline", *SHAPE, "--power-limit-watts", f"500,{top + 1}"),
                   f"--power-limit-watts: {top + 1:g} W is above every known card's maximum power ({top:g} W")  # fmt: skip
    fine = invoke("roofline", *SHAPE, "--power-limit-watts", f"{top}")
    assert fine.exit_code == 0 and "power limits need a GPU: ignored" in fine.output
    one_line_error(invoke("roofline", *SHAPE, "--power-limit", "80,5000"),
                   "--power-limit: 5000% is above the default limit")  # fmt: skip
    assert invoke("roofline", *SHAPE, "--power-limit", "80,100").exit_code == 0


def test_a_limit_outside_the_cards_nvml_range_names_the_option_and_the_range(fake_gpu, monkeypatch):
    from test_cli import FakeController

    import mxbench.instruments.power

    monkeypatch.setattr(mxbench.instruments.power, "PowerController", FakeController)
    one_line_error(invoke("roofline", *SHAPE, "--power-limit-watts", "100"),
                   "--power-limit-watts: 100 W is outside this card's power-limit range [200, 700] W")  # fmt: skip


# ----------------------------------------------------------------------------------------------- the model


def test_without_a_gpu_the_model_run_is_saved_where_help_says(no_gpu, tmp_path):
    assert "without a GPU the model run goes to results/model-<spec>/" in " ".join(
        invoke("roofline", "--help").output.split())  # fmt: skip
    result = invoke("roofline", "--K", 7168, "--N", 2048, "--M", 16384)
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "results" / "model-b200").glob("roofline-7168x2048-*.json")
    assert f"results: results/model-b200/{path.name} (model, not measured)" in result.output
    assert path.with_suffix(".csv").exists()
    run = load_run(path)
    assert run.meta["measured"] is False and run.records and not any(r.measured for r in run.records)
    # the header states the model's assumption, on screen and in a table of the stored run
    assumption = "time = max(bytes / bandwidth, FLOPs / peak) + 2 us launch overhead"
    assert f"Model: {assumption}" in result.output
    assert f"- **Model:** {assumption}" in invoke("table", path).output


def test_a_model_rows_efficiency_is_model_at_peak_not_a_percentage():
    from mxkernels.stages.pipeline import plan_step

    from mxbench.instruments.hardware import datasheet_peaks, get_spec
    from mxbench.storage.results import Point, Run
    from mxbench.instruments.roofline import MODEL_AT_PEAK, efficiency, model_records
    from mxbench.workloads.step.tables import breakdown_rows

    spec = get_spec("b200")
    point = Point(16384, 2048, 7168, 8)
    records = model_records(point, plan_step("mxfp8", 16384, 2048, 7168, 8, [2048] * 8), spec)
    peaks = datasheet_peaks(spec)
    gemm = next(r for r in records if r.category == "gemm")
    assert 95 < efficiency(gemm, peaks)[0] < 100  # what a percentage would say: the roof less the launch overhead
    rows = breakdown_rows(Run({"card": "b200", "hardware": "b200", "measured": False}, records))
    assert {row["Efficiency"] for row in rows} == {MODEL_AT_PEAK} and MODEL_AT_PEAK == "model at peak"


@pytest.mark.parametrize("target", ["baseline", "regress"])
def test_make_baseline_and_regress_refuse_without_a_gpu(tmp_path, target):
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(["make", target, f"PYTHON={sys.executable}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"make {target}: no CUDA GPU found" in done.stderr
    assert not (tmp_path / "results").exists()


# ------------------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_keeps_the_measured_points_marks_the_run_partial_and_exits_130(tmp_path):
    """A real SIGINT in a real process: the roofline sweep (run_sweep itself, over fake instruments) is interrupted
    while its third of four points is built."""
    out = tmp_path / "run.json"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(TESTS)!r})
        from helpers import FakeGPU
        from mxbench.cli import main
        from mxbench.clikit import common
        from mxbench.instruments.kit import Instruments

        common.has_gpu = lambda: True
        common.detected_spec = lambda device=0: "h100-sxm"
        common.card_name = lambda device=0: "Fake GPU"

        def interrupt(n):
            if n == 2:
                os.kill(os.getpid(), signal.SIGINT)

        fake = FakeGPU(on_point=interrupt)
        Instruments.real = classmethod(lambda cls, *a, **k: fake.instruments())
        main(["roofline", "--K", "256", "--N", "128", "--G", "2", "--M", "512,1024", "--out", {str(out)!r}])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=False)  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert "interrupted: the partial results above were saved" in done.stderr and "Traceback" not in done.stderr
    run = load_run(out)
    assert run.meta["interrupted"] is True and run.meta["partial"] == "interrupted (Ctrl-C) after 2 of 4 points"
    assert {(r.point.M, r.point.recipe) for r in run.records} == {(512, "mxfp8"), (512, "bf16")}
    assert "- **Partial:** interrupted (Ctrl-C) after 2 of 4 points" in invoke("table", out).output
