"""The FP8 GEMM tuning table shown in the docs is what ``scripts/tune_fp8_gemm.py --table`` prints for the stored
tuning runs, byte for byte."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHOWN = [REPO / "README.md", *sorted((REPO / "docs" / "results").glob("*.md"))]
COMMAND = re.compile(r"```bash\n(python scripts/tune_fp8_gemm.py --table [^\n]*)\n```\n\n")


def test_the_shown_table_is_what_the_script_prints():
    blocks = [(path.read_text(), block) for path in SHOWN if path.exists() for block in COMMAND.finditer(path.read_text())]
    assert blocks, "the docs show the GEMM table with its command"
    for text, block in blocks:
        words = block.group(1).split()
        done = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, cwd=REPO, check=True)
        assert text[block.end() : block.end() + len(done.stdout)] == done.stdout
