"""No run is lost: results are written atomically, and a file this process did not write is set aside, never
overwritten.

* Atomic: each write goes to a temporary file of its own in the target's folder and is renamed over the target
  (``os.replace``), so a reader, an interrupted save or a second writer of the same path never sees half a file.
* Set aside: before a results file (or its CSV) is replaced, whatever is there that this process did not write
  itself (a run of an earlier command, or of another command writing the same path at the same time) is moved to
  ``.replaced/<name>.<UTC time>.<ext>`` beside it, and the move is said on stderr. The folder is hidden:
  ``mxbench.load`` and every folder walk pass over it, so a kept copy is never counted twice.
* Before any work (``check_replace``): a file that is not an mxbench run is refused (even with ``--force``: mxbench
  replaces only what it wrote, and a notes.json is not a run), and a measured run is not replaced by a model run, or
  by a run of another card or another shape, without ``--force``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from mxkernels.core.errors import InputError

from .results import CSV_COLUMNS, CSV_WGRAD_COLUMN, load_run
from .writing import REPLACED_DIR, read_bytes


class RunIdentity(NamedTuple):
    """What a run is, for the replacement rule: measured or the model, on which card, of which (N, K, G) shapes
    (None: not known before the run, not compared)."""

    measured: bool
    card: str
    shapes: frozenset[tuple[int, int, int]] | None


def identity(run) -> RunIdentity:
    """A stored run's identity: measured when any record is, its card, its records' (N, K, G)."""
    measured = bool(run.meta.get("measured", True)) and any(r.measured for r in run.records)
    return RunIdentity(measured, run.card, frozenset((r.point.N, r.point.K, r.point.G) for r in run.records))


def check_replace(path: Path, option: str, new: RunIdentity, force: bool | None) -> None:
    """Before any work: may the run ``new`` replace what ``path`` (a results file) and its CSV hold? (module doc)
    ``force`` None: the command has no --force (``regress``, whose --force would read as compare's)."""
    path = Path(path)
    csv_path = path.with_suffix(".csv")
    if path.exists():
        try:
            old = identity(load_run(path))
        except InputError as e:
            raise InputError(f"{option} {path}: the file exists and is not an mxbench run ({e}); mxbench replaces only "
                             "runs it wrote, even with --force: choose another name") from None  # fmt: skip
        why = _differs(old, new)
        if why and not force:
            what = "choose another name" if force is None else (
                f"give --force to replace it (the old copy is kept in {path.parent / REPLACED_DIR})")
            raise InputError(f"{option} {path}: holds a measured run of {old.card} that {why}; {what}")
    if csv_path.exists():
        head = (read_bytes(csv_path) or b"").split(b"\n", 1)[0].decode(errors="replace").strip()
        headers = (",".join(CSV_COLUMNS), ",".join([*CSV_COLUMNS, CSV_WGRAD_COLUMN]))  # ``results.csv_columns``
        if not path.exists() or head not in headers:
            raise InputError(f"{option} {path}: {csv_path} exists and is not the CSV of an mxbench run (the CSV is "
                             "written beside the JSON); mxbench does not replace it: choose another name")  # fmt: skip


def _differs(old: RunIdentity, new: RunIdentity) -> str:
    """Why ``new`` must not replace ``old`` without --force ("" when it may)."""
    if not old.measured:
        return ""
    if not new.measured:
        return "the analytic model (not measured) would replace"
    if new.card != old.card:
        return f"a run of {new.card} would replace"
    if new.shapes is not None and new.shapes != old.shapes:
        shown = ", ".join(f"N={n} K={k} G={g}" for n, k, g in sorted(new.shapes))
        return f"a run of other shapes ({shown}) would replace"
    return ""
