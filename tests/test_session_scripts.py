"""The device session scripts (``scripts/*_session.sh``, ``scripts/gpu_*.sh``): each parses and sources
``scripts/session_common.sh``, which refuses to start when the checkout's git HEAD is not the tree that runs (the
device's .git can be older than the copied tree: its runs would record a stale commit) unless MXBENCH_GIT_COMMIT
names the commit. Run on a scratch git repository with a stand-in ``python3`` (no install, no GPU)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
SESSIONS = sorted({*SCRIPTS.glob("*_session.sh"), *SCRIPTS.glob("gpu_*.sh")})
# The stand-in python3: records its arguments, prints a card name for the CARD probe, succeeds.
FAKE_PYTHON = '#!/bin/sh\necho "$@" >> "$CALLS"\ncase "$1" in -c) echo fake-card ;; esac\n'


def test_every_session_script_parses_and_sources_the_common_setup():
    assert len(SESSIONS) >= 9, SESSIONS
    for script in [*SESSIONS, SCRIPTS / "session_common.sh", SCRIPTS / "run_step.sh"]:
        parsed = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
        assert parsed.returncode == 0, (script.name, parsed.stderr)
    for script in SESSIONS:
        text = script.read_text()
        assert 'source "$(dirname "$0")/session_common.sh"' in text, script.name
        assert "-e ./kernels" not in text and "card_slug" not in text, f"{script.name} repeats session_common.sh"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)  # fmt: skip


@pytest.fixture
def repo(tmp_path):
    """A committed checkout holding the common setup and one tracked file; a stand-in python3 first on PATH."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPTS / "session_common.sh", repo / "scripts")
    (repo / "tracked.txt").write_text("as committed\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "c")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    return repo


def _session(repo: Path, body: str = "", **env: str) -> subprocess.CompletedProcess:
    """``bash session.sh`` in ``repo``: a script that sources the common setup, then runs ``body``."""
    (repo / "session.sh").write_text(f'set -u\nsource "$(dirname "$0")/scripts/session_common.sh"\n{body}\n')
    environ = {k: v for k, v in os.environ.items() if k not in ("MXBENCH_GIT_COMMIT", "DEADLINE")}
    environ.update(PATH=f"{repo.parent / 'bin'}:{environ['PATH']}", CALLS=str(repo.parent / "calls"),
                   OUT=str(repo.parent / "out"), **env)  # fmt: skip
    return subprocess.run(["bash", "session.sh"], cwd=repo, env=environ, check=False, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def _calls(repo: Path) -> list[str]:
    calls = repo.parent / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_clean_checkout_installs_and_names_the_card(repo):
    done = _session(repo, 'echo "card=$CARD out=$OUT"')
    assert done.returncode == 0, done.stderr
    assert f"card=fake-card out={repo.parent / 'out'}" in done.stdout
    assert (repo.parent / "out").is_dir()
    assert _calls(repo)[0] == "-m pip install -q --no-deps --no-build-isolation -e ./kernels -e ."


def test_a_tree_that_differs_from_head_is_refused_in_one_line_before_any_install(repo):
    (repo / "tracked.txt").write_text("changed after the commit\n")
    done = _session(repo, "echo started")
    assert done.returncode == 2
    assert "started" not in done.stdout and _calls(repo) == []
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "MXBENCH_GIT_COMMIT" in lines[0] and lines[0].startswith("session.sh:"), done.stderr


def test_a_named_commit_lets_a_changed_tree_run(repo):
    (repo / "tracked.txt").write_text("changed after the commit\n")
    done = _session(repo, "echo started", MXBENCH_GIT_COMMIT="0123abc")
    assert done.returncode == 0 and "started" in done.stdout, done.stderr


def test_untracked_files_alone_do_not_stop_a_session(repo):
    (repo / "results.json").write_text("{}")  # what a session writes: never in git's tree
    done = _session(repo, "echo started")
    assert done.returncode == 0 and "started" in done.stdout, done.stderr


def test_a_failed_install_prints_its_log_and_exits_1(repo):
    (repo.parent / "bin" / "python3").write_text('#!/bin/sh\necho "no network here"\nexit 1\n')
    done = _session(repo, "echo started")
    assert done.returncode == 1 and "no network here" in done.stdout and "started" not in done.stdout


def test_left_counts_down_to_the_deadline_and_pack_archives_out(repo):
    deadline = int(time.time()) + 300
    done = _session(repo, 'echo "left=$(left)"; mkdir -p "$OUT/m"; echo x > "$OUT/m/a.log"; pack maps.tgz m',
                    DEADLINE=str(deadline))  # fmt: skip
    assert done.returncode == 0, done.stderr
    left = int(done.stdout.split("left=")[1].split()[0])
    assert 240 <= left <= 300
    archive = repo.parent / "out" / "maps.tgz"
    listed = subprocess.run(["tar", "tzf", str(archive)], check=True, capture_output=True, text=True)
    assert "m/a.log" in listed.stdout.split()
    assert "left=100000" in _session(repo, 'echo "left=$(left)"').stdout  # no deadline
