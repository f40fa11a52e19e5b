"""The mxbench command line, through click's CliRunner: help, presets, the no-GPU model, bad input (exit 2, one
line, no traceback), and the table / compare commands on synthetic result files."""

from __future__ import annotations

import csv
import importlib
import io
import random
import subprocess
import sys
import traceback
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxbench.cli import cli

from mxbench.clikit import common
from mxbench.storage.results import Point, Record, Run, load_run, save_run

CARD = "NVIDIA H100 80GB HBM3"


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the model run is saved under results/ of the working folder
    monkeypatch.setattr(common, "has_gpu", lambda: False)


def test_help_lists_every_command():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("roofline", "presets", "ceilings", "table", "plot", "compare", "regress", "peers"):
        assert command in result.output


def test_version_is_the_installed_distribution_version():
    result = invoke("--version")
    assert result.exit_code == 0 and version("mxbench") in result.output


@pytest.mark.parametrize("module", ["mxbench", "mxbench.cli"])
def test_python_dash_m_runs_the_command_line(module):
    done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("mxbench") and version("mxbench") in done.stdout


def test_the_command_line_loads_no_kernels_until_a_command_runs():
    """``--help`` stays fast: torch, the kernels and numpy (~90 ms; ep-project's model) are imported by the commands
    that need them. The help is printed to stdout; the check goes to stderr."""
    code = ("import sys\nfrom mxbench.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted({'torch', 'mxkernels', 'numpy'} & set(sys.modules)), file=sys.stderr)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "ep-project" in done.stdout and done.stderr.strip() == "[]"


def test_the_options_offer_what_the_harness_knows():
    from mxbench.cli import report_commands
    from mxbench.clikit import common
    from mxbench.instruments import roofline
    from mxbench.views.render import FORMATS
    from mxbench.workloads.layer import command as layer_command
    from mxbench.workloads.registered import WORKLOADS
    from mxbench.workloads.step.tables import STEP_ROWS

    assert common.FORMATS == FORMATS
    # --kind offers every registered workload's table kinds in their order: the step's first, then each workload's
    # own, as its package states them (TABLE_KINDS) where it does
    assert report_commands.TABLE_KINDS[: len(STEP_ROWS) + 1] == (*STEP_ROWS, "peers")
    assert report_commands.TABLE_KINDS == tuple(kind for w in WORKLOADS for kind in w.table_kinds)
    for w in WORKLOADS:
        package = importlib.import_module(w.commands[0].callback.__module__.rpartition(".")[0])
        assert getattr(package, "TABLE_KINDS", w.table_kinds) == w.table_kinds, w.name
    assert layer_command.DENOMINATORS == roofline.DENOMINATORS  # written out there: the CLI imports no kernels


def test_presets_lists_every_model_with_its_shapes():
    result = invoke("presets")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    for name, K, N in [
        ("deepseek-v3", "7168", "2048"),
        ("llama4-scout", "5120", "8192"),
        ("mixtral-8x7b", "4096", "14336"),
    ]:
        (line,) = [line for line in lines if line.split() and line.split()[0] == name]
        assert f" {K} " in line and f" {N} " in line and "huggingface.co" in line


# ----------------------------------------------------------------------------------------- roofline, no GPU


def test_roofline_without_a_gpu_prints_the_labelled_model(no_gpu, tmp_path):
    out = tmp_path / "model.json"
    result = invoke("roofline", "--K", 7168, "--N", 2048, "--M", "16384,131072", "--out", out)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("no CUDA GPU found")
    assert "model, not measured" in result.output
    for kernel in ("quantize_dim0", "rearrange_m_groups", "rearrange_k_groups", "mxfp8_scaled_grouped_mm"):
        assert kernel in result.output
    assert "Net speedup" in result.output and "131072" in result.output
    stored = load_run(out)
    assert stored.meta["measured"] is False and stored.meta["hardware"] == "b200"
    assert stored.records and not any(r.measured for r in stored.records)
    # the breakdown is at the largest M unless --breakdown-M says otherwise
    assert "(131072, 7168)" in result.output and "(16384, 7168)" not in result.output


def test_roofline_preset_and_breakdown_M(no_gpu):
    result = invoke("roofline", "--preset", "llama4-scout", "--M", "16384,32768", "--breakdown-M", 16384)
    assert result.exit_code == 0, result.output
    assert "(16384, 5120)" in result.output and "(32768, 5120)" not in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "nope"], "unknown preset 'nope'; valid presets: deepseek-v2-lite, deepseek-v3"),
        (["--K", 7000, "--N", 2048], "K must be a positive multiple of 32"),
        (["--K", 7168, "--N", 2050], "N must be a positive multiple of 32"),
        (["--K", 7168], "give --K and --N"),
        (["--preset", "deepseek-v3", "--K", 7168], "either --preset or --K/--N"),
        (["--K", 7168, "--N", 2048, "--M", 0], "every M must be positive"),
        (["--K", 7168, "--N", 2048, "--M", "1024,-5"], "every M must be positive"),
        (["--K", 7168, "--N", 2048, "--M", "many"], "comma-separated list"),
        (["--K", 7168, "--N", 2048, "--G", 0], "--G"),
        (["--K", 7168, "--N", 2048, "--G", 513], "--G"),
        (["--K", 7168, "--N", 2048, "--recipe", "mxfp4"], "recipe must be one or more of mxfp8, fp8_rowwise, bf16"),
        (["--K", 7168, "--N", 2048, "--mode", "ceil"], "--mode"),
        (["--K", 7168, "--N", 2048, "--groups", "zipf"], "--groups"),
        (["--K", 7168, "--N", 2048, "--power-limit", "80,-10"], "must be positive"),
        (["--K", 7168, "--N", 2048, "--breakdown-M", 4096], "not one of the swept M"),
        (["--K", 7168, "--N", 2048, "--hardware", "tpu"], "unknown hardware 'tpu'"),
        (["--K", 7168, "--N", 2048, "--denominator", "measured"], "measured ceilings need a GPU"),
    ],
)
def test_roofline_bad_input_exits_2_with_a_message(no_gpu, args, message):
    result = invoke("roofline", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


class FakeController:
    """Stands in for PowerController: a card whose limit may be set between 200 and 700 W, by ``allowed``."""

    allowed = True

    def __init__(self, device=0):
        pass

    def resolve(self, percents=None, watts=None):
        from mxkernels.core.runtime import InputError

        limits = [700 * p / 100 for p in percents] if percents else list(watts)
        for w in limits:
            if not 200 <= w <= 700:
                raise InputError(f"{w:g} W is outside this card's power-limit range [200, 700] W")
        return limits

    def check_permission(self, watts):
        from mxbench.instruments.power import PowerPermissionError

        if watts is not None and not self.allowed:
            raise PowerPermissionError("setting a GPU power limit needs root (or CAP_SYS_ADMIN)")


@pytest.mark.parametrize(
    "args, allowed, message",
    [
        (["--power-limit", "100,10"], True, "70 W is outside this card's power-limit range"),
        (["--power-limit-watts", "900"], True, "900 W is outside"),
        (["--power-limit", "80"], False, "needs root"),
    ],
)
def test_power_limits_are_checked_before_anything_runs(monkeypatch, args, allowed, message):
    import mxbench.instruments.power
    import mxbench.workloads.step.sweep

    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(common, "detected_spec", lambda device=0: "h100-sxm")
    monkeypatch.setattr(FakeController, "allowed", allowed)
    monkeypatch.setattr(mxbench.instruments.power, "PowerController", FakeController)
    monkeypatch.setattr(mxbench.workloads.step.sweep, "run_sweep", lambda *a, **k: pytest.fail("the sweep must not start"))
    result = invoke("roofline", "--K", 7168, "--N", 2048, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [["regress", "--baseline", "{run}"], ["peers", "--K", 7168, "--N", 2048],
                                     ["ceilings"]])  # fmt: skip
def test_gpu_commands_say_plainly_there_is_no_gpu(no_gpu, tmp_path, command):
    path = tmp_path / "base.json"
    save_run(synthetic_run(), path)
    result = invoke(*[str(a).format(run=path) for a in command])
    assert result.exit_code == 2 and "no CUDA GPU found" in result.output
    assert "Traceback" not in result.output


# ----------------------------------------------------------------------------------- synthetic result files


def samples(center: float, spread: float = 0.005, n: int = 15, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def synthetic_run(card: str = CARD, slow: float = 1.0, seed: int = 0) -> Run:
    """mxfp8 at M=1024: a quantize (10 us), a GEMM (50 us) and fwd+bwd (200 us); bf16: GEMM 75 us, fwd+bwd
    300 us. ``slow`` scales every mxfp8 time."""
    mx, bf = Point(1024, 2048, 7168, 8, "mxfp8"), Point(1024, 2048, 7168, 8, "bf16")
    flops = 2 * 1024 * 2048 * 7168
    rows = [
        Record(mx, "forward", "quantize_a", "quantize_dim0", "quantize", "Quantize A", "(1024, 7168)",
               bytes_read=2 * 1024 * 7168, bytes_written=1024 * 7168 * 33 // 32,
               samples_us=samples(10 * slow, seed=seed)),
        Record(mx, "forward", "gemm", "mxfp8_grouped_mm", "gemm", "GEMM", "(1024, 7168) @ (8, 7168, 2048)",
               flops=flops, precision="mxfp8", samples_us=samples(50 * slow, seed=seed + 1)),
        Record(mx, "end_to_end", "fwd+bwd", "autograd", "end_to_end", samples_us=samples(200 * slow, seed=seed + 2)),
        Record(bf, "forward", "gemm", "torch._grouped_mm", "gemm", "GEMM", "(1024, 7168) @ (8, 7168, 2048)",
               flops=flops, precision="bf16", samples_us=samples(75, seed=seed + 3)),
        Record(bf, "end_to_end", "fwd+bwd", "autograd", "end_to_end", samples_us=samples(300, seed=seed + 4)),
    ]  # fmt: skip
    meta = {"card": card, "hardware": "h100-sxm", "measured": True, "command": "synthetic",
            "timing": {"cold_l2": True, "use_graph": True, "samples": 15}}  # fmt: skip
    return Run(meta=meta, records=rows)


def test_table_markdown_names_card_and_denominator(stored):
    result = invoke("table", stored("a", synthetic_run()), "--format", "markdown")
    assert result.exit_code == 0, result.output
    assert CARD in result.output and "H100" in result.output and "datasheet" in result.output
    assert next(line for line in result.output.splitlines() if "quantize_dim0" in line).startswith("|")
    assert "synthetic" in result.output  # the command that produced the run


def test_table_csv_parses_with_the_chosen_columns(stored):
    result = invoke("table", stored("a", synthetic_run()), "--format", "csv", "--columns", "Kernel,Time (us)")
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.output)))
    assert rows[0] == ["Kernel", "Time (us)"]
    assert [r[0] for r in rows[1:]] == ["quantize_dim0", "mxfp8_grouped_mm"]
    assert abs(float(rows[1][1]) - 10.0) < 0.1


