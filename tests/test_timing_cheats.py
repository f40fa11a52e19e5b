"""Timing that cannot be fooled (issue 34, item 6): new input values between timed calls and the last call's outputs
held to the oracle (``measuring.fresh``), and a time below the stage's roofline floor recorded IMPOSSIBLE, shown in
tables and failing the gate.

On the CPU a timing double stands in for ``timing.time_fn``: it keeps the CUDA-graph protocol (warm-up calls, a
"capture" whose outputs every "replay" writes again, ``fresh.refill`` before each timed replay, ``fresh.verify`` of
the captured outputs after the last) and reads its times off a fake clock. A replay is emulated by running the
callable's host code again with ``torch.cuda.is_current_stream_capturing()`` true, and writing what it returns into
the captured outputs: what a real replay of the kernels it chose at capture computes. The GPU tests at the end run
the same cheats through ``mxbench roofline --impl`` on the card.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from unittest import mock

import cheats
import pytest
import torch
from click.testing import CliRunner
from helpers import FakeTelemetry, FakeTiming
from mxkernels.core.cost import Cost
from mxkernels.stages.pipeline import BoundCall, make_inputs, step_stages

from mxbench.cli import cli
from mxbench.gate.compare import compare_runs
from mxbench.gate.report import json_report, verdict_line
from mxbench.implementations.registry import Implementation
from mxbench.instruments.hardware import get_spec
from mxbench.instruments.roofline import below_floor, floor_us
from mxbench.instruments.timing import StaleOutput
from mxbench.measuring.fresh import SECOND_SEED, FreshInputs, fresh_inputs
from mxbench.measuring.stages import StageTimer, SweepOptions
from mxbench.storage.results import IMPOSSIBLE, Point, Run, load_run, save_run

HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]
M, N, K, G = 64, 64, 64, 2
SPEC = get_spec("h200-sxm")


class GraphDouble:
    """``time_fn``'s CUDA-graph protocol on the CPU, with ``us`` per call off a fake clock (see the module)."""

    def __init__(self, us: float):
        self.us, self.refills = us, []

    def time_fn(self, fn, *, cold_l2, use_graph, samples, window=None, fresh=None):
        for _ in range(3):  # warm-up: eager
            fn()
        with mock.patch.object(torch.cuda, "is_current_stream_capturing", return_value=True):
            outputs = fn()  # the capture
            with window() if window else FakeTelemetry():
                for i in range(samples):
                    if fresh is not None:
                        fresh.refill(samples - 1 - i)
                        self.refills.append(samples - 1 - i)
                    for out, new in zip(outputs, fn(), strict=True):  # the replay writes the captured outputs
                        out.copy_(new)
        problem = None if fresh is None else fresh.verify(outputs)
        if problem is not None:
            raise StaleOutput(problem)
        return FakeTiming([self.us] * samples)


