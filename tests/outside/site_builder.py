"""Building the outside team's package for the tests and the GPU scripts: its git repo, and what ``pip install
git+file://<repo>@<commit>`` leaves in a site folder (pip itself needs a wheel builder the test environment
lacks): the modules and a dist-info with the entry point and the commit in ``direct_url.json`` (PEP 610).

``build(root)`` makes two site folders under ``root``: "good" (``outside_kernels``: correct and planted-fault
implementations) and "broken" (a plugin whose ``register`` raises, one that exits at import).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "outside_kernels.py", HERE.parent.parent / "examples" / "plain_quantizer" / "plain_quantizer.py")
VERSION = "0.3.0"


def _repo(root: Path, name: str, files: dict[str, str]) -> tuple[Path, str]:
    """The team's source: a folder with ``files`` (module name -> source) and a git repo of one commit."""
    folder = root / name
    folder.mkdir(parents=True)
    for stem, text in files.items():
        (folder / f"{stem}.py").write_text(text)
    git = ["git", "-c", "user.name=outside", "-c", "user.email=outside@example.com"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "kernels"]):
        subprocess.run([*git, *args], cwd=folder, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, check=True, capture_output=True, text=True)
    return folder, head.stdout.strip()


def _install(target: Path, name: str, module: str, source: Path, commit: str) -> Path:
    """What ``pip install git+file://<source>@<commit>`` leaves in ``target`` (pip itself needs a wheel builder this
    environment lacks): the modules, and a dist-info with the entry point and the commit in ``direct_url.json``."""
    target.mkdir(exist_ok=True)
    for path in source.glob("*.py"):
        shutil.copy(path, target / path.name)
    info = target / f"{name.replace('-', '_')}-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {VERSION}\n")
    (info / "entry_points.txt").write_text(f"[mxbench.implementations]\n{name} = {module}:register\n")
    (info / "top_level.txt").write_text("".join(f"{p.stem}\n" for p in source.glob("*.py")))
    (info / "direct_url.json").write_text(json.dumps(
        {"url": source.as_uri(), "vcs_info": {"vcs": "git", "commit_id": commit, "requested_revision": commit}}))
    return target


def build(root: Path) -> dict:
    """The site folders ("good", "broken") under ``root`` and the good package's commit."""
    kernels, commit = _repo(root, "outside-kernels", {p.stem: p.read_text() for p in SOURCES})
    raising = _repo(root, "outside-raising", {"outside_raising": "def register(registry):\n"
                                                                 "    raise ImportError('needs libfoo.so')\n"})
    exiting = _repo(root, "outside-exiting", {"outside_exiting": "import sys\nsys.exit('no GPU, bye')\n"})
    _install(root / "broken", "outside-raising", "outside_raising", *raising)
    _install(root / "broken", "outside-exiting", "outside_exiting", *exiting)
    return {"good": _install(root / "good", "outside-kernels", "outside_kernels", kernels, commit),
            "broken": root / "broken", "commit": commit}  # fmt: skip


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1]))["good"])
