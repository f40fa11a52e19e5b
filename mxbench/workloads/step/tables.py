"""The step's tables of stored runs (breakdown, speedup, sweep, power), built with pandas on the frame of
``views.frame``: every table selects its records with the same ``frame.select``, so a filter means the same in
each, and one that matches nothing says what the run does hold.

Row builders take a ``Run`` or a frame and the ``TableOptions`` (which records, against which peaks) and return
lists of dicts (column name -> display string, None where a cell has no value). Every efficiency cell names its
denominator; model rows say "model, not measured". ``rows_table`` renders one of them (``render``) under its
header block.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from mxkernels.core.errors import InputError
from mxkernels.core.names import MEMORY_CATEGORIES, OURS

from ...instruments.roofline import MODEL_AT_PEAK, peaks_for_run
from ...storage.results import IMPOSSIBLE, Run
from ...views.frame import PASS_TITLES, POINT_FIELDS, efficiency, frame_of, select
from ...views.render import MODEL_MARK, Row, header_block, render

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
    "fuse_scales": "Fused scales",
}
# The per-GEMM speedup columns: which pass's GEMM, in the operand shapes it multiplies.
GEMM_SPEEDUP_COLUMNS = {
    "forward": "Fwd GEMM 2Dx3D",
    "backward_input": "dA GEMM 2Dx3D",
    "backward_weight": "dB GEMM 2Dx2D",
}
BASELINE_RECIPE = "bf16"
POINT_KEY = ["file", *POINT_FIELDS]
"""What names one point of one run in a frame of several runs."""
STEP_KEY = ["file", *(f for f in POINT_FIELDS if f not in ("recipe", "mode", "fuse_scales", "wgrad"))]
"""A point without its recipe: where a recipe's step finds its bf16 counterpart, the same point of the same run
in any scale mode (it means nothing to bf16)."""


# ---------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class TableOptions:
    """What a table of stored runs shows: the records ``frame.select`` keeps (each filter None: no filter), and
    what its efficiency cells are against: ``peaks`` when given, else the run's peaks of ``denominator``
    ("datasheet" | "measured", ``peaks_for_run``; for a frame, its stored ``eff_<denominator>_pct``; None: blank).
    Tables without efficiencies (speedup, peers) read only the filters."""

    passes: str | Iterable[str] | None = None
    M: int | Iterable[int] | None = None
    recipe: str | Iterable[str] | None = None
    card: str | None = None
    denominator: str | None = "datasheet"
    peaks: Mapping | None = None

    def select(self, df: pd.DataFrame, **instead: Any) -> pd.DataFrame:
        """The rows of ``df`` that every filter keeps; ``instead`` replaces filters (None: that one not applied)."""
        filters = {"passes": self.passes, "M": self.M, "recipe": self.recipe, "card": self.card}
        return select(df, **{**filters, **instead})


ALL = TableOptions()
"""Every record, efficiency against the datasheet."""


# ---------------------------------------------------------------------------------------------- frames


def as_frame(data: Run | pd.DataFrame) -> pd.DataFrame:
    return frame_of(data) if isinstance(data, Run) else data


def _efficiency(data: Run | pd.DataFrame, df: pd.DataFrame, options: TableOptions):
    """(percent, label) per row of ``df``: against ``options.peaks`` when given; else, for a Run, its peaks of
    ``options.denominator``; for a frame, its stored ``eff_<denominator>_pct`` columns; no denominator: none."""
    denominator, peaks = options.denominator, options.peaks
    if peaks is None and denominator and isinstance(data, Run):
        peaks = peaks_for_run(data, denominator)
    if peaks is not None:
        return efficiency(df, peaks)
    if denominator:
        return df[f"eff_{denominator}_pct"], df[f"peak_{denominator}"]
    return pd.Series(float("nan"), index=df.index), pd.Series(None, index=df.index, dtype=object)


def first_seen(df: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Rank of each row's ``columns`` values by first appearance (a sweep stores points in plan order)."""
    return df.groupby(columns, sort=False, dropna=False).ngroup()


