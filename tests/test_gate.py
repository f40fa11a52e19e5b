"""``compare`` and ``regress`` as a CI gate: exit 2 when nothing is comparable or the new run lacks stages of the
baseline (unless --allow-missing), JSON for machines, markdown for a step summary, exit codes in --help."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner
from helpers import FakeGPU
from test_cli import synthetic_run

from mxbench.cli import cli

from mxbench.clikit import common
from mxbench.instruments.kit import Instruments
from mxbench.storage.results import Point, Record, Run, load_run


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def without(run: Run, stage: str) -> Run:
    return Run(run.meta, [r for r in run.records if r.stage != stage])


def other_shape(run: Run) -> Run:
    from dataclasses import replace

    return Run(run.meta, [replace(r, point=replace(r.point, N=8192, K=5120)) for r in run.records])


def test_runs_with_no_comparable_stage_exit_2_and_say_what_each_holds(stored):
    base, new = stored("deepseek", synthetic_run()), stored("scout", other_shape(synthetic_run(seed=3)))
    result = invoke("compare", base, new)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"{base} and {new} share no comparable stage" in text
    assert f"{base} holds M=1024 N=2048 K=7168 G=8 recipe in {{bf16, mxfp8}}" in text
    assert f"{new} holds M=1024 N=8192 K=5120 G=8" in text
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_a_new_run_that_lacks_stages_of_the_baseline_exits_2_listing_them(stored):
    base, new = stored("base", synthetic_run()), stored("new", without(synthetic_run(seed=3), "quantize_a"))
    result = invoke("compare", base, new)
    assert result.exit_code == 2, result.output
    assert (f"{new} lacks 1 stage(s) that {base} has: M=1024 N=2048 K=7168 G=8 mxfp8/rceil balanced: "
            "forward/quantize_a; pass --allow-missing to compare the rest") in " ".join(result.output.split())
    allowed = invoke("compare", base, new, "--allow-missing")
    assert allowed.exit_code == 0, allowed.output
    assert "1 only in base" in allowed.output and "PASS (no stage slower)" in allowed.output


def test_a_whole_missing_point_is_one_phrase(stored):
    run = synthetic_run()
    base = stored("base", run)
    new = stored("new", Run(run.meta, [r for r in synthetic_run(seed=3).records if r.point.recipe == "mxfp8"]))
    result = invoke("compare", base, new)
    assert result.exit_code == 2 and "M=1024 N=2048 K=7168 G=8 bf16/rceil balanced: all 2 stages" in result.output


def test_a_slowdown_still_fails_with_1_when_stages_are_allowed_missing(stored):
    slow = without(synthetic_run(slow=1.2, seed=3), "quantize_a")
    result = invoke("compare", stored("base", synthetic_run()), stored("new", slow), "--allow-missing")
    assert result.exit_code == 1 and "FAIL (2 SLOWER)" in result.output


def test_json_has_one_object_per_stage_with_medians_ratio_ci_and_verdict(stored):
    base_run, new_run = synthetic_run(), without(synthetic_run(slow=1.2, seed=3), "quantize_a")
    base, new = stored("base", base_run), stored("new", new_run)
    result = invoke("compare", base, new, "--format", "json", "--allow-missing")
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert (report["base"], report["new"], report["exit_code"]) == (str(base), str(new), 1)
    by_stage = {(s["point"]["recipe"], s["pass"], s["stage"]): s for s in report["stages"]}
    gemm = by_stage[("mxfp8", "forward", "gemm")]
    # the medians are those of the stored samples, independently of compare's code
    import statistics

    (b,) = [r for r in base_run.records if r.stage == "gemm" and r.point.recipe == "mxfp8"]
    (n,) = [r for r in new_run.records if r.stage == "gemm" and r.point.recipe == "mxfp8"]
    assert gemm["base_median_us"] == pytest.approx(statistics.median(b.samples_us))
    assert gemm["new_median_us"] == pytest.approx(statistics.median(n.samples_us))
    assert gemm["ratio"] == pytest.approx(gemm["new_median_us"] / gemm["base_median_us"]) == pytest.approx(1.2, 0.02)
    assert gemm["ci95"][0] <= gemm["ratio"] <= gemm["ci95"][1] and gemm["verdict"] == "SLOWER"
    assert by_stage[("bf16", "forward", "gemm")]["verdict"] == "SAME"
    assert by_stage[("mxfp8", "forward", "quantize_a")]["verdict"] == "MISSING"
    assert report["counts"]["SLOWER"] == 2 and len(report["stages"]) == 5


def test_markdown_is_a_step_summary_with_the_verdict_first(stored):
    result = invoke("compare", stored("a", synthetic_run()), stored("b", synthetic_run(slow=1.2, seed=3)),
                    "--format", "markdown")  # fmt: skip
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "### mxbench compare: FAIL (3 SLOWER)"  # every mxfp8 stage is 20% slower
    table = [line for line in lines if line.startswith("|")]
    verdicts = [cells.split("|")[-3].strip() for cells in table[2:]]
    assert verdicts[:3] == ["SLOWER"] * 3 and set(verdicts[3:]) <= {"SAME", "UNSURE"} and len(verdicts) == 5


@pytest.mark.parametrize("command", ["compare", "regress"])
def test_exit_codes_are_in_the_help(command):
    text = " ".join(invoke(command, "--help").output.split())
    assert "Exit codes: 0 no stage slower; 1 a stage SLOWER" in text and "2 unusable input" in text


# ---------------------------------------------------------------------------------------------------- regress


def fake_baseline(us: float = 10.0) -> Run:
    """A baseline of the fake GPU: every stage of one small mxfp8 point and its bf16 point, 25 samples at us."""
    from mxbench.measuring.stages import SweepOptions
    from mxbench.workloads.step.sweep import run_sweep

    run = run_sweep([Point(512, 128, 256, 2)], options=SweepOptions(samples=25), progress=False,
                    instruments=FakeGPU(us).instruments())  # fmt: skip
    assert run.records and all(r.ok for r in run.records)
    return run


@pytest.fixture
def fake_card(monkeypatch, tmp_path):
    """regress on a fake GPU whose code version is set per test (``fake_card(us=..., drop=...)``)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "has_gpu", lambda: True)

    def set_code(**kwargs):
        fake = FakeGPU(**kwargs)
        monkeypatch.setattr(Instruments, "real", classmethod(lambda cls, *a, **k: fake.instruments()))

    return set_code