def quantize_stage(fn=None):
    """quantize_a of the MXFP8 step, bound to its input ``a`` (a BoundCall, as ``build_step`` binds it), run by
    ``fn`` (mxkernels' own by default), and its second input values (the step's inputs of the second seed)."""
    impls = {} if fn is None else {"quantize_a": Implementation("mxfp8", "quantize_a", fn.__name__, fn)}
    stage = next(s for s in step_stages("mxfp8", M, N, K, G, impls=impls) if s.name == "quantize_a")
    sizes = [M // 2, M // 2]
    first, second = (make_inputs(M, N, K, G, sizes, device="cpu", seed=s) for s in (0, SECOND_SEED))
    stage = replace(stage, run=BoundCall(stage.fn, (first["a"],), stage.params))
    return stage, fresh_inputs([stage], second, impls)[0]


def timed(stage, fresh, us: float = 50.0):
    cheats.forget()
    double = GraphDouble(us)
    timer = StageTimer(SweepOptions(samples=4, hardware="h200-sxm"), mock.Mock(time_fn=double.time_fn,
                                                                                telemetry=FakeTelemetry))
    return timer.time(Point(M, N, K, G), stage, stage.run, fresh=fresh), double


# ------------------------------------------------------------------------------------------------ fresh inputs


def test_the_last_timed_replay_runs_on_the_second_values_and_the_first_come_back():
    stage, fresh = quantize_stage()
    a = stage.run.args[0]
    first = a.clone()
    assert not torch.equal(first, fresh.second[0])  # another seed: other values
    record, double = timed(stage, fresh)
    assert record.ok and record.error is None, record.error
    assert double.refills == [3, 2, 1, 0]  # before every timed replay, the last one's (0) on the second values
    assert torch.equal(a, first)  # written back: the next stage starts from the first values
    with fresh:
        fresh.refill(0)
        assert torch.equal(a, fresh.second[0])
        fresh.refill(1)
        assert torch.equal(a, first)


def test_refill_outside_its_context_is_refused():
    _, fresh = quantize_stage()
    with pytest.raises(RuntimeError, match="outside its context"):
        fresh.refill(0)


@pytest.mark.parametrize("name", cheats.CHEATS)
def test_each_cheat_passes_on_the_first_values_and_is_an_error_row_when_timed(name):
    cheat = getattr(cheats, name)
    stage, fresh = quantize_stage(cheat)
    a = stage.run.args[0]
    for x in (a, fresh.second[0]):  # called once on any values (as check calls it), each cheat is right
        cheats.forget()
        got, expected = cheat(x, mode="rceil"), stage.spec.oracle(x, mode="rceil")
        assert all(torch.equal(g.view(torch.uint8), e.view(torch.uint8)) for g, e in zip(got, expected, strict=True))
    record, _ = timed(stage, fresh)
    assert not record.ok and not record.samples_us
    assert record.error.startswith("StaleOutput:"), record.error
    assert "a_q" in record.error or "a_s" in record.error  # the output that differs, by the stage's rule


def test_the_honest_implementation_behind_the_cheats_is_timed():
    stage, fresh = quantize_stage(cheats.honest)
    record, _ = timed(stage, fresh)
    assert record.ok and record.impossible is None, record.failure
    assert record.telemetry["refilled"] is True


def test_without_fresh_inputs_a_caching_cheat_is_timed_as_before():
    """The control: the cheat is caught by the fresh inputs, not by something else in the double."""
    stage, _ = quantize_stage(cheats.caching)
    record, _ = timed(stage, None)
    assert record.ok, record.failure


@pytest.mark.parametrize("name, caught", [("caching", True), ("honest", False)])
def test_peers_times_each_implementation_on_fresh_inputs_too(name, caught):
    from mxbench.workloads.peers.measure import _time_one

    stage, fresh = quantize_stage()
    impl = Implementation("mxfp8", "quantize_a", name, getattr(cheats, name))
    cheats.forget()
    timer = StageTimer(SweepOptions(samples=4, hardware="h200-sxm"),
                       mock.Mock(time_fn=GraphDouble(50.0).time_fn, telemetry=FakeTelemetry))  # fmt: skip
    record = _time_one(timer, Point(M, N, K, G), stage, impl, list(stage.run.args), "cpu", fresh.second)
    assert record.impl == name
    assert (record.error or "").startswith("StaleOutput") == caught, record.failure


# ------------------------------------------------------------------------------------------------ the floor


def test_floor_is_the_larger_of_bytes_over_bandwidth_and_flops_over_peak():
    # h200-sxm: 4.8 TB/s = 4.8e6 B/us; 4.8e6 bytes -> 1 us. FLOPs: 2 us at the mxfp8 (fp8) peak -> the floor is 2 us.
    peak = SPEC.mxfp8_tflops or SPEC.fp8_tflops
    cost = Cost(2_400_000, 2_400_000, int(2 * peak * 1e6), "mxfp8")
    assert floor_us(cost, SPEC) == pytest.approx(2.0)
    assert floor_us(Cost(2_400_000, 2_400_000), SPEC) == pytest.approx(1.0)
    assert below_floor(1.9, cost, SPEC) is not None and below_floor(2.0, cost, SPEC) is None
    assert "2 us" in below_floor(1.9, cost, SPEC) and "TFLOP/s" in below_floor(1.9, cost, SPEC)


def test_a_time_below_the_stages_floor_is_recorded_impossible():
    stage, fresh = quantize_stage()
    floor = floor_us(stage.cost, SPEC)
    record, _ = timed(stage, fresh, us=floor * 0.5)
    assert record.impossible is not None and not record.ok
    assert record.samples_us  # kept as measured
    assert record.failure.startswith(f"{IMPOSSIBLE}: ")
    at_floor, _ = timed(stage, fresh, us=floor * 1.01)
    assert at_floor.ok and at_floor.impossible is None


# ------------------------------------------------------------------------------------------------ stored, shown, gated


def _runs(tmp_path, new_us: float):
    stage, fresh = quantize_stage()
    base, _ = timed(stage, fresh, us=floor_us(stage.cost, SPEC) * 3)
    new, _ = timed(stage, fresh, us=new_us)
    meta = {"card": "NVIDIA H200", "hardware": "h200-sxm", "kind": "roofline"}
    paths = []
    for name, record in (("base", base), ("new", new)):
        path = tmp_path / f"{name}.json"
        save_run(Run(dict(meta), [record, replace(record, samples_us=list(record.samples_us))]), path)
        paths.append(path)
    return paths, floor_us(stage.cost, SPEC)


def test_impossible_is_stored_and_read_back_and_old_runs_lack_it(tmp_path):
    (_, new), _ = _runs(tmp_path, new_us=1e-3)
    payload = json.loads(new.read_text())
    assert payload["records"][0]["impossible"].startswith("0.001 us is below the roofline floor")
    assert load_run(new).records[0].impossible == payload["records"][0]["impossible"]
    assert "impossible" in new.with_suffix(".csv").read_text().splitlines()[0]
    del payload["records"][0]["impossible"]  # a run written before the field: still valid, and a result
    old = tmp_path / "old.json"
    old.write_text(json.dumps(payload))
    assert load_run(old).records[0].impossible is None and load_run(old).records[0].ok


def test_compare_fails_on_an_impossible_stage_and_says_so(tmp_path):
    (base, new), _ = _runs(tmp_path, new_us=1e-3)
    cmp = compare_runs(load_run(base), load_run(new))
    assert cmp.exit_code == 1 and not cmp.matches and list(cmp.impossible)
    assert IMPOSSIBLE in verdict_line(cmp)
    assert json.loads(json_report(cmp, "base", "new"))["counts"][IMPOSSIBLE] == 1
    result = CliRunner().invoke(cli, ["compare", str(base), str(new)])
    assert result.exit_code == 1, result.output
    assert IMPOSSIBLE in result.output and "roofline floor" in result.output
    same = CliRunner().invoke(cli, ["compare", str(base), str(base)])
    assert same.exit_code == 0, same.output  # the control: the same runs without the impossible time pass


def test_the_table_shows_impossible_in_place_of_a_time(tmp_path):
    (_, new), _ = _runs(tmp_path, new_us=1e-3)
    result = CliRunner().invoke(cli, ["table", str(new)])
    assert result.exit_code == 0, result.output
    assert f"{IMPOSSIBLE}: 0.001 us is below the roofline floor" in result.output


# ------------------------------------------------------------------------------------------------ on the GPU


def _roofline(folder: Path, *impl: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mxbench", "roofline", "--K", "2048", "--N", "1024", "--G", "8", "--M", "8192",
               "--samples", "5", "--out", str(folder / "run.json"), *impl]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "kernels"), str(ROOT)])}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)


