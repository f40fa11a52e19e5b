"""An installed mxbench (a wheel, not an editable install) has everything a checkout has: every package folder, the
shape presets as package data (the top-level shapes/ links to them) and the hardware specs beside them; the kernel
package's wheel likewise holds every folder of kernels/mxkernels/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "mxbench")


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, check=False, **kwargs)


def run_in(args, env, cwd):
    return run(args, env={**env, "CUDA_VISIBLE_DEVICES": ""}, cwd=cwd)


def build_wheel(tmp_path: Path, folder: Path, sources) -> Path:
    """The wheel of the distribution in ``folder``, built from a copy (a build writes build/ and *.egg-info next to
    the sources)."""
    src = tmp_path / f"src-{folder.name}"
    src.mkdir()
    for name in sources:
        copy = shutil.copytree if (folder / name).is_dir() else shutil.copy
        copy(folder / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (folder / name).is_dir()
                                           else {}))  # fmt: skip
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                 str(tmp_path / "dist"), str(src)])  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob(f"{Path(sources[-1]).name.split('/')[0]}-*.whl")
    return wheel


def package_folders(root: Path, top: str) -> set[str]:
    """Every folder under ``root / top`` with an ``__init__.py``, as an import path."""
    return {".".join(p.parent.relative_to(root).parts) for p in (root / top).rglob("__init__.py")
            if "__pycache__" not in p.parts}  # fmt: skip


@pytest.mark.parametrize("folder, sources", [(REPO, SOURCES), (REPO / "kernels", ("pyproject.toml", "mxkernels"))],
                         ids=["mxbench", "mxkernels"])  # fmt: skip
def test_each_wheel_holds_every_package_folder(tmp_path, folder, sources):
    wheel = build_wheel(tmp_path, folder, sources)
    inside = {".".join(Path(n).parent.parts) for n in zipfile.ZipFile(wheel).namelist() if n.endswith("/__init__.py")}
    assert inside == package_folders(folder, sources[-1])


def test_a_wheel_installed_elsewhere_lists_the_presets(tmp_path):
    wheel = build_wheel(tmp_path, REPO, SOURCES)
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
    assert Path(module).is_relative_to(target) and Path(shapes) == target / "mxbench" / "data" / "shapes"
    listed = run([sys.executable, "-m", "mxbench", "presets", "--format", "csv"], env=env, cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr
    names = {line.split(",")[0] for line in listed.stdout.splitlines()[1:]}
    assert names == {p.stem for p in (REPO / "shapes").glob("*.toml")} and "deepseek-v3" in names
    model = run([sys.executable, "-m", "mxbench", "roofline", "--preset", "deepseek-v3", "--M", "16384",
                 "--hardware", "b200"], env={**env, "CUDA_VISIBLE_DEVICES": ""}, cwd=elsewhere)  # fmt: skip
    assert model.returncode == 0, model.stderr
    assert "(16384, 7168)" in model.stdout and list((elsewhere / "results" / "model-b200").glob("*.json"))
    # the published schemas ship beside the code: what outside tools validate runs with, and what a table reads by
    published = {p.name for p in (REPO / "mxbench" / "data").glob("*.schema.json")}
    assert {p.name for p in (target / "mxbench" / "data").glob("*.schema.json")} == published
    assert {"run.schema.json", "ceilings.schema.json", "alltoall-ceilings.schema.json", "tuning.schema.json"} <= published
    (saved,) = (elsewhere / "results" / "model-b200").glob("*.json")
    shown = run_in([sys.executable, "-m", "mxbench", "table", str(saved)], env, elsewhere)
    assert shown.returncode == 0 and "model, not measured" in shown.stdout, shown.stderr
