"""History over commits: the runs of one card ordered by the commit they were made at, each stage's median per
commit, and a mark wherever a stage changed from its previous commit, judged by ``compare.compare_runs`` (the
same bootstrap statistics and thresholds as ``mxbench compare``).

A step is one commit: the runs made at it are pooled (as ``compare`` pools several records of a stage). Steps
are ordered by the commit's time: the time a run recorded for it (``meta["git_commit_time"]``), else the
commit's date in this checkout's git, else the run's own date; each step says which. ``by`` names whose commit
orders the runs: mxbench's own (``meta["git_commit"]``), or an implementation's from
``meta["implementations"][name]`` (its commit, else its version), for a team that tracks its kernels' commits: its
runs record the commit's time where the module ran from a git checkout, and ``checkout`` names that checkout for the
runs that did not (an install from ``pip install git+URL@SHA`` records the commit, not its time).
"""

from __future__ import annotations

import importlib.util
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from mxkernels.core.errors import InputError

from ..gate.compare import Comparison, MatchKey, compare_runs
from ..instruments.provenance import REPO_ROOT
from ..storage.results import DEFAULT_WGRAD, Record, Run
from ..views.frame import PASS_TITLES, POINT_FIELDS, implementation_info, samples_of, select
from ..views.render import Row, card_label

MXBENCH = "mxbench"
COMMIT_TIME_KEY = "git_commit_time"
"""Where a run records its commit's time, when the machine that made it could tell."""
CHANGES = ("SLOWER", "FASTER")
"""The verdicts a history marks (a SAME or UNSURE step is not a change)."""
_KEY_FIELDS = ("M", "N", "K", "G", "recipe", "mode", "groups", "power_limit_w", "fuse_scales", "wgrad", "pass_name",
               "stage", "impl")


@dataclass
class Step:
    """One commit of the history: its label, its time and where the time came from, and its runs pooled."""

    label: str
    commit: str | None
    time: pd.Timestamp
    time_source: str
    files: list[str]
    run: Run

    @property
    def keys(self) -> set[MatchKey]:
        return {MatchKey.of(r, by_impl=True) for r in self.run.records}


@dataclass
class History:
    """``steps`` oldest first; ``changes[i]``: the comparisons of step i's stages with their previous step
    (several when stages were last measured at different steps); ``left_out``: (run, why it is left out): no ``by`` commit, or an expert-parallel run among single-GPU ones."""

    card: str
    by: str
    steps: list[Step]
    changes: list[list[Comparison]] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)

    def verdicts(self, i: int) -> dict[MatchKey, tuple[str, float]]:
        """Step i's stages that changed (or broke) since their previous step: verdict and new/base ratio."""
        out = {}
        for cmp in self.changes[i]:
            out.update({m.key: (m.verdict, m.ratio) for m in cmp.matches if m.verdict in CHANGES})
            out.update({k: ("BROKEN", float("nan")) for k in cmp.broken})
        return out

    @property
    def latest_failed(self) -> bool:
        """The newest step is SLOWER than (or broke against) the one before, in any stage."""
        return len(self.steps) > 1 and any(v in ("SLOWER", "BROKEN") for v, _ in self.verdicts(-1).values())


# ---------------------------------------------------------------------------------------------- commits


