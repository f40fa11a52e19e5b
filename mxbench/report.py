"""Tables of stored runs (breakdown, speedup, sweep, power) and their rendering: markdown, github, csv, plain.

Row builders return lists of dicts (column name -> display string, None where a cell has no value) built only
from stored Records, so any past run renders again. Every efficiency cell names its denominator; model rows say
"model, not measured". ``compare_runs`` gives per-stage verdicts (FASTER / SAME / SLOWER / UNSURE) between two
stored runs; ``comparison_rows`` tabulates them.
"""

from __future__ import annotations

import csv
import io
import re
import zlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from mxkernels.runtime import InputError
from tabulate import tabulate

from .results import Point, Record, Run
from .roofline import MEMORY_CATEGORIES, achieved_tbps, achieved_tflops, efficiency, peaks_for_run

Row = dict[str, Any]

PASS_TITLES = {
    "forward": "Forward",
    "backward_input": "Backward (dA)",
    "backward_weight": "Backward (dB)",
    "end_to_end": "End to end",
}
FORMATS = ("markdown", "github", "csv", "plain")
_TABLEFMT = {"markdown": "pipe", "github": "github", "plain": "simple"}
MODEL_MARK = "model, not measured"
MISSING = "—"

SM_CLOCK_KEY = "sm_clock_mhz"
"""Telemetry key of a record's median SM clock during its samples (MHz)."""
ENERGY_KEY = "energy_j_per_call"
"""Telemetry key of a record's energy per call (J)."""

# Point fields that become leading columns when they vary across a table's records (seed never does: it only
# changes group sizes, which the other fields already name).
_POINT_COLUMNS = {
    "M": "M",
    "N": "N",
    "K": "K",
    "G": "G",
    "recipe": "Recipe",
    "mode": "Mode",
    "groups": "Groups",
    "power_limit_w": "Power limit (W)",
}
# The per-GEMM speedup columns: which pass's GEMM, in the operand shapes it multiplies.
GEMM_SPEEDUP_COLUMNS = {
    "forward": "Fwd GEMM 2Dx3D",
    "backward_input": "dA GEMM 2Dx3D",
    "backward_weight": "dB GEMM 2Dx2D",
}


# ---------------------------------------------------------------------------------------------- selection


def _as_set(x: Any) -> set | None:
    if x is None:
        return None
    return {x} if isinstance(x, (str, int, float)) else set(x)


def select(
    run: Run,
    *,
    passes: str | Iterable[str] | None = None,
    M: int | Iterable[int] | None = None,
    recipe: str | Iterable[str] | None = None,
    card: str | None = None,
) -> list[Record]:
    """The run's records that match every given filter (None = no filter); ``card`` matches ``run.card`` without
    regard to case, and a run of another card contributes nothing."""
    if card is not None and card.lower() != run.card.lower():
        return []
    passes, Ms, recipes = _as_set(passes), _as_set(M), _as_set(recipe)
    unknown = passes - set(PASS_TITLES) if passes else set()
    if unknown:
        raise InputError(f"passes: unknown pass {sorted(unknown)}; known: {list(PASS_TITLES)}")
    return [
        r
        for r in run.records
        if (passes is None or r.pass_name in passes)
        and (Ms is None or r.point.M in Ms)
        and (recipes is None or r.point.recipe in recipes)
    ]


def _point_cells(
    points: list[Point], always: Iterable[str] = (), exclude: Iterable[str] = ()
) -> Callable[[Point], Row]:
    """Leading cells naming a point: the fields in ``always`` plus every field that varies among ``points``."""
    keep = [f for f in _POINT_COLUMNS if f not in exclude and (f in always or len({getattr(p, f) for p in points}) > 1)]

    def cells(p: Point) -> Row:
        return {_POINT_COLUMNS[f]: _fmt_point_field(getattr(p, f)) for f in keep}

    return cells


def _fmt_point_field(v: Any) -> str:
    if v is None:
        return "as found"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _pass_order(r: Record) -> int:
    return list(PASS_TITLES).index(r.pass_name) if r.pass_name in PASS_TITLES else len(PASS_TITLES)


