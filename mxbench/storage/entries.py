"""Stored entry files (a measured-ceilings file per card: the bandwidth and GEMM ceilings, the all-to-all one): read
checked against their published schema, written through the one write path. Apart from the instruments that measure
them, so that a table reading a stored ceiling imports neither torch nor triton."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mxkernels.core.errors import InputError

from .validation import Published, read_json, schema_file, validate
from .writing import write_files


def read_entries(path: Path, kind: Published) -> list[dict[str, Any]]:
    """The entries of a stored ceilings file of ``kind`` ([] when there is none), every field checked against its
    published schema: a malformed file raises ``InputError`` naming it and the field."""
    if not path.exists():
        return []
    payload = read_json(path, f"mxbench {kind.value} file")
    version = schema_file(kind)["x-mxbench-schema"]
    if not isinstance(payload, dict) or payload.get("schema") != version:
        found = payload.get("schema") if isinstance(payload, dict) else type(payload).__name__
        raise InputError(f"{path}: not an mxbench {kind.value} file (schema {found!r}; readable: {version})")
    try:
        validate(payload, kind)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    return [dict(e) for e in payload["entries"]]


def write_entries(path: Path, schema: int, card: str, entries: list[dict[str, Any]]) -> Path:
    """Write a ceilings file through the one write path (``storage.writing``: atomic, the file it replaces kept in
    .replaced/; the caller read it first as ceilings, so it never replaces another kind of file); returns ``path``."""
    write_files({path: json.dumps({"schema": schema, "card": card, "entries": entries}, indent=1)})
    return path
