"""The ``mxbench`` command line (click): roofline, presets, ceilings, table, plot, compare, regress, peers.

Bad input exits with code 2 and a one-line message: click's own usage errors, and any ``ValueError`` raised below
the CLI (the harness and the kernels validate their arguments with ValueErrors that name them). Heavy modules
(torch, the kernels, NVML) are imported inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from . import __version__

DEFAULT_MS = "16384,32768,65536,131072"
RESULTS_DIR = Path("results")
TABLE_KINDS = ("breakdown", "speedup", "sweep", "power", "peers")
FORMATS = ("markdown", "github", "csv", "plain")


class InputError(click.ClickException):
    """Bad input found below the option parser: exit code 2 with a one-line message, as click's usage errors."""

    exit_code = 2


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ValueError as e:  # the harness's argument checks: a message, never a traceback
            raise InputError(" ".join(str(e).split())) from None


class CommaList(click.ParamType):
    """A comma-separated list of ``item`` values ("16384,32768")."""

    name = "list"

    def __init__(self, item: Callable[[str], Any]):
        self.item = item

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        try:
            return [self.item(v.strip()) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of {self.item.__name__} values", param, ctx)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _require_gpu(what: str) -> None:
    if not _has_gpu():
        raise InputError(f"no CUDA GPU found: {what}")


def _command_line() -> str:
    """The running command as typed (the options given on the command line, in declaration order), for metadata."""
    ctx = click.get_current_context()
    words = ["mxbench", ctx.info_name]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name]
        if isinstance(param, click.Option):
            words += [param.opts[0]] if param.is_flag else [param.opts[0], _word(value)]
        else:  # an argument; nargs=-1 gives a tuple
            words += [_word(v) for v in (value if isinstance(value, tuple) else (value,))]
    return shlex.join(words)


