"""Results: the schema of a run, its metadata, and JSON (source of truth) / CSV I/O.

A ``Run`` is the metadata of one invocation plus one ``Record`` per (sweep point, stage). Tables, plots and
comparisons read only stored Runs, so any past run can be re-rendered or compared.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mxkernels.core.errors import InputError
from mxkernels.core.names import OURS, Wgrad, format_shapes

from .schema import check_payload
from .validation import Published, parse, schema_file
from .reading import read_text
from .writing import write_files

IMPOSSIBLE = "IMPOSSIBLE"
"""The status of a record whose measured time is below its stage's roofline floor (``Record.impossible``)."""

PROVENANCE_FIELDS = ("module", "distribution", "version", "commit", "dirty", "git_commit_time")
"""The fields of an implementation's entry in ``meta["implementations"]`` (``instruments.provenance`` fills them)."""

DEFAULT_WGRAD = Wgrad.RECIPE.value
"""A point's weight-gradient precision when none is stored: the recipe's own (every run before ``wgrad``)."""

SCHEMA_VERSION: int = schema_file(Published.RUN)["x-mxbench-schema"]
"""The schema written: the version of the published ``run.schema.json``."""
READABLE_SCHEMAS: tuple[int, ...] = tuple(schema_file(Published.RUN)["properties"]["schema"]["enum"])
"""Schema 1 (before implementations were declarations) is read and migrated on load: see ``_migrate_v1``."""


@dataclass(frozen=True)
class Point:
    """One sweep point: the problem and the conditions it was measured under.

    ``power_limit_w`` None means the card's limit as found (never changed). ``wgrad``: the weight-gradient GEMMs'
    precision (``mxkernels.core.names.Wgrad``: the recipe's, or bf16 under a quantized recipe; the layer's and the
    map's ``--wgrad``). It is stored only when not the default, so runs without it read and write as before.
    """

    M: int
    N: int
    K: int
    G: int
    recipe: str = "mxfp8"
    mode: str = "rceil"
    groups: str = "balanced"
    seed: int = 0
    power_limit_w: float | None = None
    fuse_scales: bool = False
    wgrad: str = DEFAULT_WGRAD

    def label(self) -> str:
        pl = "" if self.power_limit_w is None else f" @{self.power_limit_w:g}W"
        pl += " fused scales" if self.fuse_scales else ""
        pl += f" {self.wgrad} wgrad" if self.wgrad != DEFAULT_WGRAD else ""
        return f"M={self.M} N={self.N} K={self.K} G={self.G} {self.recipe}/{self.mode} {self.groups}{pl}"

    def recipe_label(self) -> str:
        """The recipe as tables and figures show it: with the wgrad precision when it is not the recipe's."""
        return self.recipe if self.wgrad == DEFAULT_WGRAD else f"{self.recipe} ({self.wgrad} wgrad)"


