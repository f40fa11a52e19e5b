"""``--impl`` of the commands that measure (``roofline``, ``regress``, ``peers``): which implementation runs a
stage, checked against the stage's oracle before anything is timed, and refused (exit 2) when the run has no such
stage. ``regress`` also re-measures the implementations its baseline recorded (``recorded_impls``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence

import click

from .common import BadInput

CHECK_M = 256
"""Tokens per expert of the check an ``--impl`` passes before it is timed: small, so it costs seconds."""
IMPL_HELP = (
    "Run this implementation of its stage in place of mxkernels' (repeatable): STAGE=NAME or NAME (a registered "
    "implementation: `mxbench impls` lists them; NAME alone: every stage it implements), or STAGE=module:function "
    "(a module in the current folder is found). STAGE may be RECIPE/STAGE. Checked against the stage's oracle "
    "first (`mxbench check`) and not timed if it fails; refused when the run has no such stage."
)


def impl_option(command: Callable) -> Callable:
    return click.option("--impl", "impl_texts", multiple=True, metavar="[STAGE=]NAME|STAGE=module:function",
                        help=IMPL_HELP)(command)  # fmt: skip


def _registry():
    """The process-wide registry; a plugin that did not load is a failure: printed, exit 1 (it may be the one the
    run was meant to measure)."""
    from ..implementations.default import default_registry

    registry = default_registry()
    if registry.load_errors:
        for origin, message in registry.load_errors:
            click.echo(f"ERROR plugin {origin} did not load: {message}", err=True)
        sys.exit(1)
    return registry


def resolve(texts: Iterable[str], recipes: Sequence[str]) -> list:
    """The implementations ``texts`` name, from the process-wide registry (``_registry``); none: the entry points
    are not even loaded."""
    from ..implementations.registry import with_cli_impls

    texts = list(texts)
    if not texts:
        return []
    registry = _registry()
    impls = []
    for recipe in dict.fromkeys(recipes or ["mxfp8"]):
        mine = [t for t in texts if "/" not in t.partition("=")[0] or t.startswith(f"{recipe}/")]
        named_only = [t for t in mine if "=" not in t]
        try:
            impls += with_cli_impls(registry, mine, recipe)
        except ValueError:
            if named_only and len(recipes) > 1:  # NAME may implement stages of one recipe only
                impls += with_cli_impls(registry, [t for t in mine if "=" in t], recipe)
                continue
            raise
    return list(dict.fromkeys(impls))


def run_impls(texts: Sequence[str], recipes: Sequence[str], points) -> list:
    """The ``--impl`` implementations of a run of ``points``, each for a stage the run has."""
    impls = resolve(texts, recipes)
    refuse_absent(impls, points)
    return impls


def refuse_absent(impls: Sequence, points: Sequence) -> None:
    """Each implementation's (recipe, stage) must run at some point of the run (``pad_a`` does not when every
    group is aligned, say): otherwise it would be accepted and never run."""
    from mxkernels.stages.pipeline import plan_step

    from ..plan.points import point_group_sizes

    present = set()
    for p in points:
        stages = plan_step(p.recipe, p.M, p.N, p.K, p.G, point_group_sizes(p), mode=p.mode, fuse_scales=p.fuse_scales)
        present |= {(p.recipe, s.name) for s in stages}
    absent = [f"{i.recipe}/{i.stage}" for i in impls if (i.recipe, i.stage) not in present]
    if absent:
        raise BadInput(f"--impl: the run has no stage {', '.join(absent)} (no point of it runs that stage): "
                       f"nothing would run it")  # fmt: skip


def checked(impls: Sequence, K: int, N: int, G: int, mode: str) -> tuple:
    """``impls``, each checked against its stage's oracle on this machine first (at a small M, the run's K, N, G).
    A failing check exits 1 with its finding; one that cannot run here is bad input."""
    if not impls:
        return ()
    import torch

    from ..implementations.check import Verdict, check_step, merged
    from ..measuring.shard import is_other_rank, local_device

    device = f"cuda:{local_device()}" if torch.cuda.is_available() else "cpu"
    for recipe in dict.fromkeys(i.recipe for i in impls):
        mine = {i.stage: [i] for i in impls if i.recipe == recipe}
        for r in merged(check_step(recipe, CHECK_M * G, N, K, G, mine, mode=mode, device=device)):
            if not is_other_rank():  # a sharded sweep reports its checks once
                click.echo(f"check {r.recipe}/{r.stage} [{r.impl}]: {r.verdict} {r.finding()}", err=True)
            if r.verdict == Verdict.SKIP:
                raise BadInput(f"--impl {r.impl} cannot run here: {r.detail}")
            if r.verdict not in (Verdict.PASS, Verdict.DEVIATES):
                click.echo(f"--impl {r.impl} failed its check against the {r.stage} oracle: not timed", err=True)
                sys.exit(1)
    return tuple(impls)


def recorded_impls(baseline, overrides: Sequence = ()) -> list:
    """The implementations ``baseline``'s stage records ran other than mxkernels' (by registered name), with each
    of ``overrides`` (``--impl``) in place of the one recorded for its stage. One the registry here lacks is
    refused: re-measuring mxkernels' kernel instead would compare the wrong code."""
    from mxkernels.core.names import END_TO_END_STAGE

    from ..implementations.registry import OURS

    given = {(i.recipe, i.stage): i for i in overrides}
    wanted: dict[tuple, str] = {}
    for r in baseline.records:
        if r.impl and r.impl != OURS and r.stage != END_TO_END_STAGE:
            wanted.setdefault((r.point.recipe, r.stage), r.impl)
    if not set(wanted) - set(given):
        return list(given.values())
    registry = _registry()
    impls, missing = list(given.values()), []
    for (recipe, stage), name in wanted.items():
        if (recipe, stage) in given:
            continue
        found = registry.impls.get((recipe, stage, name))
        if found is None:
            missing.append(f"{recipe}/{stage}={name}")
        else:
            impls.append(found)
    if missing:
        raise BadInput(f"the baseline ran {', '.join(missing)}, which is not registered here: install it (its "
                       f"entry point) or pass --impl STAGE=module:function")  # fmt: skip
    return impls


def report_check(results, load_errors, fmt: str, verbose: bool) -> int:
    """The table of ``results`` (one row per implementation, its worst verdict), each finding below it; the exit
    code."""
    from ..implementations.check import exit_code, merged
    from ..views.render import render

    rows = [{"Stage": r.stage, "Implementation": r.impl, "Verdict": str(r.verdict), "Detail": _first_line(r.detail)}
            for r in merged(results)]  # fmt: skip
    click.echo(render(rows, fmt), nl=False)
    for origin, message in load_errors:
        click.echo(f"ERROR plugin {origin} did not load: {message}")
    for r in merged(results):
        if r.verdict in ("FAIL", "ERROR", "DEVIATES"):
            for line in r.findings():
                click.echo(f"{r.verdict} {r.stage} / {r.impl}: {line}")
            if verbose and r.trace:
                click.echo(r.trace.rstrip())
    return exit_code(results, load_errors)


def _first_line(detail: str, width: int = 160) -> str:
    """A table cell: the detail cut to ``width`` characters (the findings below the table have it all)."""
    return detail if len(detail) <= width else detail[: width - 3] + "..."