def test_table_speedup_is_bf16_over_the_recipe(stored):
    result = invoke("table", stored("a", synthetic_run()), "--kind", "speedup", "--format", "plain")
    assert result.exit_code == 0, result.output
    # fwd+bwd 300 us / 200 us, forward GEMM 75 us / 50 us (medians of samples within 0.5% of those)
    line = next(line for line in result.output.splitlines() if line.lstrip().startswith("1024"))
    speedups = [float(w[:-1]) for w in line.split() if w.endswith("x")]
    assert speedups == pytest.approx([1.5, 1.5], abs=0.02)


def test_table_filters_by_pass_and_card(stored):
    path = stored("a", synthetic_run())
    result = invoke("table", path, "--kind", "sweep", "--pass", "end_to_end", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert [r[-1] for r in csv.reader(io.StringIO(result.output))][1:] and "quantize_dim0" not in result.output
    other = invoke("table", path, "--card", "NVIDIA B200")
    assert other.exit_code == 2 and f"no records with card=NVIDIA B200; {path} has card in {CARD}" in other.output


def test_table_unknown_column_exits_2(stored):
    result = invoke("table", stored("a", synthetic_run()), "--columns", "Kernel,Nope")
    assert result.exit_code == 2 and "Nope" in result.output and "Traceback" not in result.output


def test_compare_identical_runs_is_same_and_exits_0(stored):
    result = invoke("compare", stored("a", synthetic_run()), stored("b", synthetic_run(seed=10)))
    assert result.exit_code == 0, result.output
    assert "SLOWER" not in result.output.replace("0 SLOWER", "") and "SAME" in result.output


def test_compare_20_percent_slower_exits_1(stored):
    result = invoke("compare", stored("a", synthetic_run()), stored("b", synthetic_run(slow=1.2, seed=10)))
    assert result.exit_code == 1, result.output
    assert "SLOWER" in result.output


def test_compare_refuses_runs_of_different_cards_unless_forced(stored):
    base, other = stored("a", synthetic_run()), stored("b", synthetic_run(card="NVIDIA H200", seed=10))
    refused = invoke("compare", base, other)
    assert refused.exit_code == 2 and "different cards" in refused.output and "Traceback" not in refused.output
    forced = invoke("compare", base, other, "--force")
    assert forced.exit_code == 0, forced.output


def test_a_file_that_is_not_a_run_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = invoke("table", bad)
    assert result.exit_code == 2 and f"{bad}: results schema None" in " ".join(result.output.split())


def test_an_exception_that_is_not_an_input_error_is_a_bug_and_exits_1(stored, monkeypatch):
    import mxbench.views.frame

    def broken(path):
        raise RuntimeError("a bug, not bad input")

    monkeypatch.setattr(mxbench.views.frame, "load_run", broken)  # how `table` reads its files and folders
    result = invoke("table", stored("a", synthetic_run()))
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)
    assert "broken" in "".join(traceback.format_tb(result.exc_info[2]))  # its traceback reaches where it was raised