def _word(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(_word, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _card_dir(device: int = 0) -> str:
    """``results/<card>/``: the running card's name made path-safe, the folder its ceilings are stored in."""
    from .hardware import card_slug

    return card_slug(_card_name(device))


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def _echo_tables(run, breakdown_M: int | None, denominator: str | None, fmt: str = "plain") -> None:
    from .report import table

    click.echo(table(run, "breakdown", fmt, M=breakdown_M, denominator=denominator))
    click.echo("Net speedup over bf16 by M")
    click.echo(table(run, "speedup", fmt, header=False))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mxbench")
def cli() -> None:
    """Benchmark and roofline suite for MXFP8 mixture-of-experts grouped-GEMM training kernels."""


# ------------------------------------------------------------------------------------------------- roofline


def _shape_args(K: int | None, N: int | None, G: int | None, preset: str | None) -> tuple[int, int, int, str]:
    """(K, N, G, label) from --preset or --K/--N; G defaults to the preset's, else 8."""
    from .sweep import check_shape, get_preset

    if preset is not None:
        if K is not None or N is not None:
            raise click.UsageError("give either --preset or --K/--N, not both")
        p = get_preset(preset)
        K, N, G, label = p.K, p.N, p.G if G is None else G, preset
    elif K is None or N is None:
        raise click.UsageError("give --K and --N (or --preset NAME; `mxbench presets` lists them)")
    else:
        G, label = 8 if G is None else G, f"{K}x{N}"
    check_shape(N, K, G)
    return K, N, G, label


def _power_limits(percents: Sequence[float] | None, watts: Sequence[float] | None, gpu: bool):
    """Watts per requested limit ([None] = the card's limit as found) and the controller that will set them.

    Permission is checked here, before anything runs. Without a GPU the request is checked for sign only.
    """
    if not percents and not watts:
        return [None], None
    for name, values in (("--power-limit", percents), ("--power-limit-watts", watts)):
        if values and any(v <= 0 for v in values):
            raise click.BadParameter(f"must be positive, got {values}", param_hint=name)
    if not gpu:
        return [None], None
    from .power import PowerController, PowerError

    try:
        controller = PowerController(0)
        limits = controller.resolve(percents=percents or None, watts=watts or None)
        for w in limits:
            controller.check_permission(w)
    except PowerError as e:  # no NVML, or no permission to set a limit: before anything runs
        raise InputError(" ".join(str(e).split())) from None
    return limits, controller


@cli.command()
@click.option("--K", "K", type=int, help="Model dim (contraction dim of the forward GEMM); multiple of 32.")
@click.option("--N", "N", type=int, help="Expert hidden dim; multiple of 32.")
@click.option("--preset", help="Shapes of a model (see `mxbench presets`) instead of --K/--N.")
@click.option(
    "--G", "G", type=click.IntRange(1, 512), help="Local experts (token groups). [default: 8 or the preset's]"
)
@click.option("--M", "Ms", type=CommaList(int), default=DEFAULT_MS, show_default=True, help="Tokens, comma list.")
@click.option(
    "--recipe",
    "recipes",
    type=CommaList(str),
    default="mxfp8",
    show_default=True,
    help="mxfp8, fp8_rowwise, bf16; comma list. bf16 is always measured as the baseline.",
)
@click.option(
    "--mode", type=click.Choice(["rceil", "floor"]), default="rceil", show_default=True, help="MX scale mode."
)
@click.option(
    "--groups",
    type=click.Choice(["balanced", "skewed"]),
    default="balanced",
    show_default=True,
    help="Token-group sizes: even, or router-like (seeded, recorded).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of inputs and skewed group sizes.")
@click.option(
    "--power-limit",
    "power_percent",
    type=CommaList(float),
    help="Power limits in percent of the default limit, comma list (needs permission to set).",
)
@click.option("--power-limit-watts", "power_watts", type=CommaList(float), help="Power limits in watts, comma list.")
@click.option("--breakdown-M", "breakdown_M", type=int, help="M of the per-pass breakdown table. [default: largest]")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results file. [default: results/<card>/roofline-<preset or KxN>-<date>.json]",
)
@click.option("--plot-file", type=click.Path(path_type=Path), help="Also draw the figures (a .png, or a folder).")
@click.option(
    "--hardware",
    help="Hardware spec of the datasheet peaks and of the model without a GPU. "
    "[default: the detected card's; b200 without a GPU]",
)
@click.option(
    "--denominator",
    type=click.Choice(["datasheet", "measured"]),
    default="datasheet",
    show_default=True,
    help="Peak that efficiencies are shown against.",
)
@click.option("--warm-l2", is_flag=True, help="Time with a warm L2 (default: cold, flushed).")
@click.option("--samples", type=click.IntRange(min=1), default=25, show_default=True, help="Samples per stage.")
def roofline(K, N, preset, G, Ms, recipes, mode, groups, seed, power_percent, power_watts, breakdown_M, out,
             plot_file, hardware, denominator, warm_l2, samples):  # fmt: skip
    """Time every stage of every pass over a sweep of M (or, without a GPU, print the analytic model)."""
    from .sweep import plan_points

    K, N, G, label = _shape_args(K, N, G, preset)
    if any(M <= 0 for M in Ms):
        raise click.BadParameter(f"every M must be positive, got {Ms}", param_hint="--M")
    if breakdown_M is not None and breakdown_M not in Ms:
        raise click.BadParameter(f"{breakdown_M} is not one of the swept M {Ms}", param_hint="--breakdown-M")
    gpu = _has_gpu()
    hardware = hardware or (_detected_spec() if gpu else "b200")
    spec = _spec(hardware) if hardware else None
    limits, controller = _power_limits(power_percent, power_watts, gpu)
    points = plan_points(Ms, N, K, G, recipes, mode, groups, seed, limits)
    if gpu:
        out = out or RESULTS_DIR / _card_dir() / f"roofline-{label}-{_stamp()}.json"
        run = _measure(points, hardware, denominator, out, controller, warm_l2, samples)
    else:
        run = _model(points, spec, hardware, power_percent or power_watts, denominator)
        if out is not None:
            from .results import save_run

            save_run(run, out)
    _echo_tables(run, breakdown_M, denominator if hardware or denominator == "measured" else None)
    if out is not None:
        click.echo(f"results: {out}")
    if plot_file is not None:
        from .plots import plot_all

        for path in plot_all(run, plot_file, spec=spec):
            click.echo(f"figure: {path}")
    if run.meta.get("interrupted"):
        click.echo("interrupted: the partial results above were saved", err=True)
        sys.exit(130)


def _spec(key: str):
    from .hardware import get_spec

    try:
        return get_spec(key)
    except (KeyError, ValueError) as e:
        raise click.BadParameter(str(e).strip("'\""), param_hint="--hardware") from None


def _model(points, spec, hardware: str, power_requested, denominator: str):
    from .sweep import model_run

    if denominator == "measured":
        raise click.BadParameter("measured ceilings need a GPU; use datasheet", param_hint="--denominator")
    click.echo(f"no CUDA GPU found: showing the analytic model over the {hardware} spec (model, not measured)")
    if power_requested:
        click.echo("power limits need a GPU: ignored")
    return model_run(points, spec=spec, hardware=hardware, command=_command_line())


def _measure(points, hardware: str | None, denominator: str, out: Path, controller, warm_l2: bool, samples: int):
    from .sweep import Instruments, SweepOptions, run_sweep

    options = SweepOptions(cold_l2=not warm_l2, samples=samples, out=out, results_dir=RESULTS_DIR,
                           hardware=hardware, denominator=denominator, command=_command_line())  # fmt: skip
    instruments = Instruments.real(0, RESULTS_DIR, power=controller)
    if denominator == "measured" and not instruments.ceilings(_card_name()):
        raise click.BadParameter("no measured ceilings stored for this card: run `mxbench ceilings` first",
                                 param_hint="--denominator")  # fmt: skip
    return run_sweep(points, options=options, instruments=instruments)


def _detected_spec(device: int = 0) -> str | None:
    """Key of the running card's hardware spec, None for a card without one."""
    from .hardware import detect

    spec = detect(device)
    return None if spec is None else spec.key


def _card_name(device: int = 0) -> str:
    from .hardware import device_properties

    return str(device_properties(device).get("name", "unknown"))


# ------------------------------------------------------------------------------------------------- presets


@cli.command()
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
def presets(fmt: str) -> None:
    """List the model shape presets (shapes/*.toml) with their sources."""
    from .report import render
    from .sweep import load_presets

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
        }  # fmt: skip
        for p in load_presets().values()
    ]
    click.echo(render(rows, fmt), nl=False)


