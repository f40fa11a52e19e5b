"""The schema of a stored run, checked on load: the type of every field, so that a file that is valid JSON but not a
valid run is refused with the field that is wrong, before any table, figure or comparison reads it.

``check_payload`` takes the parsed JSON of a results file (schema 1 or 2, before schema 1 is migrated) and raises
``InputError`` naming the first bad field as a path ("records[3].point.M must be an integer, got 'abc'"). Fields
not listed here are kept unchecked: a newer writer may add some, and nothing reads them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from mxkernels.errors import InputError
from mxkernels.names import Category, Pass

Check = Callable[[Any], str | None]
"""A check returns what the value should have been ("an integer"), or None when it is fine."""


def _integer(minimum: int | None = None) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int):
            return "an integer"
        if minimum is not None and v < minimum:
            return f"an integer >= {minimum}"
        return None

    return check


def _number(v: Any) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return None if ok else "a finite number"


def _non_negative(v: Any) -> str | None:
    return _number(v) or (None if v >= 0 else "a number >= 0")


def _string(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _one_of(values: tuple[str, ...]) -> Check:
    """A string of a closed vocabulary (tables and figures look these up)."""

    def check(v: Any) -> str | None:
        return None if v in values else f"one of {', '.join(values)}"

    return check


def _object(v: Any) -> str | None:
    return None if isinstance(v, dict) else "an object"


def _optional(check: Check) -> Check:
    def optional(v: Any) -> str | None:
        wanted = None if v is None else check(v)
        return None if wanted is None else f"{wanted} or null"

    return optional


POINT: dict[str, Check] = {
    "M": _integer(1), "N": _integer(1), "K": _integer(1), "G": _integer(1), "recipe": _string, "mode": _string,
    "groups": _string, "seed": _integer(0), "power_limit_w": _optional(_non_negative), "fuse_scales": _boolean,
}  # fmt: skip
POINT_REQUIRED = ("M", "N", "K", "G")

RECORD: dict[str, Check] = {
    "pass_name": _one_of(tuple(Pass)), "stage": _string, "kernel": _string, "category": _one_of(tuple(Category)),
    "purpose": _string,
    "bytes_read": _integer(0), "bytes_written": _integer(0), "flops": _integer(0), "precision": _optional(_string),
    "backend": _optional(_string), "method": _string, "measured": _boolean, "model_us": _optional(_non_negative),
    "telemetry": _object, "error": _optional(_string), "impl": _string, "skipped": _optional(_string),
}  # fmt: skip
RECORD_REQUIRED = ("point", "pass_name", "stage", "kernel", "category")
# Schema 1 stored a display string "(M, K) @ (G, K, N)"; schema 2 the shapes themselves.
SHAPES_FIELD = {1: ("shape", _string), 2: ("shapes", None)}

IMPLEMENTATION: dict[str, Check] = {
    "module": _optional(_string), "distribution": _optional(_string), "version": _optional(_string),
    "commit": _optional(_string), "dirty": _optional(_boolean),
}  # fmt: skip
CEILINGS: dict[str, Check] = {
    "card": _string, "power_limit_w": _optional(_non_negative), "copy_tbps": _number, "read2write1_tbps": _number,
    "read_tbps": _number, "bandwidth_tbps": _number, "bf16_tflops": _number, "fp8_tflops": _optional(_number),
    "bf16_shape": _optional(_string), "fp8_shape": _optional(_string), "meta": _object,
}  # fmt: skip
"""The fields of ``ceilings.Ceilings`` (a test keeps the two in step): ``peaks_for_run`` builds one from them."""
CEILINGS_REQUIRED = ("card", "bandwidth_tbps", "bf16_tflops")

META: dict[str, Check] = {
    "card": _string, "uuid": _optional(_string), "driver": _optional(_string), "device_properties": _object,
    "date": _string, "finished": _string, "command": _string, "torch": _string, "cuda": _optional(_string),
    "triton": _string, "mxbench": _string, "git_commit": _optional(_string), "python": _string, "nvml": _object,
    "backend": _optional(_string), "hardware": _optional(_string), "denominator": _string, "measured": _boolean,
    "label": _string, "kind": _string, "torchao": _string, "interrupted": _boolean, "partial": _string,
    "rounds": _integer(1), "model": _string,
}  # fmt: skip


def _fail(path: str, wanted: str, value: Any) -> InputError:
    shown = repr(value)
    return InputError(f"{path} must be {wanted}, got {shown if len(shown) <= 40 else shown[:37] + '...'}")


def _fields(d: Mapping[str, Any], checks: Mapping[str, Check], path: str, required: tuple[str, ...] = ()) -> None:
    for name in required:
        if name not in d:
            raise InputError(f"{path}.{name} is missing")
    for name, check in checks.items():
        if name in d and (wanted := check(d[name])) is not None:
            raise _fail(f"{path}.{name}", wanted, d[name])


def _list(value: Any, path: str, item: Check) -> None:
    if not isinstance(value, list):
        raise _fail(path, "a list", value)
    for i, v in enumerate(value):
        if (wanted := item(v)) is not None:
            raise _fail(f"{path}[{i}]", wanted, v)


def _shapes(value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise _fail(path, "a list of shapes", value)
    for i, shape in enumerate(value):
        _list(shape, f"{path}[{i}]", _integer(0))


def check_record(d: Any, path: str, schema: int) -> None:
    """One stored record of ``schema``; ``path`` names it in messages ("records[3]")."""
    if (wanted := _object(d)) is not None:
        raise _fail(path, wanted, d)
    _fields(d, RECORD, path, RECORD_REQUIRED)
    if (wanted := _object(d["point"])) is not None:
        raise _fail(f"{path}.point", wanted, d["point"])
    _fields(d["point"], POINT, f"{path}.point", POINT_REQUIRED)
    unknown = sorted(set(d["point"]) - set(POINT))
    if unknown:
        raise InputError(f"{path}.point has unknown fields {unknown}; known: {list(POINT)}")
    name, check = SHAPES_FIELD[schema]
    if name in d:
        if check is None:
            _shapes(d[name], f"{path}.{name}")
        elif (wanted := check(d[name])) is not None:
            raise _fail(f"{path}.{name}", wanted, d[name])
    if "samples_us" in d:
        _list(d["samples_us"], f"{path}.samples_us", _number)
        # one sample may dip below zero once the flush cost is subtracted; the timer refuses a median that does,
        # and every ratio and throughput divides by it
        if d["samples_us"] and (median := statistics.median(d["samples_us"])) <= 0:
            raise InputError(f"{path}.samples_us must have a positive median, got {median!r}")


def check_meta(meta: Any) -> None:
    """A run's metadata: the type of every field mxbench reads."""
    if (wanted := _object(meta)) is not None:
        raise _fail("meta", wanted, meta)
    _fields(meta, META, "meta")
    if "timing" in meta and not isinstance(meta["timing"], (dict, str)):
        raise _fail("meta.timing", "an object", meta["timing"])
    if isinstance(meta.get("timing"), dict):
        _fields(meta["timing"], {"cold_l2": _boolean, "use_graph": _boolean, "samples": _integer(1)}, "meta.timing")
    if meta.get("ceilings") is not None:
        if (wanted := _object(meta["ceilings"])) is not None:
            raise _fail("meta.ceilings", wanted, meta["ceilings"])
        unknown = sorted(set(meta["ceilings"]) - set(CEILINGS))
        if unknown:
            raise InputError(f"meta.ceilings has unknown fields {unknown}; known: {list(CEILINGS)}")
        _fields(meta["ceilings"], CEILINGS, "meta.ceilings", CEILINGS_REQUIRED)
    impls = meta.get("implementations")
    if isinstance(impls, dict):
        for name, entry in impls.items():
            if (wanted := _object(entry)) is not None:
                raise _fail(f"meta.implementations[{name!r}]", wanted, entry)
            _fields(entry, IMPLEMENTATION, f"meta.implementations[{name!r}]")
    elif impls is not None:  # peers runs written before provenance was recorded named their implementations only
        _list(impls, "meta.implementations", _string)
    if "seeds" in meta:
        _list(meta["seeds"], "meta.seeds", _integer(0))


def check_payload(payload: Any, schema: int) -> None:
    """A whole results file of ``schema`` (already known to be a readable one): meta, then every record."""
    for key in ("meta", "records"):
        if key not in payload:
            raise InputError(f"{key} is missing")
    check_meta(payload["meta"])
    if not isinstance(payload["records"], list):
        raise _fail("records", "a list", payload["records"])
    for i, d in enumerate(payload["records"]):
        check_record(d, f"records[{i}]", schema)
