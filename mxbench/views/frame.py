"""Stored runs as pandas DataFrames: one tidy row per record (``load``), one row per sample (``load_samples``), and
the record selection every table shares (``select``).

The JSON runs stay the source of truth; a frame is a view of them that a notebook can filter, pivot and plot
without learning the schema. Every column is documented in ``COLUMNS`` (the frame holds exactly those, in that
order). Values are taken from the ``Record``s as they are (medians and IQRs from ``Record.median_us`` /
``iqr_us``), so a table built on the frame prints the same digits as one built on the records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mxkernels.core.errors import InputError
from mxkernels.core.names import MEMORY_CATEGORIES, Pass

from ..instruments.hardware import Peak
from ..instruments.roofline import gemm_peak, peaks_for_run
from ..storage.results import Run, load_run
from ..storage.validation import read_json
from .render import card_label

PASS_TITLES = {
    str(Pass.FORWARD): "Forward",
    str(Pass.BACKWARD_INPUT): "Backward (dA)",
    str(Pass.BACKWARD_WEIGHT): "Backward (dB)",
    str(Pass.END_TO_END): "End to end",
}
POINT_FIELDS = ("M", "N", "K", "G", "recipe", "mode", "groups", "seed", "power_limit_w", "fuse_scales", "wgrad")
SM_CLOCK_KEY = "sm_clock_mhz"
"""Telemetry key of a record's median SM clock during its samples (MHz)."""
ENERGY_KEY = "energy_j_per_call"
"""Telemetry key of a record's energy per call (J)."""

COLUMNS = {
    # the run the record belongs to (the same on every row of a run)
    "file": "path the run was read from (None for a run given in memory)",
    "record": "index of the record in its run's JSON (0-based); with ``file`` the key of ``load_samples`` rows",
    "card": 'the card that measured the run, or for a model run the spec it priced: "b200 (model, not measured)"',
    "hardware": "key of the hardware spec the run names for its datasheet denominators (None if it names none)",
    "run_kind": '"peers" for a run of `mxbench peers`, else the run\'s meta "kind" ("roofline" when it has none)',
    "commit": 'mxbench\'s git commit the run was made at ("+dirty" when the tree had changes; None if unknown)',
    "date": "when the run was made (UTC timestamp; NaT if not recorded)",
    "mxbench": "mxbench version that made the run",
    # the sweep point
    "M": "tokens (rows of the activations)",
    "N": "expert hidden dim",
    "K": "model dim",
    "G": "local experts (token groups)",
    "recipe": '"mxfp8", "fp8_rowwise" or "bf16" (the baseline)',
    "mode": 'MX scale mode ("rceil", "floor"); meaningful only for mxfp8',
    "groups": '"balanced" or "skewed" token-group sizes',
    "seed": "seed of the inputs and of skewed group sizes",
    "power_limit_w": "power limit mxbench set (W); NaN: the card's limit as found",
    "fuse_scales": "True where the quantizers fused their scales: MXFP8's wrote the blocked scales themselves (no "
    "rearrange stages), FP8 rowwise's second copy of each tensor was scaled from column amaxes its first folded",
    "wgrad": 'the weight-gradient GEMMs\' precision: "recipe" (the recipe\'s own) or "bf16" (`--wgrad bf16`)',
    # the stage and what ran
    "pass_name": '"forward", "backward_input", "backward_weight" or "end_to_end"',
    "stage": 'the stage in its pass ("quantize_a", "gemm_fwd", ..., "fwd+bwd")',
    "kernel": "the function that ran",
    "impl": 'the implementation that ran ("mxkernels", "torchao", "torch.compile", "module:function")',
    "impl_version": 'that implementation\'s version from run.meta["implementations"] (None where not recorded)',
    "impl_commit": "that implementation's git commit, where its module lived in a checkout (else None)",
    "category": '"quantize", "rearrange", "pad", "gemm" or "end_to_end"',
    "purpose": "what the stage does, in words",
    "shape": 'the input shapes: "(M, K)" or "(M, K) @ (G, K, N)"',
    "precision": "precision of the stage's FLOPs (GEMMs), else None",
    "backend": "GEMM backend where one was chosen",
    "method": 'how it was timed ("graph-cold", "graph-warm", "events", "model")',
    # its declared cost
    "bytes_read": "bytes the stage must read (its declared cost)",
    "bytes_written": "bytes it must write, padding and zero fill included",
    "bytes": "bytes_read + bytes_written",
    "flops": "FLOPs it does (0 for data movement)",
    # how it went
    "measured": "True for a measurement, False for the analytic model (its time is the model's)",
    "ok": "True when the record has a time (not an error, not skipped, not IMPOSSIBLE)",
    "error": "the error message of a failed record, else None",
    "skipped": "why the implementation could not run on this card, else None",
    "impossible": "why the measured time is below the stage's roofline floor on the card (IMPOSSIBLE), else None",
    # its time
    "samples": "number of timing samples (0 for model, error and skipped rows)",
    "median_us": "median per-call time (us); a model row's model time; NaN when not ok",
    "iqr_us": "interquartile range of the samples (us, inclusive quartiles); NaN with fewer than 2 samples",
    "min_us": "fastest sample (us)",
    "max_us": "slowest sample (us)",
    # derived from time and cost
    "gbps": "bytes / median time, GB/s (10**9 bytes per second)",
    "tflops": "flops / median time, TFLOP/s (NaN without FLOPs)",
    "flop_per_byte": "arithmetic intensity: flops / bytes (NaN without FLOPs)",
    "eff_datasheet_pct": "percent of the datasheet roof of the run's spec (bandwidth, or the GEMM's precision)",
    "peak_datasheet": "label of that roof (None where no roof applies or the run names no spec)",
    "eff_measured_pct": "percent of the run's stored measured ceiling (NaN if it stored none)",
    "peak_measured": "label of that ceiling",
    # telemetry
    "sm_clock_mhz": "median SM clock during the samples (MHz; NaN if not recorded)",
    "energy_j_per_call": "energy per call (J; NaN if not recorded)",
}
SAMPLE_COLUMNS = {
    "file": "path the run was read from",
    "record": "index of the record in its run (joins ``load`` rows on file and record)",
    "sample": "index of the sample in the record (0-based, in timing order)",
    "us": "per-call time of the sample (us)",
}
SAMPLE_KEYS = ("card", "pass_name", "stage", "impl", *POINT_FIELDS)
"""Columns of the record repeated on each of its samples, so a samples frame can be grouped on its own."""


