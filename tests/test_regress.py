"""The regression gate with a fake ``measure``: deterministic synthetic samples whose shift is set per call."""

import random

import pytest

from mxbench.gate.compare import CompareError
from mxbench.gate.regress import measure_rounds, regress
from mxbench.storage.results import Point, Record, Run

CARD = "NVIDIA H100 80GB HBM3"
POINTS = [Point(M, 2048, 7168, 8, recipe=r) for M in (16384, 131072) for r in ("mxfp8", "bf16")]
STAGES = {"quantize_a": ("quantize", 60.0), "gemm": ("gemm", 900.0)}  # stage -> (category, base time at M=16384)


def samples(center: float, rel_sd: float, seed: int, n: int = 30) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rel_sd * rng.gauss(0, 1)) for _ in range(n)]


def records(points, factor, rel_sd, seed) -> list[Record]:
    """Every stage of ``points``, times scaled by ``factor(point, stage)``."""
    out = []
    for i, p in enumerate(points):
        for j, (stage, (category, us)) in enumerate(STAGES.items()):
            center = us * p.M / 16384 * factor(p, stage)
            out.append(
                Record(p, "forward", stage, stage, category, samples_us=samples(center, rel_sd, seed + 10 * i + j))
            )
    return out


BASELINE = Run(meta={"card": CARD}, records=records(POINTS, lambda p, s: 1.0, 0.005, seed=0))


class FakeMeasure:
    """``measure(points)``: call k (from 0) scales stage times by ``factor(k, point, stage)``."""

    def __init__(self, factor=lambda k, p, s: 1.0, rel_sd=0.005, card=CARD):
        self.factor, self.rel_sd, self.card = factor, rel_sd, card
        self.calls: list[list[Point]] = []

    def __call__(self, points: list[Point]) -> Run:
        k = len(self.calls)
        self.calls.append(points)
        recs = records(points, lambda p, s: self.factor(k, p, s), self.rel_sd, seed=1000 * (k + 1))
        return Run(meta={"card": self.card, "call": k}, records=recs)


def test_identical_timings_pass_without_confirmation():
    measure = FakeMeasure()
    result = regress(BASELINE, measure, rounds=3)
    assert {m.verdict for m in result.comparison.matches} == {"SAME"}
    assert len(result.comparison.matches) == 8
    assert result.exit_code == 0 and result.confirmation is None and result.confirmed == []
    assert len(measure.calls) == 3


def test_rounds_alternate_the_order_and_pool_their_samples():
    measure = FakeMeasure()
    pooled = measure_rounds(POINTS, measure, rounds=3)
    assert measure.calls == [POINTS, POINTS[::-1], POINTS]
    assert pooled.meta["rounds"] == 3 and pooled.meta["card"] == CARD and len(pooled.records) == 3 * 8


def test_a_reproducible_slowdown_fails():
    # the mxfp8 GEMM at M=131072 is 20% slower on every call
    def factor(k, p, s):
        return 1.2 if (p.M, p.recipe, s) == (131072, "mxfp8", "gemm") else 1.0

    measure = FakeMeasure(factor)
    result = regress(BASELINE, measure, rounds=2)
    assert result.exit_code == 1
    (slow,) = result.confirmed
    assert (slow.key.M, slow.key.recipe, slow.key.stage) == (131072, "mxfp8", "gemm") and slow.verdict == "SLOWER"
    assert "reproduced" in slow.reason
    # two rounds of everything, then two rounds of the suspect's point only
    assert [len(c) for c in measure.calls] == [4, 4, 1, 1]
    assert measure.calls[2] == [POINTS[2]]


def test_a_slowdown_that_does_not_reproduce_does_not_fail():
    # slower in the first two calls (the first comparison), normal when confirming
    def factor(k, p, s):
        return 1.2 if k < 2 and (p.M, p.recipe, s) == (16384, "bf16", "quantize_a") else 1.0

    result = regress(BASELINE, FakeMeasure(factor), rounds=2)
    assert [m.verdict for m in result.first.matches].count("SLOWER") == 1
    assert result.exit_code == 0 and result.confirmed == []
    settled = [m for m in result.comparison.matches if m.key.stage == "quantize_a" and m.key.recipe == "bf16"]
    assert settled[0].key.M == 16384 and settled[0].verdict != "SLOWER"
    assert "not reproduced" in settled[0].reason


def test_without_confirmation_a_single_slow_pass_fails():
    def factor(k, p, s):
        return 1.2 if k == 0 and s == "gemm" else 1.0

    result = regress(BASELINE, FakeMeasure(factor), rounds=1, confirm=False)
    assert result.exit_code == 1 and result.confirmation is None and len(result.confirmed) == 4


def test_very_noisy_measurements_are_unsure_and_pass():
    result = regress(BASELINE, FakeMeasure(lambda k, p, s: 1.05, rel_sd=0.5), rounds=1)
    verdicts = [m.verdict for m in result.comparison.matches]
    assert "UNSURE" in verdicts and "SLOWER" not in verdicts and result.exit_code == 0


def test_a_baseline_from_another_card_is_refused():
    with pytest.raises(CompareError):
        regress(BASELINE, FakeMeasure(card="NVIDIA B200"), rounds=1)


@pytest.mark.parametrize("rounds", [0, -1])
def test_rounds_must_be_positive(rounds):
    with pytest.raises(ValueError, match="rounds"):
        regress(BASELINE, FakeMeasure(), rounds=rounds)


def test_an_empty_baseline_is_rejected():
    with pytest.raises(ValueError, match="baseline"):
        regress(Run(meta={"card": CARD}), FakeMeasure())
