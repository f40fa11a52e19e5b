"""Which code a run records (issue 14): mxbench's commit only from its own checkout (a copy nested in another git
repository must not take that repository's HEAD), ``MXBENCH_GIT_COMMIT`` first, and the distribution, version and
git commit of every implementation that ran, recorded once per run and named by each record."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import FakeGPU

import mxbench
from mxbench.instruments import provenance
from mxbench.implementations import default, registry
from mxbench.cli import cli
from mxbench.clikit import common
from mxbench.gate.compare import compare_runs
from mxbench.instruments.kit import Instruments
from mxbench.measuring.stages import SweepOptions
from mxbench.measuring.metadata import run_metadata
from mxbench.views.render import header_block
from mxbench.storage.results import Point, Record, Run, load_run

REPO = Path(__file__).resolve().parent.parent
PLAIN = REPO / "examples" / "plain_quantizer" / "plain_quantizer.py"


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args],
                          cwd=cwd, capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return done.stdout.strip()


def new_repo(path: Path) -> str:
    """A git repository at ``path`` with everything in it committed; returns its HEAD."""
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "test")
    return git(path, "rev-parse", "HEAD")


@pytest.fixture(autouse=True)
def no_named_commit(monkeypatch):
    monkeypatch.delenv(provenance.ENV_COMMIT, raising=False)


# --------------------------------------------------------------------------------------------- mxbench's own


def own_commit(tree: Path, **env: str) -> str:
    """``git_commit()`` as a process importing mxbench from ``tree`` reports it."""
    clean = {k: v for k, v in os.environ.items() if k != provenance.ENV_COMMIT}
    done = subprocess.run(
        [sys.executable, "-c", "import mxbench, mxbench.instruments.provenance as p; print(p.REPO_ROOT, p.git_commit())"],
        env={**clean, "PYTHONPATH": str(tree), **env}, cwd=tree, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    root, commit = done.stdout.split()
    assert Path(root) == tree.resolve()  # the copy is what ran
    return commit


def test_a_copy_nested_in_another_repository_does_not_take_its_commit(tmp_path):
    outer = tmp_path / "outer"
    tree = outer / "work" / "mxbench-copy"
    shutil.copytree(REPO / "mxbench", tree / "mxbench", ignore=shutil.ignore_patterns("__pycache__"))
    outer_head = new_repo(outer)
    assert own_commit(tree) == "None"  # git's top level is outer, not the project's root
    assert own_commit(tree, MXBENCH_GIT_COMMIT="0123abc") == "0123abc"
    # the same copy as a checkout of its own (nested inside the outer one): its own HEAD
    own_head = new_repo(tree)
    assert own_head != outer_head and own_commit(tree) == own_head
    (tree / "mxbench" / "__init__.py").write_text((tree / "mxbench" / "__init__.py").read_text() + "# edited\n")
    assert own_commit(tree) == own_head + "+dirty"
    assert own_commit(tree, MXBENCH_GIT_COMMIT="feed42+dirty") == "feed42+dirty"  # the named commit always wins


def test_the_named_commit_wins_over_git_and_says_whether_it_was_dirty(monkeypatch):
    monkeypatch.setenv(provenance.ENV_COMMIT, "abc123")
    assert provenance.project_commit() == ("abc123", None)  # clean or not: unknown
    monkeypatch.setenv(provenance.ENV_COMMIT, "abc123+dirty")
    assert provenance.project_commit() == ("abc123", True) and provenance.git_commit() == "abc123+dirty"


# ----------------------------------------------------------------------------------------- implementations


@pytest.fixture
def outside_module(tmp_path, monkeypatch):
    """The plain-torch quantizer example as a module of its own git repository (a third party's kernel)."""
    repo = tmp_path / "their-kernels"
    repo.mkdir()
    shutil.copy(PLAIN, repo / "their_quantizer.py")
    head = new_repo(repo)
    monkeypatch.syspath_prepend(str(repo))
    monkeypatch.delitem(sys.modules, "their_quantizer", raising=False)
    monkeypatch.setattr(default, "_DEFAULT", None)
    return repo, head


def test_an_impl_module_in_a_git_repository_records_that_repositorys_commit(outside_module):
    repo, head = outside_module
    impl = registry.parse_impl("quantize_a=their_quantizer:quantize_a")
    options = SweepOptions(impls=(impl,))
    meta = run_metadata([Point(64, 64, 64, 2)], options, FakeGPU().instruments())["implementations"]
    when = subprocess.run(["git", "-C", str(repo), "show", "-s", "--format=%cI", head], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert meta["their_quantizer:quantize_a"] == {
        "module": "their_quantizer", "distribution": None, "version": None, "commit": head, "dirty": False,
        "git_commit_time": when,  # what a history orders this implementation's runs by, wherever it is read
    }  # fmt: skip
    # ours: the distribution that provides mxkernels (this project, installed) and this checkout's commit
    ours = meta["mxkernels"]
    assert ours["distribution"] == "mxkernels" and ours["version"] == importlib.metadata.version("mxkernels")
    assert ours["commit"] == provenance.project_commit()[0]
    (repo / "their_quantizer.py").write_text(PLAIN.read_text() + "\n# tuned\n")
    again = run_metadata([Point(64, 64, 64, 2)], options, FakeGPU().instruments())["implementations"]
    assert again["their_quantizer:quantize_a"]["dirty"] is True


def test_a_module_installed_in_site_packages_is_not_filed_under_an_enclosing_checkout(tmp_path, monkeypatch):
    site = tmp_path / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "installed_kernel.py").write_text("def f(x):\n    return (x,)\n")
    new_repo(tmp_path)  # the virtualenv sits inside some project's repository
    monkeypatch.syspath_prepend(str(site))
    info = provenance.module_provenance("installed_kernel", {})
    assert info == {"module": "installed_kernel", "distribution": None, "version": None, "commit": None,
                    "dirty": None, "git_commit_time": None}  # fmt: skip


def test_torchaos_adapters_are_filed_under_torchao():
    impl = default.builtin_registry().get("mxfp8", "quantize_a", "torchao")
    assert impl.module == "torchao" and impl.fn.__module__ == "mxbench.implementations.builtin"


def test_a_swept_run_names_each_records_implementation_once_in_its_metadata(outside_module, tmp_path, monkeypatch):
    """End to end: ``roofline --impl`` on a fake GPU records the outside module's commit, and every record's
    implementation (an end-to-end row names several, joined by '+') is a key of meta["implementations"]."""
    _, head = outside_module
    fake = FakeGPU()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(common, "detected_spec", lambda device=0: "h100-sxm")
    monkeypatch.setattr(common, "card_name", lambda device=0: "Fake GPU")
    monkeypatch.setattr(Instruments, "real", classmethod(lambda cls, *a, **k: fake.instruments()))
    out = tmp_path / "run.json"
    result = CliRunner().invoke(cli, ["roofline", "--K", "256", "--N", "128", "--G", "2", "--M", "512", "--out",
                                      str(out), "--impl", "quantize_a=their_quantizer:quantize_a"])  # fmt: skip
    assert result.exit_code == 0, result.output
    run = load_run(out)
    impls = run.meta["implementations"]
    assert impls["their_quantizer:quantize_a"]["commit"] == head and set(impls) == {
        "mxkernels", "their_quantizer:quantize_a"}  # fmt: skip
    named = {name for r in run.records for name in r.impl.split("+")}
    assert named == set(impls)
    assert [r.impl for r in run.records if r.stage == "quantize_a"] == ["their_quantizer:quantize_a"]
    # the table header shows each implementation's code beside mxbench's commit
    table = CliRunner().invoke(cli, ["table", str(out)]).output
    assert f"their_quantizer:quantize_a unversioned, commit {head[:12]}" in table
    assert f"mxkernels {importlib.metadata.version('mxkernels')} (mxkernels)" in table


# ---------------------------------------------------------------------------------------- two runs' code


def run_with(implementations: dict, git_commit: str = "aaa") -> Run:
    records = [Record(Point(1024, 2048, 7168, 8), "forward", "quantize_a", "q", "quantize",
                      samples_us=[10.0, 10.1, 9.9, 10.0, 10.05])]  # fmt: skip
    meta = {"card": "NVIDIA H200", "git_commit": git_commit, "mxbench": "0.1.0", "implementations": implementations}
    return Run(meta, records)


def entry(version="1.0", commit="c1", dirty=False, distribution="theirs"):
    return {"module": "m", "distribution": distribution, "version": version, "commit": commit, "dirty": dirty}


def test_compare_says_which_implementations_code_changed(tmp_path):
    base = run_with({"mxkernels": entry("0.1.0", "aaa"), "m:f": entry("1.0", "c1")})
    new = run_with({"mxkernels": entry("0.1.0", "aaa"), "m:f": entry("1.1", "c2", dirty=True)})
    (change,) = compare_runs(base, new).code
    assert change.text() == "m:f 1.0 (theirs), commit c1 -> 1.1 (theirs), commit c2+dirty"
    same = compare_runs(base, run_with({"mxkernels": entry("0.1.0", "aaa"), "m:f": entry("1.0", "c1")}))
    assert same.code == []
    # mxbench's own commit, and an implementation only one run recorded
    other = compare_runs(base, run_with({"mxkernels": entry("0.1.0", "aaa")}, git_commit="bbb+dirty")).code
    assert [c.text() for c in other] == ["mxbench 0.1.0, commit aaa -> 0.1.0, commit bbb+dirty",
                                         "m:f 1.0 (theirs), commit c1 -> not recorded"]  # fmt: skip
    from mxbench.storage.results import save_run

    save_run(base, tmp_path / "a.json")
    save_run(new, tmp_path / "b.json")
    result = CliRunner().invoke(cli, ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    assert "code changed: m:f 1.0 (theirs), commit c1 -> 1.1 (theirs), commit c2+dirty" in result.output


def test_header_leaves_out_implementations_recorded_by_name_only():
    """Peers runs made before provenance listed names only: nothing to show, and their tables render as before."""
    run = run_with(dict.fromkeys(["mxkernels", "torchao"], dict.fromkeys(provenance.FIELDS)))
    assert "Implementations" not in header_block(run)
    run.meta["implementations"]["torchao"] = entry("0.17.0", None, None, "torchao")
    assert "- **Implementations:** torchao 0.17.0 (torchao)\n" in header_block(run)


def test_the_mxbench_version_is_the_distributions():
    assert mxbench.__version__ == importlib.metadata.version("mxbench")