def _first_seen(items: Iterable[Hashable]) -> dict[Hashable, int]:
    """Each distinct item -> its rank of first appearance (a sweep stores points in plan order)."""
    order: dict[Hashable, int] = {}
    for x in items:
        order.setdefault(x, len(order))
    return order


def _sorted(records: list[Record]) -> list[Record]:
    """Grouped by point (stored order), then by pass; stages keep their pipeline order inside a pass."""
    order = _first_seen(r.point for r in records)
    return sorted(records, key=lambda r: (order[r.point], _pass_order(r)))


# ---------------------------------------------------------------------------------------------- cells


def _num(x: float | None, digits: int) -> str | None:
    return None if x is None else f"{x:.{digits}f}"


def _times(x: float | None) -> str | None:
    return None if x is None else f"{x:.3f}x"


def _failure_text(r: Record) -> str:
    """The first line of an error row's message (an error row shows it in place of its time)."""
    lines = (r.error or "").strip().splitlines()
    return f"error: {lines[0][:100]}" if lines else "no result"


def _stage_cells(r: Record, peaks: dict | None) -> Row:
    """Time, spread, throughput and efficiency of one record; model and error rows say what they are."""
    if not r.ok:
        return {"Time (us)": _failure_text(r), **dict.fromkeys(("IQR (us)", "GB/s", "TFLOP/s", "Efficiency"))}
    us = r.median_us
    eff = efficiency(r, peaks) if peaks else None
    return {
        "Time (us)": _num(us, 1),
        "IQR (us)": _num(r.iqr_us, 1) if r.measured else MODEL_MARK,
        "GB/s": _num(achieved_tbps(r.bytes, us) * 1e3, 0) if r.category in MEMORY_CATEGORIES else None,
        "TFLOP/s": _num(achieved_tflops(r.flops, us), 1) if r.flops else None,
        "Efficiency": f"{eff[0]:.1f}% of {eff[1].label}" if eff else None,
    }


def _peaks(run: Run, denominator: str | None, peaks: dict | None) -> dict:
    """``peaks`` when given, else the run's peaks for ``denominator``; {} (no efficiency) for None."""
    if peaks is not None:
        return peaks
    return peaks_for_run(run, denominator) if denominator else {}


# ---------------------------------------------------------------------------------------------- row builders


def breakdown_rows(
    run: Run,
    M: int | None = None,
    *,
    passes: str | Iterable[str] | None = None,
    recipe: str | Iterable[str] | None = None,
    card: str | None = None,
    denominator: str | None = "datasheet",
    peaks: dict | None = None,
) -> list[Row]:
    """The "Kernel Microbenchmarks: Breakdown by Pass" table: one row per kernel of each pass at one M.

    ``M`` None takes the largest M of the run; ``recipe`` None shows every recipe but the bf16 baseline (unless
    the run holds nothing else). End-to-end rows belong to ``speedup_rows``. Efficiency is against ``peaks`` if
    given, else ``peaks_for_run(run, denominator)``; ``denominator`` None leaves it blank.
    """
    records = [r for r in select(run, passes=passes, recipe=recipe, card=card) if r.category != "end_to_end"]
    if not records:
        return []
    if recipe is None and any(r.point.recipe != "bf16" for r in records):
        records = [r for r in records if r.point.recipe != "bf16"]
    M = max(r.point.M for r in records) if M is None else M
    records = [r for r in records if r.point.M == M]
    pk = _peaks(run, denominator, peaks)
    lead = _point_cells([r.point for r in records])
    return [
        {
            **lead(r.point),
            "Pass": PASS_TITLES.get(r.pass_name, r.pass_name),
            "Kernel": r.kernel,
            "Purpose": r.purpose,
            "Input shape": r.shape,
            **_stage_cells(r, pk),
        }
        for r in _sorted(records)
    ]


