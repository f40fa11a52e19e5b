"""History over commits: ordering by commit time (recorded, from git, else the run date), pooling the runs of one
commit, the change marks (the statistics of compare), --fail-on-latest, --by an implementation's commit, and the
committed H200 runs."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from mxkernels.core.errors import InputError

from mxbench.instruments.provenance import REPO_ROOT
from mxbench.cli import cli
from mxbench.views.frame import load_runs
from mxbench.reporting.history import history, history_rows, latest_summary, step_rows
from mxbench.storage.results import Point, Record, Run, save_run

CARD = "NVIDIA H100 80GB HBM3"
MX, BF = Point(1024, 2048, 7168, 8, "mxfp8"), Point(1024, 2048, 7168, 8, "bf16")


def samples(center: float, seed: int, n: int = 15) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-0.005, 0.005)) for _ in range(n)]


def run_at(commit: str, date: str, gemm_us: float = 50.0, seed: int = 0, card: str = CARD, **meta) -> Run:
    """A quantize (10 us) and a GEMM (``gemm_us``) of mxfp8, and a bf16 GEMM (75 us), made at ``commit``."""
    records = [
        Record(MX, "forward", "quantize_a", "quantize_dim0", "quantize", samples_us=samples(10.0, seed)),
        Record(MX, "forward", "gemm_fwd", "mxfp8_grouped_mm", "gemm", flops=2**30, precision="mxfp8",
               samples_us=samples(gemm_us, seed + 1)),
        Record(BF, "forward", "gemm_fwd", "grouped_mm", "gemm", flops=2**30, precision="bf16",
               samples_us=samples(75.0, seed + 2)),
    ]  # fmt: skip
    return Run(meta={"card": card, "git_commit": commit, "date": date, "mxbench": "0.1.0", **meta}, records=records)


def stored(tmp_path: Path, runs: dict[str, Run]) -> list[Path]:
    paths = []
    for name, run in runs.items():
        save_run(run, tmp_path / f"{name}.json")
        paths.append(tmp_path / f"{name}.json")
    return paths


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_steps_follow_the_commit_time_not_the_file_order(tmp_path):
    # commits unknown to this checkout: ordered by run date, and the steps say so; one recorded its commit time
    paths = stored(tmp_path, {
        "c": run_at("c" * 40, "2026-01-03T00:00:00+00:00", seed=20),
        "a": run_at("a" * 40, "2026-01-05T00:00:00+00:00", seed=0, git_commit_time="2026-01-01T00:00:00+00:00"),
        "b": run_at("b" * 40, "2026-01-02T00:00:00+00:00", seed=10),
    })  # fmt: skip
    h = history(load_runs(paths))
    assert [s.label for s in h.steps] == ["aaaaaaa", "bbbbbbb", "ccccccc"]
    assert [s.time_source for s in h.steps] == [
        "commit time recorded by the run", "run date (commit not in this checkout)",
        "run date (commit not in this checkout)",
    ]  # fmt: skip
    assert [r["Time (UTC)"] for r in step_rows(h)] == ["2026-01-01 00:00", "2026-01-02 00:00", "2026-01-03 00:00"]


def test_the_runs_of_one_commit_are_pooled(tmp_path):
    paths = stored(tmp_path, {
        "x1": run_at("a" * 40, "2026-01-01T00:00:00+00:00", seed=0),
        "x2": run_at("a" * 40, "2026-01-01T01:00:00+00:00", seed=5),
    })  # fmt: skip
    (step,) = history(load_runs(paths)).steps
    assert step.files == [str(p) for p in paths] and len(step.run.records) == 6
    rows = history_rows(history(load_runs(paths)))
    gemm = next(r for r in rows if r["Stage"] == "gemm_fwd" and "mxfp8" in r["Point"])
    pooled = sorted(samples(50.0, 1) + samples(50.0, 6))
    assert gemm["1: aaaaaaa"] == f"{(pooled[14] + pooled[15]) / 2:.1f}"  # the median of the 30 pooled samples


def test_a_point_with_bf16_weight_gradients_is_another_point_not_a_change(tmp_path):
    """The same recipe and shape with ``--wgrad bf16`` at the next commit: its stages are rows of their own (named
    "bf16 wgrad"), not a step of the recipe's own rows, so a slower bf16-wgrad GEMM marks nothing SLOWER."""
    old = run_at("a" * 40, "2026-01-01T00:00:00+00:00", seed=0)
    new = run_at("b" * 40, "2026-01-02T00:00:00+00:00", gemm_us=60.0, seed=10)
    new.records = [dataclasses.replace(r, point=dataclasses.replace(r.point, wgrad="bf16")) if r.point.recipe == "mxfp8"
                   else r for r in new.records]  # fmt: skip
    h = history(load_runs(stored(tmp_path, {"old": old, "new": new})))
    rows = {(r["Point"], r["Stage"]): r for r in history_rows(h)}
    mx = "M=1024 N=2048 K=7168 G=8 mxfp8/rceil balanced"
    assert (rows[(mx, "gemm_fwd")]["1: aaaaaaa"], rows[(mx, "gemm_fwd")]["2: bbbbbbb"]) == ("50.0", None)
    assert (rows[(mx + " bf16 wgrad", "gemm_fwd")]["1: aaaaaaa"], rows[(mx + " bf16 wgrad", "gemm_fwd")]["2: bbbbbbb"]) \
        == (None, "60.0")  # a time and no mark: nothing before it to be slower than
    assert not h.latest_failed


