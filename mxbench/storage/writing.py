"""The one write path of every output (runs and their CSVs, figures, tables, projections, check records): each
file written atomically, and whatever a path holds that this process did not write set aside in ``.replaced/``
beside it, never overwritten (``replacing``'s module doc says why). An output that is not a run replaces only an
output of its kind mxbench wrote (``marks``), unless its command's ``--force`` allowed it (``allow``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import weakref
from datetime import UTC, datetime
from pathlib import Path

from mxkernels.core.errors import InputError

from .marks import Output, is_ours
from .reading import read_input

REPLACED_DIR = ".replaced"

def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()
"""A results file's permissions as ``open`` would give it (a temporary file is created private)."""

_written: dict[Path, tuple[str, weakref.ref]] = {}
"""What was last written at each path, and by which run (``owner``): a file that still holds it, saved again by the
same run, is that run's own (a sweep saves after every point) and is replaced without a copy. Another run of this
process (a rerun in a notebook) is another run: its predecessor is kept."""


_paths: list[Path] = []
"""Every path this process wrote, in order: what Ctrl-C kept (``written``)."""


def writes() -> int:
    """How many writes this process has made: ``written(since=writes())`` lists what a command wrote."""
    return len(_paths)


def written(since: int = 0) -> list[Path]:
    """The paths this process wrote after its first ``since`` writes (each whole: every write is atomic), each
    once, in the order first written."""
    return list(dict.fromkeys(_paths[since:]))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: Path) -> bytes | None:
    """What ``path`` holds now (None when nothing), read as every input is (``reading``: a regular file, capped)."""
    if not os.path.lexists(path):
        return None
    return read_input(path, "file mxbench may replace")


_allowed: set[Path] = set()
"""Paths (or folders of them) whose command gave --force: what they hold may be replaced whatever it is."""


def allow(path: Path) -> None:
    """--force: ``path`` (a file, or a folder of figures) may replace what it holds (still kept in .replaced/)."""
    _allowed.add(Path(os.path.abspath(path)))


def _allowed_at(path: Path) -> bool:
    path = Path(os.path.abspath(path))
    return path in _allowed or path.parent in _allowed


def refusal(path: Path, kind: Output, option: str) -> str | None:
    """Why ``path`` may not be replaced by an output of ``kind`` (None when it may: nothing there, an output of
    ``kind`` mxbench wrote, or --force given)."""
    current = read_bytes(path)
    if current is None or is_ours(current, kind) or _allowed_at(path):
        return None
    return (f"{option} {path}: the file exists and is not a {kind.value} mxbench wrote; give --force to replace it "
            f"(the old copy is kept in {path.parent / REPLACED_DIR}), or choose another name")  # fmt: skip


def write_output(path: str | Path, data: bytes | str, kind: Output, option: str = "--out") -> Path:
    """Write one output that is not a run (a figure, a table): refused (``InputError``) where ``refusal`` says,
    else written as every file is (``write_files``). Returns ``path``."""
    path = Path(path)
    why = refusal(path, kind, option)
    if why is not None:
        raise InputError(why)
    write_files({path: data})
    return path


def _set_aside(path: Path, stamp: str) -> Path | None:
    """Keep what ``path`` holds under ``.replaced/`` beside it (a name no other copy has: another process's copies
    carry its pid); returns where, or None where the file is gone (a concurrent writer's work). A second name of the
    same file (a hard link), not a move: ``path`` holds the old file until the new one replaces it, so a reader never
    finds it missing (a move left it absent between the two renames); a copy where the file system has no links."""
    folder = path.parent / REPLACED_DIR
    folder.mkdir(exist_ok=True)
    base = f"{path.stem}.{stamp}.{os.getpid()}"
    target, n = folder / f"{base}{path.suffix}", 1
    while target.exists():
        n += 1
        target = folder / f"{base}.{n}{path.suffix}"
    try:
        os.link(path, target)
    except FileNotFoundError:
        return None
    except OSError:  # no hard links on this file system: the bytes instead
        try:
            shutil.copy2(path, target)
        except FileNotFoundError:
            return None
    return target


def write_files(texts: dict[Path, str | bytes], owner: object | None = None) -> None:
    """Write each path's text, the files of ``owner`` (a Run), atomically; whatever a path holds that ``owner`` did
    not write (with no owner: whatever it holds) is set aside first (module doc), the JSON's and its CSV's copies
    under one time stamp."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    for path, text in texts.items():
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode() if isinstance(text, str) else text
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), FILE_MODE)
                f.write(data)
            key = Path(os.path.realpath(path))  # never raises, a symlink loop included
            current = read_bytes(path)
            digest, writer = _written.get(key, (None, None))
            if current is not None and (_digest(current) != digest or writer is None or writer() is not owner):
                kept = _set_aside(path, stamp)
                if kept is not None:
                    print(f"replaced {path}: the old copy is at {kept}", file=sys.stderr)
            os.replace(tmp, path)
            _paths.append(path)
            if owner is not None:
                _written[key] = (_digest(data), weakref.ref(owner))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