@dataclass
class Record:
    """One stage at one point: what ran, what it must move, how long it took.

    ``pass_name``: a ``mxkernels.stages.step_specs.Pass`` value; ``category`` a ``Category`` value (stored as their strings).
    ``impl``: the implementation that ran (``mxkernels``, ``torchao``, ``module:function`` ...); ``kernel`` the
    function it ran; ``backend`` the GEMM backend where one was chosen. ``shapes``: the stage's input shapes
    (given as their display string "(M, K) @ (G, K, N)", they are parsed into tuples here).
    ``samples_us``: per-call times (each sample = one graph replay / calls per replay). Empty for model rows, error
    rows and skipped rows. ``measured`` False marks the analytic model (``model_us`` set), never a measurement.
    ``skipped``: why the implementation could not run here (not an error: it never ran).
    ``impossible``: why the measured time cannot be true (below the stage's roofline floor on the run's card): the
    samples are kept as measured, but the record is no result (``ok`` False) and fails the gate.
    """

    point: Point
    pass_name: str
    stage: str
    kernel: str
    category: str
    purpose: str = ""
    shapes: tuple[tuple[int, ...], ...] = ()
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    precision: str | None = None
    backend: str | None = None
    method: str = ""
    samples_us: list[float] = field(default_factory=list)
    measured: bool = True
    model_us: float | None = None
    telemetry: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    impl: str = OURS
    skipped: str | None = None
    impossible: str | None = None

    def __post_init__(self):
        self.shapes = parse_shapes(self.shapes) if isinstance(self.shapes, str) else tuple(
            tuple(int(d) for d in s) for s in self.shapes
        )

    @property
    def ok(self) -> bool:
        return (self.error is None and self.skipped is None and self.impossible is None
                and (bool(self.samples_us) or self.model_us is not None))  # fmt: skip

    @property
    def failure(self) -> str | None:
        """What a row that is no result shows in place of its time: its error, or IMPOSSIBLE and why."""
        if self.impossible is not None:
            return f"{IMPOSSIBLE}: {self.impossible}"
        return self.error

    @property
    def shape(self) -> str:
        """Display form of ``shapes``: "(M, K)" or "(M, K) @ (G, K, N)"."""
        return format_shapes(self.shapes)

    @property
    def median_us(self) -> float | None:
        if self.samples_us:
            return statistics.median(self.samples_us)
        return self.model_us

    @property
    def iqr_us(self) -> float | None:
        if len(self.samples_us) < 2:
            return None
        q = statistics.quantiles(self.samples_us, n=4, method="inclusive")
        return q[2] - q[0]

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass
class Run:
    """``meta``: card name and UUID, driver, CUDA, torch, triton, mxbench version and git commit, clocks, power
    limits, date, command line, seeds, timing options, hardware spec used for denominators."""

    meta: dict[str, Any]
    records: list[Record] = field(default_factory=list)

    @property
    def card(self) -> str:
        return str(self.meta.get("card", "unknown"))


def _record_to_dict(r: Record) -> dict[str, Any]:
    d = asdict(r)
    d["point"] = _point_dict(r.point)
    d["shapes"] = [list(s) for s in r.shapes]
    return d


def _point_dict(p: Point) -> dict[str, Any]:
    """A point as stored: ``wgrad`` only when not the default (files of default runs unchanged)."""
    d = asdict(p)
    if d["wgrad"] == DEFAULT_WGRAD:
        del d["wgrad"]
    return d


def _record_from_dict(d: dict[str, Any]) -> Record:
    d = dict(d)
    point = Point(**d.pop("point"))
    known = {f.name for f in fields(Record)}
    return Record(point=point, **{k: v for k, v in d.items() if k in known})


_SHAPE = re.compile(r"\(([^)]*)\)")


def parse_shapes(text: str) -> tuple[tuple[int, ...], ...]:
    """The shapes a display string names: "(M, K) @ (G, K, N)" -> ((M, K), (G, K, N)) (the inverse of
    ``format_shapes``; schema-1 files stored only the string)."""
    return tuple(tuple(int(x) for x in dims.split(",") if x.strip()) for dims in _SHAPE.findall(text))
_V1_GEMMS = {"forward": "gemm_fwd", "backward_input": "gemm_dgrad", "backward_weight": "gemm_wgrad"}
_V1_IMPLS = ("mxkernels", "torchao", "torch.compile")