def test_a_slower_step_is_marked_and_fails_the_latest_gate(tmp_path):
    paths = stored(tmp_path, {
        "old": run_at("a" * 40, "2026-01-01T00:00:00+00:00", seed=0),
        "new": run_at("b" * 40, "2026-01-02T00:00:00+00:00", gemm_us=60.0, seed=10),
    })  # fmt: skip
    h = history(load_runs(paths))
    rows = {(r["Point"].split()[4], r["Stage"]): r for r in history_rows(h)}
    assert rows[("mxfp8/rceil", "gemm_fwd")]["2: bbbbbbb"].startswith("60.0 SLOWER x1.2")
    for unchanged in (("mxfp8/rceil", "quantize_a"), ("bf16", "gemm_fwd")):
        assert " " not in rows[unchanged]["2: bbbbbbb"]  # a time and no mark
    assert h.latest_failed and "1 SLOWER, 0 BROKEN, 0 FASTER of 3 stages" in latest_summary(h)
    assert [r["Stage"] for r in history_rows(h, changed_only=True)] == ["gemm_fwd"]
    result = invoke("history", *paths, "--fail-on-latest", "--format", "plain")
    assert result.exit_code == 1, result.output
    assert invoke("history", *paths, "--format", "plain").exit_code == 0  # without the gate: a report


def test_a_faster_latest_step_passes_the_gate(tmp_path):
    paths = stored(tmp_path, {
        "old": run_at("a" * 40, "2026-01-01T00:00:00+00:00", gemm_us=60.0, seed=0),
        "new": run_at("b" * 40, "2026-01-02T00:00:00+00:00", gemm_us=50.0, seed=10),
    })  # fmt: skip
    result = invoke("history", *paths, "--fail-on-latest", "--format", "csv", "--changed")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].startswith("M=1024 N=2048 K=7168 G=8 mxfp8/rceil balanced,Forward,gemm_fwd,")
    assert "FASTER x0.83" in result.output


def test_a_stage_is_compared_with_the_last_commit_that_measured_it(tmp_path):
    middle = run_at("b" * 40, "2026-01-02T00:00:00+00:00", seed=10)
    middle.records = [r for r in middle.records if r.stage == "quantize_a"]  # no GEMM at the middle commit
    paths = stored(tmp_path, {
        "old": run_at("a" * 40, "2026-01-01T00:00:00+00:00", seed=0),
        "mid": middle,
        "new": run_at("c" * 40, "2026-01-03T00:00:00+00:00", gemm_us=60.0, seed=20),
    })  # fmt: skip
    rows = history_rows(history(load_runs(paths)), M=1024, recipe="mxfp8")
    gemm = next(r for r in rows if r["Stage"] == "gemm_fwd")
    assert gemm["2: bbbbbbb"] is None and gemm["3: ccccccc"].startswith("60.0 SLOWER")