# ---------------------------------------------------------------------------------------------- reading


def result_files(paths_or_folders: str | Path | Iterable[str | Path]) -> list[Path]:
    """The results files named: each file as given, each folder's ``*.json`` below it (sorted) that hold a run.

    Files in a folder that are not runs at all (``ceilings.json``: no "records"; a tuning script's JSON list) are
    passed over; a file named explicitly must be a run.
    """
    items = [paths_or_folders] if isinstance(paths_or_folders, (str, Path)) else list(paths_or_folders)
    files: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            # a hidden folder (.replaced/: the copies of replaced runs) is passed over: a kept copy is not a new run
            files += [p for p in sorted(item.rglob("*.json"))
                      if not any(part.startswith(".") for part in p.relative_to(item).parts) and _holds_records(p)]
        elif item.exists():
            files.append(item)
        else:
            raise InputError(f"{item}: no such file or folder")
    if not files:
        raise InputError(f"no results files in {', '.join(map(str, items)) or 'nothing'}")
    return files


def _holds_records(path: Path) -> bool:
    """Whether a JSON file found in a folder is a run: an object with "records" (a tuning script's list, a
    ceilings file are not, and are passed over)."""
    try:
        payload = read_json(path)
    except InputError:
        return True  # not readable as a run: load_run says why, naming the file
    return isinstance(payload, dict) and "records" in payload


def load_runs(paths_or_folders: str | Path | Iterable[str | Path]) -> list[tuple[Path, Run]]:
    """(file, Run) of every results file named (see ``result_files``), in order."""
    return [(path, load_run(path)) for path in result_files(paths_or_folders)]


