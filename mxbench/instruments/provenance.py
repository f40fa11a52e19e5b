"""Which code a run measured: mxbench's own commit, and the distribution, version and git checkout of every
implementation that ran.

A run is filed under the code it measured, so the commit must be the right one:

* mxbench's commit comes from git only when git's top level is the project's own root (``REPO_ROOT``). A copy of
  the tree inside a subfolder of another repository (as a GPU machine's working copy can be) would otherwise
  report the *enclosing* repository's HEAD. ``MXBENCH_GIT_COMMIT`` always wins: a tree shipped without ``.git``
  names its commit that way. Otherwise the commit is None (the version still says which release ran).
* An implementation (ours included) is named by its module: the distribution that provides the module's top-level
  package and its version come from ``importlib.metadata``; when the module file lives in a git checkout, that
  checkout's commit and dirty flag too (our own modules take mxbench's commit by the rule above); for an installed
  copy, the commit pip recorded in the distribution's ``direct_url.json`` (``pip install git+URL@SHA``).

``implementations_meta`` gives the ``run.meta["implementations"]`` mapping, recorded once per run and keyed by the
implementation names that ``Record.impl`` carries; ``code_changes`` says which of them differ between two runs.
"""

from __future__ import annotations

import importlib.metadata
import json
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..storage.results import PROVENANCE_FIELDS

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout mxbench runs from: every run records its commit."""

ENV_COMMIT = "MXBENCH_GIT_COMMIT"
DIRTY = "+dirty"
FIELDS = PROVENANCE_FIELDS
"""The keys of each ``meta["implementations"]`` entry (``history --by <implementation>`` reads them)."""
OWN_PACKAGES = ("mxbench", "mxkernels")
"""The top-level packages of this project's own tree (``REPO_ROOT``): their commit is mxbench's."""
# Folders pip installs distributions into: a module found there is an installed copy, not a checkout, even when
# the environment itself sits inside some git repository (a virtualenv in a project folder).
_INSTALLED_DIRS = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class Checkout:
    """A git working tree: its top-level folder, HEAD commit, whether tracked files differ from HEAD, and HEAD's
    commit time (ISO 8601, UTC offset included)."""

    root: Path
    commit: str
    dirty: bool
    time: str | None = None


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def git_checkout(path: Path) -> Checkout | None:
    """The git checkout that holds ``path`` (a file or a folder), or None (no git, or not inside a checkout)."""
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    try:
        root = Path(_git(folder, "rev-parse", "--show-toplevel")).resolve()
        commit = _git(folder, "rev-parse", "HEAD")
        dirty = bool(_git(folder, "status", "--porcelain", "--untracked-files=no"))
        time = _git(folder, "show", "-s", "--format=%cI", "HEAD") or None
    except (OSError, subprocess.SubprocessError):
        return None
    return Checkout(root, commit, dirty, time)


def project_commit() -> tuple[str | None, bool | None]:
    """(commit, dirty) of mxbench's own tree: ``MXBENCH_GIT_COMMIT`` when set (dirty only if it ends in "+dirty",
    else unknown), else git's HEAD when git's top level is ``REPO_ROOT`` itself, else (None, None)."""
    named = os.environ.get(ENV_COMMIT)
    if named:
        return (named.removesuffix(DIRTY), True) if named.endswith(DIRTY) else (named, None)
    checkout = git_checkout(REPO_ROOT)
    if checkout is None or checkout.root != REPO_ROOT.resolve():
        return None, None
    return checkout.commit, checkout.dirty


def git_commit() -> str | None:
    """mxbench's commit as stored in ``meta["git_commit"]``: ``project_commit`` with "+dirty" appended when dirty."""
    commit, dirty = project_commit()
    return None if commit is None else commit + (DIRTY if dirty else "")


def _module_file(module: str) -> Path | None:
    """Where ``module``'s code lives, without importing a module that is not imported yet where it can be helped
    (a top-level package is only located)."""
    loaded = sys.modules.get(module)
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and origin not in ("built-in", "frozen") else None


