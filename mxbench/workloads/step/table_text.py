"""``mxbench table`` for the step's and the peers' kinds: every file's records filtered alike (``frame.select``, so a
filter that matches nothing in any file is refused with what the files hold), each file's table with what it holds
of the values asked for (a file with none of them is left out), and the projection beside where asked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import click

from ...instruments.roofline import run_denominator
from ...storage.results import Run
from ...views.frame import frame_of, held_filters, select
from ..declaration import TableRequest
from .projection import projection_table


def filtered_tables(runs: Sequence[tuple[Path, Run]], kind: str, request: TableRequest,
                    table: Callable[..., str]) -> str:  # fmt: skip
    """The ``kind`` table (``table(run, fmt, ...)``) of each run, filtered as ``request`` asks."""
    if kind == "speedup" and request.passes:
        raise click.BadParameter("the speedup table compares whole steps: no pass to choose", param_hint="--pass")
    Ms = [_breakdown_M(request.Ms)] if kind == "breakdown" and request.Ms else request.Ms
    filters = {"passes": request.passes, "M": Ms, "recipe": request.recipes, "card": request.card}
    chosen = select(frame_of([run for _, run in runs], files=[str(path) for path, _ in runs]), **filters)
    texts = []
    for path, run in runs:
        mine = chosen[chosen["file"] == str(path)]
        if mine.empty:
            continue
        held = held_filters(mine, **filters)
        if kind == "breakdown":
            held["M"] = held["M"][0] if held["M"] else None
        if kind == "speedup":
            del held["passes"]
        texts.append(table(run, request.fmt, columns=request.columns,
                           denominator=run_denominator(run, request.denominator), **held))  # fmt: skip
        if request.project is not None:
            # the run's header block is just above: the projection adds only the line that says what it is
            texts.append(projection_table(run, kind, request.fmt, request.project, columns=request.columns,
                                          header=False, **held))  # fmt: skip
    return "\n".join(texts)


def _breakdown_M(Ms: Sequence[int] | None) -> int | None:
    if Ms and len(Ms) > 1:
        raise click.BadParameter("the breakdown table shows one M", param_hint="--M")
    return Ms[0] if Ms else None