def load(paths_or_folders: str | Path | Iterable[str | Path]) -> pd.DataFrame:
    """Every record of the runs in the given files and folders as one DataFrame (``COLUMNS``), one row a record.

    ``df.attrs["runs"]`` maps each file to its run's metadata (pandas keeps it through filtering).
    """
    loaded = load_runs(paths_or_folders)
    return frame_of([run for _, run in loaded], files=[str(path) for path, _ in loaded])


def load_samples(data: str | Path | Iterable[str | Path] | pd.DataFrame) -> pd.DataFrame:
    """Every timing sample as a row (``SAMPLE_COLUMNS`` plus the record's ``SAMPLE_KEYS``), of the runs in the
    given files and folders, or of the files a ``load`` frame came from (only its rows' records)."""
    if isinstance(data, pd.DataFrame):
        files = list(dict.fromkeys(data["file"]))
        samples = samples_of([load_run(f) for f in files], files)
        wanted = pd.MultiIndex.from_frame(data[["file", "record"]])
        return samples[pd.MultiIndex.from_frame(samples[["file", "record"]]).isin(wanted)].reset_index(drop=True)
    loaded = load_runs(data)
    return samples_of([run for _, run in loaded], [str(path) for path, _ in loaded])


def samples_of(runs: Sequence[Run], files: Sequence[str | None]) -> pd.DataFrame:
    """The samples frame of runs held in memory (see ``load_samples``)."""
    rows = []
    for run, file in zip(runs, files, strict=True):
        card = card_label(run)
        for i, r in enumerate(run.records):
            keys = {"card": card, "pass_name": r.pass_name, "stage": r.stage, "impl": r.impl,
                    **{f: getattr(r.point, f) for f in POINT_FIELDS}}  # fmt: skip
            rows += [{"file": file, "record": i, "sample": j, "us": us, **keys} for j, us in enumerate(r.samples_us)]
    return pd.DataFrame(rows, columns=[*SAMPLE_COLUMNS, *SAMPLE_KEYS])


# ---------------------------------------------------------------------------------------------- building


def implementation_info(meta: dict[str, Any], impl: str) -> dict[str, Any]:
    """What a run recorded of implementation ``impl``: ``meta["implementations"][impl]`` (module, distribution,
    version, commit, dirty); {} where the run recorded none (older runs stored a plain list of names)."""
    impls = meta.get("implementations")
    info = dict(impls.get(impl) or {}) if isinstance(impls, dict) else {}
    if info.get("version") is None and isinstance(meta.get(impl), str):
        # peers runs before the implementations table recorded the peer's version under its own name
        info["version"] = meta[impl]
    return info


def _stored_peaks(run: Run) -> dict[str, dict[str, Peak]]:
    """The denominators a run can be shown against: its spec's datasheet roofs and its stored ceilings."""
    out = {}
    if run.meta.get("hardware"):
        try:
            out["datasheet"] = peaks_for_run(run, "datasheet")
        except InputError:  # a spec this mxbench does not know: the frame still loads, without the efficiency
            pass
    if run.meta.get("ceilings"):
        out["measured"] = peaks_for_run(run, "measured")
    return out


def _run_rows(run: Run, file: str | None) -> list[dict[str, Any]]:
    meta = run.meta
    common = {
        "file": file, "card": card_label(run), "hardware": meta.get("hardware"),
        "run_kind": meta.get("kind") or "roofline", "commit": meta.get("git_commit"), "date": meta.get("date"),
        "mxbench": meta.get("mxbench"),
    }  # fmt: skip
    rows = []
    for i, r in enumerate(run.records):
        info = implementation_info(meta, r.impl)
        ok = r.ok
        rows.append({
            **common, "record": i, **{f: getattr(r.point, f) for f in POINT_FIELDS},
            "pass_name": r.pass_name, "stage": r.stage, "kernel": r.kernel, "impl": r.impl,
            "impl_version": info.get("version"), "impl_commit": info.get("commit"), "category": r.category,
            "purpose": r.purpose, "shape": r.shape, "precision": r.precision, "backend": r.backend, "method": r.method,
            "bytes_read": r.bytes_read, "bytes_written": r.bytes_written, "bytes": r.bytes, "flops": r.flops,
            "measured": r.measured, "ok": ok, "error": r.error,
            "skipped": r.skipped, "impossible": r.impossible, "samples": len(r.samples_us),
            "median_us": r.median_us if ok else None, "iqr_us": r.iqr_us if ok else None,
            "min_us": min(r.samples_us) if r.samples_us else None,
            "max_us": max(r.samples_us) if r.samples_us else None,
            SM_CLOCK_KEY: r.telemetry.get(SM_CLOCK_KEY), ENERGY_KEY: r.telemetry.get(ENERGY_KEY),
        })  # fmt: skip
    return rows


