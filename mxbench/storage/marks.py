"""How mxbench recognizes an output it wrote, so that it replaces only its own (``writing.write_output``).

* A run: its JSON holds to the published schema (``replacing``), and its CSV's first line is the run CSV's header.
* A figure (.png, .svg, .pdf): the metadata every figure is saved with, ``Creator: mxbench figure`` (``FIGURE_MARK``:
  a PNG ``tEXt`` chunk, the SVG's ``dc:creator``, the PDF's ``/Creator``; matplotlib writes each uncompressed).
* A text output (a table or a projection, ``ep-project --out``): JSON whose top-level ``kind`` is one of
  ``JSON_KINDS`` (``ep-projection``, ``ep-check``); any other format's first line is ``TEXT_MARK`` as a comment of
  the format (markdown: an HTML comment, invisible when rendered; csv and plain: a ``#`` line).
"""

from __future__ import annotations

import json
from enum import Enum

FIGURE_MARK = "mxbench figure"
TEXT_MARK = "written by mxbench"
JSON_KINDS = ("ep-projection", "ep-check")
"""The ``kind`` of every JSON output that is not a run."""


class Output(Enum):
    """The kinds of output that are not runs: one replaces only its own kind."""

    FIGURE = "figure"
    TEXT = "text output"


def figure_metadata() -> dict[str, str]:
    """The metadata every figure is saved with (``savefig(metadata=...)``)."""
    return {"Creator": FIGURE_MARK}


def marked_text(text: str, fmt: str, command: str) -> str:
    """``text`` (a table in ``fmt``) as written to a file: its first line says mxbench's ``command`` wrote it
    (JSON carries its ``kind`` instead)."""
    if fmt == "json":
        return text
    line = f"<!-- {TEXT_MARK} {command} -->" if fmt in ("markdown", "github") else f"# {TEXT_MARK} {command}"
    return f"{line}\n{text}"


def is_ours(data: bytes, kind: Output) -> bool:
    """Whether ``data`` (a file's bytes) is an output mxbench wrote of ``kind`` (module doc)."""
    if kind is Output.FIGURE:
        return FIGURE_MARK.encode() in data
    head = data[:200].lstrip()
    if head.startswith(f"<!-- {TEXT_MARK} ".encode()) or head.startswith(f"# {TEXT_MARK} ".encode()):
        return True
    try:
        payload = json.loads(data)
    except ValueError:  # not JSON (a 5000-digit integer included)
        return False
    except RecursionError:
        return False
    return isinstance(payload, dict) and payload.get("kind") in JSON_KINDS
