"""Rendering rows as text: markdown, github, csv or plain tables, and the header block that says what a table came
from (card, denominators, mxbench version and commit, the implementations' code, command, timing).

A row is a dict of column name -> display string (None where a cell has no value, printed as "—"). Model runs are
marked "model, not measured" wherever a table could be mistaken for a measurement.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from typing import Any

from mxkernels.core.errors import InputError
from tabulate import tabulate

from ..instruments.provenance import describe
from ..instruments.roofline import MODEL_ASSUMPTION
from ..storage.results import Run

Row = dict[str, Any]

FORMATS = ("markdown", "github", "csv", "plain")
_TABLEFMT = {"markdown": "pipe", "github": "github", "plain": "simple"}
MODEL_MARK = "model, not measured"
MODEL_CANNOT_SHOW = ("a model run has no samples: no spread, no telemetry (energy, power, SM clock) and no "
                     "measured-ceiling efficiency")
MISSING = "—"

_NUMERIC = re.compile(r"^[-+]?\d[\d,]*(\.\d+)?(x|%)?$")


def _mostly_numeric(cells: Iterable[Any]) -> bool:
    present = [str(v) for v in cells if v is not None]
    return bool(present) and 2 * sum(bool(_NUMERIC.match(v)) for v in present) >= len(present)


def render(rows: list[Row], fmt: str = "markdown", columns: list[str] | None = None) -> str:
    """Rows as a table: "markdown" (pipe), "github", "plain" (terminal) via tabulate, or "csv" via the csv module.

    ``columns`` picks and orders columns (default: every column, first-seen order). Missing cells print as "—"
    ("" in csv). Columns that hold mostly numbers are right-aligned (an error text in a time column does not
    change that).
    """
    if fmt not in FORMATS:
        raise InputError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    available = list(dict.fromkeys(c for row in rows for c in row))
    if columns is not None:
        unknown = [c for c in columns if c not in available]
        if unknown and rows:
            raise InputError(f"columns: unknown {unknown}; available: {available}")
        available = list(columns)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(available)
        w.writerows([["" if row.get(c) is None else row.get(c) for c in available] for row in rows])
        return buf.getvalue()
    if not rows:
        return "(no matching records)\n"
    body = [[row.get(c) for c in available] for row in rows]
    align = ["right" if _mostly_numeric(col) else "left" for col in zip(*body, strict=True)]
    return (
        tabulate(
            body, headers=available, tablefmt=_TABLEFMT[fmt], disable_numparse=True, colalign=align, missingval=MISSING
        )
        + "\n"
    )


def peak_text(peak) -> str:
    """A peak's label, with its value appended where the label does not already state it."""
    return peak.label if f"{peak.value:g}" in peak.label else f"{peak.label} ({peak.value:g} {peak.unit})"


def _denominator_text(peaks: dict | None) -> str:
    if not peaks:
        return "none (efficiency not computed)"
    return "; ".join(f"{k}: {peak_text(p)}" for k, p in peaks.items())


def card_label(run: Run) -> str:
    """The card a run measured or, for a model run, the spec it priced, marked as a model."""
    if run.meta.get("measured") is False:
        return f"{run.meta.get('hardware', 'unknown spec')} ({MODEL_MARK})"
    return run.card


def _implementations_text(meta: dict) -> str | None:
    """The code of each implementation the run recorded ("mxkernels 0.1.0 (mxbench), commit ..."); None when it
    recorded none, or only their names (runs made before provenance was recorded)."""
    entries = meta.get("implementations")
    if not isinstance(entries, dict):
        return None
    known = [f"{name} {describe(entry)}" for name, entry in entries.items() if any(v is not None for v in entry.values())]
    return "; ".join(known) or None


def header_block(run: Run, peaks: dict | None = None, fmt: str = "markdown") -> str:
    """What a table came from: card (and spec), denominators, mxbench version and commit, the implementations'
    versions and commits, the model's assumption (model runs), command, timing, and whether the run is partial.

    Lines a run has nothing for are left out, so older runs render as they always did."""
    meta = run.meta
    card = card_label(run)
    if meta.get("measured") is not False and meta.get("hardware"):
        card += f" (spec {meta['hardware']})"
    version = str(meta.get("mxbench", "unknown"))
    if meta.get("git_commit"):
        version += f", commit {meta['git_commit']}"
    timing = meta.get("timing")
    lines = [("Card", card), ("Denominators", _denominator_text(peaks)), ("mxbench", version)]
    if implementations := _implementations_text(meta):
        lines.append(("Implementations", implementations))
    if meta.get("measured") is False:
        lines.append(("Model", meta.get("model") or MODEL_ASSUMPTION))
        lines.append(("Not shown", MODEL_CANNOT_SHOW))
    lines.append(("Command", meta.get("command") or "unknown"))
    if timing:
        text = timing if isinstance(timing, str) else ", ".join(f"{k}={v}" for k, v in timing.items())
        lines.append(("Timing", text))
    if meta.get("partial") or meta.get("interrupted"):
        lines.append(("Partial", meta.get("partial") or "interrupted before the sweep finished"))
    if fmt in ("markdown", "github"):
        return "\n".join(f"- **{k}:** " + (f"`{v}`" if k == "Command" else v) for k, v in lines) + "\n"
    return "\n".join(f"{k}: {v}" for k, v in lines) + "\n"