def frame_of(runs: Run | Sequence[Run], files: Sequence[str | None] | None = None) -> pd.DataFrame:
    """The frame (``COLUMNS``) of runs held in memory; ``files`` names where each came from."""
    runs = [runs] if isinstance(runs, Run) else list(runs)
    files = list(files) if files is not None else [None] * len(runs)
    if len(files) != len(runs):
        raise InputError(f"files: {len(files)} names for {len(runs)} runs")
    parts = []
    for run, file in zip(runs, files, strict=True):
        part = pd.DataFrame(_run_rows(run, file), columns=[c for c in COLUMNS if c in _RAW])
        part = _derive(part)
        for name, peaks in _stored_peaks(run).items():
            part[f"eff_{name}_pct"], part[f"peak_{name}"] = efficiency(part, peaks)
        parts.append(part.reindex(columns=list(COLUMNS)))
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(COLUMNS))
    df = _typed(df)
    df.attrs["runs"] = RunsMeta({file: run.meta for run, file in zip(runs, files, strict=True)})
    return df


class RunsMeta(dict):
    """``df.attrs["runs"]``: each file's run metadata, read-only and shared by every frame derived from ``df``.
    pandas deep-copies ``attrs`` into the result of every operation; a run's metadata (its command, versions,
    telemetry) copied on each filter and groupby was a fifth of drawing a roofline run's figures."""

    def __deepcopy__(self, memo: dict) -> RunsMeta:
        return self


_DERIVED = ("gbps", "tflops", "flop_per_byte", "eff_datasheet_pct", "peak_datasheet", "eff_measured_pct",
            "peak_measured")  # fmt: skip
_RAW = [c for c in COLUMNS if c not in _DERIVED]


def _derive(df: pd.DataFrame) -> pd.DataFrame:
    """Throughputs from the declared cost and the median: the same arithmetic as ``roofline.achieved_*``."""
    us = df["median_us"].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        df["gbps"] = (df["bytes"] / us / 1e6 * 1e3).where(us > 0)
        flops = df["flops"].where(df["flops"] > 0)
        df["tflops"] = (flops / us / 1e6).where(us > 0)
        df["flop_per_byte"] = flops / df["bytes"].where(df["bytes"] > 0)
    return df


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    df["date"] = pd.to_datetime(df["date"], utc=True, errors="coerce", format="ISO8601")
    for c in ("median_us", "iqr_us", "min_us", "max_us", "power_limit_w", SM_CLOCK_KEY, ENERGY_KEY,
              "eff_datasheet_pct", "eff_measured_pct"):  # fmt: skip
        df[c] = df[c].astype(float)
    for c in ("M", "N", "K", "G", "seed", "bytes_read", "bytes_written", "bytes", "flops", "record", "samples"):
        df[c] = df[c].astype("int64")
    for c in ("measured", "ok"):
        df[c] = df[c].astype(bool)
    return df