def test_a_bare_value_error_prints_its_traceback_and_exits_1(stored):
    """A ValueError that is not an InputError is a bug too: the process shows the traceback, not a one-line message."""
    code = (
        "import mxbench.storage.results\n"
        "def broken(path): raise ValueError('a bug, not bad input')\n"
        "mxbench.storage.results.load_run = broken\n"
        "from mxbench.cli import main\n"
        f"main(['table', {str(stored('a', synthetic_run()))!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "ValueError: a bug, not bad input" in done.stderr


# ------------------------------------------------------------------------------------- roofline, with a GPU


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A GPU run without a GPU: the card is an H100 and run_sweep returns the synthetic run (saved where asked)."""
    import mxbench.instruments.power
    import mxbench.workloads.step.sweep

    calls = {}

    def fake_sweep(points, *, options, progress=True, instruments=None):
        calls.update(points=points, options=options, instruments=instruments)
        run = synthetic_run()
        save_run(run, options.out)
        return run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(common, "detected_spec", lambda device=0: "h100-sxm")
    monkeypatch.setattr(common, "card_name", lambda device=0: CARD)
    monkeypatch.setattr(mxbench.instruments.power, "PowerController", FakeController)
    monkeypatch.setattr(mxbench.workloads.step.sweep, "run_sweep", fake_sweep)
    return calls


def test_roofline_with_a_gpu_sweeps_saves_and_prints_both_tables(fake_gpu, tmp_path):
    result = invoke("roofline", "--K", 7168, "--N", 2048, "--M", "1024,2048", "--samples", 9, "--warm-l2")
    assert result.exit_code == 0, result.output
    options = fake_gpu["options"]
    assert (options.cold_l2, options.samples, options.hardware) == (False, 9, "h100-sxm")
    assert options.command == "mxbench roofline --K 7168 --N 2048 --M 1024,2048 --warm-l2 --samples 9"
    assert options.out.parent == Path("results/nvidia-h100-80gb-hbm3")  # relative to the working directory
    assert options.out.name.startswith("roofline-7168x2048-") and (tmp_path / options.out).exists()
    assert f"results: {options.out}" in result.output
    assert [(p.M, p.recipe, p.power_limit_w) for p in fake_gpu["points"]] == [
        (1024, "mxfp8", None),
        (2048, "mxfp8", None),
    ]
    assert "mxfp8_grouped_mm" in result.output and "Net speedup" in result.output
    assert "of H100 SXM datasheet" in result.output  # efficiency against the detected card's spec


def test_roofline_power_limits_become_points_in_watts(fake_gpu):
    result = invoke("roofline", "--K", 7168, "--N", 2048, "--M", 1024, "--power-limit", "80,60")
    assert result.exit_code == 0, result.output
    assert [p.power_limit_w for p in fake_gpu["points"]] == pytest.approx([560.0, 420.0])
    assert fake_gpu["options"].command == "mxbench roofline --K 7168 --N 2048 --M 1024 --power-limit 80,60"
    assert fake_gpu["instruments"].power is not None  # the controller that checked permission sets the limits


def test_plot_draws_png_files(stored, tmp_path):
    result = invoke("plot", stored("a", synthetic_run()), "--out", tmp_path / "figures")
    assert result.exit_code == 0, result.output
    paths = [tmp_path / "figures" / line.split("/")[-1] for line in result.output.split()]
    assert paths and all(p.suffix == ".png" and p.read_bytes().startswith(b"\x89PNG") for p in paths)


# ---------------------------------------------------------------------- the committed runs: filters, kinds, --project

H200 = Path(__file__).resolve().parent.parent / "results" / "nvidia-h200"
DEEPSEEK, SKEWED, PEERS = (H200 / f"{n}.json" for n in ("roofline-deepseek-v3", "roofline-deepseek-v3-skewed",
                                                          "peers-deepseek-v3"))  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        ([DEEPSEEK, "--M", 12345], f"no records with M=12345; {DEEPSEEK} has M in 16384, 32768, 65536, 131072"),
        ([DEEPSEEK, "--kind", "sweep", "--recipe", "nvfp4"],
         f"no records with recipe=nvfp4; {DEEPSEEK} has recipe in bf16, mxfp8"),
        ([DEEPSEEK, "--kind", "power", "--pass", "end_to_end", "--M", "16384,1"],
         f"no records with M=1 (pass=end_to_end); {DEEPSEEK} has M in 16384, 32768, 65536, 131072"),
        ([DEEPSEEK, SKEWED, "--card", "NVIDIA B200"], "no records with card=NVIDIA B200; these 2 files have card in NVIDIA H200"),
        ([DEEPSEEK, "--pass", "sideways"], "passes: unknown pass ['sideways']"),
        ([PEERS, "--kind", "peers", "--M", 8], f"no records with M=8; {PEERS} has M in 131072"),
        ([DEEPSEEK, "--kind", "peers"], f"--kind peers needs a run of `mxbench peers`; {DEEPSEEK} is not one: its "
                                        + "tables are breakdown, speedup, sweep, power"),
        ([PEERS], f"{PEERS} is a peers run (made by `mxbench peers`): its tables are --kind peers, not breakdown"),
        ([DEEPSEEK, "--kind", "ep"], f"--kind ep needs a run of `mxbench ep`; {DEEPSEEK} is not one"),
        ([DEEPSEEK, "--kind", "speedup", "--pass", "forward"], "the speedup table compares whole steps"),
        ([DEEPSEEK, "--kind", "power", "--project", "b200"], "--project shows the breakdown and speedup tables"),
        ([DEEPSEEK, "--project", "tpu"], "unknown hardware 'tpu'"),
    ],
)  # fmt: skip
def test_table_input_that_matches_nothing_exits_2_naming_what_is_there(args, message):
    result = invoke("table", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_table_of_several_files_shows_each_what_it_has_of_the_filter():
    result = invoke("table", DEEPSEEK, SKEWED, "--kind", "speedup", "--M", "16384,131072", "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.output)))
    # the skewed run holds M=131072 only: its table comes after the balanced run's two rows
    assert [r[0] for r in rows if r and r[0].isdigit()] == ["16384", "131072", "131072"]


def test_table_project_adds_the_b200_projection_beside_the_measurement():
    result = invoke("table", DEEPSEEK, "--kind", "speedup", "--project", "b200", "--format", "plain")
    assert result.exit_code == 0, result.output
    assert result.output.count("Card: NVIDIA H200") == 1  # the projection shares the run's header block
    assert "Projection: B200 datasheet roofs, projection from NVIDIA H200 efficiencies" in result.output
    last = result.output.strip().splitlines()[-1].split()
    assert last[:5] == ["131072", "2048", "7168", "8", "mxfp8"] and last[5] == "0.876x"  # measured on the H200


def test_roofline_project_needs_a_measured_run(no_gpu):
    result = invoke("roofline", "--K", 7168, "--N", 2048, "--project", "b200")
    assert result.exit_code == 2 and "--project" in result.output and "without a GPU nothing is" in result.output


def test_roofline_with_a_gpu_prints_the_projection(fake_gpu, tmp_path):
    result = invoke("roofline", "--K", 7168, "--N", 2048, "--M", 1024, "--project", "b200", "--plot-file", "figs")
    assert result.exit_code == 0, result.output
    assert "Projection: B200 datasheet roofs, projection from NVIDIA H100 80GB HBM3 efficiencies" in result.output
    assert "Projected net speedup" in result.output and "B200 projected (us)" in result.output
    assert "figure: figs/projection_b200.png" in result.output and (tmp_path / "figs/projection_b200.png").exists()


def test_plot_of_a_peers_file_draws_the_peers_figure(tmp_path):
    result = invoke("plot", PEERS, "--out", tmp_path / "figs")
    assert result.exit_code == 0, result.output
    assert result.output.split() == [str(tmp_path / "figs" / "peers.png")]
    refused = invoke("plot", PEERS, "--out", tmp_path / "figs", "--project", "b200")
    assert refused.exit_code == 2 and "no step to project" in refused.output
