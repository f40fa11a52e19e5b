"""The one write path of results: each file written atomically, and whatever a path holds that this process did
not write set aside in ``.replaced/`` beside it, never overwritten (``replacing``'s module doc says why).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import weakref
from datetime import UTC, datetime
from pathlib import Path

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


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _set_aside(path: Path, stamp: str) -> Path | None:
    """Move ``path`` into ``.replaced/`` beside it (a name no other copy has: another process's copies carry its
    pid); returns where it went, or None where a concurrent writer moved it first (that writer kept it)."""
    folder = path.parent / REPLACED_DIR
    folder.mkdir(exist_ok=True)
    base = f"{path.stem}.{stamp}.{os.getpid()}"
    target, n = folder / f"{base}{path.suffix}", 1
    while target.exists():
        n += 1
        target = folder / f"{base}.{n}{path.suffix}"
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    return target


def write_files(texts: dict[Path, str], owner: object | None = None) -> None:
    """Write each path's text, the files of ``owner`` (a Run), atomically; whatever a path holds that ``owner`` did
    not write (with no owner: whatever it holds) is set aside first (module doc), the JSON's and its CSV's copies
    under one time stamp."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    for path, text in texts.items():
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), FILE_MODE)
                f.write(data)
            key = path.resolve()
            current = read_bytes(path)
            digest, writer = _written.get(key, (None, None))
            if current is not None and (_digest(current) != digest or writer is None or writer() is not owner):
                kept = _set_aside(path, stamp)
                if kept is not None:
                    print(f"replaced {path}: the old copy is at {kept}", file=sys.stderr)
            os.replace(tmp, path)
            if owner is not None:
                _written[key] = (_digest(data), weakref.ref(owner))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
