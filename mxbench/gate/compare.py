"""Comparing two stored runs: per stage, the ratio of medians new/base with a bootstrap 95% CI and a verdict
(FASTER / SAME / SLOWER / UNSURE) against practical thresholds; ``comparison_rows`` tabulates them.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from mxkernels.core.errors import InputError

from ..instruments.provenance import CodeChange, code_changes
from ..storage.results import DEFAULT_WGRAD, IMPOSSIBLE, Point, Record, Run
from ..views.frame import PASS_TITLES, SM_CLOCK_KEY
from ..views.render import Row, card_label
from .rules import CLOCK_RULE_CATEGORIES, DEFAULT_DELTAS, DEFAULT_FLOOR_US, MIN_SAMPLES, VERDICTS


class CompareError(InputError):
    """Two runs that must not be compared (different cards without ``force``)."""


@dataclass(frozen=True)
class Thresholds:
    """Practical significance: a relative change ``delta`` per category and an absolute floor in microseconds."""

    deltas: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_DELTAS))
    floor_us: float = DEFAULT_FLOOR_US
    default_delta: float = 0.07

    def delta(self, category: str) -> float:
        return self.deltas.get(category, self.default_delta)

    @classmethod
    def parse(cls, texts: Sequence[str] = (), floor_us: float | None = None) -> Thresholds:
        """``--threshold CATEGORY=PCT`` (repeatable; ``all=PCT`` sets every band) and ``--floor-us``."""
        deltas = dict(DEFAULT_DELTAS)
        for text in texts:
            category, sep, pct = text.partition("=")
            try:
                value = float(pct) / 100 if sep else float("nan")
            except ValueError:
                value = float("nan")
            if not (0 < value < 1):
                raise InputError(f"--threshold: {text!r} must be CATEGORY=PCT with 0 < PCT < 100 (e.g. quantize=5)")
            if category.strip() == "all":
                deltas = dict.fromkeys(deltas, value)
            elif category.strip() in deltas:
                deltas[category.strip()] = value
            else:
                raise InputError(f"--threshold: unknown category {category.strip()!r}; categories: "
                                 f"{', '.join(deltas)}, all")  # fmt: skip
        if floor_us is not None and floor_us < 0:
            raise InputError(f"--floor-us must be >= 0, got {floor_us:g}")
        return cls(deltas, DEFAULT_FLOOR_US if floor_us is None else floor_us)


_KEY_FIELDS = ("M", "N", "K", "G", "recipe", "mode", "groups", "power_limit_w", "fuse_scales")


@dataclass(frozen=True)
class MatchKey:
    """What pairs a record of one run with a record of another: the point without its seed, pass and stage, and in
    a peers run (several implementations of each stage) the implementation."""

    M: int
    N: int
    K: int
    G: int
    recipe: str
    mode: str
    groups: str
    power_limit_w: float | None
    fuse_scales: bool
    pass_name: str
    stage: str
    impl: str | None = None
    wgrad: str = DEFAULT_WGRAD  # the weight gradient's precision (a point of bf16 wgrad is another point)

    @classmethod
    def of(cls, r: Record, by_impl: bool = False) -> MatchKey:
        return cls(*(getattr(r.point, f) for f in _KEY_FIELDS), r.pass_name, r.stage, r.impl if by_impl else None,
                   r.point.wgrad)  # fmt: skip

    def stage_label(self) -> str:
        return self.stage if self.impl is None else f"{self.stage} [{self.impl}]"

    def point_label(self) -> str:
        """The label of the point the key names (a point's label leaves out its seed, as the key does)."""
        p = Point(self.M, self.N, self.K, self.G, self.recipe, self.mode, self.groups, power_limit_w=self.power_limit_w,
                  fuse_scales=self.fuse_scales, wgrad=self.wgrad)
        return p.label()


@dataclass(frozen=True)
class Match:
    """One matched stage: medians, the ratio new/base with its bootstrap 95% CI, and the verdict with why."""

    key: MatchKey
    category: str
    kernel: str
    base_us: float
    new_us: float
    ratio: float
    ci: tuple[float, float] | None
    verdict: str
    reason: str
    cycles_ratio: float | None = None


@dataclass
class Comparison:
    """``matches`` in base order; ``only_base``/``only_new``: stages with no counterpart; ``broken``: stages that
    completed in base but only errored in new; ``code``: the implementations whose code differs between the runs."""

    base_card: str
    new_card: str
    matches: list[Match]
    only_base: list[MatchKey] = field(default_factory=list)
    only_new: list[MatchKey] = field(default_factory=list)
    broken: list[MatchKey] = field(default_factory=list)
    forced: bool = False
    code: list[CodeChange] = field(default_factory=list)
    errors: dict[MatchKey, str] = field(default_factory=dict)
    """The error of each broken stage in new (its first record's)."""
    impossible: dict[MatchKey, str] = field(default_factory=dict)
    """The stages of new whose time is IMPOSSIBLE (below the roofline floor), with why (their first record's)."""

    def by_verdict(self, verdict: str) -> list[Match]:
        return [m for m in self.matches if m.verdict == verdict]

    @property
    def exit_code(self) -> int:
        """1 if any stage is SLOWER, broke (ran in base, errors now) or timed IMPOSSIBLE in new, else 0."""
        return 1 if self.by_verdict("SLOWER") or self.broken or self.impossible else 0

    @property
    def model_note(self) -> str | None:
        """One line on the stages that a model run gave (no samples: no interval, no verdict), None where none did."""
        model = self.by_verdict("MODEL")
        if not model:
            return None
        every = "every" if len(model) == len(self.matches) else f"{len(model)} of {len(self.matches)}"
        return (f"{every} stage compared against a model run (model, not measured): new/base ratios of the model's "
                "times only; no samples, so no interval and no verdict, and such a stage never fails the gate")

    def summary(self) -> str:
        counts = ", ".join(f"{len(self.by_verdict(v))} {v}" for v in VERDICTS)
        geo = float(np.exp(np.mean(np.log([m.ratio for m in self.matches])))) if self.matches else float("nan")
        cards = self.base_card if self.base_card == self.new_card else f"{self.base_card} vs {self.new_card} (forced)"
        text = f"{cards}: {counts}; geomean new/base {geo:.3f} over {len(self.matches)} stages"
        extra = [
            f"{len(xs)} {what}"
            for xs, what in ((self.impossible, IMPOSSIBLE), (self.broken, "broken"), (self.only_base, "only in base"),
                             (self.only_new, "only in new"))
            if xs
        ]
        return text + ("; " + ", ".join(extra) if extra else "")


@dataclass
class _Side:
    """A run's completed records of one key, pooled (several seeds or rounds of the same stage)."""

    records: list[Record]

    @property
    def samples(self) -> np.ndarray:
        return np.array([s for r in self.records for s in (r.samples_us or [r.model_us])], dtype=np.float64)

    @property
    def measured(self) -> bool:
        return all(r.measured for r in self.records)

    @property
    def clock_mhz(self) -> float | None:
        clocks = [r.telemetry.get(SM_CLOCK_KEY) for r in self.records]
        return float(np.mean(clocks)) if clocks and all(c for c in clocks) else None


def _pool(run: Run) -> tuple[dict[MatchKey, _Side], dict[MatchKey, str], dict[MatchKey, str]]:
    """Completed records by key, the keys that only errored with their first error, and the keys with an
    IMPOSSIBLE record (a time below the roofline floor: never pooled with the others' samples) with why."""
    ok: dict[MatchKey, _Side] = {}
    failed: dict[MatchKey, str] = {}
    impossible: dict[MatchKey, str] = {}
    by_impl = run.meta.get("kind") == "peers"
    for r in run.records:
        if r.skipped:
            continue  # it never ran: neither a result nor a failure
        key = MatchKey.of(r, by_impl)
        if r.impossible is not None:
            impossible.setdefault(key, r.impossible)
        elif r.ok:
            ok.setdefault(key, _Side([])).records.append(r)
        else:
            failed.setdefault(key, r.error or "no samples")
    return ok, {k: e for k, e in failed.items() if k not in ok and k not in impossible}, impossible


def _resampled_medians(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """Medians of ``resamples`` resamples (with replacement) of ``x``.

    On sorted samples the middle order statistics of the resampled *indices* pick the resampled median, and
    partitioning small integers is several times cheaper than taking medians of the gathered floats.
    """
    xs = np.sort(x)
    n = xs.size
    lo, hi = (n - 1) // 2, n // 2
    idx = np.partition(rng.integers(0, n, (resamples, n)), (lo, hi), axis=1)
    return (xs[idx[:, lo]] + xs[idx[:, hi]]) / 2


def _bootstrap_ratio_ci(
    base: np.ndarray, new: np.ndarray, rng: np.random.Generator, resamples: int
) -> tuple[float, float]:
    """95% percentile CI of median(new) / median(base), each side resampled with replacement on its own."""
    ratios = _resampled_medians(new, rng, resamples) / _resampled_medians(base, rng, resamples)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def _key_seed(key: MatchKey) -> int:
    """A per-key stream, so a stage's CI does not depend on which other stages are compared with it."""
    return zlib.crc32(repr(key).encode())


def _verdict(ci: tuple[float, float], base_us: float, new_us: float, delta: float, floor_us: float) -> tuple[str, str]:
    lo, hi = ci
    diff = new_us - base_us
    band = f"[{1 - delta:.3f}, {1 + delta:.3f}]"
    if lo > 1 + delta and diff > floor_us:
        return "SLOWER", f"CI above {1 + delta:.3f} and +{diff:.1f} us"
    if hi < 1 - delta and -diff > floor_us:
        return "FASTER", f"CI below {1 - delta:.3f} and {diff:.1f} us"
    if 1 - delta <= lo and hi <= 1 + delta:
        return "SAME", f"CI within {band}"
    if max(abs(lo - 1), abs(hi - 1)) * base_us <= floor_us:
        return "SAME", f"any change within the {floor_us:g} us floor"
    return "UNSURE", f"CI [{lo:.3f}, {hi:.3f}] neither clear of nor within {band}"


def _in_cycles(
    verdict: str, reason: str, ci: tuple[float, float], base_mhz: float, new_mhz: float, delta: float
) -> tuple[str, str]:
    """time x clock = cycles: a change in time that the clocks explain is not the code's doing."""
    clock = new_mhz / base_mhz
    change = f"({base_mhz:.0f} -> {new_mhz:.0f} MHz)"
    if verdict == "SLOWER" and ci[0] * clock <= 1 + delta:
        return "UNSURE", f"clock drop {change}: not slower in cycles"
    if verdict == "FASTER" and ci[1] * clock >= 1 - delta:
        return "UNSURE", f"clock rise {change}: not faster in cycles"
    return verdict, reason


def _compare_one(key: MatchKey, b: _Side, n: _Side, th: Thresholds, seed: int, resamples: int) -> Match:
    bs, ns = b.samples, n.samples
    base_us, new_us = float(np.median(bs)), float(np.median(ns))
    ratio = new_us / base_us
    category = b.records[0].category
    delta = th.delta(category)
    cycles = None
    fewest = min((s.size for s, side in ((bs, b), (ns, n)) if side.measured), default=MIN_SAMPLES)
    if not (b.measured and n.measured):
        unmeasured = "neither run" if not (b.measured or n.measured) else "one run"
        ci, verdict, reason = None, "MODEL", f"{unmeasured} measured (model, not measured): no interval"
    elif fewest < MIN_SAMPLES:
        ci, verdict, reason = (ratio, ratio), "UNSURE", f"too few samples ({fewest})"
    else:
        ci = _bootstrap_ratio_ci(bs, ns, np.random.default_rng([seed, _key_seed(key)]), resamples)
        verdict, reason = _verdict(ci, base_us, new_us, delta, th.floor_us)
        if b.clock_mhz and n.clock_mhz and category in CLOCK_RULE_CATEGORIES:
            cycles = ratio * n.clock_mhz / b.clock_mhz
            verdict, reason = _in_cycles(verdict, reason, ci, b.clock_mhz, n.clock_mhz, delta)
    return Match(key, category, n.records[0].kernel, base_us, new_us, ratio, ci, verdict, reason, cycles)


def compare_runs(
    base: Run,
    new: Run,
    *,
    force: bool = False,
    thresholds: Thresholds | None = None,
    seed: int = 0,
    resamples: int = 2000,
) -> Comparison:
    """Verdict per stage of ``new`` against ``base``: FASTER / SAME / SLOWER / UNSURE.

    Records pair by ``MatchKey`` (point without seed, pass, stage); records of one key in one run pool their
    samples. Per pair: r = median(new) / median(base) and a bootstrap 95% CI of r (``resamples`` resamples of
    each side's stored samples, seeded by ``seed`` and the key). SLOWER needs the CI's lower bound above
    1 + delta(category) and new - base above ``floor_us``; FASTER mirrors it; SAME: the CI lies within
    [1 - delta, 1 + delta] (or any change it allows is under the floor); UNSURE otherwise. When both records carry
    telemetry ``sm_clock_mhz`` and the stage is compute-bound (``CLOCK_RULE_CATEGORIES``), a SLOWER (FASTER) in
    time that is not so in cycles (time x clock) becomes UNSURE. Records without samples (a model run) give MODEL.
    Runs of different cards (a model run counts as its spec's own card) raise ``CompareError`` unless ``force``.
    ``code`` lists the implementations whose recorded code (version, commit) differs between the two runs.
    """
    base_card, new_card = card_label(base), card_label(new)
    if base_card != new_card and not force:
        raise CompareError(
            f"runs come from different cards ({base_card!r} vs {new_card!r}); timings across cards are not "
            "comparable (use force=True / --force to compare anyway)"
        )
    if resamples < 100:
        raise InputError(f"resamples must be >= 100, got {resamples}")
    th = thresholds or Thresholds()
    b_ok, _, _ = _pool(base)
    n_ok, n_failed, n_impossible = _pool(new)
    n_ok = {k: side for k, side in n_ok.items() if k not in n_impossible}  # an impossible time is never compared
    matches = [_compare_one(k, side, n_ok[k], th, seed, resamples) for k, side in b_ok.items() if k in n_ok]
    return Comparison(
        base_card=base_card,
        new_card=new_card,
        matches=matches,
        only_base=[k for k in b_ok if k not in n_ok and k not in n_failed and k not in n_impossible],
        only_new=[k for k in n_ok if k not in b_ok],
        broken=[k for k in b_ok if k in n_failed],
        forced=base_card != new_card,
        code=code_changes(base.meta, new.meta),
        errors={k: e for k, e in n_failed.items() if k in b_ok},
        impossible=n_impossible,
    )


def comparison_rows(cmp: Comparison) -> list[Row]:
    """One row per matched stage, then one per broken stage; ratio and CI as new/base."""
    rows: list[Row] = [
        {
            "Point": m.key.point_label(),
            "Pass": PASS_TITLES.get(m.key.pass_name, m.key.pass_name),
            "Stage": m.key.stage_label(),
            "Base (us)": f"{m.base_us:.1f}",
            "New (us)": f"{m.new_us:.1f}",
            "New/base": f"{m.ratio:.3f}",
            "95% CI": "" if m.ci is None else f"[{m.ci[0]:.3f}, {m.ci[1]:.3f}]",
            "Verdict": m.verdict,
            "Why": m.reason,
        }
        for m in cmp.matches
    ]
    rows += [
        {
            "Point": k.point_label(),
            "Pass": PASS_TITLES.get(k.pass_name, k.pass_name),
            "Stage": k.stage_label(),
            "Verdict": "BROKEN",
            "Why": broken_reason(cmp, k),
        }
        for k in cmp.broken
    ]
    rows += [
        {
            "Point": k.point_label(),
            "Pass": PASS_TITLES.get(k.pass_name, k.pass_name),
            "Stage": k.stage_label(),
            "Verdict": IMPOSSIBLE,
            "Why": why,
        }
        for k, why in cmp.impossible.items()
    ]
    return rows


def broken_reason(cmp: Comparison, key: MatchKey) -> str:
    """Why a stage is BROKEN: it ran in base, and new's error."""
    return f"ran in base, only errors in new: {cmp.errors.get(key, 'no samples')}"