def sweep_rows(
    run: Run,
    *,
    passes: str | Iterable[str] | None = None,
    M: int | Iterable[int] | None = None,
    recipe: str | Iterable[str] | None = None,
    card: str | None = None,
    denominator: str | None = "datasheet",
    peaks: dict | None = None,
) -> list[Row]:
    """Every stage at every point (bf16 baseline and end-to-end rows included), M always named."""
    records = select(run, passes=passes, M=M, recipe=recipe, card=card)
    pk = _peaks(run, denominator, peaks)
    lead = _point_cells([r.point for r in records], always=("M",))
    return [
        {
            **lead(r.point),
            "Pass": PASS_TITLES.get(r.pass_name, r.pass_name),
            "Stage": r.stage,
            "Kernel": r.kernel,
            **_stage_cells(r, pk),
        }
        for r in _sorted(records)
    ]


def baseline_key(p: Point) -> Point:
    """The bf16 counterpart of a point: the same point with recipe bf16 (scale mode means nothing to bf16)."""
    return replace(p, recipe="bf16", mode="")


def baseline_index(records: Iterable[Record]) -> dict[tuple[Point, str, str], Record]:
    """bf16 records that completed, by (baseline point, pass, category): where a recipe's counterpart is found."""
    return {(baseline_key(r.point), r.pass_name, r.category): r for r in records if r.point.recipe == "bf16" and r.ok}


def baseline_of(r: Record, index: dict[tuple[Point, str, str], Record]) -> Record | None:
    return index.get((baseline_key(r.point), r.pass_name, r.category))


@dataclass(frozen=True)
class Speedup:
    """A recipe's point against its bf16 counterpart. ``bf16_us`` / ``recipe_us``: fwd+bwd medians; ``gemm``:
    per pass, bf16 GEMM time over the recipe's GEMM time. None where either side is missing."""

    point: Point
    bf16_us: float | None
    recipe_us: float | None
    gemm: dict[str, float | None]
    measured: bool

    @property
    def net(self) -> float | None:
        return _ratio(self.bf16_us, self.recipe_us)


def _ratio(base_us: float | None, us: float | None) -> float | None:
    return base_us / us if base_us and us else None


def speedups(
    run: Run,
    *,
    M: int | Iterable[int] | None = None,
    recipe: str | Iterable[str] | None = None,
    card: str | None = None,
) -> list[Speedup]:
    """Per point of every recipe but bf16 (stored order): net fwd+bwd and per-GEMM speedups over bf16."""
    records = select(run, M=M, card=card)
    index = baseline_index(records)
    wanted = _as_set(recipe)
    by_point: dict[Point, dict[tuple[str, str], Record]] = {}
    for r in records:
        if r.point.recipe != "bf16" and (wanted is None or r.point.recipe in wanted) and r.ok:
            by_point.setdefault(r.point, {})[(r.pass_name, r.category)] = r

    def times(stages: dict[tuple[str, str], Record], pass_name: str, category: str) -> tuple[float | None, ...]:
        r = stages.get((pass_name, category))
        base = baseline_of(r, index) if r else None
        return (base.median_us if base else None), (r.median_us if r else None)

    return [
        Speedup(
            point,
            *times(stages, "end_to_end", "end_to_end"),
            gemm={p: _ratio(*times(stages, p, "gemm")) for p in GEMM_SPEEDUP_COLUMNS},
            measured=all(r.measured for r in stages.values()),
        )
        for point, stages in by_point.items()
    ]


def speedup_rows(
    run: Run,
    *,
    M: int | Iterable[int] | None = None,
    recipe: str | Iterable[str] | None = None,
    card: str | None = None,
) -> list[Row]:
    """Speedup over bf16 per point: net fwd+bwd (bf16 end_to_end time / the recipe's) and per GEMM
    (2D x 3D forward, 2D x 3D dA, 2D x 2D dB), each over the bf16 GEMM of the same pass and point."""
    found = speedups(run, M=M, recipe=recipe, card=card)
    lead = _point_cells([s.point for s in found], always=("M", "N", "K", "G", "recipe"))
    return [
        {
            **lead(s.point),
            "bf16 fwd+bwd (us)": _num(s.bf16_us, 1),
            "Recipe fwd+bwd (us)": _num(s.recipe_us, 1),
            "Net speedup": _times(s.net),
            **{column: _times(s.gemm[p]) for p, column in GEMM_SPEEDUP_COLUMNS.items()},
            "Source": "measured" if s.measured else MODEL_MARK,
        }
        for s in found
    ]


