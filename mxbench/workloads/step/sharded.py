"""The step's sweep over every GPU of a host (``measuring.shard``'s module doc): a unit is the points of every
recipe at one shape and condition plus their bf16 baseline, so a speedup never divides times of two cards; and
``regress`` with every round's points split so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ...instruments.kit import Instruments
from ...measuring.metadata import points_metadata
from ...measuring.shard import ShardFailed, Shard, assign, exchange, gathered_meta, measure_share, session, tagged
from ...measuring.stages import SweepOptions
from ...plan.points import with_baselines
from ...storage.results import Point, Record, Run, save_run
from .sweep import run_sweep


def _sweep_share(s: Shard, work: list[Point], options: SweepOptions, ins: Instruments, progress: bool) -> Run:
    """Measure this rank's share of ``work`` (with baselines) and return the gathered Run, on every rank."""
    owner = assign(work, s.world)
    mine = [p for p in work if owner[p] == s.rank]
    note = {"partial": f"rank 0's share of a sharded sweep over {s.world} GPUs ({len(mine)} of {len(work)} "
                       "points) until every rank's records are gathered"}  # fmt: skip
    local = replace(options, out=options.out if s.root else None)
    run, payload = measure_share(s, lambda: run_sweep(mine, options=local, progress=progress and s.root,
                                                             instruments=ins, meta=note))  # fmt: skip
    parts = exchange(s, payload)
    by_point: dict[Point, list[Record]] = {}
    for records in tagged(s, parts):
        for r in records:
            by_point.setdefault(r.point, []).append(r)
    missing = sum(1 for p in work if p not in by_point)
    meta = {**gathered_meta(s, run.meta, parts, missing), **points_metadata(work)}
    return Run(meta, [r for p in work for r in by_point.get(p, [])])


def sharded_sweep(points: Sequence[Point], *, options: SweepOptions, instruments: Instruments | None = None,
                  progress: bool = True) -> Run | None:  # fmt: skip
    """``sweep.run_sweep`` over every rank's GPU (module doc): the gathered Run on rank 0 (saved to
    ``options.out``), None on the other ranks."""
    ins = instruments or Instruments.real(options.device, options.results_dir)
    work = with_baselines(points)
    with session(ins, plan=work) as s:
        run = _sweep_share(s, work, options, ins, progress)
        if s.root and options.out is not None:
            save_run(run, options.out)
    return run if s.root else None


def sharded_regress(baseline: Run, *, options: SweepOptions, instruments: Instruments | None = None,
                    **kwargs):  # fmt: skip
    """``regress.regress`` with every round's points split over the ranks (module doc): the ``RegressResult`` on
    rank 0, None on the other ranks. Every rank gets every round's records and so decides the same suspects to
    confirm. A rank that fails or is stopped ends it on every rank (``ShardFailed``, ``KeyboardInterrupt``)."""
    ins = instruments or Instruments.real(options.device, options.results_dir)
    local = replace(options, out=None)
    with session(ins, plan=list(dict.fromkeys(r.point for r in baseline.records))) as s:

        def measure(points: list[Point]) -> Run:
            run = _sweep_share(s, with_baselines(points), local, ins, progress=False)
            if run.meta.get("interrupted"):
                raise KeyboardInterrupt(run.meta.get("partial", "stopped"))
            if run.meta.get("partial"):
                raise ShardFailed(run.meta["partial"])
            return run

        from ...gate.regress import regress  # here: pandas stays out of every rank of a sharded sweep

        result = regress(baseline, measure, **kwargs)
    return result if s.root else None
