"""The harness's own measuring commands, for any workload: ``ceilings`` (what this card reaches, and what only
several processes measure) and ``regress`` (a stored baseline re-measured by its workload, and gated)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..clikit import common
from ..clikit.common import (
    REGRESS_EXIT_CODES_HELP,
    RESULTS_DIR,
    command_line,
    comparison_format,
    echo_comparison,
    threshold_options,
)
from ..clikit.impls import checked, impl_option, recorded_impls, run_impls
from ..workloads.registered import WORKLOADS, workload_of


@click.command()
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=RESULTS_DIR, show_default=True)
def ceilings(out_dir: Path) -> None:
    """Measure this card's achievable bandwidth and GEMM throughput at its current power limit, and store them.

    Each GEMM ceiling is the best of the square matmul and the training step's own grouped GEMMs (DeepSeek-V3, Llama 4
    Scout; the roofline's token counts; balanced and skewed groups), with the shape that gave it. Under torchrun with
    several processes: the all-to-all ceiling of these GPUs instead (``ep.ceiling``)."""
    from ..storage.outputs import check_folder

    check_folder(out_dir, "--out-dir")
    common.require_gpu("ceilings are measured on a GPU")
    from ..measuring.dist import under_torchrun

    if under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:  # the ceilings that only several processes measure
        for workload in WORKLOADS:
            if workload.ceiling is not None:
                click.get_current_context().exit(workload.ceiling(out_dir, click.echo))
    from dataclasses import asdict

    from ..instruments.ceiling_store import save_ceilings
    from ..instruments.ceilings import measure_ceilings

    c = measure_ceilings(0)
    path = save_ceilings(c, out_dir)
    for k, v in asdict(c).items():
        click.echo(f"{k}: {v}")
    click.echo(f"stored: {path}")


# -------------------------------------------------------------------------------------------------- regress


@click.command(epilog=REGRESS_EXIT_CODES_HELP)
@click.option(
    "--baseline",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="A stored run of this card (results/baselines/<card>.json).",
)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="Interleaved rounds.")
@comparison_format
@click.option("--allow-missing", is_flag=True, help="Pass when stages of the baseline no longer run.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also save the fresh measurement (every round pooled) as a results file, e.g. a CI artifact.",
)
@impl_option
@threshold_options
def regress(baseline: Path, rounds: int, fmt: str, allow_missing: bool, out: Path | None, impl_texts, thresholds,
            floor_us) -> None:  # fmt: skip
    """Re-measure the baseline's points on this card, with the implementations it recorded (by registered name)
    unless --impl names others; exit 1 only on a confirmed regression. The gate's rules: `mxbench compare --help`."""
    from ..gate.compare import Thresholds
    from ..storage.outputs import check_results_file
    from ..storage.results import load_run, save_run

    bands = Thresholds.parse(thresholds, floor_us)

    base = load_run(baseline)  # a broken baseline is bad input, GPU or not
    if out is not None:
        check_results_file(out, "--out")
    points = list(dict.fromkeys(r.point for r in base.records))
    recipes = list(dict.fromkeys(p.recipe for p in points))
    # the baseline's workload re-measures it (a `mxbench layer` run: its layer, with mxkernels' stages)
    remeasure = workload_of(base).remeasure or WORKLOADS[0].remeasure
    if remeasure.impl_refused and impl_texts:
        raise click.BadParameter(remeasure.impl_refused, param_hint="--impl")
    impls = [] if remeasure.impl_refused else recorded_impls(base, run_impls(impl_texts, recipes, points))
    common.require_gpu("regress re-measures the baseline on a GPU")
    if out is not None:
        common.check_replace(out, True, common.card_name(), points, None)  # no --force: compare's means other cards
    if impls:
        first = next(p for p in points if p.recipe == impls[0].recipe)
        impls = checked(impls, first.K, first.N, first.G, first.mode)
    from ..gate.regress import regress as run_regress
    from ..gate.report import check_usable
    from ..instruments.kit import Instruments
    from ..measuring.shard import launched, local_device
    from ..measuring.stages import SweepOptions

    timing = base.meta.get("timing") or {}
    device = local_device()
    options = SweepOptions(cold_l2=timing.get("cold_l2", True), use_graph=timing.get("use_graph", True),
                           samples=timing.get("samples", 25), hardware=base.meta.get("hardware"),
                           backend=base.meta.get("backend"), command=command_line(), device=device,
                           impls=tuple(impls))  # fmt: skip
    instruments = Instruments.real(device, RESULTS_DIR)
    measure = remeasure.measure(base, options, instruments)
    try:
        if launched() and remeasure.sharded is not None:  # every round's points split over the ranks; rank 0 reports
            result = remeasure.sharded(base, options=options, instruments=instruments, rounds=rounds, thresholds=bands)
            if result is None:
                return
        else:
            result = run_regress(base, measure, rounds=rounds, thresholds=bands)
    except KeyboardInterrupt:
        click.echo("interrupted: nothing compared", err=True)
        sys.exit(130)
    if out is not None:
        save_run(result.measured, out)
    check_usable(result.comparison, str(baseline), "this run", allow_missing=allow_missing)
    echo_comparison(result.comparison, fmt, str(baseline), "this run")
    sys.exit(result.exit_code)
