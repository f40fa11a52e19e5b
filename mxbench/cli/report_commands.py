"""The commands that read stored results: table, plot, compare, and the presets they name."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..ep import TABLE_KINDS as EP_TABLE_KINDS
from .common import (
    EXIT_CODES_HELP,
    FORMATS,
    BadInput,
    CommaList,
    comparison_format,
    echo_comparison,
    hardware_spec,
    peer_table,
)

TABLE_KINDS = ("breakdown", "speedup", "sweep", "power", "peers", *EP_TABLE_KINDS)


# ------------------------------------------------------------------------------------------------- presets


@click.command()
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
def presets(fmt: str) -> None:
    """List the model shape presets (shapes/*.toml) with their sources."""
    from ..presets import load_presets
    from ..render import render

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
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="markdown", show_default=True)
@click.option("--kind", type=click.Choice(TABLE_KINDS), default="breakdown", show_default=True)
@click.option(
    "--pass", "passes", type=CommaList(str), help="Passes: forward, backward_input, backward_weight, end_to_end."
)
@click.option("--M", "Ms", type=CommaList(int), help="Only these M (breakdown: the one M shown).")
@click.option("--recipe", "recipes", type=CommaList(str), help="Only these recipes.")
@click.option("--card", help="Only runs of this card.")
@click.option("--columns", type=CommaList(str), help="Columns to show, in order.")
@click.option(
    "--denominator",
    type=click.Choice(["datasheet", "measured", "none"]),
    help="Peak of the efficiency column. [default: the run's, datasheet if it names a spec, else none]",
)
def table_cmd(results, fmt, kind, passes, Ms, recipes, card, columns, denominator) -> None:
    """Render stored results as tables (ready to paste into docs)."""
    from ..results import load_run
    from ..tables import table

    texts = []
    for path in results:
        run = load_run(path)
        if card is not None and card.lower() != run.card.lower():
            continue
        if kind == "peers":
            texts.append(peer_table(run, fmt, Ms, columns))
            continue
        if kind in EP_TABLE_KINDS:
            from ..ep.tables import ep_table

            texts.append(ep_table(run, kind, fmt, columns=columns, strategies=recipes))
            continue
        filters = {"M": _breakdown_M(Ms) if kind == "breakdown" else Ms, "recipe": recipes}
        if kind != "speedup":
            filters["passes"] = passes
        denom = _denominator(run, denominator)
        texts.append(table(run, kind, fmt, columns=columns, denominator=denom, **filters))
    if not texts:
        raise BadInput(f"no results of card {card!r}")
    click.echo("\n".join(texts), nl=False)


def _breakdown_M(Ms: list[int] | None) -> int | None:
    if Ms and len(Ms) > 1:
        raise click.BadParameter("the breakdown table shows one M", param_hint="--M")
    return Ms[0] if Ms else None


def _denominator(run, choice: str | None) -> str | None:
    if choice == "none":
        return None
    if choice is not None:
        return choice
    return run.meta.get("denominator", "datasheet") if run.meta.get("hardware") else None


@click.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A .png file, or a folder for all figures.")
@click.option("--hardware", help="Spec of the roofs and the model. [default: the run's]")
def plot(results: Path, out: Path, hardware: str | None) -> None:
    """Draw the figures of stored results."""
    from ..outputs import check_figure_target
    from ..plots import IMAGE_SUFFIXES, plot_all
    from ..results import load_run

    check_figure_target(out, "--out", IMAGE_SUFFIXES)
    run = load_run(results)
    key = hardware or run.meta.get("hardware")
    for path in plot_all(run, out, spec=hardware_spec(key) if key else None):
        click.echo(str(path))


# --------------------------------------------------------------------------------------------------- compare


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("base", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@comparison_format
@click.option("--force", is_flag=True, help="Compare runs of different cards anyway.")
@click.option("--allow-missing", is_flag=True, help="Compare what both runs hold when NEW lacks stages BASE has.")
def compare(base: Path, new: Path, fmt: str, force: bool, allow_missing: bool) -> None:
    """Per stage: new/base ratio of medians with a bootstrap CI and a verdict (FASTER / SAME / SLOWER / UNSURE);
    says which implementations' code differs between the runs."""
    from ..compare import compare_runs
    from ..gate import check_usable
    from ..results import load_run

    cmp = compare_runs(load_run(base), load_run(new), force=force)
    check_usable(cmp, str(base), str(new), allow_missing=allow_missing)
    echo_comparison(cmp, fmt, str(base), str(new))
    sys.exit(cmp.exit_code)
