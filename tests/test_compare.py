"""Compare verdicts on synthetic samples whose true ratio and noise are set by hand."""

import random
import time

import pytest

from mxbench.gate import compare
from mxbench.views import render
from mxbench.gate.compare import CompareError, Thresholds, compare_runs
from mxbench.storage.results import Point, Record, Run


def samples(center: float, rel_sd: float, n: int = 30, seed: int = 1) -> list[float]:
    """n draws of center * (1 + rel_sd * standard normal), from a fixed stream (independent of the code)."""
    rng = random.Random(seed)
    return [center * (1 + rel_sd * rng.gauss(0, 1)) for _ in range(n)]


def rec(us, category="gemm", stage="gemm", pass_name="forward", M=131072, seed=0, clock=None, **kw) -> Record:
    return Record(
        point=Point(M, 2048, 7168, 8, seed=seed), pass_name=pass_name, stage=stage, kernel=stage, category=category,
        samples_us=list(us), telemetry={} if clock is None else {"sm_clock_mhz": clock}, **kw,
    )  # fmt: skip


def run(*records, card="NVIDIA H100 80GB HBM3") -> Run:
    return Run(meta={"card": card}, records=list(records))


def verdict(base_us, new_us, **kw) -> compare.Match:
    cmp = compare_runs(run(rec(base_us, **kw)), run(rec(new_us, **kw)))
    assert len(cmp.matches) == 1
    return cmp.matches[0]


def test_identical_runs_are_the_same():
    base = run(rec(samples(1000, 0.01)), rec(samples(50, 0.02, seed=2), "quantize", "quantize_a"))
    cmp = compare_runs(base, base)
    assert [m.verdict for m in cmp.matches] == ["SAME", "SAME"]
    assert all(m.ratio == 1.0 and m.ci[0] <= 1.0 <= m.ci[1] for m in cmp.matches)
    assert cmp.exit_code == 0


def test_twenty_percent_slower_with_a_tight_spread_is_slower_and_fails():
    cmp = compare_runs(run(rec(samples(1000, 0.005))), run(rec(samples(1200, 0.005, seed=7))))
    m = cmp.matches[0]
    assert m.verdict == "SLOWER" and m.ratio == pytest.approx(1.2, rel=0.01)
    assert 1.03 < m.ci[0] <= 1.2 <= m.ci[1]
    assert cmp.exit_code == 1


def test_twenty_percent_faster_is_faster_and_passes():
    cmp = compare_runs(run(rec(samples(1000, 0.005))), run(rec(samples(800, 0.005, seed=7))))
    assert cmp.matches[0].verdict == "FASTER" and cmp.exit_code == 0


def test_very_noisy_samples_are_unsure():
    # a 10% shift buried in 40% noise with few samples: the CI straddles both 1 and 1.03
    m = verdict(samples(1000, 0.4, n=8, seed=3), samples(1100, 0.4, n=8, seed=4))
    assert m.verdict == "UNSURE" and m.ci[0] < 1.0 < m.ci[1]


def test_slower_in_time_but_not_in_cycles_is_a_clock_drop():
    # 20% slower while the SM clock fell 1980 -> 1650 MHz: time x clock is unchanged
    cmp = compare_runs(run(rec(samples(1000, 0.005), clock=1980.0)), run(rec(samples(1200, 0.005, 7), clock=1650.0)))
    m = cmp.matches[0]
    assert m.verdict == "UNSURE" and "clock drop" in m.reason and m.cycles_ratio == pytest.approx(1.0, rel=0.01)
    assert cmp.exit_code == 0


def test_slower_at_the_same_clock_stays_slower():
    m = verdict(samples(1000, 0.005), samples(1200, 0.005, seed=7), clock=1980.0)
    assert m.verdict == "SLOWER" and m.cycles_ratio == pytest.approx(m.ratio)


def test_practical_threshold_depends_on_the_category():
    # a tight 5% slowdown: beyond the 3% GEMM delta, inside the 7% rearrange delta
    base, new = samples(1000, 0.002), samples(1050, 0.002, seed=9)
    assert verdict(base, new).verdict == "SLOWER"
    assert verdict(base, new, category="rearrange", stage="rearrange_a").verdict == "SAME"
    loose = compare_runs(run(rec(base)), run(rec(new)), thresholds=Thresholds(deltas={"gemm": 0.10}))
    assert loose.matches[0].verdict == "SAME"


