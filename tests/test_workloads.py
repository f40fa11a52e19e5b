"""A workload is one file and one line listing it: a throwaway workload, declared in a file of its own outside the
package, joins the command line (its command in ``mxbench --help``, runnable), ``mxbench table`` (its table kind
accepted, and asked of its runs only), ``mxbench plot`` (its figure) once it is listed beside the others; unlisted,
none of that happens."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
STORED = REPO / "results" / "nvidia-h200" / "peers-deepseek-v3.json"

TOY = '''
"""A throwaway workload: ``mxbench toy`` stores a run of kind "toy"; its one table counts the records."""

from pathlib import Path

import click

from mxbench.workloads.declaration import Figures, TableKind, Workload


@click.command("toy")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def toy(out):
    """Store a toy run."""
    from mxbench.storage.results import Run, load_run, save_run

    stored = load_run(STORED)
    save_run(Run({**stored.meta, "kind": "toy"}, stored.records), out)
    click.echo(f"toy run: {out}")


def count(runs, request):
    return "".join(f"toy table: {len(run.records)} records\\n" for _, run in runs)


def draw(run, out, spec=None, project=None):
    out.write_text("a toy figure")
    return [out]


TOY = Workload(name="toy", commands=(toy,), tables=(TableKind("toy-table", count),), figures=Figures(draw))
'''

DRIVER = '''
import json, sys

from click.testing import CliRunner

import mxbench.workloads.registered as registered
from toy_workload import TOY

if sys.argv[1] == "listed":
    registered.WORKLOADS = (*registered.WORKLOADS, TOY)  # the one line that lists it

from mxbench.cli import cli

stored, out, figure = sys.argv[2:5]
said = {}
for name, args in {"help": ["--help"], "toy": ["toy", "--out", out], "table": ["table", stored, "--kind", "toy-table"],
                   "breakdown": ["table", stored, "--kind", "breakdown"],
                   "plot": ["plot", stored, "--out", figure]}.items():
    result = CliRunner().invoke(cli, args)
    said[name] = [result.exit_code, result.output]
print(json.dumps(said))
'''


def _run(tmp_path: Path, listed: bool) -> dict:
    """Every command's (exit code, output), the toy workload listed or not; a toy run is stored beforehand."""
    (tmp_path / "toy_workload.py").write_text(f"STORED = {str(STORED)!r}\n" + textwrap.dedent(TOY))
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    run = json.loads(STORED.read_text())
    run["meta"]["kind"] = "toy"
    (tmp_path / "stored.json").write_text(json.dumps(run))
    args = [str(tmp_path / name) for name in ("stored.json", "toy.json", "toy.png")]
    done = subprocess.run([sys.executable, "driver.py", "listed" if listed else "unlisted", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def test_a_listed_workload_joins_the_command_line_the_tables_and_the_figures(tmp_path):
    said = _run(tmp_path, listed=True)
    code, text = said["help"]
    assert code == 0 and any(line.split()[:1] == ["toy"] for line in text.splitlines())
    assert said["toy"][0] == 0 and (tmp_path / "toy.json").exists()
    records = len(json.loads(STORED.read_text())["records"])
    assert said["table"] == [0, f"toy table: {records} records\n"]
    code, text = said["breakdown"]  # the step's tables are not a toy run's
    assert code == 2 and "is a toy run (made by `mxbench toy`): its tables are --kind toy-table" in text
    assert said["plot"][0] == 0 and (tmp_path / "toy.png").read_text() == "a toy figure"


def test_an_unlisted_workload_is_not_joined(tmp_path):
    said = _run(tmp_path, listed=False)
    code, text = said["help"]
    assert code == 0 and not any(line.split()[:1] == ["toy"] for line in text.splitlines())
    assert said["toy"][0] == 2 and "No such command 'toy'" in said["toy"][1]
    assert said["table"][0] == 2 and "'toy-table' is not one of" in said["table"][1]
