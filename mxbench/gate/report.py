"""A comparison as a CI gate: when it cannot be trusted, and its verdict for people and for machines.

``compare`` and ``regress`` exit 0 when no stage is slower, 1 when a stage is SLOWER (or ran in the baseline and
only errors now), and 2 when the input cannot give a verdict. ``check_usable`` raises that exit-2 ``CompareError``:

* the two runs share no comparable stage (other shapes, another recipe): a gate pointed at the wrong baseline
  would otherwise compare nothing and stay green;
* the new run lacks stages the baseline has: a stage that vanished (renamed, not run) would otherwise escape the
  gate. ``allow_missing`` compares the rest instead.

``json_report`` gives one object per stage (medians, ratio, CI, verdict) for machines; ``markdown_report`` a CI
step summary (a verdict heading, the summary, the code that changed, the table).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from ..storage.results import IMPOSSIBLE
from ..views.render import render
from .compare import VERDICTS, CompareError, Comparison, MatchKey, broken_reason, comparison_rows

EXIT_CODES = {0: "no stage slower", 1: "a stage SLOWER, broken or IMPOSSIBLE",
              2: "unusable input (nothing compared)"}  # fmt: skip
_HOLDING_FIELDS = ("M", "N", "K", "G", "recipe", "mode", "groups", "power_limit_w")
_REPORT_ORDER = (IMPOSSIBLE, "BROKEN", "SLOWER", "UNSURE", "FASTER", "SAME")
_LISTED = 12
"""Missing stages named in the one-line refusal; the rest are counted."""


def _holdings(keys: Iterable[MatchKey]) -> str:
    """What a run's stages cover, field by field ("K=7168 N=2048 G=8 M in {16384, 32768} recipe in {bf16, mxfp8}")."""
    keys = list(keys)
    if not keys:
        return "no completed stage"
    words = []
    for f in _HOLDING_FIELDS:
        values = sorted({getattr(k, f) for k in keys}, key=lambda v: (v is None, str(v) if isinstance(v, str) else v))
        shown = ["as found" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in values]
        words.append(f"{f}={shown[0]}" if len(shown) == 1 else f"{f} in {{{', '.join(shown)}}}")
    return " ".join(words)


def check_usable(cmp: Comparison, base: str, new: str, *, allow_missing: bool = False) -> None:
    """Raise ``CompareError`` (exit 2) when ``cmp`` cannot gate: nothing comparable, or stages of ``base`` missing
    from ``new`` (unless ``allow_missing``). ``base``/``new`` name the runs in the message."""
    if not cmp.matches and not cmp.broken and not cmp.impossible:
        raise CompareError(
            f"{base} and {new} share no comparable stage: {base} holds {_holdings(cmp.only_base)}; {new} holds "
            f"{_holdings(cmp.only_new)}; compare runs of the same shapes and recipe"
        )
    if cmp.only_base and not allow_missing:
        raise CompareError(
            f"{new} lacks {len(cmp.only_base)} stage(s) that {base} has: {missing_text(cmp)}; "
            "pass --allow-missing to compare the rest"
        )


def missing_text(cmp: Comparison, listed: int = _LISTED) -> str:
    """The base stages missing from new, by point: a point missing whole is one phrase ("all 12 stages"), single
    stages are named as pass/stage, at most ``listed`` of them, the rest counted."""
    in_base: dict[str, int] = {}
    for key in [m.key for m in cmp.matches] + cmp.broken + cmp.only_base:
        in_base[key.point_label()] = in_base.get(key.point_label(), 0) + 1
    by_point: dict[str, list[MatchKey]] = {}
    for key in cmp.only_base:
        by_point.setdefault(key.point_label(), []).append(key)
    parts, named = [], 0
    for point, keys in by_point.items():
        if len(keys) == in_base[point]:
            parts.append(f"{point}: all {len(keys)} stages")
            continue
        shown = keys[: max(0, listed - named)]
        named += len(shown)
        rest = f" and {len(keys) - len(shown)} more" if len(keys) > len(shown) else ""
        parts.append(f"{point}: " + ", ".join(f"{k.pass_name}/{k.stage_label()}" for k in shown) + rest)
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------- reports


def _point(key: MatchKey) -> dict[str, Any]:
    return {f: getattr(key, f) for f in _HOLDING_FIELDS}


