"""What another card (a B200) would do with a measured run: each kernel keeps the fraction of its roof it reached
on the card that ran it, and that fraction of the other card's roof gives its projected time.

A data-movement kernel that moved its bytes at e% of this card's datasheet bandwidth is projected at e% of the
target's; a GEMM at e% of the compute roof of its precision likewise. A card without MX tensor cores (Hopper)
runs an MXFP8 GEMM by another route (dequantize, then a bf16 GEMM), whose fraction of an fp8 roof says nothing
about a native block-scaled MMA: there the MXFP8 GEMM is carried over at the efficiency the card's bf16 GEMM of
the same pass and point reached (its tensor-core GEMM of that shape), and the table says so. Datasheet roofs on
both sides: the target's measured ceilings are not known here. Nothing is added for launches, so the projection
of a kernel of a few microseconds is optimistic.

Beside it, the peak model prices every stage's declared cost at the target's roofs (``roofline.model_time_us``).
Labelled everywhere "projection from <card> efficiencies".
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from mxkernels.core.errors import InputError
from mxkernels.core.names import MEMORY_CATEGORIES

from ...instruments.cards import DEFAULT_CARD
from ...instruments.hardware import HardwareSpec, datasheet_peaks, get_spec
from ...instruments.roofline import cost_of, gemm_peak, model_step_us, model_time_us
from ...storage.results import Run
from ...views.frame import PASS_TITLES, efficiency, select
from ...views.render import Row, header_block, render
from .tables import BASELINE_RECIPE, GEMM_SPEEDUP_COLUMNS, POINT_KEY, STEP_KEY, as_frame, speedups

STEP_PASSES = tuple(p for p in PASS_TITLES if p != "end_to_end")


def _key(df: pd.DataFrame, columns: list[str]) -> pd.Series:
    """``columns`` of each row as one string: a key that missing values (no file, no power limit) cannot break."""
    return pd.Series(["|".join(map(str, values)) for values in df[columns].itertuples(index=False)], index=df.index)


def source_label(card: str) -> str:
    return f"projection from {card} efficiencies"


# ---------------------------------------------------------------------------------------------- projecting


def _source_spec(df: pd.DataFrame) -> HardwareSpec:
    keys = [k for k in dict.fromkeys(df["hardware"]) if isinstance(k, str)]
    if not keys:
        raise InputError("a projection needs the run's hardware spec (meta['hardware']): this run names none")
    if len(keys) > 1:
        raise InputError(f"a projection carries one card's efficiencies: these runs name specs {keys}")
    return get_spec(keys[0])


def project(data: Run | pd.DataFrame, target: str = DEFAULT_CARD) -> pd.DataFrame:
    """The measured stages of the three passes with their projected time on ``target``.

    Added columns: ``carried_pct`` (the efficiency carried over, % of ``carried_peak`` on this card),
    ``carried_from`` ("own" or "bf16 GEMM": where it came from), ``target_peak`` (the roof it is applied to),
    ``projected_us`` and ``model_us`` (the target's peak model of the stage).
    """
    df = as_frame(data)
    measured = df[df["measured"] & df["ok"] & df["pass_name"].isin(STEP_PASSES)]
    if measured.empty:
        what = "a model run" if len(df) and not df["measured"].any() else "no measured stages"
        raise InputError(f"--project carries measured efficiencies over to another card; this is {what}")
    source, spec = _source_spec(measured), get_spec(target)
    src_peaks, tgt_peaks = datasheet_peaks(source), datasheet_peaks(spec)
    pct, label = efficiency(measured, src_peaks)
    out = measured.assign(carried_pct=pct, carried_peak=label, carried_from="own", step=_key(measured, STEP_KEY),
                          point=_key(measured, POINT_KEY))  # fmt: skip
    if source.mxfp8_tflops is None:
        out = _mxfp8_gemms_at_bf16_efficiency(out)
    target_peak = [gemm_peak(tgt_peaks, r.precision) if r.category == "gemm" else tgt_peaks["bandwidth"]
                   for r in out.itertuples()]  # fmt: skip
    amount = out["bytes"].where(out["category"].isin(MEMORY_CATEGORIES), out["flops"])
    values = pd.Series([p.value if p else float("nan") for p in target_peak], index=out.index)
    # time = amount / (carried fraction x target roof); TB/s and TFLOP/s both move 10**6 units per microsecond
    out["projected_us"] = amount / (out["carried_pct"] / 100.0 * values * 1e6)
    out["target_peak"] = [p.label if p else None for p in target_peak]
    out["model_us"] = [model_time_us(cost_of(r), spec) for r in out.itertuples()]
    out.attrs.update(source_card=str(out["card"].iloc[0]), target=spec.name, target_key=spec.key)
    return out


def _mxfp8_gemms_at_bf16_efficiency(out: pd.DataFrame) -> pd.DataFrame:
    """MXFP8 GEMMs take the efficiency of their bf16 twin: the bf16 GEMM of the same stage name, pass and point (a
    layer has several GEMMs a pass: each its own twin), where the run measured one. A GEMM without a twin (a layer's
    shared experts as grouped GEMMs beside bf16's dense products) takes the pooled efficiency of the bf16 GEMMs of
    its pass and point (their FLOPs over the time they would take at their own efficiencies)."""
    gemm = out["category"] == "gemm"
    bf16 = out[gemm & (out["recipe"] == BASELINE_RECIPE)]
    mx = gemm & (out["recipe"] == "mxfp8")
    if not mx.any() or bf16.empty:
        return out
    twin_key = lambda df: df["step"] + "|" + df["pass_name"] + "|" + df["stage"]
    twins = bf16.assign(key=twin_key(bf16)).drop_duplicates("key", keep="last").set_index("key")
    pass_key = lambda df: df["step"] + "|" + df["pass_name"]
    pooled = bf16.assign(key=pass_key(bf16), weight=bf16["flops"] / bf16["carried_pct"]).groupby("key").agg(
        flops=("flops", "sum"), weight=("weight", "sum"), carried_peak=("carried_peak", "last"))
    pooled["carried_pct"] = pooled["flops"] / pooled["weight"]
    for keys, table, origin in ((twin_key(out), twins, "bf16 GEMM"), (pass_key(out), pooled, "bf16 GEMMs of the pass")):
        rows = mx & keys.isin(table.index) & (out["carried_from"] == "own")
        if not rows.any():
            continue
        out.loc[rows, "carried_pct"] = keys[rows].map(table["carried_pct"])
        out.loc[rows, "carried_peak"] = keys[rows].map(table["carried_peak"])
        out.loc[rows, "carried_from"] = origin
    return out


def projected_speedups(proj: pd.DataFrame) -> pd.DataFrame:
    """Per point of every recipe but bf16 (``project``'s rows): the projected fwd+bwd of both steps (their
    stages back to back), the projected net and per-GEMM speedups, and the target's peak-model net speedup."""
    spec = get_spec(proj.attrs["target_key"])
    steps = dict(list(proj[proj["recipe"] == BASELINE_RECIPE].groupby("step")))
    out = []
    for _, mine in proj[proj["recipe"] != BASELINE_RECIPE].groupby("point", sort=False):
        point = {c: mine[c].iloc[0] for c in POINT_KEY}
        bf16 = steps.get(mine["step"].iloc[0], proj.iloc[:0])
        bf16_us, recipe_us = bf16["projected_us"].sum(), mine["projected_us"].sum()
        gemm = {f"gemm_{p}": _ratio(_gemm_us(bf16, p), _gemm_us(mine, p)) for p in GEMM_SPEEDUP_COLUMNS}
        model = _ratio(model_step_us(bf16.itertuples(), spec), model_step_us(mine.itertuples(), spec))
        out.append({**point, "bf16_us": bf16_us if len(bf16) else None, "recipe_us": recipe_us,
                    "net": _ratio(bf16_us, recipe_us) if len(bf16) else None, **gemm, "model_net": model})  # fmt: skip
    return pd.DataFrame(out)


def _ratio(base: float | None, new: float | None) -> float | None:
    return base / new if base and new else None


def _gemm_us(rows: pd.DataFrame, pass_name: str) -> float | None:
    found = rows.loc[(rows["pass_name"] == pass_name) & (rows["category"] == "gemm"), "projected_us"]
    return float(found.iloc[-1]) if len(found) else None


# ---------------------------------------------------------------------------------------------- tables


def _us(x: float | None) -> str | None:
    return None if x is None or pd.isna(x) else f"{x:.1f}"


def _x(x: float | None) -> str | None:
    return None if x is None or pd.isna(x) else f"{x:.3f}x"


def projected_breakdown_rows(proj: pd.DataFrame, M: int | None = None) -> list[Row]:
    """Per stage of one M (default the largest; the recipe's stages, or bf16's if the run holds nothing else):
    the time measured here, the efficiency carried over, the projected time and the target's peak model."""
    rows = proj[proj["recipe"] != BASELINE_RECIPE] if (proj["recipe"] != BASELINE_RECIPE).any() else proj
    rows = select(rows, M=int(rows["M"].max()) if M is None else M)
    card, target = proj.attrs["source_card"], proj.attrs["target"]
    return [
        {
            "Pass": PASS_TITLES.get(r.pass_name, r.pass_name),
            "Kernel": r.kernel,
            "Input shape": r.shape,
            f"{card} (us)": _us(r.median_us),
            "Efficiency carried over": f"{r.carried_pct:.1f}% of {r.carried_peak}"
            + (" (the bf16 GEMM's: no MX tensor cores)" if r.carried_from == "bf16 GEMM" else ""),
            f"{target} projected (us)": _us(r.projected_us),
            f"{target} peak model (us)": _us(r.model_us),
        }
        for r in rows.itertuples()
    ]


def projected_speedup_rows(data: Run | pd.DataFrame, proj: pd.DataFrame) -> list[Row]:
    """Per point: the net speedup measured here, the projected fwd+bwd of both steps and their net and
    per-GEMM speedups, and the target's peak-model net speedup, side by side."""
    card, target = proj.attrs["source_card"], proj.attrs["target"]
    here = {tuple(r[c] for c in ("file", "M", "recipe")): r["net"] for _, r in speedups(as_frame(data)).iterrows()}
    return [
        {
            "M": str(s.M), "N": str(s.N), "K": str(s.K), "G": str(s.G), "Recipe": s.recipe,
            f"{card} measured net": _x(here.get((s.file, s.M, s.recipe))),
            f"{target} bf16 fwd+bwd (us)": _us(s.bf16_us),
            f"{target} recipe fwd+bwd (us)": _us(s.recipe_us),
            "Projected net speedup": _x(s.net),
            **{f"{target} {column}": _x(getattr(s, f"gemm_{p}")) for p, column in GEMM_SPEEDUP_COLUMNS.items()},
            f"{target} peak model net": _x(s.model_net),
            "Source": source_label(card),
        }
        for s in projected_speedups(proj).itertuples()
    ]  # fmt: skip


PROJECTED_KINDS = ("breakdown", "speedup")


def projection_table(run: Run, kind: str, fmt: str, target: str = DEFAULT_CARD, *, columns: list[str] | None = None,
                     header: bool = True, **filters: Any) -> str:  # fmt: skip
    """The projected breakdown or speedup table of ``run`` on ``target``, under the run's header block and a line
    that says what the projection is (``header`` False: the line only). ``filters``: ``frame.select``'s (M,
    recipe, passes, card)."""
    if kind not in PROJECTED_KINDS:
        raise InputError(f"--project shows the {' and '.join(PROJECTED_KINDS)} tables, not {kind}")
    df = as_frame(run)
    M = filters.pop("M", None) if kind == "breakdown" else None
    chosen = select(df, **filters)
    proj = project(chosen, target)
    rows = projected_breakdown_rows(proj, M) if kind == "breakdown" else projected_speedup_rows(chosen, proj)
    text = render(rows, fmt, columns)
    if fmt == "csv":
        return text
    block = header_block(run, datasheet_peaks(_source_spec(proj)), fmt) if header else ""
    return block + _projection_line(proj, fmt) + "\n" + text


def projection_note(proj: pd.DataFrame) -> str:
    """What the projection is, in one line."""
    card, target = proj.attrs["source_card"], proj.attrs["target"]
    note = f"{target} datasheet roofs, {source_label(card)} against its datasheet roofs"
    if (proj["carried_from"] == "bf16 GEMM").any():
        note += "; MXFP8 GEMMs at the bf16 GEMM's efficiency (no MX tensor cores on the card that ran them)"
    return note + "; nothing added for launches"


def _projection_line(proj: pd.DataFrame, fmt: str) -> str:
    return (
        f"- **Projection:** {projection_note(proj)}\n"
        if fmt in ("markdown", "github")
        else (f"Projection: {projection_note(proj)}\n")
    )
