"""What a user who follows the README sees: the set-up and the CPU-torch install line CI runs, the exit code `make regress` gives,
and the Python API reachable right after ``import mxbench`` (issue 26, item 9)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_the_readmes_cpu_torch_install_is_the_line_ci_runs():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if "install" in line and "torch==" in line]
    (line,) = ci
    assert "--index-url https://download.pytorch.org/whl/cpu" in line  # PyPI's Linux wheel is a CUDA build
    words = [w for w in line.split() if w != "--quiet"]
    assert words[:3] == ["python", "-m", "pip"]
    assert "\n" + " ".join(["pip", *words[3:]]) + "\n" in README


def test_the_readmes_set_up_is_what_ci_runs():
    """Both distributions in one install (mxbench requires mxkernels, which is kernels/ here, not on an index), then
    the test command: what .ci/run and `make install` do."""
    (block,) = re.findall(r"## Set-up\n\n```bash\n(.*?)```", README, flags=re.DOTALL)
    install, test = [line.split("  #")[0].strip() for line in block.strip().splitlines()]
    assert install == 'pip install -e ./kernels -e ".[test]"' and test == "make test"
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.startswith("python -m pip install") and "torch==" not in line]
    assert [" ".join(w for w in line.split() if w != "--quiet") for line in ci] == ["python -m " + install]
    assert test in (REPO / ".ci" / "run").read_text().splitlines()  # then the wheels' run (.ci/wheels)
    assert "$(PYTHON) -m " + install in (REPO / "Makefile").read_text()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make here")
@pytest.mark.parametrize("code", [1, 2])
def test_make_regress_exits_2_whatever_mxbench_returned_as_the_readme_says(code, tmp_path):
    stand_in = tmp_path / "mxbench"
    stand_in.write_text(f"#!/bin/sh\nexit {code}\n")
    stand_in.chmod(0o755)
    done = subprocess.run(["make", "-s", "regress", f"MXBENCH={stand_in}", "CARD=some-card"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (stated,) = re.findall(r"^make regress +# (.*)$", README, flags=re.MULTILINE)
    assert stated == "exit 0 pass; 2 on SLOWER or bad input"
    assert "Through `make` every failure exits 2" in README


def test_make_regress_passes_exit_0_through():
    done = subprocess.run(["make", "-s", "regress", "MXBENCH=true", "CARD=some-card"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_registry_register_works_right_after_import_mxbench():
    code = ("import sys, mxbench; assert 'mxbench.implementations.default' not in sys.modules; "
            "from mxbench.instruments import timing; print(mxbench.register.__module__, timing.time_fn.__module__)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.split() == ["mxbench.implementations.default", "mxbench.instruments.timing"], done.stderr
    missing = subprocess.run([sys.executable, "-c", "import mxbench; mxbench.no_such_thing"], capture_output=True,
                             text=True, timeout=120, check=False)  # fmt: skip
    assert missing.returncode == 1 and "has no attribute 'no_such_thing'" in missing.stderr
