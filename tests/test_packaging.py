"""An installed mxbench (a wheel, not an editable install) has everything a checkout has: the shape presets ship as
package data (the top-level shapes/ stays their source) and the hardware specs beside them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "mxbench", "kernels", "shapes")


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, check=False, **kwargs)


def run_in(args, env, cwd):
    return run(args, env={**env, "CUDA_VISIBLE_DEVICES": ""}, cwd=cwd)


def test_a_wheel_installed_elsewhere_lists_the_presets(tmp_path):
    # build from a copy: a build writes build/ and *.egg-info next to the sources
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (REPO / name).is_dir()
                                         else {}))  # fmt: skip
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                 str(tmp_path / "dist"), str(src)])  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("mxbench-*.whl")
    target = tmp_path / "site"
    installed = run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                     str(target), str(wheel)])  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the installed copy first; the rest of the path only for torch, triton and the other dependencies
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    where = run([sys.executable, "-c", "import mxbench.plan.presets as p; print(p.__file__, p.SHAPES_DIR)"], env=env,
                cwd=elsewhere)  # fmt: skip
    module, shapes = where.stdout.split()
    assert Path(module).is_relative_to(target) and Path(shapes) == target / "mxbench" / "shapes"
    listed = run([sys.executable, "-m", "mxbench", "presets", "--format", "csv"], env=env, cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr
    names = {line.split(",")[0] for line in listed.stdout.splitlines()[1:]}
    assert names == {p.stem for p in (REPO / "shapes").glob("*.toml")} and "deepseek-v3" in names
    model = run([sys.executable, "-m", "mxbench", "roofline", "--preset", "deepseek-v3", "--M", "16384",
                 "--hardware", "b200"], env={**env, "CUDA_VISIBLE_DEVICES": ""}, cwd=elsewhere)  # fmt: skip
    assert model.returncode == 0, model.stderr
    assert "(16384, 7168)" in model.stdout and list((elsewhere / "results" / "model-b200").glob("*.json"))
    # the published schemas ship beside the code: what outside tools validate runs with, and what a table reads by
    assert {p.name for p in (target / "mxbench" / "data").glob("*.schema.json")} == {
        "run.schema.json", "ceilings.schema.json", "alltoall-ceilings.schema.json"}
    (saved,) = (elsewhere / "results" / "model-b200").glob("*.json")
    shown = run_in([sys.executable, "-m", "mxbench", "table", str(saved)], env, elsewhere)
    assert shown.returncode == 0 and "model, not measured" in shown.stdout, shown.stderr