def pass_rank(df: pd.DataFrame) -> pd.Series:
    order = {p: i for i, p in enumerate(PASS_TITLES)}
    return df["pass_name"].map(order).fillna(len(order))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    """Grouped by point (stored order), then by pass; stages keep their pipeline order inside a pass."""
    keys = pd.DataFrame({"point": first_seen(df, POINT_KEY), "pass": pass_rank(df)})
    return df.loc[keys.sort_values(["point", "pass"], kind="stable").index]


# ---------------------------------------------------------------------------------------------- cells


def present(x: Any) -> bool:
    """A cell value: not None and not NaN (pandas' marker of a missing number)."""
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def num_text(x: float | None, digits: int) -> str | None:
    return f"{x:.{digits}f}" if present(x) else None


def _times(x: float | None) -> str | None:
    return f"{x:.3f}x" if present(x) else None


def _point_cells(df: pd.DataFrame, always: Iterable[str] = (), exclude: Iterable[str] = ()) -> Callable[[Any], Row]:
    """Leading cells naming a point: the fields in ``always`` plus every field that varies among ``df``'s rows."""
    keep = [f for f in _POINT_COLUMNS if f not in exclude and (f in always or df[f].nunique(dropna=False) > 1)]

    def cells(row: Any) -> Row:
        return {_POINT_COLUMNS[f]: point_text(getattr(row, f)) for f in keep}

    return cells


def point_text(v: Any) -> str:
    if not present(v):
        return "as found"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _failure_text(error: str | None, impossible: str | None = None) -> str:
    """The first line of an error row's message (an error row shows it in place of its time); an IMPOSSIBLE
    row's status and why."""
    if present(impossible):
        return f"{IMPOSSIBLE}: {impossible[:100]}"
    lines = (error or "").strip().splitlines()
    return f"error: {lines[0][:100]}" if lines else "no result"


def _stage_cells(row: Any, pct: float, label: str | None) -> Row:
    """Time, spread, throughput and efficiency of one record; model and error rows say what they are."""
    if not row.ok:
        return {"Time (us)": _failure_text(row.error, getattr(row, "impossible", None)),
                **dict.fromkeys(("IQR (us)", "GB/s", "TFLOP/s", "Efficiency"))}  # fmt: skip
    return {
        "Time (us)": num_text(row.median_us, 1),
        "IQR (us)": num_text(row.iqr_us, 1) if row.measured else MODEL_MARK,
        "GB/s": num_text(row.gbps, 0) if row.category in MEMORY_CATEGORIES else None,
        "TFLOP/s": num_text(row.tflops, 1) if row.flops else None,
        "Efficiency": (f"{pct:.1f}% of {label}" if row.measured else MODEL_AT_PEAK)
        if present(label) and present(pct) else None,
    }  # fmt: skip


def _rows_with_cells(df: pd.DataFrame, pct: pd.Series, label: pd.Series):
    """Each row of ``df`` with its stage cells."""
    for row in df.itertuples(index=True):
        yield row, _stage_cells(row, pct[row.Index], label[row.Index])


# ---------------------------------------------------------------------------------------------- row builders


def breakdown_rows(data: Run | pd.DataFrame, options: TableOptions = ALL) -> list[Row]:
    """The "Kernel Microbenchmarks: Breakdown by Pass" table: one row per kernel of each pass at one M.

    ``options.M`` (one M) None takes the largest M of the run; ``recipe`` None shows every recipe but the bf16
    baseline (unless the run holds nothing else). End-to-end rows belong to ``speedup_rows``.
    """
    df = options.select(as_frame(data), M=None)
    df = df[df["category"] != "end_to_end"]
    if df.empty:
        return []
    if options.recipe is None and (df["recipe"] != BASELINE_RECIPE).any():
        df = df[df["recipe"] != BASELINE_RECIPE]
    df = _sorted(select(df, M=int(df["M"].max()) if options.M is None else options.M))
    pct, label = _efficiency(data, df, options)
    lead = _point_cells(df)
    impl = _impl_cell(df)
    return [
        {
            **lead(row),
            "Pass": PASS_TITLES.get(row.pass_name, row.pass_name),
            **impl(row),
            "Kernel": row.kernel,
            "Purpose": row.purpose,
            "Input shape": row.shape,
            **cells,
        }
        for row, cells in _rows_with_cells(df, pct, label)
    ]