def efficiency(df: pd.DataFrame, peaks: dict[str, Peak]) -> tuple[pd.Series, pd.Series]:
    """Percent of its roof each row reached, and that roof's label: ``roofline.efficiency`` over a frame.

    Data movement against ``peaks["bandwidth"]``, GEMMs against the peak of their precision (``gemm_peak``: an
    mxfp8 GEMM on a card without one is shown against the fp8 roof, and says so); NaN / None elsewhere.
    """
    pct = pd.Series(np.nan, index=df.index, dtype=float)
    label = pd.Series(None, index=df.index, dtype=object)
    us = df["median_us"].astype(float)
    timed = df["ok"].astype(bool) & (us > 0)
    memory = timed & df["category"].isin([str(c) for c in MEMORY_CATEGORIES])
    gemm = timed & (df["category"] == "gemm") & (df["flops"] > 0)
    targets = [(memory, peaks.get("bandwidth"), df["bytes"])]
    targets += [
        (gemm & (df["precision"] == p), gemm_peak(peaks, p), df["flops"]) for p in df.loc[gemm, "precision"].unique()
    ]
    for rows, peak, amount in targets:
        if peak is None or not rows.any():
            continue
        # the same operations, in the same order, as roofline.efficiency: 100 * (amount / us / 1e6) / peak
        pct[rows] = 100.0 * (amount[rows] / us[rows] / 1e6) / peak.value
        label[rows] = peak.label
    return pct, label


# ---------------------------------------------------------------------------------------------- selection


def _wanted(x: Any) -> list | None:
    if x is None:
        return None
    return [x] if isinstance(x, str) or not isinstance(x, Iterable) else list(x)


def _listing(values: Iterable[Any]) -> str:
    shown = sorted({v for v in values if not pd.isna(v)}, key=lambda v: (str(type(v)), v))
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in shown) or "nothing"


def _where(df: pd.DataFrame) -> str:
    files = [f for f in dict.fromkeys(df["file"]) if f is not None] if len(df) else []
    if len(files) == 1:
        return f"{files[0]} has"
    return f"these {len(files)} files have" if files else "the run has"


def select(
    df: pd.DataFrame,
    *,
    passes: str | Iterable[str] | None = None,
    M: int | Iterable[int] | None = None,
    recipe: str | Iterable[str] | None = None,
    card: str | None = None,
    impl: str | Iterable[str] | None = None,
) -> pd.DataFrame:
    """The rows that match every given filter (None = no filter): the one record selection of every table.

    ``card`` matches without regard to case. A filter value that matches nothing raises ``InputError`` naming what
    the file does hold ("no records with M=12345; x.json has M in 16384, 32768, 65536, 131072"); an unknown pass
    is refused with the known ones. Filters apply in the order card, pass, recipe, M, implementation, so the
    values listed are those left by the filters before.
    """
    unknown = sorted(set(_wanted(passes) or ()) - set(PASS_TITLES))
    if unknown:
        raise InputError(f"passes: unknown pass {unknown}; known: {list(PASS_TITLES)}")
    applied: list[str] = []
    for name, column, values in (
        ("card", "card", card),
        ("pass", "pass_name", passes),
        ("recipe", "recipe", recipe),
        ("M", "M", M),
        ("implementation", "impl", impl),
    ):
        wanted = _wanted(values)
        if wanted is None:
            continue
        if not wanted:  # an empty list selects nothing: refused, never an empty table that reads as a pass
            raise InputError(f"the {name} filter is an empty list: it selects nothing; give at least one {name}")
        held = df[column].str.lower() if name == "card" else df[column]
        keys = [str(w).lower() for w in wanted] if name == "card" else wanted
        missing = [w for w, k in zip(wanted, keys, strict=True) if not (held == k).any()]
        if missing:
            given = f" ({', '.join(applied)})" if applied else ""
            raise InputError(
                f"no records with {name}={','.join(map(str, missing))}{given}; "
                f"{_where(df)} {name} in {_listing(df[column])}"
            )
        df = df[held.isin(keys)]
        applied.append(f"{name}={','.join(map(str, wanted))}")
    return df


def held_filters(df: pd.DataFrame, **filters: Any) -> dict[str, Any]:
    """``filters`` (``select``'s keywords) narrowed to the values ``df`` holds: what a table of one file among
    several selects, once ``select`` over all of them has found that every value matches somewhere."""
    columns = {"passes": "pass_name", "M": "M", "recipe": "recipe", "impl": "impl"}
    out = dict(filters)
    for name, column in columns.items():
        wanted = _wanted(filters.get(name))
        if wanted is not None:
            out[name] = [w for w in wanted if (df[column] == w).any()]
    return out
