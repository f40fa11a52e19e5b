"""Tables of stored runs: which records a table shows, and its rows (breakdown, speedup, sweep, power).

Row builders return lists of dicts (column name -> display string, None where a cell has no value) built only
from stored Records, so any past run renders again. Every efficiency cell names its denominator; model rows say
"model, not measured". ``table`` renders one of them (``render``) under its header block.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from mxkernels.errors import InputError

from .render import MODEL_MARK, Row, header_block, render
from .results import Point, Record, Run
from .roofline import MEMORY_CATEGORIES, achieved_tbps, achieved_tflops, efficiency, peaks_for_run

PASS_TITLES = {
    "forward": "Forward",
    "backward_input": "Backward (dA)",
    "backward_weight": "Backward (dB)",
    "end_to_end": "End to end",
}
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


# ---------------------------------------------------------------------------------------------- one table


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