def _migrate_v1(d: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 record as schema 2: its display ``shape`` string parsed into ``shapes``; the three GEMM stages,
    all named "gemm" then, named by pass; a peers record's "<stage>/<implementation>" name and implementation
    ``backend`` split into ``stage`` and ``impl``."""
    d = dict(d)
    d["shapes"] = parse_shapes(d.pop("shape", "") or "")
    if d.get("stage") == "gemm":
        d["stage"] = _V1_GEMMS.get(d.get("pass_name"), "gemm")
    stage, sep, impl = str(d.get("stage", "")).rpartition("/")
    if sep and impl in _V1_IMPLS and d.get("backend") == impl:
        d["stage"], d["impl"], d["backend"] = stage, impl, None
    return d


def run_to_json(run: Run) -> str:
    payload = {"schema": SCHEMA_VERSION, "meta": run.meta, "records": [_record_to_dict(r) for r in run.records]}
    return json.dumps(payload, indent=1, sort_keys=False)


def _migrate_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Peers runs written before provenance was recorded list their implementations' names only: each becomes an
    entry whose code is unknown, so ``meta["implementations"]`` always maps a name to its code."""
    names = meta.get("implementations")
    if isinstance(names, list):
        meta = {**meta, "implementations": {name: dict.fromkeys(PROVENANCE_FIELDS) for name in names}}
    return meta


def run_from_json(text: str) -> Run:
    """The Run a results file's text holds; every field is checked against its schema first (``schema``), so a
    file that is JSON but not a run raises ``InputError`` naming the field."""
    payload = parse(text, "mxbench results file")
    if not isinstance(payload, dict):
        raise InputError(f"a results file holds a JSON object, got {type(payload).__name__}")
    schema = payload.get("schema")
    if isinstance(schema, bool) or schema not in READABLE_SCHEMAS:  # true would pass as 1
        raise InputError(f"results schema {schema!r} is not supported (readable: {READABLE_SCHEMAS})")
    check_payload(payload, schema)
    records = payload["records"]
    if schema == 1:
        records = [_migrate_v1(d) for d in records]
    return Run(meta=_migrate_meta(payload["meta"]), records=[_record_from_dict(d) for d in records])


CSV_COLUMNS = [
    "M", "N", "K", "G", "recipe", "mode", "groups", "seed", "power_limit_w", "fuse_scales",
    "pass_name", "stage", "impl", "kernel", "category", "purpose", "shape", "backend", "method", "measured",
    "median_us", "iqr_us", "samples", "bytes_read", "bytes_written", "flops", "precision", "error", "skipped",
    "impossible",
]  # fmt: skip


CSV_WGRAD_COLUMN = "wgrad"
"""Appended to ``CSV_COLUMNS`` only in the CSV of a run with a point of non-default wgrad (others read as before)."""


def csv_columns(run: Run) -> list[str]:
    """The CSV's columns for ``run``: ``CSV_COLUMNS``, plus ``wgrad`` when any point has a non-default one."""
    extra = any(r.point.wgrad != DEFAULT_WGRAD for r in run.records)
    return CSV_COLUMNS + [CSV_WGRAD_COLUMN] if extra else CSV_COLUMNS


def _csv_row(r: Record) -> dict[str, Any]:
    row = _point_dict(r.point)
    row.update({k: getattr(r, k) for k in CSV_COLUMNS if hasattr(r, k) and k not in row})
    row["samples"] = len(r.samples_us)
    return row


def save_run(run: Run, path: str | Path) -> tuple[Path, Path]:
    """Write ``path`` (JSON, the source of truth) and the CSV beside it; returns both paths.

    Each file is written atomically, and what they held that this process did not write is kept in ``.replaced/``
    beside them (``writing.write_files``): an interrupted save, a second writer or a rerun never loses a run.
    """
    path = Path(path)
    csv_path = path.with_suffix(".csv")
    rows = io.StringIO(newline="")
    w = csv.DictWriter(rows, fieldnames=csv_columns(run))
    w.writeheader()
    for r in run.records:
        w.writerow(_csv_row(r))
    write_files({path: run_to_json(run), csv_path: rows.getvalue()}, owner=run)
    return path, csv_path


def load_run(path: str | Path) -> Run:
    """The Run stored at ``path``; a file that is not one raises ``InputError`` naming it."""
    path = Path(path)
    text = read_text(path, "mxbench results file")  # a regular file, capped, read once (``reading``)
    try:
        return run_from_json(text)
    except InputError as e:  # not JSON, another schema, or a field of the wrong type or range
        raise InputError(f"{path}: {e}") from None