def test_a_clear_change_under_the_absolute_floor_is_not_slower():
    # 1.0 us -> 1.2 us is 20% but only 0.2 us: below the 0.25 us floor
    m = verdict(samples(1.0, 0.002), samples(1.2, 0.002, seed=5), category="quantize", stage="quantize_a")
    assert m.verdict == "SAME" and "floor" in m.reason
    assert verdict(samples(1.0, 0.002), samples(1.2, 0.002, seed=5)).verdict != "SLOWER"


def test_too_few_samples_are_unsure():
    m = verdict([1000.0, 1001.0], [1500.0, 1501.0])
    assert m.verdict == "UNSURE" and "few samples" in m.reason


def test_runs_of_different_cards_are_refused_unless_forced():
    base, new = run(rec(samples(1000, 0.01))), run(rec(samples(1000, 0.01)), card="NVIDIA B200")
    with pytest.raises(CompareError, match="different cards"):
        compare_runs(base, new)
    forced = compare_runs(base, new, force=True)
    assert forced.forced and len(forced.matches) == 1 and "forced" in forced.summary()


def test_a_model_is_not_the_card_it_models():
    measured = run(rec(samples(1000, 0.01)), card="NVIDIA B200")
    model = Run(meta={"hardware": "b200", "measured": False}, records=[rec([], measured=False, model_us=1000.0)])
    with pytest.raises(CompareError, match="model, not measured"):
        compare_runs(model, measured)
    other_spec = Run(meta={"hardware": "h100-sxm", "measured": False}, records=model.records)
    with pytest.raises(CompareError):
        compare_runs(model, other_spec)
    cmp = compare_runs(model, model)
    (m,) = cmp.matches
    assert m.verdict == "MODEL" and m.ci is None and "no interval" in m.reason  # no samples: no verdict either
    assert cmp.exit_code == 0 and "1 MODEL" in cmp.summary()
    assert compare.comparison_rows(cmp)[0]["95% CI"] == ""


def test_matching_ignores_the_seed_and_pools_duplicate_keys():
    base = run(rec(samples(1000, 0.005), seed=0), rec(samples(1000, 0.005, seed=3), seed=1))
    new = run(rec(samples(1000, 0.005, seed=4), seed=5))
    cmp = compare_runs(base, new)
    assert len(cmp.matches) == 1 and cmp.matches[0].verdict == "SAME"


def test_unmatched_and_broken_stages_are_listed():
    base = run(rec(samples(100, 0.01)), rec(samples(100, 0.01), stage="gone"), rec(samples(100, 0.01), stage="breaks"))
    new = run(rec(samples(100, 0.01)), rec(samples(100, 0.01), stage="added"), rec([], stage="breaks", error="boom"))
    cmp = compare_runs(base, new)
    assert [k.stage for k in cmp.only_base] == ["gone"] and [k.stage for k in cmp.only_new] == ["added"]
    assert [k.stage for k in cmp.broken] == ["breaks"]
    assert cmp.exit_code == 1  # a stage that ran before and errors now fails like a regression
    assert [r["Verdict"] for r in compare.comparison_rows(cmp)] == ["SAME", "BROKEN"]
    assert compare.comparison_rows(cmp)[1]["Why"] == "ran in base, only errors in new: boom"


def test_the_bootstrap_is_seeded():
    base, new = run(rec(samples(1000, 0.05))), run(rec(samples(1040, 0.05, seed=8)))
    a, b = compare_runs(base, new, seed=3), compare_runs(base, new, seed=3)
    assert a.matches[0].ci == b.matches[0].ci
    assert compare_runs(base, new, seed=4).matches[0].ci != a.matches[0].ci


def test_comparison_rows_and_summary():
    cmp = compare_runs(run(rec(samples(1000, 0.005))), run(rec(samples(1200, 0.005, seed=7))))
    (row,) = compare.comparison_rows(cmp)
    assert row["Verdict"] == "SLOWER" and row["Pass"] == "Forward" and row["Stage"] == "gemm"
    assert row["Point"].startswith("M=131072 N=2048 K=7168 G=8")
    assert float(row["New/base"]) == pytest.approx(1.2, rel=0.01)
    assert cmp.summary().startswith("NVIDIA H100 80GB HBM3: 1 SLOWER, 0 UNSURE, 0 SAME, 0 FASTER")
    text = render.render(compare.comparison_rows(cmp), "markdown")
    assert "SLOWER" in text