# ------------------------------------------------------------------------------------------------ ceilings


@cli.command()
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=RESULTS_DIR, show_default=True)
def ceilings(out_dir: Path) -> None:
    """Measure this card's achievable bandwidth and GEMM throughput at its current power limit, and store them.

    Each GEMM ceiling is the best of the square matmul and the training step's own grouped GEMMs (DeepSeek-V3, Llama 4
    Scout; the roofline's token counts; balanced and skewed groups), with the shape that gave it."""
    _require_gpu("ceilings are measured on a GPU")
    from dataclasses import asdict

    from .ceilings import measure_ceilings, save_ceilings

    c = measure_ceilings(0)
    path = save_ceilings(c, out_dir)
    for k, v in asdict(c).items():
        click.echo(f"{k}: {v}")
    click.echo(f"stored: {path}")


# ------------------------------------------------------------------------------------------- table and plot


def _load(path: Path):
    """A stored run; a file that is not one is bad input, named in the message."""
    from .results import load_run

    try:
        return load_run(path)
    except ValueError as e:
        raise ValueError(str(e) if str(path) in str(e) else f"{path}: {e}") from None


@cli.command("table")
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
    from .report import header_block, render, table

    texts = []
    for path in results:
        run = _load(path)
        if card is not None and card.lower() != run.card.lower():
            continue
        if kind == "peers":
            from .peers import peer_rows

            texts.append(header_block(run, None, fmt) + "\n" + render(peer_rows(run, M=Ms), fmt, columns))
            continue
        filters = {"M": _breakdown_M(Ms) if kind == "breakdown" else Ms, "recipe": recipes}
        if kind != "speedup":
            filters["passes"] = passes
        denom = _denominator(run, denominator)
        texts.append(table(run, kind, fmt, columns=columns, denominator=denom, **filters))
    if not texts:
        raise InputError(f"no results of card {card!r}")
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


