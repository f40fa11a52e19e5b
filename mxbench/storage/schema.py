"""The schema of a stored run, checked on load: every field's type and range, so that a file that is valid JSON but
not a valid run is refused with the field that is wrong, before any table, figure or comparison reads it.

The declaration is the published JSON Schema ``mxbench/data/run.schema.json`` (outside tools validate and write
runs with it); ``validation`` checks a file against it. ``check_payload`` takes the parsed JSON of a results file
(schema 1 or 2, before schema 1 is migrated) and raises ``InputError`` naming the first bad field as a path
("records[3].point.M must be an integer >= 1 and <= 2**31-1, got 'abc'"). What JSON Schema cannot say is checked
here after it: a record's samples must have a positive median.
"""

from __future__ import annotations

import statistics
from typing import Any

from mxkernels.core.errors import InputError

from .validation import Published, validate


def check_payload(payload: Any, schema: int) -> None:
    """A whole results file of ``schema`` (already known to be a readable one): meta, then every record."""
    validate(payload, Published.RUN)
    for i, d in enumerate(payload["records"]):
        samples = d.get("samples_us")
        # one sample may dip below zero once the flush cost is subtracted; the timer refuses a median that does,
        # and every ratio and throughput divides by it
        if samples and (median := statistics.median(samples)) <= 0:
            raise InputError(f"records[{i}].samples_us must have a positive median, got {median!r}")
