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


def _row(backend, us, config=None, **extra):
    return {"model": "deepseek-v3", "pass": "fwd", "M": 1, "N": 1, "K": 1, "G": 8, "backend": backend,
            "config": config, "us": us, "tflops": 1000.0 / us, **extra}  # fmt: skip


def test_the_headline_is_the_shipped_default_and_the_best_candidate_is_labelled_beside_it(tmp_path):
    """A run whose fastest candidate is not the shipped default: the headline ratio is the default's (torch 10 us /
    default 8 us = 1.25x), the best (5 us, 2.00x) sits in its own labelled column."""
    import dataclasses
    import json

    sys.path.insert(0, str(REPO / "scripts"))
    import tune_fp8_gemm as T

    default = dataclasses.asdict(T.WS.default_config("2d3d"))
    other = {**default, "num_stages": default["num_stages"] + 1}
    run = {"device": "card", "rows": [
        _row("native", 10.0), _row("native_fast_accum", 9.0), _row("dense_scaled_mm", 10.0),
        _row("triton_ws", 5.0, other, sqnr_vs_native_db=50.0), _row("triton_ws", 8.0, default, sqnr_vs_native_db=float("inf")),
    ]}  # fmt: skip
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    head, _, line = T.table([str(path)]).splitlines()
    cells = dict(zip([c.strip() for c in head.split("|")[1:-1]], [c.strip() for c in line.split("|")[1:-1]]))
    assert cells["default / torch"] == "1.25x" and cells["default vs torch's bits"] == "equal"
    assert cells["ours, shipped default (config)"].startswith("125 (")
    assert cells["ours, best ws candidate (config)"].startswith("200 (") and cells["best / torch"] == "2.00x"
    # a run that never timed the shipped default shows none rather than another config
    run["rows"].pop()
    path.write_text(json.dumps(run))
    assert "| - | - | - | - | 200 (" in T.table([str(path)])
