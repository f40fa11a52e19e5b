"""Reading a stored JSON file safely and checking it against the JSON Schema mxbench publishes for it.

The schemas are the files in ``mxbench/data/*.schema.json`` (shipped with the package, so outside tools can
validate and write runs): they are the one declaration of every field's type and range. This module reads them and
checks a parsed file against them, raising ``InputError`` with the JSON path of the first field that is wrong and
what it should have been ("records[3].point.M must be an integer >= 1 and <= 2**31-1, got 100000000000000000000").
It understands the keywords the schemas use (``KEYWORDS``; a test keeps the files to them) and holds a file to
three rules JSON Schema leaves open, stated in each file's description: an integer is a JSON integer without a
fraction part, a number is finite, and nesting is at most ``MAX_DEPTH`` levels deep.

``read_json`` parses a file's text without a traceback on the inputs that break ``json.loads``: nesting past the
interpreter's recursion limit (RecursionError), an integer of more than 4300 digits (ValueError), bytes that are not
UTF-8.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from enum import Enum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from mxkernels.core.errors import InputError

MAX_DEPTH = 32
"""The deepest nesting a stored file may have (the committed runs reach 8)."""
KEYWORDS = frozenset({
    "$schema", "$ref", "$defs", "title", "description", "x-mxbench-schema", "type", "enum", "const", "minimum",
    "maximum", "exclusiveMinimum", "format", "pattern", "minItems", "items", "required", "properties",
    "additionalProperties", "if", "then", "else", "anyOf",
})  # fmt: skip
"""The JSON Schema keywords this validator implements (a schema file using another would be checked in part)."""
_TYPE_WORDS = {"integer": "an integer", "number": "a finite number", "string": "a string", "boolean": "true or false",
               "object": "an object", "array": "a list", "null": "null"}  # fmt: skip
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
"""RFC 3339 (the ISO 8601 profile of JSON Schema's "date-time"): a date, a time and its offset from UTC."""


# --------------------------------------------------------------------------------------------- the schema files


class Published(Enum):
    """The kinds of stored file, each with its schema ``mxbench/data/<value>.schema.json``."""

    RUN = "run"
    CEILINGS = "ceilings"
    ALLTOALL_CEILINGS = "alltoall-ceilings"
    TUNING = "tuning"

    @property
    def path(self):
        return resources.files("mxbench").joinpath("data", f"{self.value}.schema.json")


@cache
def schema_file(kind: Published) -> dict[str, Any]:
    """The published schema of ``kind``."""
    return json.loads(kind.path.read_text())


@cache
def _resolve(ref: str, root: Published) -> tuple[dict[str, Any], Published]:
    """The schema a ``$ref`` names ("#/$defs/point", or "ceilings.schema.json#/$defs/entry") and the file it is in."""
    where, _, pointer = ref.partition("#")
    if where:
        root = Published(where.removesuffix(".schema.json"))
    node = schema_file(root)
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return node, root


# --------------------------------------------------------------------------------------------- checking


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TYPE_TESTS = {
    "integer": _is_integer,
    # an int is finite however long (math.isfinite would convert it to a float and overflow)
    "number": lambda v: _is_integer(v) or (isinstance(v, float) and math.isfinite(v)),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list), "null": lambda v: v is None,
}  # fmt: skip


