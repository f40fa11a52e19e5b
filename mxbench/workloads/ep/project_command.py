"""``workloads.ep.project``: a measured EP run projected to other EP degrees per strategy, or validated against a run
measured at another degree (``--validate``). The model and its assumptions: ``workloads.ep.project``.

Exit codes: 0 written, 2 bad input (an option out of range, an EP degree the model cannot place, a file that is
not a measured EP run, runs that do not time the same layer), before any projection.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from ...clikit.common import FORMATS, CommaList, replace_option
from .project import DEEPSEEK_V3_MAX_NODES, DEFAULT_EPS, DEFAULT_INTER_GBPS, DEFAULT_INTRA_GBPS, LinkModel, Measured

POSITIVE = click.FloatRange(min=0.0, min_open=True)
SAME_LAYER = ("card", "K", "N", "E", "T", "top_k", "groups", "seed")


def _read(paths) -> list[Measured]:
    from ...storage.results import load_run
    from .project import read_run

    return [read_run(load_run(p), Path(p).stem) for p in paths]


def _run_rate(m: Measured, option: str) -> float:
    from mxkernels.core.errors import InputError

    if m.nodes > 1:
        raise InputError(f"{option}: {m.label} ran on {m.nodes} nodes: its all-to-all times mix NVLink and the NIC, "
                         "so they give no intra-node rate; give --intra-gbps")  # fmt: skip
    return m.intra_rate_gbps()


def _model_for(m: Measured, base: LinkModel, from_run: bool) -> LinkModel:
    if not from_run:
        return base
    rate = _run_rate(m, "--intra-from-run")
    return replace(base, intra_gbps=rate, intra_source=f"measured in {m.label} (busiest rank's one-way bytes over "
                   f"time, every all-to-all of the run; {m.card}, EP {m.ep})")  # fmt: skip


def _check_same_layer(a: Measured, b: Measured) -> None:
    from mxkernels.core.errors import InputError

    differ = [f"{k} {getattr(a, k)} vs {getattr(b, k)}" for k in SAME_LAYER if getattr(a, k) != getattr(b, k)]
    if differ:
        raise InputError(f"--validate: {b.label} does not time the layer of {a.label} with its routing "
                         f"({'; '.join(differ)}): the projection holds them")  # fmt: skip


@click.command("ep-project")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--ep", "eps", type=CommaList(int), default=",".join(map(str, DEFAULT_EPS)), show_default=True,
              help="EP degrees to project to.")  # fmt: skip
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--intra-gbps", type=POSITIVE, help=f"NVLink GB/s, one way per GPU. [default: {DEFAULT_INTRA_GBPS}]")
@click.option("--inter-gbps", type=POSITIVE, help=f"NIC GB/s, one way per GPU. [default: {DEFAULT_INTER_GBPS}]")
@click.option("--intra-from-run", is_flag=True, help="The run's own all-to-all rate as the NVLink rate.")
@click.option("--max-nodes-per-token", "max_nodes", type=click.IntRange(min=0), default=DEEPSEEK_V3_MAX_NODES,
              show_default=True,
              help="Node-limited routing (DeepSeek-V3: 4); 0: no limit, no per-node dedup.")  # fmt: skip
@click.option("--top-k", "top_k", type=click.IntRange(min=1),
              help="Project a layer of this top-k with the run's copies per rank (tokens per rank x top-k) held. "
              "[default: the run's]")  # fmt: skip
@click.option("--latency-us", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Fixed time per all-to-all call.")  # fmt: skip
@click.option("--validate", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A run of the same layer at another EP degree: predict it from RUN and compare.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice([*FORMATS, "json"]), default="markdown", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the output here.")
@click.option("--plot-file", type=click.Path(dir_okay=False, path_type=Path), help="Draw the figure (.png/.svg/.pdf).")
@replace_option
def ep_project(runs, eps, gpus_per_node, intra_gbps, inter_gbps, intra_from_run, max_nodes, top_k, latency_us,
               validate, fmt, out, plot_file, force) -> None:  # fmt: skip
    """Project measured EP runs to EP degrees 8-256 per strategy with a link model.

    Default rates: DeepEP's published H800 measurements (normal kernels; NVLink 153 / 158 GB/s dispatch / combine,
    RDMA 43-58 GB/s at EP 16-64). The assumptions are printed under the table and stored in the JSON."""
    from mxkernels.core.errors import InputError

    from ...storage.outputs import IMAGE_SUFFIXES, check_figure_target, check_output_file
    from .project import check_degree, predict, with_top_k
    from .project_output import assumptions, json_output, plot_projection, projection_rows, text_output, validation_rows

    if intra_from_run and intra_gbps is not None:
        raise click.UsageError("give either --intra-gbps or --intra-from-run, not both")
    if validate is None:
        for ep in eps:
            check_degree(ep, gpus_per_node)
    elif len(runs) != 1 or top_k is not None:
        raise click.UsageError("--validate predicts one run from one run as measured: give one RUN, and no --top-k")
    if out is not None:
        check_output_file(out, "--out", force)  # a run given as --out is not a projection: refused without --force
    if plot_file is not None:
        check_figure_target(plot_file, "--plot-file", IMAGE_SUFFIXES, force)
    measured = [m if top_k is None else with_top_k(m, top_k) for m in _read(runs)]
    base = LinkModel(gpus_per_node, intra_gbps or DEFAULT_INTRA_GBPS, inter_gbps or DEFAULT_INTER_GBPS, max_nodes,
                     latency_us)  # fmt: skip
    if validate is not None:
        target = _read([validate])[0]
        _check_same_layer(measured[0], target)
        if target.ep == measured[0].ep:
            raise InputError(f"--validate: {target.label} is at the EP degree of {measured[0].label} ({target.ep})")
        # the validation places the ranks as the measured run had them, at the source run's own rate unless given
        model = _model_for(measured[0], replace(base, gpus_per_node=target.ep // target.nodes), intra_gbps is None)
        preds = predict(measured[0], target.ep, model)
        seen = f"Validation run {target.label}: {target.card}, EP {target.ep} on {target.nodes} node(s), measured"
        notes = [*assumptions(model, measured), seen]
        rows = validation = validation_rows(preds, target)
        title = f"Validation: {target.label} (EP {target.ep}) predicted from {measured[0].label} (EP {measured[0].ep})"
        lines = [*predict(measured[0], measured[0].ep, model), *preds]
        shown = [measured[0], target]
    else:
        models = {m.label: _model_for(m, base, intra_from_run) for m in measured}
        preds = [p for m in measured for ep in eps for p in predict(m, ep, models[m.label])]
        model = models[measured[0].label]
        notes = assumptions(model, measured)
        if len(measured) > 1 and intra_from_run:
            notes += [f"{m.label}: intra-node rate {models[m.label].intra_gbps:.1f} GB/s (its own)" for m in measured]
        rows, validation = projection_rows(preds, measured), None
        title = "EP projection per strategy (projected, not measured)"
        lines, shown = preds, measured
    if fmt == "json":
        text = json_output(model, measured, [] if validate else rows, validation, notes)
    else:
        text = text_output(rows, notes, fmt, title)
    click.echo(text, nl=False)
    if out is not None:
        from ...storage.marks import Output, marked_text
        from ...storage.writing import write_output

        click.echo(f"wrote {write_output(out, marked_text(text, fmt, 'ep-project'), Output.TEXT)}", err=True)
    if plot_file is not None:
        click.echo(f"wrote {plot_projection(lines, shown, plot_file)}", err=True)
