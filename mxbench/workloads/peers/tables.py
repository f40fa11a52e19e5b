"""The peers table: per stage of a peers run, each implementation's median time beside ours."""

from __future__ import annotations

from typing import Any

import pandas as pd
from mxkernels.core.names import OURS

from ...storage.results import Run
from ...views.frame import PASS_TITLES
from ...views.render import Row
from ..step.tables import ALL, POINT_KEY, TableOptions, as_frame, num_text, present, rows_table


def _peer_cell(row: Any) -> str | None:
    if row is None:
        return None
    if row.ok:
        return f"{row.median_us:.1f}"
    if present(getattr(row, "impossible", None)):
        return "IMPOSSIBLE"
    return "skipped" if present(row.skipped) else "error"


def peer_rows(data: Run | pd.DataFrame, options: TableOptions = ALL) -> list[Row]:
    """One row per stage of a peers run: each implementation's median time, our bandwidth, and best peer time /
    ours (> 1: ours is faster). Cells of an implementation that failed say "error", of one that could not run
    here "skipped"; absent ones are empty."""
    from ...implementations.builtin import COMPILED, TORCHAO  # imported on use: the built-ins load torch

    df = options.select(as_frame(data))
    columns = list(dict.fromkeys([OURS, TORCHAO, COMPILED, *df["impl"]]))
    many_M = df["M"].nunique() > 1
    rows = []
    for _, stage in df.groupby([*POINT_KEY, "pass_name", "stage"], sort=False, dropna=False):
        by_impl = {r.impl: r for r in stage.itertuples()}  # a later record of an implementation replaces one before
        first = stage.iloc[0]
        row = {"M": str(first["M"])} if many_M else {}
        row.update({"Pass": PASS_TITLES.get(first["pass_name"], first["pass_name"]), "Stage": first["stage"],
                    "Input shape": first["shape"]})  # fmt: skip
        row.update({f"{impl} (us)": _peer_cell(by_impl.get(impl)) for impl in columns})
        ours = by_impl.get(OURS)
        ok = ours is not None and ours.ok
        peer_us = [r.median_us for i, r in by_impl.items() if i != OURS and r.ok]
        row["mxkernels GB/s"] = num_text(ours.gbps, 0) if ok else None
        row["Best peer / ours"] = f"{min(peer_us) / ours.median_us:.2f}x" if ok and peer_us else None
        rows.append(row)
    return rows



def peers_table(run: Run, fmt: str = "markdown", **kwargs: Any) -> str:
    """The peers table of ``run`` under its header block (a peers run has no denominators)."""
    return rows_table(run, peer_rows, fmt, efficiencies=False, **kwargs)