@pytest.fixture(scope="module")
def honest_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("honest")
    done = _roofline(folder, "--impl", "quantize_a=tests.cheats:honest")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]  # no stage of ours refused either
    return folder / "run.json"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", cheats.CHEATS)
def test_each_cheat_is_caught_on_the_card_and_fails_the_gate(tmp_path, honest_run, name):
    cheat = _roofline(tmp_path, "--impl", f"quantize_a=tests.cheats:{name}")
    assert f"check mxfp8/quantize_a [tests.cheats:{name}]: PASS" in cheat.stderr  # check cannot see it
    record = next(r for r in load_run(tmp_path / "run.json").records
                  if r.stage == "quantize_a" and r.point.recipe == "mxfp8")  # fmt: skip
    assert not record.ok
    assert (record.error or "").startswith(("StaleOutput", "TimingError")) or record.impossible, record
    assert cheat.returncode == 1, cheat.stdout[-3000:] + cheat.stderr[-3000:]  # roofline fails on a fooled time
    gate = subprocess.run([sys.executable, "-m", "mxbench", "compare", str(honest_run), str(tmp_path / "run.json")],
                          cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "kernels"), str(ROOT)])})
    assert gate.returncode == 1, gate.stdout[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_the_real_timer_refills_and_verifies_on_the_card():
    """``time_fn`` itself (graph-cold, graph-warm, events-cold): the honest quantizer is timed, each cheat raises."""
    from mxbench.instruments.timing import time_fn

    for name in ("honest", *cheats.CHEATS):
        stage, fresh = quantize_stage(getattr(cheats, name))
        stage = replace(stage, run=BoundCall(stage.fn, (stage.run.args[0].cuda(),), stage.params))
        fresh = FreshInputs(stage, stage.run.args, tuple(x.cuda() for x in fresh.second))
        for options in ({}, {"cold_l2": False}, {"use_graph": False}):
            cheats.forget()
            with fresh:
                if name == "honest":
                    assert time_fn(stage.run, samples=5, fresh=fresh, **options).median_us > 0
                    continue
                if name == "capture_detecting" and options.get("use_graph") is False:
                    assert time_fn(stage.run, samples=5, fresh=fresh, **options).median_us > 0  # nothing to detect
                    continue
                with pytest.raises(StaleOutput):
                    time_fn(stage.run, samples=5, fresh=fresh, **options)