def energy_per_call_j(r: Record) -> float | None:
    return r.telemetry.get(ENERGY_KEY)


def power_rows(
    run: Run,
    *,
    passes: str | Iterable[str] | None = None,
    M: int | Iterable[int] | None = None,
    recipe: str | Iterable[str] | None = None,
    card: str | None = None,
    denominator: str | None = "datasheet",
    peaks: dict | None = None,
) -> list[Row]:
    """Per stage, one row per power limit: time, efficiency, energy per call and median SM clock.

    Rows are grouped by (point without its limit, pass, stage) and ordered by limit, the card's own limit
    ("as found") first.
    """
    records = select(run, passes=passes, M=M, recipe=recipe, card=card)
    pk = _peaks(run, denominator, peaks)
    lead = _point_cells([r.point for r in records], exclude=("power_limit_w",))
    points = _first_seen(replace(r.point, power_limit_w=None) for r in records)
    stages = _first_seen((r.pass_name, r.stage) for r in records)

    def key(r: Record):
        limit = r.point.power_limit_w
        where = (points[replace(r.point, power_limit_w=None)], _pass_order(r), stages[r.pass_name, r.stage])
        return (*where, limit is not None, limit or 0)

    rows = []
    for r in sorted(records, key=key):
        cells = _stage_cells(r, pk)
        energy = energy_per_call_j(r)
        clock = r.telemetry.get(SM_CLOCK_KEY)
        rows.append(
            {
                **lead(r.point),
                "Pass": PASS_TITLES.get(r.pass_name, r.pass_name),
                "Stage": r.stage,
                "Power limit (W)": _fmt_point_field(r.point.power_limit_w),
                "Time (us)": cells["Time (us)"],
                "Efficiency": cells["Efficiency"],
                "Energy/call (mJ)": _num(energy * 1e3 if energy is not None else None, 3),
                "SM clock (MHz)": _num(clock, 0),
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------- rendering

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


def header_block(run: Run, peaks: dict | None = None, fmt: str = "markdown") -> str:
    """What a table came from: card (and spec), denominators, mxbench version and commit, command, timing."""
    meta = run.meta
    card = card_label(run)
    if meta.get("measured") is not False and meta.get("hardware"):
        card += f" (spec {meta['hardware']})"
    version = str(meta.get("mxbench", "unknown"))
    if meta.get("git_commit"):
        version += f", commit {meta['git_commit']}"
    timing = meta.get("timing")
    lines = [
        ("Card", card),
        ("Denominators", _denominator_text(peaks)),
        ("mxbench", version),
        ("Command", meta.get("command") or "unknown"),
    ]
    if timing:
        text = timing if isinstance(timing, str) else ", ".join(f"{k}={v}" for k, v in timing.items())
        lines.append(("Timing", text))
    if fmt in ("markdown", "github"):
        return "\n".join(f"- **{k}:** " + (f"`{v}`" if k == "Command" else v) for k, v in lines) + "\n"
    return "\n".join(f"{k}: {v}" for k, v in lines) + "\n"


TABLES: dict[str, Callable[..., list[Row]]] = {
    "breakdown": breakdown_rows,
    "speedup": speedup_rows,
    "sweep": sweep_rows,
    "power": power_rows,
}


def table(
    run: Run,
    kind: str = "breakdown",
    fmt: str = "markdown",
    *,
    columns: list[str] | None = None,
    denominator: str | None = "datasheet",
    header: bool = True,
    **filters: Any,
) -> str:
    """One table of ``run`` rendered in ``fmt``, preceded (except in csv) by its header block.

    ``kind``: "breakdown" | "speedup" | "sweep" | "power"; ``filters`` go to the row builder (passes, M, recipe,
    card); ``denominator``: "datasheet" | "measured" (see ``peaks_for_run``) or None for no efficiency column
    values (speedups need none).
    """
    if kind not in TABLES:
        raise InputError(f"kind must be one of {list(TABLES)}, got {kind!r}")
    peaks = {} if kind == "speedup" else _peaks(run, denominator, None)
    if kind != "speedup":
        filters = {**filters, "peaks": peaks}
    text = render(TABLES[kind](run, **filters), fmt, columns)
    if header and fmt != "csv":
        text = header_block(run, peaks, fmt) + "\n" + text
    return text


# ---------------------------------------------------------------------------------------------- comparison


class CompareError(InputError):
    """Two runs that must not be compared (different cards without ``force``)."""


DEFAULT_DELTAS = {"gemm": 0.03, "end_to_end": 0.03, "quantize": 0.07, "rearrange": 0.07, "pad": 0.07}
VERDICTS = ("SLOWER", "UNSURE", "SAME", "FASTER")
"""The verdicts, worst first."""
MIN_SAMPLES = 3
"""Fewer measured samples than this on either side cannot bound a ratio: the verdict is UNSURE."""


@dataclass(frozen=True)
class Thresholds:
    """Practical significance: a relative change ``delta`` per category and an absolute floor in microseconds."""

    deltas: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_DELTAS))
    floor_us: float = 1.0
    default_delta: float = 0.07

    def delta(self, category: str) -> float:
        return self.deltas.get(category, self.default_delta)