def sweep_rows(data: Run | pd.DataFrame, options: TableOptions = ALL) -> list[Row]:
    """Every stage at every point (bf16 baseline and end-to-end rows included), M always named."""
    df = _sorted(options.select(as_frame(data)))
    pct, label = _efficiency(data, df, options)
    lead = _point_cells(df, always=("M",))
    impl = _impl_cell(df)
    return [
        {**lead(row), "Pass": PASS_TITLES.get(row.pass_name, row.pass_name), "Stage": row.stage, **impl(row),
         "Kernel": row.kernel, **cells}
        for row, cells in _rows_with_cells(df, pct, label)
    ]  # fmt: skip


def _impl_cell(df: pd.DataFrame) -> Callable[[Any], Row]:
    """An "Implementation" cell per row where some stage ran another implementation than ours (``--impl``)."""
    if (df["impl"] == OURS).all():
        return lambda row: {}
    return lambda row: {"Implementation": row.impl}


def _ratio(base_us: float | None, us: float | None) -> float | None:
    return base_us / us if present(base_us) and present(us) and base_us and us else None


def speedups(data: Run | pd.DataFrame, options: TableOptions = ALL) -> pd.DataFrame:
    """Per point of every recipe but bf16 (stored order): net fwd+bwd and per-GEMM speedups over bf16.

    Columns: ``POINT_KEY``; ``bf16_us`` / ``recipe_us`` (fwd+bwd medians); ``net`` (bf16 / recipe); ``gemm_<pass>``
    (bf16 GEMM time / the recipe's, per pass); ``measured`` (every stage of the point a measurement). NaN where
    either side is missing. A point's bf16 counterpart is the bf16 record of the same run, point (any scale mode),
    pass and category. ``options``: M, recipe and card (a whole step has no pass to choose).
    """
    if options.passes is not None:
        raise InputError("the speedup table compares whole steps: no pass to choose")
    recipe = options.recipe
    df = options.select(as_frame(data), recipe=None)
    if recipe is not None:
        select(df[df["recipe"] != BASELINE_RECIPE], recipe=recipe)  # names what the run holds if it matches nothing
    done = df[df["ok"]]
    stage = ["pass_name", "category"]
    # a later record of the same key replaces an earlier one (a point measured twice: the last record counts)
    base = done[done["recipe"] == BASELINE_RECIPE].drop_duplicates([*STEP_KEY, *stage], keep="last")
    mine = done[done["recipe"] != BASELINE_RECIPE]
    if recipe is not None:
        mine = mine[mine["recipe"].isin(_listed(recipe))]
    mine = mine.assign(order=first_seen(mine, POINT_KEY)).drop_duplicates([*POINT_KEY, *stage], keep="last")
    base = base[[*STEP_KEY, *stage, "median_us"]].rename(columns={"median_us": "base_us"})
    paired = mine.merge(base, on=[*STEP_KEY, *stage], how="left").sort_values("order", kind="stable")
    rows = []
    for _, point in paired.groupby(POINT_KEY, sort=False, dropna=False):
        by = {(r.pass_name, r.category): r for r in point.itertuples()}
        e2e = by.get(("end_to_end", "end_to_end"))
        gemm = {p: by.get((p, "gemm")) for p in GEMM_SPEEDUP_COLUMNS}
        first = point.iloc[0]
        rows.append({
            **{c: first[c] for c in POINT_KEY},
            "bf16_us": e2e.base_us if e2e else None,
            "recipe_us": e2e.median_us if e2e else None,
            **{f"gemm_{p}": _ratio(r.base_us, r.median_us) if r else None for p, r in gemm.items()},
            "measured": bool(point["measured"].all()),
        })  # fmt: skip
    out = pd.DataFrame(rows, columns=[*POINT_KEY, "bf16_us", "recipe_us", *(f"gemm_{p}" for p in GEMM_SPEEDUP_COLUMNS),
                                      "measured"])  # fmt: skip
    out.insert(out.columns.get_loc("recipe_us") + 1, "net", [_ratio(b, r) for b, r in zip(out.bf16_us, out.recipe_us,
                                                                                           strict=True)])  # fmt: skip
    return out


def _listed(x: str | Iterable[str]) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


