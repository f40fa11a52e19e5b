"""Regression gate: re-measure a stored baseline's points on this card, compare, and fail only on what reproduces.

The baseline is a stored Run of this card. Its points are measured again ``rounds`` times, each round in the
opposite order to the last (ABBA-style), so slow drift (temperature, clocks) spreads evenly over the points; the
rounds' samples are pooled per stage and compared with ``compare_runs``. Every stage found SLOWER is a suspect:
with ``confirm`` its points are measured again (another ``rounds`` rounds) and only a suspect that is SLOWER again
counts as a regression (one noisy pass never fails CI).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from mxkernels.core.errors import InputError

from ..storage.results import Point, Run
from .compare import Comparison, Match, MatchKey, Thresholds, compare_runs

Measure = Callable[[list[Point]], Run]


@dataclass
class RegressResult:
    """``comparison``: the verdicts that decide, each suspect's replaced by its confirmation;
    ``first``: the comparison before confirmation; ``confirmation``: the suspects' comparison (None when nothing
    was SLOWER or ``confirm`` was off); ``confirmed``: the regressions that reproduced; ``measured``: the fresh
    measurement of every point (its rounds pooled), what a CI keeps beside the verdict."""

    comparison: Comparison
    first: Comparison
    confirmation: Comparison | None
    confirmed: list[Match]
    measured: Run | None = None

    @property
    def exit_code(self) -> int:
        return self.comparison.exit_code


def measure_rounds(points: Sequence[Point], measure: Measure, rounds: int) -> Run:
    """``rounds`` measurements of ``points`` in alternating order, pooled into one Run (meta of the first round,
    plus ``meta["rounds"]``)."""
    if rounds < 1:
        raise InputError(f"rounds must be >= 1, got {rounds}")
    runs = [measure(list(points) if i % 2 == 0 else list(reversed(points))) for i in range(rounds)]
    return Run(meta={**runs[0].meta, "rounds": rounds}, records=[r for run in runs for r in run.records])


def regress(
    baseline: Run,
    measure: Measure,
    *,
    rounds: int = 3,
    confirm: bool = True,
    seed: int = 0,
    thresholds: Thresholds | None = None,
) -> RegressResult:
    """Compare fresh measurements of ``baseline``'s points (``measure(points) -> Run`` on this card) with it.

    Raises ``CompareError`` when ``measure`` ran on another card than the baseline's.
    """
    points = list(dict.fromkeys(r.point for r in baseline.records))
    if not points:
        raise InputError("baseline holds no records to re-measure")
    measured = measure_rounds(points, measure, rounds)
    first = compare_runs(baseline, measured, thresholds=thresholds, seed=seed)
    suspects = {m.key for m in first.by_verdict("SLOWER")}
    if not (confirm and suspects):
        return RegressResult(first, first, None, first.by_verdict("SLOWER"), measured)
    suspect_points = list(dict.fromkeys(r.point for r in baseline.records if MatchKey.of(r) in suspects))
    again = measure_rounds(suspect_points, measure, rounds)
    suspects_base = Run(baseline.meta, [r for r in baseline.records if MatchKey.of(r) in suspects])
    confirmation = compare_runs(suspects_base, again, thresholds=thresholds, seed=seed)
    final = _settle(first, confirmation, suspects)
    return RegressResult(final, first, confirmation, final.by_verdict("SLOWER"), measured)


def _settle(first: Comparison, confirmation: Comparison, suspects: set[MatchKey]) -> Comparison:
    """``first`` with each suspect's verdict taken from ``confirmation``."""
    redo = {m.key: m for m in confirmation.matches}

    def settled(m: Match) -> Match:
        if m.key not in suspects:
            return m
        again = redo.get(m.key)
        if again is None:
            return replace(m, verdict="UNSURE", reason="SLOWER once; the confirmation has no result for it")
        if again.verdict == "SLOWER":
            return replace(again, reason=f"reproduced: {again.reason}")
        return replace(again, reason=f"SLOWER once, not reproduced: {again.reason}")

    return replace(
        first,
        matches=[settled(m) for m in first.matches],
        broken=first.broken + [k for k in confirmation.broken if k not in first.broken],
        impossible={**first.impossible, **confirmation.impossible},
    )