def _stage(key: MatchKey, verdict: str, **values: Any) -> dict[str, Any]:
    fields = ("category", "kernel", "base_median_us", "new_median_us", "ratio", "ci95", "reason", "cycles_ratio")
    return {"point": _point(key), "pass": key.pass_name, "stage": key.stage, "impl": key.impl,
            **dict.fromkeys(fields), **values, "verdict": verdict}  # fmt: skip


def stage_objects(cmp: Comparison) -> list[dict[str, Any]]:
    """One object per stage: matched ones with medians, ratio new/base, its 95% CI and the verdict; then BROKEN
    (ran in base, only errors in new), MISSING (only in base) and ADDED (only in new) with the values left null."""
    stages = [
        _stage(m.key, m.verdict, category=m.category, kernel=m.kernel, base_median_us=m.base_us,
               new_median_us=m.new_us, ratio=m.ratio, ci95=m.ci and list(m.ci), reason=m.reason,
               cycles_ratio=m.cycles_ratio)
        for m in cmp.matches
    ]  # fmt: skip
    stages += [_stage(k, "BROKEN", reason=broken_reason(cmp, k)) for k in cmp.broken]
    stages += [_stage(k, IMPOSSIBLE, reason=why) for k, why in cmp.impossible.items()]
    stages += [_stage(k, "MISSING", reason="in base, not in new") for k in cmp.only_base]
    stages += [_stage(k, "ADDED", reason="in new, not in base") for k in cmp.only_new]
    return stages


def _geomean(cmp: Comparison) -> float | None:
    ratios = [m.ratio for m in cmp.matches]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def json_report(cmp: Comparison, base: str, new: str) -> str:
    """The comparison for machines: cards, exit code, counts per verdict, geomean ratio, the code that changed and
    ``stage_objects``."""
    payload = {
        "base": base, "new": new, "base_card": cmp.base_card, "new_card": cmp.new_card, "forced": cmp.forced,
        "exit_code": cmp.exit_code, "counts": {v: len(cmp.by_verdict(v)) for v in VERDICTS}
        | {"BROKEN": len(cmp.broken), IMPOSSIBLE: len(cmp.impossible)},
        "geomean_ratio": _geomean(cmp), "summary": cmp.summary(), "note": cmp.model_note,
        "code_changes": [{"implementation": c.name, "old": c.old, "new": c.new, "text": c.text()} for c in cmp.code],
        "stages": stage_objects(cmp),
    }  # fmt: skip
    return json.dumps(payload, indent=1) + "\n"


def verdict_line(cmp: Comparison) -> str:
    """PASS or FAIL with why, as a CI log or a step summary states it."""
    if cmp.exit_code == 0:
        return "PASS (no stage slower)"
    failing = [f"{len(cmp.by_verdict('SLOWER'))} SLOWER"] if cmp.by_verdict("SLOWER") else []
    failing += [f"{len(cmp.broken)} broken"] if cmp.broken else []
    failing += [f"{len(cmp.impossible)} {IMPOSSIBLE} (below the roofline floor)"] if cmp.impossible else []
    return f"FAIL ({', '.join(failing)})"


def code_text(cmp: Comparison) -> str | None:
    """"code changed: mxbench ... -> ...; torchao 0.16.0 -> 0.17.0", or None when the recorded code is the same."""
    return "code changed: " + "; ".join(c.text() for c in cmp.code) if cmp.code else None


def markdown_report(cmp: Comparison, base: str, new: str) -> str:
    """A CI step summary: verdict heading, what was compared, the summary, the code that changed, the table (the
    stages that are not SAME first, so a failure is at the top)."""
    order = {v: i for i, v in enumerate(_REPORT_ORDER)}
    rows = sorted(comparison_rows(cmp), key=lambda r: order.get(r["Verdict"], len(order)))
    lines = [f"### mxbench compare: {verdict_line(cmp)}", "", f"`{base}` -> `{new}`", "", f"**{cmp.summary()}**"]
    if cmp.model_note:
        lines += ["", cmp.model_note]
    if cmp.code:
        lines += ["", f"Code changed: {'; '.join(f'`{c.text()}`' for c in cmp.code)}"]
    if cmp.only_base:
        lines += ["", f"Missing from new (allowed): {missing_text(cmp, len(cmp.only_base))}"]
    return "\n".join(lines) + "\n\n" + render(rows, "markdown")