def speedup_rows(data: Run | pd.DataFrame, options: TableOptions = ALL) -> list[Row]:
    """Speedup over bf16 per point: net fwd+bwd (bf16 end_to_end time / the recipe's) and per GEMM
    (2D x 3D forward, 2D x 3D dA, 2D x 2D dB), each over the bf16 GEMM of the same pass and point."""
    found = speedups(data, options)
    lead = _point_cells(found, always=("M", "N", "K", "G", "recipe"))
    return [
        {
            **lead(s),
            "bf16 fwd+bwd (us)": num_text(s.bf16_us, 1),
            "Recipe fwd+bwd (us)": num_text(s.recipe_us, 1),
            "Net speedup": _times(s.net),
            **{column: _times(getattr(s, f"gemm_{p}")) for p, column in GEMM_SPEEDUP_COLUMNS.items()},
            "Source": "measured" if s.measured else MODEL_MARK,
        }
        for s in found.itertuples()
    ]


def power_rows(data: Run | pd.DataFrame, options: TableOptions = ALL) -> list[Row]:
    """Per stage, one row per power limit: time, efficiency, energy per call and median SM clock.

    Rows are grouped by (point without its limit, pass, stage) and ordered by limit, the card's own limit
    ("as found") first.
    """
    df = options.select(as_frame(data))
    limit = df["power_limit_w"]
    keys = pd.DataFrame({
        "point": first_seen(df, [c for c in POINT_KEY if c != "power_limit_w"]),
        "pass": pass_rank(df),
        "stage": first_seen(df, ["pass_name", "stage"]),
        "set": limit.notna(),
        "limit": limit.fillna(0),
    })  # fmt: skip
    df = df.loc[keys.sort_values(list(keys.columns), kind="stable").index]
    pct, label = _efficiency(data, df, options)
    lead = _point_cells(df, exclude=("power_limit_w",))
    return [
        {
            **lead(row),
            "Pass": PASS_TITLES.get(row.pass_name, row.pass_name),
            "Stage": row.stage,
            "Power limit (W)": point_text(row.power_limit_w),
            "Time (us)": cells["Time (us)"],
            "Efficiency": cells["Efficiency"],
            "Energy/call (mJ)": num_text(row.energy_j_per_call * 1e3, 3),
            "SM clock (MHz)": num_text(row.sm_clock_mhz, 0),
        }
        for row, cells in _rows_with_cells(df, pct, label)
    ]


# ---------------------------------------------------------------------------------------------- one table


STEP_ROWS: dict[str, Callable[[Run | pd.DataFrame, TableOptions], list[Row]]] = {
    "breakdown": breakdown_rows,
    "speedup": speedup_rows,
    "sweep": sweep_rows,
    "power": power_rows,
}
"""The tables of a run of the step (``roofline``, ``regress``), in the order ``table --kind`` lists them."""
_NO_DENOMINATOR = ("speedup",)
"""Tables without an efficiency column (and so without denominators in their header)."""


def rows_table(
    run: Run,
    rows: Callable[[Run, TableOptions], list[Row]],
    fmt: str = "markdown",
    *,
    columns: list[str] | None = None,
    denominator: str | None = "datasheet",
    efficiencies: bool = True,
    header: bool = True,
    **filters: Any,
) -> str:
    """The rows ``rows(run, TableOptions(**filters, ...))`` builds, rendered in ``fmt`` and preceded (except in csv)
    by the run's header block. ``efficiencies``: the rows have an efficiency column, against the run's peaks of
    ``denominator`` ("datasheet" | "measured", see ``peaks_for_run``; None: no values)."""
    peaks = (peaks_for_run(run, denominator) if denominator else {}) if efficiencies else {}
    text = render(rows(run, TableOptions(**filters, denominator=denominator, peaks=peaks)), fmt, columns)
    if header and fmt != "csv":
        text = header_block(run, peaks, fmt) + "\n" + text
    return text


def step_table(run: Run, kind: str = "breakdown", fmt: str = "markdown", **kwargs: Any) -> str:
    """One of the step's tables of ``run`` (``STEP_ROWS``: "breakdown" | "speedup" | "sweep" | "power");
    ``kwargs`` as ``rows_table`` takes them (filters: passes, M, recipe, card)."""
    return rows_table(run, STEP_ROWS[kind], fmt, efficiencies=kind not in _NO_DENOMINATOR, **kwargs)
