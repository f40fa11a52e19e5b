"""``mxbench roofline``: every stage of the step timed over a sweep of M (or, without a GPU, the analytic model)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import click

from ...clikit import common
from ...clikit.common import (
    RESULTS_DIR,
    BadInput,
    CommaList,
    Seed,
    check_recipes_on,
    command_line,
    force_option,
    hardware_spec,
    project_option,
    refuse_ignored,
    shape_args,
)
from ...clikit.impls import checked, impl_option, run_impls
from ...instruments.cards import DEFAULT_CARD

DEFAULT_MS = "16384,32768,65536,131072"


def _echo_tables(run, breakdown_M: int | None, denominator: str | None, fmt: str = "plain") -> None:
    from .tables import step_table

    click.echo(step_table(run, "breakdown", fmt, M=breakdown_M, denominator=denominator))
    click.echo("Net speedup over bf16 by M")
    click.echo(step_table(run, "speedup", fmt, header=False))


# ------------------------------------------------------------------------------------------------- roofline


def _power_limits(percents: Sequence[float] | None, watts: Sequence[float] | None, gpu: bool):
    """Watts per requested limit ([None] = the card's limit as found) and the controller that will set them.

    Range and permission are checked here, before anything runs: against the card's NVML range with a GPU;
    without one, watts above every known card's maximum are refused (the model ignores limits, but a typo such as
    7000 W is still a typo).
    """
    if not percents and not watts:
        return [None], None
    for name, values in (("--power-limit", percents), ("--power-limit-watts", watts)):
        if values and any(not math.isfinite(v) or v <= 0 for v in values):  # nan passes `v <= 0`
            raise click.BadParameter(f"must be positive and finite, got {values}", param_hint=name)
    option = "--power-limit" if percents else "--power-limit-watts"
    if not gpu:
        _check_watts_known(watts or [])
        over = [p for p in percents or [] if p > 100]
        if over:  # hardware.toml's limits are the cards' defaults (TDP), which data-center cards cannot exceed
            raise BadInput(f"--power-limit: {over[0]:g}% is above the default limit, the most a known card allows; "
                           f"give percents of at most 100")  # fmt: skip
        return [None], None
    from mxkernels.core.errors import InputError

    from ...instruments.power import PowerController, PowerError
    from ...measuring.shard import local_device

    try:
        controller = PowerController(local_device())  # a sharded sweep: each rank limits its own GPU
        limits = controller.resolve(percents=percents or None, watts=watts or None)
        for w in limits:
            controller.check_permission(w)
    except PowerError as e:  # no NVML, or no permission to set a limit: before anything runs
        raise BadInput(str(e)) from None
    except InputError as e:  # outside the card's range, which the message gives
        raise BadInput(f"{option}: {e}") from None
    return limits, controller


def _check_watts_known(watts: Sequence[float]) -> None:
    """Without a GPU: no limit above the highest TDP of the known cards (``data/hardware.toml``)."""
    from ...instruments.hardware import load_specs

    top = max(load_specs().values(), key=lambda spec: spec.tdp_w)
    over = [w for w in watts if w > top.tdp_w]
    if over:
        raise BadInput(f"--power-limit-watts: {over[0]:g} W is above every known card's maximum power "
                       f"({top.tdp_w:g} W, {top.name}); give watts within the card's range")  # fmt: skip


@click.command()
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
@click.option("--seed", type=Seed(), default=0, show_default=True, help="Seed of inputs and skewed group sizes.")
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
    help="Results file (.json; the CSV is written beside it). [default: results/<card>/roofline-<preset or "
    "KxN>-<date>.json; without a GPU the model run goes to results/model-<spec>/]",
)
@click.option("--plot-file", type=click.Path(path_type=Path), help="Also draw the figures (a .png, or a folder).")
@click.option(
    "--hardware",
    help="Hardware spec of the datasheet peaks and of the model without a GPU. "
    f"[default: the detected card's; {DEFAULT_CARD} without a GPU]",
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
@click.option(
    "--fuse-scales",
    is_flag=True,
    help="Also measure each MXFP8 and FP8 rowwise point with fused scales, side by side with the unfused step in the "
    "same run: MXFP8 quantizers that write the GEMM's blocked scales (no rearrange stages); FP8 rowwise quantizers "
    "whose first pass over a tensor also folds the column amaxes its transposed copy is scaled by (one read fewer).",
)
@click.option("--backend", help="Grouped-GEMM backend of the run's one recipe besides bf16 (mxkernels.gemm.grouped_gemm.BACKENDS lists "
              "them): e.g. fp8_rowwise native (torch._scaled_grouped_mm) or triton (ours). [default: the device's best]")
@impl_option
@project_option
@force_option
def roofline(K, N, preset, G, Ms, recipes, mode, groups, seed, power_percent, power_watts, breakdown_M, out,
             plot_file, hardware, denominator, warm_l2, samples, fuse_scales, backend, impl_texts, project,
             force):  # fmt: skip
    """Time every stage of every pass over a sweep of M (or, without a GPU, print and save the analytic model).

    Exit codes: 0 done, 1 an --impl failed its check or a stage's time was refused (IMPOSSIBLE: below its
    roofline floor; or its last timed outputs did not follow new inputs), 2 bad input (nothing ran), 130 interrupted by Ctrl-C (the
    points measured so far are saved, and the file says the run is partial).
    """
    from ...plan.points import plan_points

    K, N, G, label = shape_args(K, N, G, preset)
    if any(M <= 0 for M in Ms):
        raise click.BadParameter(f"every M must be positive, got {Ms}", param_hint="--M")
    if breakdown_M is not None and breakdown_M not in Ms:
        raise click.BadParameter(f"{breakdown_M} is not one of the swept M {Ms}", param_hint="--breakdown-M")
    gpu = common.has_gpu()
    if project is not None and not gpu:
        raise click.BadParameter("a projection carries measured efficiencies over, and without a GPU nothing is "
                                 "measured: the model over --hardware prices that card directly", param_hint="--project")  # fmt: skip
    hardware = common.spec_key(hardware, gpu)
    spec = hardware_spec(hardware) if hardware else None
    check_recipes_on(spec, recipes)
    if not gpu and denominator == "measured":
        raise click.BadParameter("measured ceilings need a GPU; use datasheet", param_hint="--denominator")
    if backend is not None:
        _check_backend(backend, recipes, gpu)
    if not gpu:
        refuse_ignored(("samples", "warm_l2"), "without a GPU the analytic model is shown, which is not timed")
    folder = common.card_dir() if gpu else f"model-{spec.key}"
    out = out or RESULTS_DIR / folder / f"roofline-{label}-{common.stamp()}.json"
    common.check_outputs(out, plot_file, force)
    limits, controller = _power_limits(power_percent, power_watts, gpu)
    points = plan_points(Ms, N, K, G, recipes, mode, groups, seed, limits, fuse_scales)
    common.check_replace(out, gpu, common.card_name() if gpu else spec.name, points, force)
    impls = run_impls(impl_texts, recipes, points)
    impls = checked(impls, K, N, G, mode)
    if gpu:
        run = _measure(points, hardware, denominator, out, controller, warm_l2, samples, impls, backend)
        if run is None:  # another rank of a sharded sweep: rank 0 writes and prints (measuring.shard)
            return
    else:
        from ...storage.results import save_run

        run = _model(points, spec, hardware, power_percent or power_watts)
        save_run(run, out)
    _echo_tables(run, breakdown_M, denominator if hardware or denominator == "measured" else None)
    if project is not None:
        from .projection import projection_table

        for kind in ("breakdown", "speedup"):
            click.echo(projection_table(run, kind, "plain", project, header=False, M=breakdown_M))
    click.echo(f"results: {out}" + ("" if gpu else " (model, not measured)"))
    if plot_file is not None:
        from .plots import plot_step

        for path in plot_step(run, plot_file, spec=spec, project=project):
            click.echo(f"figure: {path}")
    common.exit_if_partial(run)
    common.exit_if_fooled(run)


def _model(points, spec, hardware: str, power_requested):
    from .sweep import model_run

    click.echo(f"no CUDA GPU found: showing the analytic model over the {hardware} spec (model, not measured)")
    if power_requested:
        click.echo("power limits need a GPU: ignored")
    return model_run(points, spec=spec, hardware=hardware, command=command_line())


def _check_backend(backend: str, recipes: Sequence[str], gpu: bool) -> None:
    """``--backend`` names one backend of the run's one recipe besides bf16 (bad input otherwise, before any work)."""
    from mxkernels.gemm.grouped_gemm import BACKENDS

    others = [r for r in recipes if r != "bf16"]
    if len(others) != 1:
        raise click.BadParameter(f"it sets the GEMM backend of one recipe besides bf16; this run has {others or 'none'}",
                                 param_hint="--backend")  # fmt: skip
    if backend not in BACKENDS[others[0]]:
        raise click.BadParameter(f"{others[0]}'s backends are {', '.join(BACKENDS[others[0]])}; got {backend!r}",
                                 param_hint="--backend")  # fmt: skip
    if not gpu:
        raise click.BadParameter("backends are timed on a GPU; the model without one prices no backend",
                                 param_hint="--backend")  # fmt: skip


def _measure(points, hardware, denominator: str, out: Path, controller, warm_l2: bool, samples: int, impls=(),
             backend: str | None = None):  # fmt: skip
    from ...instruments.kit import Instruments
    from ...measuring.stages import SweepOptions
    from ...measuring.shard import launched, local_device
    from .sharded import sharded_sweep
    from .sweep import run_sweep

    device = local_device()
    options = SweepOptions(cold_l2=not warm_l2, samples=samples, out=out, results_dir=RESULTS_DIR, hardware=hardware,
                           denominator=denominator, command=command_line(), impls=impls, device=device,
                           backend=backend)  # fmt: skip
    instruments = Instruments.real(device, RESULTS_DIR, power=controller)
    if denominator == "measured" and not instruments.ceilings(common.card_name()):
        raise click.BadParameter("no measured ceilings stored for this card: run `mxbench ceilings` first",
                                 param_hint="--denominator")  # fmt: skip
    sweep = sharded_sweep if launched() else run_sweep  # under torchrun: None on ranks other than 0
    return sweep(points, options=options, instruments=instruments)
