"""Ctrl-C exits 130 from every command, with one line naming what was kept (issue 34, item 4): never click's
"Aborted!" and exit 1, which `compare` and `check` use for a verdict. The rule lives in the command group
(``clikit.common.Group``), so a command added later inherits it."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxbench.cli import cli

TESTS = Path(__file__).resolve().parent
RUN = "results/nvidia-h100-80gb-hbm3/roofline-deepseek-v3.json"
EP_RUN = "results/nvidia-h100-80gb-hbm3/ep/ep-deepseek-v3.json"
ARGS = {
    "roofline": ["--K", "256", "--N", "128"],
    "layer": ["--K", "64", "--N", "64"],
    "peers": ["--K", "256", "--N", "128"],
    "ep": ["--K", "64", "--N", "64"],
    "ep-project": [EP_RUN],
    "table": [RUN],
    "compare": [RUN, RUN],
    "plot": [RUN, "--out", "x.png"],
    "history": [RUN],
    "regress": ["--baseline", RUN],
    "check": [],
    "impls": [],
    "presets": [],
    "ceilings": [],
    "map": ["--K", "256", "--N", "128", "--experts", "4", "--tokens-per-expert", "128"],
}
"""Arguments each command parses; a command added later fails its case until it has a line here."""


def interrupted(result) -> str:
    assert result.exit_code == 130, (result.exit_code, result.output[-1500:])
    assert "Aborted!" not in result.output and "Traceback" not in result.output, result.output
    (line,) = [line for line in result.output.splitlines() if "interrupted" in line]
    assert line.startswith("interrupted (Ctrl-C): "), line
    return line


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_ctrl_c_inside_any_command_exits_130_naming_what_was_kept(name, monkeypatch, tmp_path):
    command = cli.commands[name]

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "callback", ctrl_c)
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    result = CliRunner().invoke(cli, [name, *ARGS.get(name, [])])
    assert name in ARGS, f"{name} is a new command: give it a line in ARGS (the arguments it parses)"
    assert interrupted(result) == "interrupted (Ctrl-C): no file was written"


def test_ctrl_c_while_reading_a_table_exits_130(monkeypatch):
    from mxbench.views import frame

    def ctrl_c(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(frame, "load_run", ctrl_c)
    interrupted(CliRunner().invoke(cli, ["table", RUN]))


def test_ctrl_c_while_comparing_exits_130_not_1(monkeypatch):
    from mxbench.gate import compare

    monkeypatch.setattr(compare, "compare_runs", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    interrupted(CliRunner().invoke(cli, ["compare", RUN, RUN]))


FIGURE_MODULES = ("mxbench.plots", "mxbench.workloads.ep.figure", "mxbench.workloads.ep.project_output",
                  "mxbench.workloads.ep.scaling", "mxbench.workloads.layer.figure", "mxbench.workloads.peers.figure",
                  "mxbench.workloads.step.plots")  # fmt: skip
"""The modules that draw figures (each takes ``panels.save`` by name)."""


def test_ctrl_c_between_two_figures_names_the_one_kept(tmp_path, monkeypatch):
    """plot into a folder: the first figure is written, Ctrl-C comes while the second is drawn."""
    from mxbench.views import panels

    calls = []
    real = panels.save

    def save(fig, path):
        if calls:
            raise KeyboardInterrupt
        calls.append(path)
        return real(fig, path)

    # Every module that took panels.save by name gets the stand-in, and each is imported first: one imported during
    # the command would otherwise keep the stand-in after this test (monkeypatch restores only what it set).
    for name in FIGURE_MODULES:
        importlib.import_module(name)
    for module in [m for n, m in sys.modules.items() if n.startswith("mxbench") and getattr(m, "save", None) is real]:
        monkeypatch.setattr(module, "save", save)
    line = interrupted(CliRunner().invoke(cli, ["plot", RUN, "--out", str(tmp_path / "figs")]))
    (kept,) = calls
    assert line == f"interrupted (Ctrl-C): kept {kept}" and Path(kept).exists()


SIGINT_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from mxbench.storage import results

    real = results.load_run

    def load_run(path):
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered while the command reads its input
        return real(path)

    results.load_run = load_run
    import mxbench.views.frame as frame
    import mxbench.cli.report_commands
    frame.load_run = load_run
    from mxbench.cli import main
    main(sys.argv[1:])
""")


@pytest.mark.parametrize("args", [["table", RUN], ["compare", RUN, RUN], ["plot", RUN, "--out", "{tmp}/x.png"]])
def test_a_real_sigint_exits_130(args, tmp_path):
    repo = TESTS.parent
    args = [a.format(tmp=tmp_path) for a in args]
    done = subprocess.run([sys.executable, "-c", SIGINT_SCRIPT, *args], capture_output=True, text=True, timeout=300,
                          cwd=repo, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          check=False)  # fmt: skip
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert "interrupted (Ctrl-C): no file was written" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())