def module_provenance(module: str | None, distributions: Mapping[str, list[str]] | None = None) -> dict[str, Any]:
    """``{"module", "distribution", "version", "commit", "dirty"}`` of the code in ``module`` (None where unknown).

    ``distributions``: ``importlib.metadata.packages_distributions()``, passed in when several modules are looked
    up (it scans every installed distribution).
    """
    info: dict[str, Any] = dict.fromkeys(FIELDS)
    info["module"] = module
    if not module:
        return info
    distributions = importlib.metadata.packages_distributions() if distributions is None else distributions
    names = distributions.get(module.split(".")[0]) or []
    if names:
        info["distribution"] = names[0]
        try:
            info["version"] = importlib.metadata.version(names[0])
        except importlib.metadata.PackageNotFoundError:
            pass
    path = _module_file(module)
    if path is None:
        return info
    if module.split(".")[0] in OWN_PACKAGES and path.is_relative_to(REPO_ROOT.resolve()):
        info["commit"], info["dirty"] = project_commit()  # our own code: the project's rule, not git's walk upwards
    elif not any(part in _INSTALLED_DIRS for part in path.parts) and (checkout := git_checkout(path)) is not None:
        # the commit's time too: a history orders this implementation's runs by it wherever it is read later
        info["commit"], info["dirty"], info["git_commit_time"] = checkout.commit, checkout.dirty, checkout.time
    elif info["distribution"]:
        info["commit"] = installed_commit(info["distribution"])
    return info


def installed_commit(distribution: str) -> str | None:
    """The commit a non-editable install was built from: ``direct_url.json``'s ``vcs_info.commit_id`` (PEP 610;
    pip writes it for ``pip install git+URL@REV``); None for an install from an index or a plain folder."""
    try:
        text = importlib.metadata.distribution(distribution).read_text("direct_url.json")
        vcs = json.loads(text or "{}").get("vcs_info") or {}
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return None
    commit = vcs.get("commit_id")
    return commit if isinstance(commit, str) and commit else None


def implementations_meta(modules: Mapping[str, str | None]) -> dict[str, dict[str, Any]]:
    """``meta["implementations"]``: implementation name -> ``module_provenance`` of its module."""
    distributions = importlib.metadata.packages_distributions()
    return {name: module_provenance(module, distributions) for name, module in modules.items()}


# ------------------------------------------------------------------------------------------ two runs' code


def describe(entry: Mapping[str, Any] | None) -> str:
    """One implementation's code in a few words: "0.1.0 (mxbench), commit 1a2b3c4d5e6f+dirty"."""
    if not entry:
        return "not recorded"
    words = str(entry.get("version") or "unversioned")
    if entry.get("distribution"):
        words += f" ({entry['distribution']})"
    if entry.get("commit"):
        words += f", commit {str(entry['commit'])[:12]}" + (DIRTY if entry.get("dirty") else "")
    return words


_CODE_FIELDS = ("distribution", "version", "commit", "dirty")


@dataclass(frozen=True)
class CodeChange:
    """An implementation whose code differs between two runs (``old``/``new``: its entries, None if absent)."""

    name: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None

    def text(self) -> str:
        return f"{self.name} {describe(self.old)} -> {describe(self.new)}"


def _own_entry(meta: Mapping[str, Any]) -> dict[str, Any]:
    """mxbench's own code as an implementation entry, from ``meta["mxbench"]`` and ``meta["git_commit"]``."""
    commit = meta.get("git_commit")
    dirty = None if commit is None else str(commit).endswith(DIRTY)
    commit = None if commit is None else str(commit).removesuffix(DIRTY)
    return {"module": "mxbench", "distribution": None, "version": meta.get("mxbench"), "commit": commit, "dirty": dirty}


def code_changes(base_meta: Mapping[str, Any], new_meta: Mapping[str, Any]) -> list[CodeChange]:
    """The code that differs between two runs: mxbench's own commit (as "mxbench"), then every implementation
    recorded in both runs' ``meta["implementations"]`` whose distribution, version, commit or dirty flag differ,
    or that only one of them ran. Runs that recorded no implementations compare on mxbench's commit alone."""
    changes = []
    if base_meta.get("git_commit") != new_meta.get("git_commit"):
        changes.append(CodeChange("mxbench", _own_entry(base_meta), _own_entry(new_meta)))
    old, new = base_meta.get("implementations"), new_meta.get("implementations")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return changes
    for name in dict.fromkeys([*old, *new]):
        a, b = old.get(name), new.get(name)
        if a is None or b is None or any(a.get(f) != b.get(f) for f in _CODE_FIELDS):
            changes.append(CodeChange(name, a, b))
    return changes
