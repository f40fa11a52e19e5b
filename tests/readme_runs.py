"""The README's CPU commands run as a user types them, each line once per test session.

test_readme runs every CPU line; test_ep and test_ep_layer read the README's ``ep --check`` lines' runs for their
two-process checks of every strategy instead of launching the same gloo workers again (each launch costs every rank
a torch import and the interpreter's run of the pipeline: 20-30 CPU s). Under pytest-xdist the workers share the
session's folder: the first to ask for a line runs it while holding the line's lock, the others read what it left.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from helpers import REPO, committed_results

CWD = {"mxbench check --impl": REPO / "examples" / "plain_quantizer"}
"""Where a command is typed, as the text before it says."""


def readme_line(prefix: str) -> str:
    """The one command line of the README's bash blocks that starts with ``prefix`` (its comment dropped)."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    (line,) = [x.split("  #")[0].strip() for b in blocks for x in b.splitlines() if x.startswith(prefix)]
    return line


def run_line(line: str, folder: Path) -> subprocess.CompletedProcess:
    """``line`` run in its folder (by CWD), else in ``folder``, which sees the committed runs under results/ and
    keeps what the command writes; no PYTHONPATH or TRITON_INTERPRET from the suite, GPUs hidden."""
    cwd = next((where for prefix, where in CWD.items() if line.startswith(prefix)), folder)
    if cwd == folder:
        (folder / "results").mkdir(parents=True)
        # only the committed folders: a user's results/model-b200 (the main job's) linked here would take this run
        for name in sorted({p.relative_to(REPO / "results").parts[0] for p in committed_results()}):
            (folder / "results" / name).symlink_to(REPO / "results" / name)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", *shlex.split(line)], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd, check=False)  # fmt: skip


def session_runner(root: Path) -> Callable[[str], subprocess.CompletedProcess]:
    """``run(line)``: ``run_line``'s result for ``line``, run once for every process that shares ``root``."""
    root.mkdir(exist_ok=True)

    def run(line: str) -> subprocess.CompletedProcess:
        key = hashlib.sha1(line.encode()).hexdigest()[:16]
        stored = root / f"{key}.json"
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if stored.exists():
                return subprocess.CompletedProcess(**json.loads(stored.read_text()))
            done = run_line(line, root / key)
            fields = {"args": done.args, "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            stored.write_text(json.dumps(fields))
            return done

    return run
