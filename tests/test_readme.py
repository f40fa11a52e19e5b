"""The README says what the code does: every `mxbench table` block is the command's output byte for byte, and the
notebook example runs and prints what the README shows."""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest
from click.testing import CliRunner

from mxbench import REPO_ROOT
from mxbench.cli import cli, run_commands

README = (REPO_ROOT / "README.md").read_text()
TABLE_BLOCKS = list(re.finditer(r"```bash\n(mxbench table [^\n]*)\n```\n\n", README))


def test_the_readme_shows_tables():
    assert len(TABLE_BLOCKS) >= 5


@pytest.mark.parametrize("block", TABLE_BLOCKS, ids=[m.group(1)[14:70] for m in TABLE_BLOCKS])
def test_each_readme_table_is_its_command_output(block, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    result = CliRunner().invoke(cli, shlex.split(block.group(1))[1:])
    assert result.exit_code == 0, result.output
    shown = README[block.end() : block.end() + len(result.output) + 1]
    assert shown == result.output + "\n"  # the block, then the blank line that ends it


def test_the_notebook_example_runs_as_written(tmp_path, monkeypatch):
    section = README[README.index("## Results in Python") :]
    bash, python, output = re.search(r"```bash\n(.*?)\n```\n\n```python\n(.*?)```\n\n```\n(.*?)```", section,
                                     re.DOTALL).groups()  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").symlink_to(REPO_ROOT / "results")
    monkeypatch.setattr(run_commands, "_has_gpu", lambda: False)  # the model run, as on a machine without a GPU
    made = CliRunner().invoke(cli, shlex.split(bash)[1:])
    assert made.exit_code == 0, made.output
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(python, "README.md", "exec"), {})  # noqa: S102 -- the README's own example, run as written
    assert printed.getvalue() == output
    assert (tmp_path / "breakdown-h200.png").read_bytes().startswith(b"\x89PNG")