def test_history_follows_the_first_files_card_unless_told_and_refuses_empty_filters(tmp_path):
    paths = stored(tmp_path, {
        "h100": run_at("a" * 40, "2026-01-01T00:00:00+00:00"),
        "b200": run_at("b" * 40, "2026-01-02T00:00:00+00:00", card="NVIDIA B200"),
    })  # fmt: skip
    h = history(load_runs(paths))  # the README's `history results/<card> results/baselines` mixes cards
    assert h.card == "NVIDIA H100 80GB HBM3" and len(h.steps) == 1
    assert [why for _, why in h.left_out] == ["another card (NVIDIA B200: --card picks it)"]
    assert len(history(load_runs(paths), card="nvidia b200").steps) == 1
    result = invoke("history", *paths, "--card", "NVIDIA B200", "--M", 5)
    assert result.exit_code == 2 and "no records with M=5; the history has M in 1024" in result.output


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def test_by_an_implementation_orders_by_its_commits_in_its_own_checkout(tmp_path):
    """Their kernel lives in a git checkout of its own: --by names it, and its commits' times order the runs."""
    repo = tmp_path / "theirs"
    repo.mkdir()
    _git(repo, "init", "-q")
    module = repo / "kern.py"
    commits = []
    for i, date in enumerate(("2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00")):
        module.write_text(f"VERSION = {i}\n")
        _git(repo, "add", "kern.py")
        _git(repo, "commit", "-q", "-m", f"v{i}", date=date)
        commits.append(_git(repo, "rev-parse", "HEAD"))

    def impl(commit):
        return {"implementations": {"kern:quantize": {"module": str(module), "version": None, "commit": commit}}}

    # made in the other order, and both at one mxbench commit: only their commits tell the two apart
    paths = stored(tmp_path, {
        "late": run_at("a" * 40, "2026-01-01T00:00:00+00:00", gemm_us=60.0, seed=0, **impl(commits[1])),
        "early": run_at("a" * 40, "2026-01-02T00:00:00+00:00", seed=10, **impl(commits[0])),
        "none": run_at("a" * 40, "2026-01-03T00:00:00+00:00", seed=20),
    })  # fmt: skip
    h = history(load_runs(paths), by="kern:quantize")
    assert [s.label for s in h.steps] == [f"kern:quantize ({commits[0][:7]})", f"kern:quantize ({commits[1][:7]})"]
    assert [s.time_source for s in h.steps] == ["commit time from git"] * 2
    assert [p for p, _ in h.left_out] == [str(paths[2])] and h.latest_failed  # their newer commit made the GEMM slower
    assert len(history(load_runs(paths)).steps) == 1  # by mxbench: one commit
    with pytest.raises(InputError, match="none of these runs recorded a commit or version of 'torchao'"):
        history(load_runs(paths), by="torchao")


def test_history_of_the_committed_h200_runs(tmp_path):
    results = REPO_ROOT / "results"
    baseline = results / "baselines" / "nvidia-h200.json"
    h = history(load_runs([results / "nvidia-h200", baseline]))
    # the older commit first, either way timed (b2355c3: the fine-grained layer and map runs of 2026-11-29; 92750bf
    # and d248d50: that day's later maps; 8ad40cb: its bf16-wgrad layers and the weight quantizer sweep; ff97928:
    # DeepSeek-V3's map with torch's GEMM and the step with both GEMMs, the next session; d86fd77 and da4d49d: the
    # fine-grained layers re-measured twice in the session after; f4c83e6 and 59b0c92: the layers after the FP8 fused
    # stages dropped the unread column amax table, and Scout's again after the end-to-end floor's fix; c51a936 and
    # c3adfe1: the layers after the GEMM's epilogue change; 94857fa: DeepSeek-V3's and Scout's after the plain
    # launch came back at 8 experts; 6bb05da: the fine-grained layers with the weights' stages overlapped)
    assert [s.commit[:7] for s in h.steps] == ["755e51b", "d3351dc", "b2355c3", "92750bf", "d248d50", "8ad40cb",
                                               "ff97928", "d86fd77", "da4d49d", "f4c83e6", "59b0c92", "c51a936",
                                               "c3adfe1", "94857fa", "6bb05da"]  # fmt: skip
    assert all(s.time_source in ("commit time from git", "run date (commit not in this checkout)") for s in h.steps)
    assert sorted(Path(f).name for f in h.steps[1].files) == [
        "peers-llama4-scout.json", "roofline-deepseek-v3-fp8_rowwise.json", "roofline-deepseek-v3-skewed.json",
    ]  # fmt: skip
    result = invoke("history", results / "nvidia-h200", baseline, "--changed", "--format", "markdown",
                    "--plot", tmp_path / "history.png")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("**History of NVIDIA H200**, by mxbench commit time, oldest first:")
    assert (tmp_path / "history.png").read_bytes().startswith(b"\x89PNG")