_KEY_FIELDS = ("M", "N", "K", "G", "recipe", "mode", "groups", "power_limit_w")


@dataclass(frozen=True)
class MatchKey:
    """What pairs a record of one run with a record of another: the point without its seed, pass and stage."""

    M: int
    N: int
    K: int
    G: int
    recipe: str
    mode: str
    groups: str
    power_limit_w: float | None
    pass_name: str
    stage: str

    @classmethod
    def of(cls, r: Record) -> MatchKey:
        return cls(*(getattr(r.point, f) for f in _KEY_FIELDS), r.pass_name, r.stage)

    def point_label(self) -> str:
        pl = "" if self.power_limit_w is None else f" @{self.power_limit_w:g}W"
        return f"M={self.M} N={self.N} K={self.K} G={self.G} {self.recipe}/{self.mode} {self.groups}{pl}"


@dataclass(frozen=True)
class Match:
    """One matched stage: medians, the ratio new/base with its bootstrap 95% CI, and the verdict with why."""

    key: MatchKey
    category: str
    kernel: str
    base_us: float
    new_us: float
    ratio: float
    ci: tuple[float, float]
    verdict: str
    reason: str
    cycles_ratio: float | None = None


@dataclass
class Comparison:
    """``matches`` in base order; ``only_base``/``only_new``: stages with no counterpart; ``broken``: stages that
    completed in base but only errored in new."""

    base_card: str
    new_card: str
    matches: list[Match]
    only_base: list[MatchKey] = field(default_factory=list)
    only_new: list[MatchKey] = field(default_factory=list)
    broken: list[MatchKey] = field(default_factory=list)
    forced: bool = False

    def by_verdict(self, verdict: str) -> list[Match]:
        return [m for m in self.matches if m.verdict == verdict]

    @property
    def exit_code(self) -> int:
        """1 if any stage is SLOWER or broke (ran in base, errors now), else 0."""
        return 1 if self.by_verdict("SLOWER") or self.broken else 0

    def summary(self) -> str:
        counts = ", ".join(f"{len(self.by_verdict(v))} {v}" for v in VERDICTS)
        geo = float(np.exp(np.mean(np.log([m.ratio for m in self.matches])))) if self.matches else float("nan")
        cards = self.base_card if self.base_card == self.new_card else f"{self.base_card} vs {self.new_card} (forced)"
        text = f"{cards}: {counts}; geomean new/base {geo:.3f} over {len(self.matches)} stages"
        extra = [
            f"{len(xs)} {what}"
            for xs, what in ((self.broken, "broken"), (self.only_base, "only in base"), (self.only_new, "only in new"))
            if xs
        ]
        return text + ("; " + ", ".join(extra) if extra else "")


