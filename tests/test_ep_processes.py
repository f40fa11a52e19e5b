"""The processes of ``mxbench ep`` (issue 26, items 5 and 8): Ctrl-C stops every rank and exits 130 with one line;
no worker outlives its launcher; a stale or garbled torchrun environment is named (exit 2); an implementation that
raises is one line naming the rank, the stage and the error (exit 1); --nproc is bounded by what the host has."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxbench.cli import cli
from mxbench.workloads.ep import launch

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--K", "64", "--N", "64", "--experts", "2", "--tokens", "32"]


def start(*args: str, extra_path: str | None = None) -> tuple[subprocess.Popen, str]:
    """``mxbench ep ARGS`` in a session of its own (as a terminal runs it: Ctrl-C goes to its process group), with a
    seed no other run uses: the mark its workers' command lines carry."""
    mark = str(random.randrange(10**9, 2 * 10**9))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (*sys.path, extra_path) if p),
           "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "mxbench", "ep", *args, "--seed", mark], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_terminal_signals)  # fmt: skip
    return proc, mark


def _terminal_signals() -> None:
    """SIGINT as a terminal's job has it (a suite started in the background inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def workers(mark: str) -> list[int]:
    """The pids of the workers whose command line carries ``mark``: neither the launcher (its has --nproc) nor
    torchrun (mxbench.workloads.ep.torchrun)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark.encode() in words and b"mxbench.workloads.ep.torchrun" not in words and b"--nproc" not in words:
            found.append(int(entry.name))
    return found


def wait_for(condition, timeout_s: float = 120.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return False


def launched_workers(*args: str, sizes=TINY) -> tuple[subprocess.Popen, str]:
    proc, mark = start("--nproc", "2", "--check", *sizes, *args)
    assert wait_for(lambda: len(workers(mark)) == 2 or proc.poll() is not None), "the workers never started"
    assert proc.poll() is None, proc.communicate()
    return proc, mark


def test_ctrl_c_stops_every_rank_and_exits_130_with_one_line():
    proc, mark = launched_workers()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines() == ["interrupted: the 2 workers were stopped"], err
    assert wait_for(lambda: not workers(mark), 10), f"workers left: {workers(mark)}"


def test_no_worker_outlives_a_killed_launcher():
    # workers given minutes of work: one left running is seen, not mistaken for one that finished (they are killed
    # while they import, so the size costs nothing when they die as they should)
    proc, mark = launched_workers(sizes=["--K", "64", "--N", "64", "--experts", "2", "--tokens", "65536"])
    proc.kill()  # SIGKILL: the launcher cannot clean up; the kernel stops torchrun, and torchrun's death its workers
    proc.wait(timeout=60)  # not communicate(): it would wait for every holder of the pipes, the workers included
    try:  # a worker still importing when torchrun died leaves at its die_with_parent, after its imports
        assert wait_for(lambda: not workers(mark), 60), f"workers left: {workers(mark)}"
    finally:
        for pid in workers(mark):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


def test_an_implementation_that_raises_is_one_line_naming_rank_stage_and_error():
    proc, _ = start("--nproc", "2", "--check", *TINY, "--strategy", "bf16", "--impl",
                    "permute=ep_broken:raising_permute", extra_path=str(Path(__file__).parent))  # fmt: skip
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    (line,) = err.strip().splitlines()
    assert line.startswith("mxbench ep: rank ") and "Traceback" not in out + err
    assert "bf16/permute (--impl permute=ep_broken:raising_permute) raised RuntimeError: kernel launch failed" in line


@pytest.mark.parametrize("env, message", [
    ({"WORLD_SIZE": "abc"}, "the environment sets WORLD_SIZE=abc but not RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "the environment sets RANK=5 WORLD_SIZE=2 but not LOCAL_RANK"),
    ({"RANK": "0"}, "sets RANK=0 but not WORLD_SIZE"),
    ({"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "1"},
     "RANK must be in 0..WORLD_SIZE-1"),
    ({"RANK": "0", "WORLD_SIZE": "abc", "LOCAL_RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "1"},
     "WORLD_SIZE='abc' in the environment is not an integer"),
])  # fmt: skip
@pytest.mark.parametrize("nproc", [[], ["--nproc", "2"]])
def test_a_stale_or_garbled_torchrun_environment_is_named_before_any_work(monkeypatch, env, message, nproc):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    from mxbench.workloads.ep import worker

    monkeypatch.setattr(worker, "run_worker", lambda *a, **k: pytest.fail("the run started"))
    result = CliRunner().invoke(cli, ["ep", *nproc, "--check", *TINY])
    assert result.exit_code == 2 and message in result.output, result.output


def test_nproc_is_bounded_by_the_cpus_on_gloo(monkeypatch):
    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    result = CliRunner().invoke(cli, ["ep", "--nproc", "100", "--check", *TINY])
    assert result.exit_code == 2 and "100 workers, but this host has 8 CPU core(s) (2;" in result.output, result.output
    monkeypatch.setattr(launch, "launch", lambda *a, **k: 0)
    assert CliRunner().invoke(cli, ["ep", "--nproc", "8", "--check", *TINY]).exit_code == 0


def test_nproc_is_bounded_by_the_gpus(monkeypatch):
    import torch

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    result = CliRunner().invoke(cli, ["ep", "--nproc", "3", "--check", *TINY])
    assert result.exit_code == 2 and "3 workers, but this host has 2 GPU(s)" in result.output, result.output
