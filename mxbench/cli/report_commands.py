"""The commands that read stored results: table, plot, compare, and the presets they name."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..clikit.common import (
    EXIT_CODES_HELP,
    FORMATS,
    CommaList,
    comparison_format,
    echo_comparison,
    filter_options,
    gate_help,
    hardware_spec,
    project_option,
    replace_option,
    threshold_options,
    unique_paths,
)
from ..workloads.declaration import TableRequest
from ..workloads.registered import table_kinds

TABLE_KINDS = tuple(t.name for t in table_kinds())
"""Every workload's table kinds (``--kind``)."""


# ------------------------------------------------------------------------------------------------- presets


@click.command()
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
def presets(fmt: str) -> None:
    """List the model shape presets (shapes/*.toml) with their sources."""
    from ..plan.presets import load_presets
    from ..views.render import render

    rows = [
        {
            "Preset": p.name,
            "Model": p.model,
            "K": str(p.K),
            "N": str(p.N),
            "Experts": str(p.experts),
            "Top-k": str(p.top_k),
            "G": str(p.G),
            "Source": p.source,
        }
        for p in load_presets().values()
    ]
    click.echo(render(rows, fmt), nl=False)


# ------------------------------------------------------------------------------------------- table and plot


@click.command("table")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path),
                callback=unique_paths)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="markdown", show_default=True)
@click.option("--kind", type=click.Choice(TABLE_KINDS), default="breakdown", show_default=True)
@filter_options
@click.option("--columns", type=CommaList(str), help="Columns to show, in order.")
@click.option(
    "--denominator",
    type=click.Choice(["datasheet", "measured", "none"]),
    help="Peak of the efficiency column. [default: the run's, datasheet if it names a spec, else none]",
)
@project_option
def table_cmd(results, fmt, kind, passes, Ms, recipes, card, columns, denominator, project) -> None:
    """Render stored results (files, or folders of them) as tables (ready to paste into docs).

    A filter value that matches nothing in any file is refused (exit 2) with what the files hold; with several
    files, each shows what it has of the values asked for, and a file with none of them is left out."""
    from mxkernels.core.errors import InputError

    from ..reporting.tables import check_kind, table_kind
    from ..views.frame import load_runs

    runs, named = [], {p.resolve() for p in results if p.is_file()}
    for path, run in load_runs(results):  # files, and the runs in folders (as `history` and `mxbench.load` read them)
        try:
            check_kind(run, kind, str(path))
        except InputError:
            if path.resolve() in named:
                raise  # a file named on the command line must be of the kind asked for
            continue  # a folder's run of another kind (a peers run beside the rooflines)
        runs.append((path, run))
    if not runs:
        raise click.BadParameter(f"no run in {', '.join(map(str, results))} has a {kind} table", param_hint="--kind")
    if any(f is not None for f in (passes, Ms, recipes, card)):
        # every kind's filters, checked on the records whatever the kind renders: a value that selects nothing is
        # refused naming what the files hold (an EP or layer table drew every row, or none, and exited 0)
        from ..views.frame import frame_of, select

        select(frame_of([run for _, run in runs], files=[str(p) for p, _ in runs]), passes=passes, M=Ms,
               recipe=recipes, card=card)  # fmt: skip
    request = TableRequest(fmt, passes, Ms, recipes, card, columns, denominator, project)
    click.echo(table_kind(kind).render(runs, request), nl=False)


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                callback=unique_paths)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A .png file, or a folder for all figures.")
@click.option("--hardware", help="Spec of the roofs and the model. [default: the run's]")
@project_option
@replace_option
def plot(results: tuple[Path, ...], out: Path, hardware: str | None, project: str | None, force: bool) -> None:
    """Draw the figures of stored results (a peers run: the peers figure; an EP run: its figure; several EP runs of
    one layer at different EP degrees: the EP-degree scaling figure)."""
    from ..reporting.plots import plot_all, plot_several
    from ..storage.outputs import IMAGE_SUFFIXES, check_figure_target
    from ..storage.results import load_run

    check_figure_target(out, "--out", IMAGE_SUFFIXES, force)
    if len(results) > 1:
        click.echo(str(plot_several(results, out, hardware=hardware, project=project)))
        return
    run = load_run(results[0])
    key = hardware or run.meta.get("hardware")
    for path in plot_all(run, out, spec=hardware_spec(key) if key else None, project=project):
        click.echo(str(path))


# --------------------------------------------------------------------------------------------------- compare


@click.command(epilog=EXIT_CODES_HELP, help=gate_help(
    "Per stage: new/base ratio of medians with a bootstrap CI and a verdict (FASTER / SAME / SLOWER / UNSURE); "
    "says which implementations' code differs between the runs."))  # fmt: skip
@click.argument("base", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@comparison_format
@click.option("--force", is_flag=True, help="Compare runs of different cards anyway.")
@click.option("--allow-missing", is_flag=True, help="Compare what both runs hold when NEW lacks stages BASE has.")
@threshold_options
def compare(base: Path, new: Path, fmt: str, force: bool, allow_missing: bool, thresholds, floor_us) -> None:
    from ..gate.compare import Thresholds, compare_runs
    from ..gate.report import check_usable
    from ..storage.results import load_run

    bands = Thresholds.parse(thresholds, floor_us)
    cmp = compare_runs(load_run(base), load_run(new), force=force, thresholds=bands)
    check_usable(cmp, str(base), str(new), allow_missing=allow_missing)
    echo_comparison(cmp, fmt, str(base), str(new))
    sys.exit(cmp.exit_code)
