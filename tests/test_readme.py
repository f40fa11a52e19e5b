"""The README says what the code does: every `mxbench table` block is the command's output byte for byte."""

from __future__ import annotations

import re
import shlex

import pytest
from click.testing import CliRunner

from mxbench import REPO_ROOT
from mxbench.cli import cli

README = (REPO_ROOT / "README.md").read_text()
TABLE_BLOCKS = list(re.finditer(r"```bash\n(mxbench table [^\n]*)\n```\n\n", README))


def test_the_readme_shows_tables():
    assert len(TABLE_BLOCKS) >= 4


@pytest.mark.parametrize("block", TABLE_BLOCKS, ids=[m.group(1)[14:70] for m in TABLE_BLOCKS])
def test_each_readme_table_is_its_command_output(block, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    result = CliRunner().invoke(cli, shlex.split(block.group(1))[1:])
    assert result.exit_code == 0, result.output
    shown = README[block.end() : block.end() + len(result.output) + 1]
    assert shown == result.output + "\n"  # the block, then the blank line that ends it