def test_hundreds_of_matches_compare_in_seconds():
    stages = [(M, f"s{i}") for M in (16384, 32768, 65536, 131072) for i in range(80)]
    base = run(*[rec(samples(100, 0.02, n=50, seed=i), stage=s, M=M) for i, (M, s) in enumerate(stages)])
    new = run(*[rec(samples(100, 0.02, n=50, seed=i + 999), stage=s, M=M) for i, (M, s) in enumerate(stages)])
    start = time.perf_counter()
    cmp = compare_runs(base, new)
    assert len(cmp.matches) == 320 and time.perf_counter() - start < 10.0
    assert not cmp.by_verdict("SLOWER")


# ---- the gate's rules, settable ------------------------------------------------------------------------------


def test_a_certain_five_percent_quantizer_regression_fails_and_a_band_is_settable():
    base, new = samples(40, 0.002), samples(42, 0.002, seed=9)  # +5%, +2 us, tight
    kw = {"category": "quantize", "stage": "quantize_a"}
    assert verdict(base, new, **kw).verdict == "SLOWER"  # the 3% default (7% let it through)
    loose = Thresholds.parse(["quantize=7"])
    cmp = compare_runs(run(rec(base, **kw)), run(rec(new, **kw)), thresholds=loose)
    assert cmp.matches[0].verdict == "SAME" and loose.deltas["gemm"] == 0.03  # the other bands keep defaults


def test_a_twenty_percent_regression_of_a_4_us_kernel_fails_and_the_floor_is_settable():
    base, new = samples(4.0, 0.002), samples(4.8, 0.002, seed=5)
    kw = {"category": "rearrange", "stage": "rearrange_a"}
    assert verdict(base, new, **kw).verdict == "SLOWER"  # 0.8 us: over the 0.25 us floor (1 us hid it)
    cmp = compare_runs(run(rec(base, **kw)), run(rec(new, **kw)), thresholds=Thresholds.parse(floor_us=1.0))
    assert cmp.matches[0].verdict == "SAME"


def test_the_clock_rule_applies_to_compute_bound_stages_only():
    """A memory-bound kernel 20% slower while the SM clock fell is still SLOWER: its time follows memory."""
    kw = {"category": "quantize", "stage": "quantize_a"}
    cmp = compare_runs(run(rec(samples(1000, 0.005), clock=1980.0, **kw)),
                       run(rec(samples(1200, 0.005, 7), clock=1650.0, **kw)))  # fmt: skip
    assert cmp.matches[0].verdict == "SLOWER" and cmp.matches[0].cycles_ratio is None


@pytest.mark.parametrize("text, message", [
    ("quantize", "CATEGORY=PCT"), ("quantize=0", "0 < PCT < 100"), ("gemmm=3", "unknown category 'gemmm'"),
    ("pad=x", "CATEGORY=PCT"),
])  # fmt: skip
def test_bad_thresholds_are_input_errors(text, message):
    with pytest.raises(compare.InputError, match=message):
        Thresholds.parse([text])


def test_all_sets_every_band():
    assert set(Thresholds.parse(["all=2"]).deltas.values()) == {0.02}


def test_compare_command_takes_the_bands_and_floor_and_states_its_rules(tmp_path):
    from click.testing import CliRunner

    from mxbench.cli import cli
    from mxbench.storage.results import save_run

    kw = {"category": "quantize", "stage": "quantize_a"}
    paths = [tmp_path / "base.json", tmp_path / "new.json"]
    save_run(run(rec(samples(40, 0.002), **kw)), paths[0])
    save_run(run(rec(samples(42, 0.002, seed=9), **kw)), paths[1])
    invoke = lambda *args: CliRunner().invoke(cli, ["compare", *map(str, paths), *args])  # noqa: E731
    assert invoke().exit_code == 1  # +5% of a quantizer: past the 3% band
    assert invoke("--threshold", "quantize=7").exit_code == 0
    bad = invoke("--threshold", "quantize=300")
    assert bad.exit_code == 2 and "--threshold: 'quantize=300' must be CATEGORY=PCT" in bad.output
    helped = CliRunner().invoke(cli, ["compare", "--help"]).output
    assert "quantize 3%" in helped and "floor 0.25 us" in helped and "compute-bound" in helped
