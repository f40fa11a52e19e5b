"""``mxbench history``: the runs of one card over commits, with a mark wherever a stage changed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..clikit.common import FORMATS, filter_options, refuse_ignored, replace_option, unique_paths


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path),
                callback=unique_paths)
@click.option(
    "--by",
    default="mxbench",
    show_default=True,
    help="Whose commit orders and labels the runs: mxbench, or an implementation the runs recorded "
    "(run.meta['implementations'], e.g. torchao); runs that did not record it are left out.",
)
@click.option("--checkout", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="With --by IMPLEMENTATION: its git checkout, whose commit times order the runs that did not record "
              "them (an installed copy is no checkout).")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="markdown", show_default=True)
@filter_options
@click.option("--changed", is_flag=True, help="Only the stages that changed at some step.")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also draw the trends: median and IQR band per stage over commits, a panel per category.")  # fmt: skip
@click.option("--fail-on-latest", is_flag=True, help="Exit 1 when the newest step is SLOWER than the one before.")
@replace_option
def history(results, by, checkout, fmt, passes, Ms, recipes, card, changed, plot_file, fail_on_latest, force) -> None:
    """Per-stage medians over commits of the runs in RESULTS (files or folders) of one card.

    Runs are ordered by the commit's time (recorded by the run, else from git, else the run's date: the steps
    table says which); the runs of one commit are pooled. A stage that changed since its previous commit is
    marked SLOWER or FASTER with the ratio, by the statistics of `mxbench compare`. Exit codes: 0, 1 with
    --fail-on-latest when the newest step is SLOWER (or broke), 2 for unusable input.
    """
    from ..views.frame import load_runs
    from ..reporting.history import history as build
    from ..reporting.history import history_rows, latest_summary, model_note, step_rows
    from ..views.render import render

    if by == "mxbench":
        refuse_ignored(("checkout",), "--checkout is the git checkout of the implementation --by names; mxbench's "
                       "commits are read from this checkout")  # fmt: skip
    if plot_file is not None:  # checked before any work: a figure path that cannot be written is bad input
        from ..storage.outputs import IMAGE_SUFFIXES, check_figure_target

        check_figure_target(plot_file, "--plot", IMAGE_SUFFIXES, force)
    h = build(load_runs(results), by=by, card=card, checkout=checkout)
    filters = {"passes": passes, "M": Ms, "recipe": recipes}
    rows = history_rows(h, changed_only=changed, **filters)
    if fmt == "csv":
        click.echo(render(rows, fmt), nl=False)
    else:
        bold = "**" if fmt in ("markdown", "github") else ""
        click.echo(f"{bold}History of {h.card}{bold}, by {by} commit time, oldest first:\n")
        click.echo(render(step_rows(h), fmt))
        for why in dict.fromkeys(w for _, w in h.left_out):
            click.echo(f"left out ({why}): {', '.join(p for p, w in h.left_out if w == why)}\n")
        click.echo(render(rows, fmt))
        click.echo(latest_summary(h))
        if note := model_note(h):
            click.echo(note)
    if plot_file is not None:
        from ..reporting.history_figure import history_figure
        from ..workloads.step.plots import save

        click.echo(f"figure: {save(history_figure(h, **filters), plot_file, '--plot')}", err=fmt == "csv")
    if fail_on_latest and h.latest_failed:
        sys.exit(1)
