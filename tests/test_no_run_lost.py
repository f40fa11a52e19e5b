"""No run is lost (issue 26, item 7): a file that is not a run is never replaced, a measured run is not replaced by
the model or by another card's or shape's run without --force, whatever is replaced is kept in .replaced/ and named,
and concurrent writers of one path leave one complete run there and lose none."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from mxkernels.core.errors import InputError

import mxbench
from mxbench.cli import cli
from mxbench.storage.replacing import REPLACED_DIR, RunIdentity, check_replace
from mxbench.storage.results import Point, Record, Run, load_run, save_run

ROOFLINE = ["roofline", "--K", "256", "--N", "128", "--M", "1024"]


def measured_run(card: str = "NVIDIA H100 80GB HBM3", N: int = 128, K: int = 256) -> Run:
    p = Point(1024, N, K, 8)
    return Run({"card": card, "measured": True},
               [Record(p, "forward", "gemm_fwd", "k", "gemm", samples_us=[10.0, 11.0, 12.0])])  # fmt: skip


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_a_file_that_is_not_a_run_is_never_replaced_even_with_force(tmp_path):
    notes, sibling = tmp_path / "notes.json", tmp_path / "notes.csv"
    notes.write_text('{"my": "notes"}')
    sibling.write_text("date,thought\n")
    for extra in ([], ["--force"]):
        result = invoke(*ROOFLINE, "--out", str(notes), *extra)
        assert result.exit_code == 2 and "is not an mxbench run" in result.stderr, result.stderr
        assert "--out" in result.stderr
    assert notes.read_text() == '{"my": "notes"}' and sibling.read_text() == "date,thought\n"
    assert not (tmp_path / REPLACED_DIR).exists()


def test_a_csv_beside_the_json_that_is_not_a_runs_is_never_replaced(tmp_path):
    (tmp_path / "notes.csv").write_text("date,thought\n")
    result = invoke(*ROOFLINE, "--out", str(tmp_path / "notes.json"), "--force")
    assert result.exit_code == 2 and "notes.csv exists and is not the CSV of an mxbench run" in result.stderr
    assert (tmp_path / "notes.csv").read_text() == "date,thought\n" and not (tmp_path / "notes.json").exists()


def test_a_measured_baseline_is_not_replaced_by_a_model_run_without_force(tmp_path):
    base = tmp_path / "baseline.json"
    save_run(measured_run(), base)
    before = base.read_bytes(), base.with_suffix(".csv").read_bytes()
    refused = invoke(*ROOFLINE, "--out", str(base))
    assert refused.exit_code == 2, refused.stderr
    assert "holds a measured run of NVIDIA H100 80GB HBM3 that the analytic model" in refused.stderr
    assert "--force" in refused.stderr and (base.read_bytes(), base.with_suffix(".csv").read_bytes()) == before

    forced = invoke(*ROOFLINE, "--out", str(base), "--force")
    assert forced.exit_code == 0, forced.stderr
    (kept_json,) = (tmp_path / REPLACED_DIR).glob("baseline.*.json")
    (kept_csv,) = (tmp_path / REPLACED_DIR).glob("baseline.*.csv")
    assert (kept_json.read_bytes(), kept_csv.read_bytes()) == before  # the measured run, byte for byte
    assert f"replaced {base}: the old copy is at {kept_json}" in forced.stderr
    assert load_run(base).records[0].measured is False


def test_a_model_run_replaces_a_model_run_and_keeps_the_old_copy_out_of_folder_reads(tmp_path):
    out = tmp_path / "run.json"
    assert invoke(*ROOFLINE, "--out", str(out)).exit_code == 0
    first = out.read_bytes()
    again = invoke(*ROOFLINE, "--out", str(out))
    assert again.exit_code == 0 and "the old copy is at" in again.stderr, again.stderr
    (kept,) = (tmp_path / REPLACED_DIR).glob("run.*.json")
    assert kept.read_bytes() == first
    assert set(mxbench.load(tmp_path)["file"]) == {str(out)}  # the kept copy is not read as another run


@pytest.mark.parametrize("new, why", [
    (RunIdentity(False, "B200", None), "the analytic model"),
    (RunIdentity(True, "NVIDIA H200", None), "a run of NVIDIA H200 would replace"),
    (RunIdentity(True, "NVIDIA H100 80GB HBM3", frozenset({(2048, 7168, 8)})), "other shapes (N=2048 K=7168 G=8)"),
])  # fmt: skip
def test_a_measured_run_is_replaced_only_by_one_of_its_card_and_shape_unless_forced(tmp_path, new, why):
    base = tmp_path / "base.json"
    save_run(measured_run(), base)
    with pytest.raises(InputError, match=re.escape(why)):
        check_replace(base, "--out", new, force=False)
    check_replace(base, "--out", new, force=True)
    with pytest.raises(InputError, match="; choose another name"):  # regress has no --force (compare's means cards)
        check_replace(base, "--out", new, force=None)
    check_replace(base, "--out", RunIdentity(True, "NVIDIA H100 80GB HBM3", frozenset({(128, 256, 8)})), force=False)


WRITER = textwrap.dedent("""
    import sys
    from mxbench.storage.results import Point, Record, Run, save_run
    writer, path = int(sys.argv[1]), sys.argv[2]
    p = Point(1024, 128, 256, 8)
    for n in range(25):
        records = [Record(p, "forward", f"stage{i}", "k" * 200, "gemm", samples_us=[float(i + 1)] * 50)
                   for i in range(300)]
        save_run(Run({"card": "X", "writer": writer, "n": n}, records), path)
""")


def test_two_concurrent_writers_leave_one_complete_run_and_lose_none(tmp_path):
    out = tmp_path / "same.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(out)], env=env, stderr=subprocess.PIPE,
                                text=True) for w in (1, 2)]  # fmt: skip
    reads = 0
    while any(w.poll() is None for w in writers):
        if out.exists():
            meta = json.loads(out.read_text())["meta"]  # a torn file fails to parse here
            assert meta["writer"] in (1, 2)
            reads += 1
    assert all(w.wait() == 0 for w in writers), [w.stderr.read() for w in writers]
    final = load_run(out)
    assert len(final.records) == 300
    kept = [json.loads(p.read_text())["meta"] for p in (tmp_path / REPLACED_DIR).glob("*.json")] if (
        tmp_path / REPLACED_DIR).exists() else []  # fmt: skip
    every = [final.meta, *kept]
    for writer in (1, 2):  # each writer's last run is there or kept
        assert any(m["writer"] == writer and m["n"] == 24 for m in every), every
    assert reads > 0
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind


@pytest.mark.parametrize("links", [True, False], ids=["hard link", "no links: a copy"])
def test_a_replaced_file_is_there_until_its_successor_takes_its_place(tmp_path, monkeypatch, links):
    """What a write sets aside is kept beside it, but the path holds it until the new file replaces it: a reader
    (another process loading the run, as in the concurrent-writers test above) never finds it missing."""
    from mxbench.storage import writing

    def no_links(*_):
        raise PermissionError(1, "no hard links on this file system")

    if not links:
        monkeypatch.setattr(os, "link", no_links)

    out = tmp_path / "x.json"
    out.write_text('{"old": 1}')
    present, real = [], os.replace

    def replace(src, dst):
        present.append(out.exists())
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    writing.write_files({out: '{"new": 2}'})
    assert present and all(present)
    assert out.read_text() == '{"new": 2}'
    assert [p.read_text() for p in (tmp_path / REPLACED_DIR).glob("x.*.json")] == ['{"old": 1}']
