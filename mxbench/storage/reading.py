"""The one reader of input files (runs, baselines, ceilings, a file an output would replace): a regular file only,
at most ``MAX_BYTES``, read once.

A FIFO, a device (``/dev/zero``, ``/dev/urandom``), a socket or a folder is refused at once from ``os.stat``, before
any ``open``: opening a FIFO blocks until a writer comes, and a device reads forever. The open itself is
non-blocking (``O_NONBLOCK``) and the opened file is checked again (``fstat``), so a path swapped for a FIFO between
the two calls cannot block either. No stored run comes near the cap; a file past it is refused with its size.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mxkernels.core.errors import InputError

MAX_BYTES = 64 * 2**20
"""The largest input read (64 MiB): the largest committed run is under 2 MiB."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n} bytes"


def _refuse(path: Path, what: str, why: str) -> InputError:
    return InputError(f"{path}: not an {what} ({why})")


def read_input(path: str | Path, what: str = "mxbench file", limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file at ``path``; ``InputError`` naming it and ``what`` it should be when it is
    missing, not a regular file, unreadable or past ``limit`` bytes."""
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as e:
        raise _refuse(path, what, e.strerror or str(e)) from None
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, what, f"it is {_kind(info.st_mode)}; give a regular file")
    if info.st_size > limit:
        raise _refuse(path, what, f"{info.st_size} bytes, past the {_size(limit)} an input may have")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise _refuse(path, what, e.strerror or str(e)) from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped since the stat
            raise _refuse(path, what, f"it is {_kind(mode)}; give a regular file")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise _refuse(path, what, e.strerror or str(e)) from None
    if len(data) > limit:  # grew since the stat
        raise _refuse(path, what, f"past the {_size(limit)} an input may have")
    return data


def read_text(path: str | Path, what: str = "mxbench file", limit: int = MAX_BYTES) -> str:
    """``read_input`` decoded as UTF-8 (``InputError`` naming the file when it is not)."""
    data = read_input(path, what, limit)
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise _refuse(Path(path), what, str(e)) from None
