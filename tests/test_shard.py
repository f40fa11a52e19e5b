"""Sharded sweeps: the split, the refusals, and roofline / peers / regress over two processes (gloo, on CPU).

Two processes are started once (``torch.multiprocessing``, spawn) with torchrun's environment; each runs every
scenario in turn, in a fresh gloo group of its own, with fake instruments (``test_sweep.Fakes``,
``test_peers.PeerFakes``), and leaves what it got in a pickle; the tests compare that with one process measuring
the same work.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import pytest
from mxkernels.core.errors import InputError

from shard_fakes import POINTS, WORLD, fakes_for, sweep_options

from mxbench.measuring import shard
from mxbench.plan.points import plan_points, with_baselines
from mxbench.gate.regress import regress
from mxbench.storage.results import load_run
from mxbench.measuring.shard import assign, check_ranks, unit_of
from mxbench.workloads.peers import sharded as peers_sharded
from mxbench.workloads.step import sharded as step_sharded
from mxbench.workloads.step.sweep import run_sweep


# ------------------------------------------------------------------------------------------------- the split


def test_a_recipe_point_and_its_baseline_go_to_the_same_rank():
    work = with_baselines(plan_points([64, 128, 256, 512], 64, 32, 2, ["mxfp8", "fp8_rowwise"]))
    owner = assign(work, 3)
    for p in work:
        assert owner[p] == owner[unit_of(p)]
    assert set(owner.values()) == {0, 1, 2}


def test_the_split_ignores_the_order_of_the_points():
    work = with_baselines(POINTS)
    assert assign(work, WORLD) == assign(list(reversed(work)), WORLD)


def test_the_split_balances_the_cost_largest_first():
    # M x N x K of 1, 2, 4, 8 units: 8 alone on rank 0, 4 + 2 + 1 on rank 1 (round robin would give 5 against 10)
    work = with_baselines(plan_points([16384, 32768, 65536, 131072], 2048, 7168, 8))
    owner = assign(work, 2)
    assert sorted({p.M for p in work if owner[p] == 0}) == [131072]
    assert sorted({p.M for p in work if owner[p] == 1}) == [16384, 32768, 65536]
    assert set(assign(work, 1).values()) == {0}
    assert set(assign(work, 8).values()) == {0, 1, 2, 3}  # more ranks than units: some measure nothing


def ranks(*cards, plans=(0, 0)):
    return [{"rank": r, "host": "h", "index": r, "uuid": f"GPU-{r}", "card": c, "plan": plans[r]}
            for r, c in enumerate(cards)]  # fmt: skip


def test_mixed_cards_and_different_plans_are_refused_naming_them():
    check_ranks(ranks("NVIDIA H100", "NVIDIA H100"))
    with pytest.raises(InputError, match=r"rank 0: NVIDIA H100 \(h cuda:0\), rank 1: NVIDIA H200 \(h cuda:1\)"):
        check_ranks(ranks("NVIDIA H100", "NVIDIA H200"))
    with pytest.raises(InputError, match="planned different work"):
        check_ranks(ranks("NVIDIA H100", "NVIDIA H100", plans=(1, 2)))


def test_the_rank_and_device_come_from_torchruns_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert not shard.launched() and shard.local_device() == 0 and not shard.is_other_rank()
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert shard.launched() and shard.is_other_rank()
    assert shard.local_device() == 1  # no GPU here: nothing to bind, the index is still this rank's


# ------------------------------------------------------------------------------------------- two processes


def _sweep(rank, tmp):
    f, ins = fakes_for(rank)
    run = step_sharded.sharded_sweep(POINTS, options=sweep_options(tmp / f"sweep-rank{rank}.json", rank), instruments=ins,
                              progress=False)  # fmt: skip
    return run, f.built, f.power.events


def _mixed(rank, tmp):
    f, ins = fakes_for(rank, card=["NVIDIA H100 80GB HBM3", "NVIDIA H200"][rank])
    try:
        step_sharded.sharded_sweep(POINTS, options=sweep_options(tmp / f"mixed-rank{rank}.json", rank), instruments=ins,
                            progress=False)  # fmt: skip
    except InputError as e:
        return str(e), f.timed
    return None, f.timed


def _failing(rank, tmp):
    _, ins = fakes_for(rank)
    if rank == 1:

        def release():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        ins.release = release
    return step_sharded.sharded_sweep(POINTS, options=sweep_options(tmp / f"failing-rank{rank}.json", rank),
                               instruments=ins, progress=False)  # fmt: skip


def _stopped(rank, tmp):
    f, ins = fakes_for(rank)
    if rank == 1:

        def ctrl_c_in_the_third_point():  # the first two (mxfp8 and its baseline) take 3 + 2 timings
            if len(f.timed) > 5:
                raise KeyboardInterrupt

        f.on_time = ctrl_c_in_the_third_point
    return step_sharded.sharded_sweep(POINTS, options=sweep_options(tmp / f"stopped-rank{rank}.json", rank),
                               instruments=ins, progress=False)  # fmt: skip


def _peers(rank, tmp):
    from test_peers import FakePipeline, PeerFakes, fake_registry

    fakes = PeerFakes()
    ins = fakes.instruments()
    ins.device_properties = lambda: {"name": "Fake GPU", "uuid": f"GPU-{rank}"}
    return peers_sharded.sharded_peers(64, 64, 32, 2, options=sweep_options(tmp / f"peers-rank{rank}.json", rank),
                               instruments=ins, registry=fake_registry(), pipeline=FakePipeline(),
                               progress=False)  # fmt: skip


def _regress(rank, tmp):
    f, ins = fakes_for(rank)
    result = step_sharded.sharded_regress(load_run(tmp / "baseline.json"), options=sweep_options(rank=rank),
                                   instruments=ins, rounds=2)  # fmt: skip
    return result, [(recipe, M, w) for recipe, M, w, _ in f.built]


def _cli(rank, tmp):
    from click.testing import CliRunner

    import mxbench.instruments.kit
    from mxbench.cli import cli
    from mxbench.clikit import common

    os.chdir(tmp)
    common.has_gpu = lambda: True
    common.detected_spec = lambda device=0: "h100-sxm"
    mxbench.instruments.kit.Instruments.real = staticmethod(lambda *a, **k: fakes_for(rank)[1])
    result = CliRunner().invoke(cli, ["roofline", "--K", "64", "--N", "64", "--G", "2", "--M", "64,128", "--samples",
                                      "3", "--out", f"cli-rank{rank}.json"])  # fmt: skip
    return result.exit_code, result.stdout, result.stderr, repr(result.exception)


SCENARIOS = {"sweep": _sweep, "mixed": _mixed, "failing": _failing, "stopped": _stopped, "peers": _peers,
             "regress": _regress, "cli": _cli}  # fmt: skip


def _rank_main(rank: int, tmp: str) -> None:
    """One rank: torchrun's environment, then every scenario in its own gloo group (a file store: no ports)."""
    import torch.distributed as dist

    tmp = Path(tmp)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="1")  # fmt: skip
    for name, scenario in SCENARIOS.items():
        dist.init_process_group("gloo", init_method=f"file://{tmp}/{name}.store", rank=rank, world_size=WORLD)
        try:
            got = ("ok", scenario(rank, tmp))
        except BaseException as e:  # noqa: BLE001 -- handed to the test, which says what went wrong
            got = ("raised", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        if dist.is_initialized():  # a scenario that raised before its session left
            dist.destroy_process_group()
        (tmp / f"{name}-{rank}.pkl").write_bytes(pickle.dumps(got))


@pytest.fixture(scope="module")
def ranks_ran(tmp_path_factory):
    """Run the scenarios on two processes; ``got(name, rank)`` is what a scenario returned on that rank."""
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("shard")
    run_sweep(POINTS, options=sweep_options(tmp / "baseline.json"), instruments=fakes_for(0)[1], progress=False)
    mp.start_processes(_rank_main, args=(str(tmp),), nprocs=WORLD, join=True, start_method="spawn")

    def got(name: str, rank: int):
        status, value = pickle.loads((tmp / f"{name}-{rank}.pkl").read_bytes())
        assert status == "ok", value
        return value

    got.tmp = tmp
    return got


def plain(records):
    """Records as dicts, without the device they ran on (one process names none)."""
    out = []
    for r in records:
        d = asdict(r)
        d["telemetry"] = {k: v for k, v in d["telemetry"].items() if k != "device"}
        out.append(d)
    return out


def test_a_sharded_sweep_gathers_what_one_process_measures_in_order(ranks_ran):
    run, built0, power0 = ranks_ran("sweep", 0)
    other, built1, power1 = ranks_ran("sweep", 1)
    assert other is None
    _, ins = fakes_for(0)
    single = run_sweep(POINTS, options=sweep_options(), instruments=ins, progress=False)
    assert plain(run.records) == plain(single.records)
    # each rank measured its units on its own GPU, and applied the power limit to its own GPU
    owner = assign(with_baselines(POINTS), WORLD)
    for rank, built in ((0, built0), (1, built1)):
        mine = [p for p in with_baselines(POINTS) if owner[p] == rank]
        assert [(recipe, M, w) for recipe, M, w, _ in built] == [(p.recipe, p.M, p.power_limit_w) for p in mine]
        assert {device for *_, device in built} == {f"cuda:{rank}"}
        limits = list(dict.fromkeys(p.power_limit_w for p in mine))
        assert (power0, power1)[rank] == [(what, w) for w in limits for what in ("set", "restore")]
    assert power0 != power1  # each rank set a limit on its own GPU: here each got the points of one limit
    for r in run.records:
        rank = owner[r.point]
        assert r.telemetry["device"] == {"rank": rank, "host": os.uname().nodename, "index": rank,
                                         "uuid": f"GPU-{rank}"}  # fmt: skip
    meta = run.meta
    assert (meta["world_size"], meta["cards"], meta["card"]) == (2, ["Fake GPU"], "Fake GPU")
    assert [(r["rank"], r["card"], r["uuid"], r["answered"]) for r in meta["ranks"]] == [
        (0, "Fake GPU", "GPU-0", True), (1, "Fake GPU", "GPU-1", True)]  # fmt: skip
    assert "partial" not in meta and "interrupted" not in meta
    assert meta["group_sizes"] == single.meta["group_sizes"]  # every rank's points, not rank 0's alone
    assert [(s["rank"], s["requested_w"]) for s in meta["power_snapshots"]] == [(0, 250.0), (1, 300.0)]


def test_compare_pairs_every_stage_of_a_sharded_run_with_the_single_gpu_run(ranks_ran, tmp_path):
    from click.testing import CliRunner

    from mxbench.cli import cli

    single = tmp_path / "single.json"
    run_sweep(POINTS, options=sweep_options(single), instruments=fakes_for(0)[1], progress=False)
    result = CliRunner().invoke(cli, ["compare", str(single), str(ranks_ran.tmp / "sweep-rank0.json")])
    assert result.exit_code == 0, result.output
    stages = len(load_run(single).records)
    assert f"over {stages} stages" in result.output and "only in" not in result.output


def test_only_rank_0_writes_the_results(ranks_ran):
    tmp = ranks_ran.tmp
    run, *_ = ranks_ran("sweep", 0)
    assert not (tmp / "sweep-rank1.json").exists() and not (tmp / "sweep-rank1.csv").exists()
    assert plain(load_run(tmp / "sweep-rank0.json").records) == plain(run.records)


def test_a_launch_on_two_card_models_is_refused_before_measuring(ranks_ran):
    for rank in (0, 1):
        message, timed = ranks_ran("mixed", rank)
        assert "rank 0: NVIDIA H100 80GB HBM3" in message and "rank 1: NVIDIA H200" in message
        assert timed == []
    assert not list(ranks_ran.tmp.glob("mixed-rank*.json"))


def test_a_failing_rank_leaves_the_others_records_marked_partial(ranks_ran):
    run = ranks_ran("failing", 0)
    assert ranks_ran("failing", 1) is None
    owner = assign(with_baselines(POINTS), WORLD)
    assert run.records and {owner[r.point] for r in run.records} == {0}
    assert "rank 1 failed: RuntimeError: CUDA error: an illegal memory access" in run.meta["partial"]
    assert "6 point(s) not measured" in run.meta["partial"] and "interrupted" not in run.meta
    assert load_run(ranks_ran.tmp / "failing-rank0.json").meta["partial"] == run.meta["partial"]


def test_a_stopped_rank_hands_in_what_it_measured(ranks_ran):
    run = ranks_ran("stopped", 0)
    owner = assign(with_baselines(POINTS), WORLD)
    from_1 = [r for r in run.records if owner[r.point] == 1]
    assert from_1 and len({r.point for r in from_1}) < sum(1 for p in with_baselines(POINTS) if owner[p] == 1)
    assert run.meta["interrupted"] and "rank 1 was stopped" in run.meta["partial"]


def test_sharded_peers_deal_the_pairs_and_gather_them_in_order(ranks_ran):
    from test_peers import PeerFakes
    from test_peers import run as run_peers_once

    gathered = ranks_ran("peers", 0)
    assert ranks_ran("peers", 1) is None
    single = run_peers_once(PeerFakes())
    assert plain(gathered.records) == plain(single.records)
    assert [r.telemetry["device"]["rank"] for r in gathered.records] == [i % 2 for i in range(len(single.records))]
    assert gathered.meta["kind"] == "peers" and gathered.meta["world_size"] == 2


def test_sharded_regress_splits_every_round_and_decides_as_one_process(ranks_ran):
    result, built0 = ranks_ran("regress", 0)
    none, built1 = ranks_ran("regress", 1)
    assert none is None
    _, ins = fakes_for(0)
    single = regress(load_run(ranks_ran.tmp / "baseline.json"),
                     lambda pts: run_sweep(pts, options=sweep_options(), instruments=ins, progress=False),
                     rounds=2)  # fmt: skip
    assert result.exit_code == single.exit_code == 0
    assert [(m.key, m.verdict, m.base_us, m.new_us) for m in result.comparison.matches] == [
        (m.key, m.verdict, m.base_us, m.new_us) for m in single.comparison.matches]  # fmt: skip
    # each rank measured its own units in both rounds, the second in reverse order
    work = list(dict.fromkeys(r.point for r in load_run(ranks_ran.tmp / "baseline.json").records))
    owner = assign(work, WORLD)
    for rank, built in ((0, built0), (1, built1)):
        mine = [(p.recipe, p.M, p.power_limit_w) for p in work if owner[p] == rank]
        assert built == mine + mine[::-1]


def test_the_roofline_command_under_torchrun_prints_and_writes_on_rank_0_only(ranks_ran):
    code0, out0, err0, exc0 = ranks_ran("cli", 0)
    code1, out1, err1, exc1 = ranks_ran("cli", 1)
    assert (code0, code1) == (0, 0), (exc0, err0, exc1, err1)
    assert "Net speedup" in out0 and "results: cli-rank0.json" in out0
    assert out1 == "" and err1 == ""
    assert (ranks_ran.tmp / "cli-rank0.json").exists() and not (ranks_ran.tmp / "cli-rank1.json").exists()
    assert load_run(ranks_ran.tmp / "cli-rank0.json").meta["world_size"] == 2


# ----------------------------------------------------------------------------------------- under torchrun


def torchrun_crash_script(out: Path, how: str) -> subprocess.Popen:
    """``tests/shard_crash.py`` on two workers started by torch.distributed.run (torchrun)."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path, str(here)])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
               str(here / "shard_crash.py"), str(out), how]  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_crashed_rank_stops_rank_0_which_writes_what_it_has(tmp_path):
    proc = torchrun_crash_script(tmp_path / "crash.json", "crash")
    log, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, log
    run = load_run(tmp_path / "crash.json")
    assert run.meta["interrupted"] and "rank 1 did not answer" in run.meta["partial"], log
    assert run.records and {r.telemetry["device"]["rank"] for r in run.records} == {0}


def test_ctrl_c_under_torchrun_gathers_what_every_rank_measured(tmp_path):
    out = tmp_path / "stopped.json"
    proc = torchrun_crash_script(out, "wait")
    deadline = time.monotonic() + 120
    cues = [out.with_suffix(f".rank{rank}") for rank in range(WORLD)]
    while not all(c.exists() for c in cues) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends torchrun, which forwards it to every worker
    log, _ = proc.communicate(timeout=60)
    run = load_run(out)
    assert run.meta["interrupted"] and "rank 0 was stopped" in run.meta["partial"], log
    assert {r.telemetry["device"]["rank"] for r in run.records} == {0, 1}
    assert [r.point for r in run.records] == sorted((r.point for r in run.records), key=with_baselines(POINTS).index)