def test_an_installed_implementations_runs_follow_its_commits_not_the_run_dates(tmp_path):
    """A backfilled run (made last, of the oldest commit) of a kernel installed without its checkout: placed by the
    commit time its run recorded, or by the checkout ``--checkout`` names; by run date only where neither is."""
    repo = tmp_path / "theirs"
    repo.mkdir()
    _git(repo, "init", "-q")
    commits = []
    for i, date in enumerate(("2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00")):
        (repo / "kern.py").write_text(f"VERSION = {i}\n")
        _git(repo, "add", "kern.py")
        _git(repo, "commit", "-q", "-m", f"v{i}", date=date)
        commits.append(_git(repo, "rev-parse", "HEAD"))

    def impl(commit, time=None):
        info = {"module": "kern_installed_elsewhere", "version": "1.0", "commit": commit}
        return {"implementations": {"kern": {**info, **({"git_commit_time": time} if time else {})}}}

    runs = {
        "newer": run_at("a" * 40, "2026-03-02T00:00:00+00:00", gemm_us=60.0, seed=0, **impl(commits[1])),
        "backfilled": run_at("a" * 40, "2026-04-01T00:00:00+00:00", seed=10, **impl(commits[0])),
    }
    paths = stored(tmp_path, runs)
    by_date = history(load_runs(paths), by="kern")
    assert [s.commit for s in by_date.steps] == [commits[1], commits[0]]  # the run dates: the wrong order
    assert by_date.steps[0].time_source == "run date (commit not in this checkout)"
    by_checkout = history(load_runs(paths), by="kern", checkout=repo)
    assert [s.commit for s in by_checkout.steps] == commits and by_checkout.latest_failed
    assert {s.time_source for s in by_checkout.steps} == {"commit time from git"}
    recorded = stored(tmp_path, {
        "newer": run_at("a" * 40, "2026-03-02T00:00:00+00:00", **impl(commits[1], "2026-03-01T00:00:00+00:00")),
        "backfilled": run_at("a" * 40, "2026-04-01T00:00:00+00:00", **impl(commits[0], "2026-02-01T00:00:00+00:00")),
    })  # fmt: skip
    assert [s.commit for s in history(load_runs(recorded), by="kern").steps] == commits
    result = invoke("history", *paths, "--by", "kern", "--checkout", repo, "--format", "csv")
    assert result.exit_code == 0, result.output


def test_history_of_model_runs_shows_their_model_times(tmp_path):
    """Two model runs (a machine without a GPU makes them): their model times per step, no crash (the pooled times
    were an object column when no run had samples)."""
    from click.testing import CliRunner

    from mxbench.cli import cli

    for i in range(2):
        made = CliRunner().invoke(cli, ["roofline", "--K", "256", "--N", "128", "--M", "1024", "--recipe", "mxfp8",
                                        "--out", str(tmp_path / f"model-{i}.json")])  # fmt: skip
        assert made.exit_code == 0, made.output
    result = CliRunner().invoke(cli, ["history", str(tmp_path / "model-0.json"), str(tmp_path / "model-1.json")])
    assert result.exit_code == 0, result.output
    assert "History of b200 (model, not measured)" in result.output
    assert "one step" in result.output  # both runs are of this checkout's commit: pooled into one step