@cli.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="A .png file, or a folder for all figures.")
@click.option("--hardware", help="Spec of the roofs and the model. [default: the run's]")
def plot(results: Path, out: Path, hardware: str | None) -> None:
    """Draw the figures of stored results."""
    from .plots import plot_all

    run = _load(results)
    key = hardware or run.meta.get("hardware")
    for path in plot_all(run, out, spec=_spec(key) if key else None):
        click.echo(str(path))


# ------------------------------------------------------------------------------------------ compare, regress


@cli.command()
@click.argument("base", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
@click.option("--force", is_flag=True, help="Compare runs of different cards anyway.")
def compare(base: Path, new: Path, fmt: str, force: bool) -> None:
    """Per stage: new/base ratio of medians with a bootstrap CI and a verdict. Exit 1 if anything is SLOWER."""
    from .report import compare_runs

    cmp = compare_runs(_load(base), _load(new), force=force)
    _echo_comparison(cmp, fmt)
    sys.exit(cmp.exit_code)


def _echo_comparison(cmp, fmt: str) -> None:
    from .report import comparison_rows, render

    click.echo(render(comparison_rows(cmp), fmt), nl=False)
    click.echo(cmp.summary())


@cli.command()
@click.option(
    "--baseline",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="A stored run of this card (results/baselines/<card>.json).",
)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="Interleaved rounds.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
def regress(baseline: Path, rounds: int, fmt: str) -> None:
    """Re-measure the baseline's points on this card; exit 1 only on a confirmed regression."""
    _require_gpu("regress re-measures the baseline on a GPU")
    from .regress import regress as run_regress
    from .sweep import Instruments, SweepOptions, run_sweep

    base = _load(baseline)
    timing = base.meta.get("timing") or {}
    options = SweepOptions(cold_l2=timing.get("cold_l2", True), use_graph=timing.get("use_graph", True),
                           samples=timing.get("samples", 25), hardware=base.meta.get("hardware"),
                           backend=base.meta.get("backend"), command=_command_line())  # fmt: skip
    instruments = Instruments.real(0, RESULTS_DIR)
    result = run_regress(base, lambda pts: run_sweep(pts, options=options, instruments=instruments), rounds=rounds)
    _echo_comparison(result.comparison, fmt)
    sys.exit(result.exit_code)


# --------------------------------------------------------------------------------------------------- peers


@cli.command()
@click.option("--K", "K", type=int, help="Model dim; multiple of 32.")
@click.option("--N", "N", type=int, help="Expert hidden dim; multiple of 32.")
@click.option("--preset", help="Shapes of a model instead of --K/--N.")
@click.option("--G", "G", type=click.IntRange(1, 512), help="Local experts. [default: 8 or the preset's]")
@click.option("--M", "M", type=click.IntRange(min=1), default=131072, show_default=True, help="Tokens.")
@click.option("--mode", type=click.Choice(["rceil", "floor"]), default="rceil", show_default=True)
@click.option("--groups", type=click.Choice(["balanced", "skewed"]), default="balanced", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--samples", type=click.IntRange(min=1), default=25, show_default=True)
@click.option("--warm-l2", is_flag=True, help="Time with a warm L2 (default: cold).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results file. [default: results/<card>/peers-<preset or KxN>-<date>.json]",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
def peers(K, N, preset, G, M, mode, groups, seed, samples, warm_l2, out, fmt) -> None:
    """Our quantize / rearrange / pad kernels beside torchao's Triton kernels and torch.compile of the references."""
    K, N, G, label = _shape_args(K, N, G, preset)
    _require_gpu("peers are timed on a GPU")
    from .peers import peer_rows, run_peers
    from .report import header_block, render
    from .sweep import SweepOptions

    out = out or RESULTS_DIR / _card_dir() / f"peers-{label}-M{M}-{_stamp()}.json"
    options = SweepOptions(cold_l2=not warm_l2, samples=samples, out=out, results_dir=RESULTS_DIR,
                           hardware=_detected_spec(), command=_command_line())  # fmt: skip
    run = run_peers(M, N, K, G, mode=mode, groups=groups, seed=seed, options=options)
    click.echo(header_block(run, None, fmt) + "\n" + render(peer_rows(run), fmt), nl=False)
    click.echo(f"results: {out}")


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="mxbench")


if __name__ == "__main__":
    main()