@dataclass
class _Side:
    """A run's completed records of one key, pooled (several seeds or rounds of the same stage)."""

    records: list[Record]

    @property
    def samples(self) -> np.ndarray:
        return np.array([s for r in self.records for s in (r.samples_us or [r.model_us])], dtype=np.float64)

    @property
    def measured(self) -> bool:
        return all(r.measured for r in self.records)

    @property
    def clock_mhz(self) -> float | None:
        clocks = [r.telemetry.get(SM_CLOCK_KEY) for r in self.records]
        return float(np.mean(clocks)) if clocks and all(c for c in clocks) else None


def _pool(run: Run) -> tuple[dict[MatchKey, _Side], set[MatchKey]]:
    """Completed records by key, and the keys that only errored."""
    ok: dict[MatchKey, _Side] = {}
    failed: set[MatchKey] = set()
    for r in run.records:
        key = MatchKey.of(r)
        if r.ok:
            ok.setdefault(key, _Side([])).records.append(r)
        else:
            failed.add(key)
    return ok, failed - set(ok)


def _resampled_medians(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of ``resamples`` resamples (with replacement) of ``x``.

    On sorted samples the middle order statistics of the resampled *indices* pick the resampled median, and
    partitioning small integers is several times cheaper than taking medians of the gathered floats.
    """
    xs = np.sort(x)
    n = xs.size
    lo, hi = (n - 1) // 2, n // 2
    idx = np.partition(rng.integers(0, n, (resamples, n)), (lo, hi), axis=1)
    return (xs[idx[:, lo]] + xs[idx[:, hi]]) / 2


def _bootstrap_ratio_ci(
    base: np.ndarray, new: np.ndarray, rng: np.random.Generator, resamples: int
) -> tuple[float, float]:
    """95% percentile CI of median(new) / median(base), each side resampled with replacement on its own."""
    ratios = _resampled_medians(new, rng, resamples) / _resampled_medians(base, rng, resamples)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def _key_seed(key: MatchKey) -> int:
    """A per-key stream, so a stage's CI does not depend on which other stages are compared with it."""
    return zlib.crc32(repr(key).encode())


def _verdict(ci: tuple[float, float], base_us: float, new_us: float, delta: float, floor_us: float) -> tuple[str, str]:
    lo, hi = ci
    diff = new_us - base_us
    band = f"[{1 - delta:.3f}, {1 + delta:.3f}]"
    if lo > 1 + delta and diff > floor_us:
        return "SLOWER", f"CI above {1 + delta:.3f} and +{diff:.1f} us"
    if hi < 1 - delta and -diff > floor_us:
        return "FASTER", f"CI below {1 - delta:.3f} and {diff:.1f} us"
    if 1 - delta <= lo and hi <= 1 + delta:
        return "SAME", f"CI within {band}"
    if max(abs(lo - 1), abs(hi - 1)) * base_us <= floor_us:
        return "SAME", f"any change within the {floor_us:g} us floor"
    return "UNSURE", f"CI [{lo:.3f}, {hi:.3f}] neither clear of nor within {band}"


def _in_cycles(
    verdict: str, reason: str, ci: tuple[float, float], base_mhz: float, new_mhz: float, delta: float
) -> tuple[str, str]:
    """time x clock = cycles: a change in time that the clocks explain is not the code's doing."""
    clock = new_mhz / base_mhz
    change = f"({base_mhz:.0f} -> {new_mhz:.0f} MHz)"
    if verdict == "SLOWER" and ci[0] * clock <= 1 + delta:
        return "UNSURE", f"clock drop {change}: not slower in cycles"
    if verdict == "FASTER" and ci[1] * clock >= 1 - delta:
        return "UNSURE", f"clock rise {change}: not faster in cycles"
    return verdict, reason


def _compare_one(key: MatchKey, b: _Side, n: _Side, th: Thresholds, seed: int, resamples: int) -> Match:
    bs, ns = b.samples, n.samples
    base_us, new_us = float(np.median(bs)), float(np.median(ns))
    ratio = new_us / base_us
    category = b.records[0].category
    delta = th.delta(category)
    cycles = None
    fewest = min((s.size for s, side in ((bs, b), (ns, n)) if side.measured), default=MIN_SAMPLES)
    if fewest < MIN_SAMPLES:
        ci, verdict, reason = (ratio, ratio), "UNSURE", f"too few samples ({fewest})"
    else:
        ci = _bootstrap_ratio_ci(bs, ns, np.random.default_rng([seed, _key_seed(key)]), resamples)
        verdict, reason = _verdict(ci, base_us, new_us, delta, th.floor_us)
        if b.clock_mhz and n.clock_mhz:
            cycles = ratio * n.clock_mhz / b.clock_mhz
            verdict, reason = _in_cycles(verdict, reason, ci, b.clock_mhz, n.clock_mhz, delta)
    return Match(key, category, n.records[0].kernel, base_us, new_us, ratio, ci, verdict, reason, cycles)


def compare_runs(
    base: Run,
    new: Run,
    *,
    force: bool = False,
    thresholds: Thresholds | None = None,
    seed: int = 0,
    resamples: int = 2000,
) -> Comparison:
    """Verdict per stage of ``new`` against ``base``: FASTER / SAME / SLOWER / UNSURE.

    Records pair by ``MatchKey`` (point without seed, pass, stage); records of one key in one run pool their
    samples. Per pair: r = median(new) / median(base) and a bootstrap 95% CI of r (``resamples`` resamples of
    each side's stored samples, seeded by ``seed`` and the key). SLOWER needs the CI's lower bound above
    1 + delta(category) and new - base above ``floor_us``; FASTER mirrors it; SAME: the CI lies within
    [1 - delta, 1 + delta] (or any change it allows is under the floor); UNSURE otherwise. When both records carry
    telemetry ``sm_clock_mhz``, a SLOWER (FASTER) in time that is not so in cycles (time x clock) becomes UNSURE.
    Runs of different cards (a model run counts as its spec's own card) raise ``CompareError`` unless ``force``.
    """
    base_card, new_card = card_label(base), card_label(new)
    if base_card != new_card and not force:
        raise CompareError(
            f"runs come from different cards ({base_card!r} vs {new_card!r}); timings across cards are not "
            "comparable (use force=True / --force to compare anyway)"
        )
    if resamples < 100:
        raise InputError(f"resamples must be >= 100, got {resamples}")
    th = thresholds or Thresholds()
    b_ok, _ = _pool(base)
    n_ok, n_failed = _pool(new)
    matches = [_compare_one(k, side, n_ok[k], th, seed, resamples) for k, side in b_ok.items() if k in n_ok]
    return Comparison(
        base_card=base_card,
        new_card=new_card,
        matches=matches,
        only_base=[k for k in b_ok if k not in n_ok and k not in n_failed],
        only_new=[k for k in n_ok if k not in b_ok],
        broken=[k for k in b_ok if k in n_failed],
        forced=base_card != new_card,
    )


def comparison_rows(cmp: Comparison) -> list[Row]:
    """One row per matched stage, then one per broken stage; ratio and CI as new/base."""
    rows: list[Row] = [
        {
            "Point": m.key.point_label(),
            "Pass": PASS_TITLES.get(m.key.pass_name, m.key.pass_name),
            "Stage": m.key.stage,
            "Base (us)": _num(m.base_us, 1),
            "New (us)": _num(m.new_us, 1),
            "New/base": f"{m.ratio:.3f}",
            "95% CI": f"[{m.ci[0]:.3f}, {m.ci[1]:.3f}]",
            "Verdict": m.verdict,
            "Why": m.reason,
        }
        for m in cmp.matches
    ]
    rows += [
        {
            "Point": k.point_label(),
            "Pass": PASS_TITLES.get(k.pass_name, k.pass_name),
            "Stage": k.stage,
            "Verdict": "BROKEN",
            "Why": "ran in base, only errors in new",
        }
        for k in cmp.broken
    ]
    return rows