def _git_time(commit: str, folder: Path) -> pd.Timestamp | None:
    """The commit's time in the git checkout holding ``folder``, None where it has no such commit."""
    try:
        done = subprocess.run(["git", "-C", str(folder), "show", "-s", "--format=%cI", commit, "--"],
                              capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return pd.Timestamp(done.stdout.strip()).tz_convert("UTC") if done.stdout.strip() else None


def _module_folder(module: str | None) -> Path | None:
    """Where an implementation's module lives (a file path, or an importable module name)."""
    if not module:
        return None
    path = Path(module.split(":")[0])
    if path.exists():
        return path if path.is_dir() else path.parent
    try:
        spec = importlib.util.find_spec(module.split(":")[0])
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def _commit_of(meta: dict, by: str) -> tuple[str | None, str | None, dict]:
    """(commit, version, recorded info) of ``by`` in a run's metadata."""
    if by == MXBENCH:
        return meta.get("git_commit"), meta.get("mxbench"), meta
    info = implementation_info(meta, by)
    return info.get("commit"), info.get("version"), info


def _timed(meta: dict, by: str, commit: str | None, info: dict,
           checkout: Path | None = None) -> tuple[pd.Timestamp, str]:  # fmt: skip
    """When ``commit`` was made and how that is known; the run's date where nothing better is. ``checkout``: the
    git checkout of ``by`` (an implementation installed without one: ``history --checkout``)."""
    if info.get(COMMIT_TIME_KEY):
        return pd.Timestamp(info[COMMIT_TIME_KEY]).tz_convert("UTC"), "commit time recorded by the run"
    folder = REPO_ROOT if by == MXBENCH else checkout or _module_folder(info.get("module"))
    sha = (commit or "").removesuffix("+dirty")
    found = _git_time(sha, folder) if sha and folder is not None else None
    if found is not None:
        return found, "commit time from git"
    date = pd.Timestamp(meta["date"]).tz_convert("UTC") if meta.get("date") else pd.NaT
    why = "no commit recorded" if not sha else "commit not in this checkout"
    return date, f"run date ({why})"


def _label(by: str, commit: str | None, version: str | None) -> str:
    short = None if commit is None else commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")
    if by == MXBENCH:
        return short or f"mxbench {version}"
    return f"{by} {version or ''}".strip() + (f" ({short})" if short else "")


# ---------------------------------------------------------------------------------------------- building


def history(runs: list[tuple[Path, Run]], by: str = MXBENCH, card: str | None = None,
            checkout: Path | None = None) -> History:  # fmt: skip
    """The runs of one card (``card``, else the first run's) as steps ordered by ``by``'s commit time, each stage
    compared with its previous step; other cards' runs are ``left_out``."""
    cards = {}
    for path, run in runs:
        cards.setdefault(card_label(run), []).append((path, run))
    if card is not None:
        chosen = [c for c in cards if c.lower() == card.lower()]
        if not chosen:
            raise InputError(f"no runs of card {card!r}; these files hold {', '.join(cards)}")
        cards = {chosen[0]: cards[chosen[0]]}
    # A history follows one card: without --card, the first file's (a baseline folder holds other cards' runs);
    # the other cards' files are listed as left out, with the option that follows them.
    name, mine = next(iter(cards.items()))
    grouped: dict[str, list[tuple[Path, Run]]] = {}
    info_of: dict = {}
    left_out = [(str(path), f"another card ({other}: --card picks it)") for other, runs in cards.items()
                if other != name for path, _ in runs]  # fmt: skip
    if len({run.meta.get("kind") == "ep" for _, run in mine}) > 1:
        # an expert-parallel run's stages (a distributed layer) share names and points with the single-GPU step's
        # but not their meaning: follow them in a history of their own
        left_out += [(str(path), "an expert-parallel run: give those alone") for path, run in mine
                     if run.meta.get("kind") == "ep"]  # fmt: skip
        mine = [(path, run) for path, run in mine if run.meta.get("kind") != "ep"]
    for path, run in mine:
        commit, version, info = _commit_of(run.meta, by)
        if commit is None and version is None:
            left_out.append((str(path), f"no {by} commit or version recorded"))
            continue
        key = commit or f"version {version}"
        grouped.setdefault(key, []).append((path, run))
        info_of.setdefault(key, (commit, version, info, run.meta))
    if not grouped:
        raise InputError(f"none of these runs recorded a commit or version of {by!r} (run.meta['implementations'])")
    steps = []
    for key, members in grouped.items():
        commit, version, info, meta = info_of[key]
        time, source = _timed(meta, by, commit, info, checkout)
        records = [r for _, run in members for r in run.records]
        # every key names its implementation, so a peers run and a roofline run at one commit pool apart
        pooled = Run(meta={**members[0][1].meta, "kind": "peers"}, records=records)
        dates = min(pd.Timestamp(run.meta.get("date") or 0, tz="UTC") for _, run in members)
        steps.append((time, dates, Step(_label(by, commit, version), commit, time, source,
                                        [str(p) for p, _ in members], pooled)))  # fmt: skip
    steps.sort(key=lambda t: (pd.Timestamp.max.tz_localize("UTC") if pd.isna(t[0]) else t[0], t[1]))
    result = History(name, by, [s for *_, s in steps], left_out=left_out)
    result.changes = [_changes(result.steps, i) for i in range(len(result.steps))]
    return result


def _changes(steps: list[Step], i: int) -> list[Comparison]:
    """Step i's stages against the last earlier step that measured each: one ``compare_runs`` per earlier step,
    on the stages the two share."""
    todo = {k for k in steps[i].keys}
    out = []
    for j in range(i - 1, -1, -1):
        shared = todo & steps[j].keys
        if not shared:
            continue
        out.append(compare_runs(_only(steps[j].run, shared), _only(steps[i].run, shared)))
        todo -= shared
    return out


def _only(run: Run, keys: set[MatchKey]) -> Run:
    return Run(meta=run.meta, records=[r for r in run.records if MatchKey.of(r, by_impl=True) in keys])


# ---------------------------------------------------------------------------------------------- tables


def trends(h: History, **filters) -> pd.DataFrame:
    """Median, 25th and 75th percentile of each stage's pooled samples (model rows: their model time) per step,
    one row per (stage key, step), in the steps' order; ``filters``: ``frame.select``'s (M, recipe, passes)."""
    runs = [s.run for s in h.steps]
    samples = samples_of(runs, [str(i) for i in range(len(runs))]).rename(columns={"file": "step"})
    model = [{"step": str(i), "us": r.model_us, **_key_cells(r)} for i, run in enumerate(runs) for r in run.records
             if r.ok and not r.samples_us]  # fmt: skip
    samples = pd.concat([samples, pd.DataFrame(model)], ignore_index=True) if model else samples
    samples["step"] = samples["step"].astype(int)
    samples["us"] = samples["us"].astype(float)  # object when only model rows were concatenated to no samples
    if any(v is not None for v in filters.values()):  # a value that matches nothing: "the history has M in ..."
        samples = select(samples.assign(file="the history"), **filters)
    samples["power_limit_w"] = samples["power_limit_w"].astype(float).fillna(-1.0)  # a key pandas does not drop
    keys = list(_KEY_FIELDS)
    stats = samples.groupby([*keys, "step"], sort=False)["us"]
    out = pd.DataFrame({"median": stats.median(), "q25": stats.quantile(0.25), "q75": stats.quantile(0.75)})
    out = out.reset_index()
    out["power_limit_w"] = out["power_limit_w"].replace(-1.0, np.nan)
    return out


def _key_cells(r: Record) -> dict:
    return {
        "pass_name": r.pass_name,
        "stage": r.stage,
        "impl": r.impl,
        **{f: getattr(r.point, f) for f in POINT_FIELDS},
    }


def match_key(row: pd.Series | dict) -> MatchKey:
    """The ``compare`` key of a ``trends`` row (what its marks are filed under)."""
    limit = None if pd.isna(row["power_limit_w"]) else float(row["power_limit_w"])
    return MatchKey(M=int(row["M"]), N=int(row["N"]), K=int(row["K"]), G=int(row["G"]), recipe=row["recipe"],
                    mode=row["mode"], groups=row["groups"], power_limit_w=limit, fuse_scales=bool(row["fuse_scales"]),
                    pass_name=row["pass_name"], stage=row["stage"], impl=row["impl"], wgrad=row["wgrad"])  # fmt: skip


def key_text(key: MatchKey) -> str:
    recipe = f"{key.recipe}/{key.mode}" if key.recipe == "mxfp8" else key.recipe
    limit = "" if key.power_limit_w is None else f" @{key.power_limit_w:g}W"
    fused = " fused scales" if key.fuse_scales else ""
    wgrad = f" {key.wgrad} wgrad" if key.wgrad != DEFAULT_WGRAD else ""
    return f"M={key.M} N={key.N} K={key.K} G={key.G} {recipe} {key.groups}{limit}{fused}{wgrad}"


def history_rows(h: History, changed_only: bool = False, **filters) -> list[Row]:
    """One row per stage: its median at each step (a step's column is "<n>: <label>"), a change since the
    stage's previous step marked "SLOWER x1.083" / "FASTER x0.912" / "BROKEN"."""
    t = trends(h, **filters)
    columns = [f"{i + 1}: {s.label}" for i, s in enumerate(h.steps)]
    marks = [h.verdicts(i) for i in range(len(h.steps))]
    rows = []
    pass_order = {p: i for i, p in enumerate(PASS_TITLES)}
    order = t.groupby(list(_KEY_FIELDS), sort=False, dropna=False).ngroup()
    t = t.assign(order=order, pass_rank=t["pass_name"].map(pass_order))
    stages: dict[int, list] = {}  # one pass over the frame: a groupby's frame per stage cost most of `history`
    for r in t.sort_values(["M", "N", "K", "recipe", "pass_rank", "order"], kind="stable").itertuples(index=False):
        stages.setdefault(r.order, []).append(r)
    for stage in stages.values():
        key = match_key(stage[0]._asdict())
        cells = dict.fromkeys(columns)
        changed = False
        for r in stage:
            mark = marks[r.step].get(key)
            changed |= mark is not None
            text = f"{r.median:.1f}"
            if mark is not None:
                text += " BROKEN" if mark[0] == "BROKEN" else f" {mark[0]} x{mark[1]:.3f}"
            cells[columns[r.step]] = text
        for i, step_marks in enumerate(marks):
            if step_marks.get(key, ("",))[0] == "BROKEN" and cells[columns[i]] is None:
                cells[columns[i]], changed = "BROKEN", True
        if changed_only and not changed:
            continue
        stage_name = key.stage if key.impl == "mxkernels" else f"{key.stage} [{key.impl}]"
        rows.append({"Point": key_text(key), "Pass": PASS_TITLES.get(key.pass_name, key.pass_name),
                     "Stage": stage_name, **cells})  # fmt: skip
    return rows


def step_rows(h: History) -> list[Row]:
    """The steps: number, label, commit time and where it came from, the runs pooled in each."""
    return [
        {"Step": str(i + 1), "Commit" if h.by == MXBENCH else h.by: s.label,
         "Time (UTC)": "unknown" if pd.isna(s.time) else s.time.strftime("%Y-%m-%d %H:%M"),
         "Time from": s.time_source, "Runs": ", ".join(Path(f).name for f in s.files)}
        for i, s in enumerate(h.steps)
    ]  # fmt: skip


def model_note(h: History) -> str | None:
    """One line where the history holds model runs (no samples), saying what it cannot show; else None."""
    if all(r.measured for s in h.steps for r in s.run.records):
        return None
    return ("model runs (model, not measured): their times are the model's, with no samples, so no IQR band and "
            "no SLOWER/FASTER mark (those need measured samples); --fail-on-latest never fails on them")


def latest_summary(h: History) -> str:
    """One line: what the newest step did against the one before."""
    if len(h.steps) < 2:
        return f"{h.card}: one step ({h.steps[0].label}): nothing to compare it with"
    verdicts = [v for v, _ in h.verdicts(-1).values()]
    shared = sum(len(c.matches) for c in h.changes[-1])
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in ("SLOWER", "BROKEN", "FASTER"))
    return f"{h.card}: newest step {h.steps[-1].label} against each stage's previous step: {counts} of {shared} stages"