def test_regress_refuses_when_stages_of_the_baseline_no_longer_run(stored, fake_card, tmp_path):
    base = stored("base", fake_baseline())
    fake_card(drop=("rearrange_a",))
    result = invoke("regress", "--baseline", base, "--rounds", 1)
    assert result.exit_code == 2, result.output
    assert (f"this run lacks 1 stage(s) that {base} has: M=512 N=128 K=256 G=2 mxfp8/rceil balanced: "
            "forward/rearrange_a; pass --allow-missing") in " ".join(result.output.split())
    fake_card(drop=("rearrange_a",))
    allowed = invoke("regress", "--baseline", base, "--rounds", 1, "--allow-missing", "--out", tmp_path / "now.json")
    assert allowed.exit_code == 0, allowed.output
    saved = load_run(tmp_path / "now.json")
    assert saved.records and not any(r.stage == "rearrange_a" for r in saved.records)


def test_regress_fails_on_a_slowdown_and_prints_json(stored, fake_card):
    base = stored("base", fake_baseline(10.0))
    fake_card(us=12.0)
    result = invoke("regress", "--baseline", base, "--rounds", 1, "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)  # the progress lines go to stderr
    assert report["new"] == "this run" and report["exit_code"] == 1
    assert {s["verdict"] for s in report["stages"]} == {"SLOWER"}
    assert all(s["ratio"] == pytest.approx(1.2) for s in report["stages"])


def test_regress_bad_out_is_refused_before_measuring(stored, fake_card):
    base = stored("base", fake_baseline())
    fake_card(on_point=lambda n: pytest.fail("nothing may be measured"))
    result = invoke("regress", "--baseline", base, "--out", "/sys/regress.json")
    assert result.exit_code == 2 and "--out /sys/regress.json: cannot write in /sys" in result.output


def shuffled(xs):
    xs = list(xs)
    random.Random(0).shuffle(xs)
    return xs


def test_stages_only_in_the_new_run_do_not_fail_the_gate(stored):
    run = synthetic_run()
    extra = Record(Point(1024, 2048, 7168, 8, "mxfp8"), "forward", "pad_a", "pad", "pad", samples_us=[5.0] * 5)
    result = invoke("compare", stored("a", run), stored("b", Run(run.meta, shuffled([*synthetic_run(seed=3).records,
                                                                                       extra]))))  # fmt: skip
    assert result.exit_code == 0 and "1 only in new" in result.output