def _is_type(value: Any, kind: str) -> bool:
    return _TYPE_TESTS[kind](value)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1 (as Python's ``True == 1`` would have it), 1.0 is 1."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _number(v: int | float) -> str:
    """A bound as people read it: 2**31-1 rather than 2147483647."""
    if isinstance(v, int) and v >= 2**16:
        for exact, text in ((v, f"2**{v.bit_length() - 1}"), (v + 1, f"2**{v.bit_length()}-1")):
            if exact & (exact - 1) == 0:
                return text
    return f"{v:g}" if isinstance(v, float) else str(v)


def expected(schema: dict[str, Any], kind: str | None = None) -> str:
    """What a value of ``schema`` must be, in words ("an integer >= 1 and <= 2**20", "a string or null"); ``kind``:
    only what a value of that type must be (a number out of range is told its range, not every type)."""
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    if "const" in schema:
        return repr(schema["const"])
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else sorted(kinds, key=lambda k: k == "null")
    if kind is not None:  # an integer out of range where any number may be is told the numbers' range
        kinds = [k for k in kinds if k == kind] or [k for k in kinds if k == "number"] or kinds
    bounds = [f"{op} {_number(schema[key])}" for key, op in
              (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<=")) if key in schema]  # fmt: skip
    words = []
    for kind in kinds:
        word = _TYPE_WORDS[kind] if kind != "number" or not bounds else "a number"
        if kind in ("integer", "number") and bounds and len(kinds) <= 2:
            word += " " + " and ".join(bounds)
        if kind == "string" and schema.get("format") == "date-time":
            word = "an ISO 8601 date and time with its UTC offset (2026-01-31T12:00:00+00:00)"
        words.append(word)
    return " or ".join(words) or "valid"


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


# Where a value sits, as (parent, key, named) links from the file's root (None): written out only for an error, since a
# valid file has every path built and none read (formatting each was a fifth of a reader's time).
Path = tuple | None


def _fail(path: Path, schema: dict[str, Any], value: Any, kind: str | None = None) -> InputError:
    return InputError(f"{_text(path) or 'the file'} must be {expected(schema, kind)}, got {_shown(value)}")


def _child(path: Path, key: str | int, named: bool) -> Path:
    return (path, key, named)


def _text(path: Path) -> str:
    """The path as messages name it: ``records[3].point.M``, ``stages['a b']``."""
    if path is None:
        return ""
    parent, key, named = path
    above = _text(parent)
    if isinstance(key, int):
        return f"{above}[{key}]"
    return (f"{above}.{key}" if above else key) if named else f"{above}[{key!r}]"


def _date_time(value: str) -> bool:
    if not _DATE_TIME.fullmatch(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:  # month 13, February 30, hour 25
        return False
    return True


def check(value: Any, schema: dict[str, Any], path: Path = None, root: Published = Published.RUN) -> None:
    """Raise ``InputError`` naming the first field of ``value`` that ``schema`` (a node of ``root``'s file) refuses."""
    _node(schema, root)(value, path)


# Each schema node is read once into the list of the checks its keywords ask for (``_Node``), in the order ``check``
# applies them: a value then meets only the checks its node has, where looking up every keyword of its node for
# every value took twice as long. Nodes are kept by the identity of their schema dict (the node holds the dict, so
# the identity is never reused while it is kept).
_NODES: dict[tuple[int, Published], _Node] = {}


def _node(schema: dict[str, Any], root: Published) -> _Node:
    node = _NODES.get((id(schema), root))
    if node is None:
        node = _NODES[(id(schema), root)] = _Node(schema, root)
    return node


class _Node:
    """The checks of one schema node, built on its first value (a ``$ref`` may lead back to the node itself)."""

    __slots__ = ("root", "schema", "steps")

    def __init__(self, schema: dict[str, Any], root: Published):
        self.schema, self.root, self.steps = schema, root, None

    def __call__(self, value: Any, path: Path) -> None:
        steps = self.steps
        if steps is None:
            steps = self.steps = _steps(self.schema, self.root)
        for step in steps:
            step(value, path)


def _steps(schema: dict[str, Any], root: Published) -> list:
    """``schema``'s checks (``check``'s order), each a call of (value, path)."""
    steps = []
    if "$ref" in schema:
        steps.append(_node(*_resolve(schema["$ref"], root)))
    kinds = schema.get("type")
    if kinds is not None:
        tests = [_TYPE_TESTS[k] for k in ([kinds] if isinstance(kinds, str) else kinds)]

        def typed(value, path, tests=tests):
            for test in tests:
                if test(value):
                    return
            raise _fail(path, schema, value)

        steps.append(typed)
    if "enum" in schema:
        options = schema["enum"]

        def enum(value, path):
            if not any(_same(value, v) for v in options):
                raise _fail(path, schema, value)

        steps.append(enum)
    if "const" in schema:

        def const(value, path):
            if not _same(value, schema["const"]):
                raise _fail(path, schema, value)

        steps.append(const)
    if "anyOf" in schema:
        steps.append(lambda value, path: _any_of(value, schema["anyOf"], path, root))
    low, above, high = schema.get("minimum"), schema.get("exclusiveMinimum"), schema.get("maximum")
    if low is not None or above is not None or high is not None:

        def bounded(value, path):
            if _is_type(value, "number"):
                below = (low is not None and value < low) or (above is not None and value <= above)
                if below or (high is not None and value > high):
                    raise _fail(path, schema, value, "integer" if _is_type(value, "integer") else "number")

        steps.append(bounded)
    if schema.get("format") == "date-time":

        def date_time(value, path):
            if isinstance(value, str) and not _date_time(value):
                raise _fail(path, schema, value)

        steps.append(date_time)
    if "pattern" in schema:
        pattern = schema["pattern"]

        def matches(value, path):
            if isinstance(value, str) and not re.search(pattern, value):
                raise InputError(f"{_text(path)} must match {pattern}, got {_shown(value)}")

        steps.append(matches)
    if "minItems" in schema or "items" in schema:
        steps.append(lambda value, path: _check_list(value, schema, path, root) if isinstance(value, list) else None)
    if "required" in schema or "properties" in schema or schema.get("additionalProperties", True) is not True:
        steps.append(lambda value, path: _check_object(value, schema, path, root) if isinstance(value, dict) else None)
    if "if" in schema:

        def branch(value, path):
            then = schema.get("then" if valid(value, schema["if"], root) else "else")
            if then is not None:
                check(value, then, path, root)

        steps.append(branch)
    return steps


def _any_of(value: Any, options: list[dict[str, Any]], path: Path, root: Published) -> None:
    """Valid against one option; else the error of the option of the value's type (the null-or-entry fields)."""
    if any(valid(value, option, root) for option in options):
        return
    typed = [o for o in options if o.get("type") is None or _is_type(value, o["type"])] or options
    check(value, typed[-1], path, root)


def _check_list(value: list, schema: dict[str, Any], path: Path, root: Published) -> None:
    if len(value) < schema.get("minItems", 0):
        where = _text(path)
        raise InputError(f"{where} is empty: the file holds no {where.rpartition('.')[2] or 'items'}"
                         if not value else f"{where} must hold at least {schema['minItems']} items, got {len(value)}")
    if "items" in schema:
        item_node = _node(schema["items"], root)
        for i, item in enumerate(value):
            item_node(item, _child(path, i, True))


def _check_object(value: dict, schema: dict[str, Any], path: Path, root: Published) -> None:
    for name in schema.get("required", ()):
        if name not in value:
            raise InputError(f"{_text(_child(path, name, True))} is missing")
    properties = schema.get("properties", {})
    for name, sub in properties.items():
        if name in value:
            _node(sub, root)(value[name], _child(path, name, True))
    extra = schema.get("additionalProperties", True)
    if extra is False:
        unknown = sorted(set(value) - set(properties))
        if unknown:
            raise InputError(f"{_text(path)} has unknown fields {unknown}; known: {list(properties)}")
    elif extra is not True:
        extra_node = _node(extra, root)
        for name in value.keys() - properties.keys():
            extra_node(value[name], _child(path, name, False))


def valid(value: Any, schema: dict[str, Any], root: Published = Published.RUN) -> bool:
    try:
        check(value, schema, None, root)
    except InputError:
        return False
    return True


def validate(payload: Any, kind: Published) -> None:
    """Check a parsed file against the published schema of its ``kind``."""
    check(payload, schema_file(kind), None, kind)


# --------------------------------------------------------------------------------------------- reading


def depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar 0, [] 1, [[]] 2), without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        node, level = todo.pop()
        if isinstance(node, (list, dict)):
            level += 1
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break  # deep enough to refuse: no need to walk the rest
            todo += [(child, level) for child in (node.values() if isinstance(node, dict) else node)]
    return deepest


def parse(text: str, what: str = "mxbench file") -> Any:
    """The JSON value ``text`` holds; ``InputError`` (without the file's name) for text that is not JSON mxbench
    can read: a syntax error, nesting deeper than ``MAX_DEPTH``, an integer of more digits than Python converts.
    ``what`` names the kind of file in the message."""
    too_deep = f"not an {what}: JSON nested deeper than the {MAX_DEPTH} levels a file may have"
    try:
        payload = json.loads(text)
    except RecursionError:
        raise InputError(too_deep) from None
    except ValueError as e:  # JSONDecodeError, and an integer of more than 4300 digits
        raise InputError(f"not an {what} ({e})") from None
    if depth(payload) > MAX_DEPTH:
        raise InputError(too_deep)
    return payload


def read_json(path: Path, what: str = "mxbench file") -> Any:
    """The parsed JSON of the file at ``path``; ``InputError`` naming it when it cannot be read as JSON."""
    from .reading import read_text

    text = read_text(path, what)  # a regular file, capped, read once
    try:
        return parse(text, what)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
