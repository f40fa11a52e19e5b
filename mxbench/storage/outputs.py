"""Output paths, checked before any work: a sweep that measures for an hour must not fail at its first save, and a
figure path with the wrong suffix must not silently become a folder.

Each check raises ``InputError`` with one line naming the option, the path and what to do. Writability is probed
by creating (and removing) a temporary file in the nearest folder that exists: permission bits alone do not tell
(root passes them, a read-only or virtual file system such as /sys does not take files).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mxkernels.core.errors import InputError

from .marks import Output
from .writing import allow, refusal

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")
"""What a figure path may end in (matplotlib writes each); any other path is a folder of figures."""

RESULTS_SUFFIX = ".json"


def _existing_ancestor(path: Path) -> Path:
    """The nearest of ``path`` and its parents that exists (``path`` itself when it does)."""
    path = Path(os.path.abspath(path))
    while not _exists(path) and path != path.parent:
        path = path.parent
    return path


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name past the file system's limit: it cannot exist
        return False


def check_folder(folder: Path, option: str, shown: Path | None = None) -> None:
    """``folder`` exists as a writable folder or can be created: its nearest existing ancestor is a folder that
    takes new files. ``shown``: the path the user gave, for the message (default ``folder``)."""
    shown = folder if shown is None else shown
    _check_names(folder, option)
    found = _existing_ancestor(folder)
    if not found.is_dir():
        raise InputError(f"{option} {shown}: {found} is a file, not a folder; choose a path in a folder")
    if not os.access(found, os.W_OK | os.X_OK):  # as the user running it (root passes; the probe below decides)
        raise InputError(f"{option} {shown}: cannot write in {found} (Permission denied); choose a writable folder")
    try:
        fd, probe = tempfile.mkstemp(dir=found, prefix=".mxbench-probe-")
    except OSError as e:
        raise InputError(f"{option} {shown}: cannot write in {found} ({e.strerror}); choose a writable folder") from None
    os.close(fd)
    os.unlink(probe)


def _check_names(path: Path, option: str) -> None:
    """Every name along ``path`` within the file system's limit (NAME_MAX bytes), and the whole path within PATH_MAX:
    a name past it fails only when the file is opened, after the work."""
    found = _existing_ancestor(path)
    try:
        name_max, path_max = os.pathconf(found, "PC_NAME_MAX"), os.pathconf(found, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in Path(os.path.abspath(path)).parts:
        if len(os.fsencode(part)) > name_max:
            raise InputError(f"{option} {path}: the name {part[:40]}... is {len(os.fsencode(part))} bytes, past the "
                             f"file system's limit of {name_max}; choose a shorter name")  # fmt: skip
    if len(os.fsencode(os.path.abspath(path))) >= path_max:
        raise InputError(f"{option}: the path is past the file system's limit of {path_max} bytes; choose a shorter "
                         "one")


def _check_name(path: Path, option: str) -> None:
    """A file name, not an empty one ('' reads as the working folder) nor a folder's ('.', '..', 'x/')."""
    if str(path) in ("", ".") or path.name in ("", ".", ".."):
        raise InputError(f"{option} {str(path)!r}: names no file (an empty name, or a folder); give a file name")


def _check_link(path: Path, option: str) -> None:
    """A symbolic link must lead to a file: one in a loop, or to nothing, fails only when written, after the work."""
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as e:
            raise InputError(f"{option} {path}: a symbolic link that leads nowhere ({e.strerror}); choose another "
                             "name") from None  # fmt: skip


def _check_file(path: Path, option: str) -> None:
    _check_name(path, option)
    _check_names(path, option)
    _check_link(path, option)
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{option} {path}: the file exists and cannot be written; choose another name")
    check_folder(path.parent, option, shown=path)


def check_output_file(path: Path, option: str = "--out", force: bool = False) -> None:
    """A text output of any format (a table in markdown, csv or json) to be written: a file name that can be
    written, in a folder that exists or can be created, where nothing is or a text output mxbench wrote (else only
    with ``force``)."""
    check_output(Path(path), option, Output.TEXT, force)


def check_results_file(path: Path, option: str = "--out") -> None:
    """A results file to be written: a ``.json`` name (its CSV goes beside it, same name, ``.csv``) that can be
    written, in a folder that exists or can be created."""
    path = Path(path)
    _check_name(path, option)
    if path.suffix.lower() != RESULTS_SUFFIX:
        raise InputError(f"{option} {path}: a results file is JSON (its CSV is written beside it); "
                         f"give a name ending in .json, e.g. {path.with_suffix(RESULTS_SUFFIX)}")  # fmt: skip
    _check_file(path, option)
    _check_file(path.with_suffix(".csv"), option)


def check_output(path: Path, option: str, kind: Output, force: bool = False) -> None:
    """An output that is not a run (a figure, a table) to be written at ``path``: a file name that can be written,
    where nothing is, or an output of ``kind`` mxbench wrote; with ``force`` anything (its copy kept in .replaced/,
    ``writing.allow``)."""
    path = Path(path)
    _check_file(path, option)
    if force:
        allow(path)
    elif (why := refusal(path, kind, option)) is not None:
        raise InputError(why)


def check_figure_target(path: Path, option: str, suffixes: Iterable[str], force: bool = False) -> None:
    """Where figures go: a file with one of ``suffixes`` (one sheet of every figure), or a folder (one file per
    figure), either of them writable. A name with any other suffix ("x.jpg") is refused, not made a folder. A file
    there that is not a figure mxbench wrote is replaced only with ``force`` (``check_output``; in a folder, checked
    as each figure is written)."""
    path = Path(path)
    suffixes = tuple(suffixes)
    _check_names(path, option)
    _check_link(path, option)
    if path.is_dir():
        check_folder(path, option)
        if force:
            allow(path)
    elif path.suffix.lower() in suffixes:
        check_output(path, option, Output.FIGURE, force)
    elif path.suffix:
        raise InputError(f"{option} {path}: figures are written as {', '.join(suffixes)} or into a folder; "
                         f"give a name ending in {suffixes[0]}, or a folder")  # fmt: skip
    else:
        check_folder(path, option)
