"""The commands that measure (or, without a GPU, model): roofline, ceilings, regress and peers."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import click

from ...clikit.common import (
    REGRESS_EXIT_CODES_HELP,
    FORMATS,
    BadInput,
    CommaList,
    Seed,
    check_recipes_on,
    command_line,
    comparison_format,
    echo_comparison,
    force_option,
    hardware_spec,
    peer_table,
    project_option,
    refuse_ignored,
    shape_args,
    threshold_options,
)
from ...clikit.impls import checked, impl_option, recorded_impls, refuse_absent, resolve

DEFAULT_MS = "16384,32768,65536,131072"
RESULTS_DIR = Path("results")


def _has_gpu() -> bool:
    """Whether this process has a CUDA GPU. Under torchrun (a sharded run) that is its own, ``cuda:LOCAL_RANK``,
    made the current device here, before anything else touches a GPU (``shard.local_device``)."""
    import torch

    if not torch.cuda.is_available():
        return False
    from ...measuring.shard import local_device

    local_device()
    return True


def _require_gpu(what: str) -> None:
    if not _has_gpu():
        raise BadInput(f"no CUDA GPU found: {what}")


def _card_dir(device: int = 0) -> str:
    """``results/<card>/``: the running card's name made path-safe, the folder its ceilings are stored in."""
    from ...instruments.hardware import card_slug

    return card_slug(_card_name(device))


def _detected_spec(device: int = 0) -> str | None:
    """Key of the running card's hardware spec, None for a card without one."""
    from ...instruments.hardware import detect

    spec = detect(device)
    return None if spec is None else spec.key


def _card_name(device: int = 0) -> str:
    from ...instruments.hardware import device_properties

    return str(device_properties(device).get("name", "unknown"))


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def _echo_tables(run, breakdown_M: int | None, denominator: str | None, fmt: str = "plain") -> None:
    from .tables import table

    click.echo(table(run, "breakdown", fmt, M=breakdown_M, denominator=denominator))
    click.echo("Net speedup over bf16 by M")
    click.echo(table(run, "speedup", fmt, header=False))


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

    Exit codes: 0 done, 1 an --impl failed its check, 2 bad input (nothing ran), 130 interrupted by Ctrl-C (the
    points measured so far are saved, and the file says the run is partial).
    """
    from ...plan.points import plan_points

    K, N, G, label = shape_args(K, N, G, preset)
    if any(M <= 0 for M in Ms):
        raise click.BadParameter(f"every M must be positive, got {Ms}", param_hint="--M")
    if breakdown_M is not None and breakdown_M not in Ms:
        raise click.BadParameter(f"{breakdown_M} is not one of the swept M {Ms}", param_hint="--breakdown-M")
    gpu = _has_gpu()
    if project is not None and not gpu:
        raise click.BadParameter("a projection carries measured efficiencies over, and without a GPU nothing is "
                                 "measured: the model over --hardware prices that card directly", param_hint="--project")  # fmt: skip
    hardware = hardware or (_detected_spec() if gpu else "b200")
    spec = hardware_spec(hardware) if hardware else None
    check_recipes_on(spec, recipes)
    if not gpu and denominator == "measured":
        raise click.BadParameter("measured ceilings need a GPU; use datasheet", param_hint="--denominator")
    if backend is not None:
        _check_backend(backend, recipes, gpu)
    if not gpu:
        refuse_ignored(("samples", "warm_l2"), "without a GPU the analytic model is shown, which is not timed")
    out = out or RESULTS_DIR / (_card_dir() if gpu else f"model-{spec.key}") / f"roofline-{label}-{_stamp()}.json"
    _check_outputs(out, plot_file)
    limits, controller = _power_limits(power_percent, power_watts, gpu)
    points = plan_points(Ms, N, K, G, recipes, mode, groups, seed, limits, fuse_scales)
    check_replace(out, gpu, _card_name() if gpu else spec.name, points, force)
    impls = _impls(impl_texts, recipes, points)
    impls = checked(impls, K, N, G, mode)
    if gpu:
        run = _measure(points, hardware, denominator, out, controller, warm_l2, samples, impls, backend)
        if run is None:  # another rank of a sharded sweep: rank 0 writes and prints (mxbench.shard)
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
        from .plots import plot_all

        for path in plot_all(run, plot_file, spec=spec, project=project):
            click.echo(f"figure: {path}")
    _exit_if_partial(run)


def _exit_if_partial(run) -> None:
    """Exit 130 after Ctrl-C, 1 when a rank of a sharded run failed: the partial results were saved."""
    if run.meta.get("interrupted"):
        click.echo("interrupted: the partial results above were saved", err=True)
        sys.exit(130)
    if run.meta.get("partial"):
        click.echo(f"partial results saved: {run.meta['partial']}", err=True)
        sys.exit(1)


def check_replace(out: Path, measured: bool, card: str, points, force: bool | None, option: str = "--out") -> None:
    """Before any work: may this run (measured or the model, on ``card``, of ``points``' shapes; ``points`` None:
    not known yet) replace what ``out`` holds? (``replacing.check_replace``)"""
    from ...storage.replacing import RunIdentity
    from ...storage.replacing import check_replace as check

    shapes = None if points is None else frozenset((p.N, p.K, p.G) for p in points)
    check(out, option, RunIdentity(measured, card, shapes), force)


def _check_outputs(out: Path, plot_file: Path | None) -> None:
    """Where results and figures go, checked before anything is measured (bad input, exit 2)."""
    from ...storage.outputs import check_figure_target, check_results_file

    check_results_file(out, "--out")
    if plot_file is not None:
        from .plots import IMAGE_SUFFIXES

        check_figure_target(plot_file, "--plot-file", IMAGE_SUFFIXES)


def _model(points, spec, hardware: str, power_requested):
    from .sweep import model_run

    click.echo(f"no CUDA GPU found: showing the analytic model over the {hardware} spec (model, not measured)")
    if power_requested:
        click.echo("power limits need a GPU: ignored")
    return model_run(points, spec=spec, hardware=hardware, command=command_line())


def _impls(texts: Sequence[str], recipes: Sequence[str], points) -> list:
    """The ``--impl`` implementations of a run of ``points``, each for a stage the run has."""
    impls = resolve(texts, recipes)
    refuse_absent(impls, points)
    return impls


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
    from ...measuring.shard import launched, local_device, sharded_sweep
    from .sweep import run_sweep

    device = local_device()
    options = SweepOptions(cold_l2=not warm_l2, samples=samples, out=out, results_dir=RESULTS_DIR, hardware=hardware,
                           denominator=denominator, command=command_line(), impls=impls, device=device,
                           backend=backend)  # fmt: skip
    instruments = Instruments.real(device, RESULTS_DIR, power=controller)
    if denominator == "measured" and not instruments.ceilings(_card_name()):
        raise click.BadParameter("no measured ceilings stored for this card: run `mxbench ceilings` first",
                                 param_hint="--denominator")  # fmt: skip
    sweep = sharded_sweep if launched() else run_sweep  # under torchrun: None on ranks other than 0
    return sweep(points, options=options, instruments=instruments)


# ------------------------------------------------------------------------------------------------ ceilings


@click.command()
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=RESULTS_DIR, show_default=True)
def ceilings(out_dir: Path) -> None:
    """Measure this card's achievable bandwidth and GEMM throughput at its current power limit, and store them.

    Each GEMM ceiling is the best of the square matmul and the training step's own grouped GEMMs (DeepSeek-V3, Llama 4
    Scout; the roofline's token counts; balanced and skewed groups), with the shape that gave it. Under torchrun with
    several processes: the all-to-all ceiling of these GPUs instead (``ep.ceiling``)."""
    from ...storage.outputs import check_folder

    check_folder(out_dir, "--out-dir")
    _require_gpu("ceilings are measured on a GPU")
    from ...measuring.dist import under_torchrun

    if under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        from ..ep.ceiling import run_alltoall_ceiling

        click.get_current_context().exit(run_alltoall_ceiling(out_dir, echo=click.echo))
    from dataclasses import asdict

    from ...instruments.ceilings import measure_ceilings, save_ceilings

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
    from ...gate.compare import Thresholds
    from ...storage.outputs import check_results_file
    from ...storage.results import load_run, save_run

    bands = Thresholds.parse(thresholds, floor_us)

    base = load_run(baseline)  # a broken baseline is bad input, GPU or not
    if out is not None:
        check_results_file(out, "--out")
    points = list(dict.fromkeys(r.point for r in base.records))
    recipes = list(dict.fromkeys(p.recipe for p in points))
    layer = base.meta.get("kind") == "layer"  # a `mxbench layer` run: its layer re-measured (mxkernels' stages)
    if layer and impl_texts:
        raise click.BadParameter("a layer baseline is re-measured with mxkernels' stages; `mxbench layer --impl` "
                                 "times another implementation", param_hint="--impl")  # fmt: skip
    impls = [] if layer else recorded_impls(base, _impls(impl_texts, recipes, points))
    _require_gpu("regress re-measures the baseline on a GPU")
    if out is not None:
        check_replace(out, True, _card_name(), points, None)  # no --force: compare's --force means other cards
    if impls:
        first = next(p for p in points if p.recipe == impls[0].recipe)
        impls = checked(impls, first.K, first.N, first.G, first.mode)
    from ...gate.report import check_usable
    from ...instruments.kit import Instruments
    from ...measuring.stages import SweepOptions
    from ...gate.regress import regress as run_regress
    from ...measuring.shard import launched, local_device, sharded_regress
    from .sweep import run_sweep

    timing = base.meta.get("timing") or {}
    device = local_device()
    options = SweepOptions(cold_l2=timing.get("cold_l2", True), use_graph=timing.get("use_graph", True),
                           samples=timing.get("samples", 25), hardware=base.meta.get("hardware"),
                           backend=base.meta.get("backend"), command=command_line(), device=device,
                           impls=tuple(impls))  # fmt: skip
    instruments = Instruments.real(device, RESULTS_DIR)

    def measure(points):
        if layer:
            from ..layer.measure import run_layer, shape_of

            run = run_layer(shape_of(base.meta), points, options, instruments, label=base.meta["layer"].get("label", ""))
        else:
            run = run_sweep(points, options=options, instruments=instruments)
        if run.meta.get("interrupted"):  # the sweep kept its points; a verdict on part of a round would mislead
            raise KeyboardInterrupt
        return run

    try:
        if launched() and not layer:  # every round's points split over the ranks; rank 0 reports
            result = sharded_regress(base, options=options, instruments=instruments, rounds=rounds, thresholds=bands)
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


# --------------------------------------------------------------------------------------------------- peers


@click.command()
@click.option("--K", "K", type=int, help="Model dim; multiple of 32.")
@click.option("--N", "N", type=int, help="Expert hidden dim; multiple of 32.")
@click.option("--preset", help="Shapes of a model instead of --K/--N.")
@click.option("--G", "G", type=click.IntRange(1, 512), help="Local experts. [default: 8 or the preset's]")
@click.option("--M", "M", type=click.IntRange(min=1), default=131072, show_default=True, help="Tokens.")
@click.option("--mode", type=click.Choice(["rceil", "floor"]), default="rceil", show_default=True)
@click.option("--groups", type=click.Choice(["balanced", "skewed"]), default="balanced", show_default=True)
@click.option("--seed", type=Seed(), default=0, show_default=True)
@click.option("--samples", type=click.IntRange(min=1), default=25, show_default=True)
@click.option("--warm-l2", is_flag=True, help="Time with a warm L2 (default: cold).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results file. [default: results/<card>/peers-<preset or KxN>-<date>.json]",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
@impl_option
@force_option
def peers(K, N, preset, G, M, mode, groups, seed, samples, warm_l2, out, fmt, impl_texts, force) -> None:
    """Our quantize / rearrange / pad kernels beside torchao's Triton kernels and torch.compile of the references
    (with --impl: beside the implementations named instead)."""
    from ...storage.outputs import check_results_file
    from ...plan.points import plan_points

    K, N, G, label = shape_args(K, N, G, preset)
    if out is not None:
        check_results_file(out, "--out")
    impls = _impls(impl_texts, ["mxfp8"], plan_points([M], N, K, G, ["mxfp8"], mode, groups, seed, [None], False))
    _require_gpu("peers are timed on a GPU")
    impls = checked(impls, K, N, G, mode)
    from ...measuring.stages import SweepOptions
    from ..peers.measure import run_peers
    from ...measuring.shard import launched, local_device, sharded_peers

    out = out or RESULTS_DIR / _card_dir() / f"peers-{label}-M{M}-{_stamp()}.json"
    check_results_file(out, "--out")  # the default path: the working folder may not take it
    check_replace(out, True, _card_name(), plan_points([M], N, K, G, ["mxfp8"], mode, groups, seed, [None], False),
                  force)  # fmt: skip
    options = SweepOptions(cold_l2=not warm_l2, samples=samples, out=out, results_dir=RESULTS_DIR,
                           hardware=_detected_spec(), command=command_line(), device=local_device())  # fmt: skip
    measure = sharded_peers if launched() else run_peers  # under torchrun: None on ranks other than 0
    run = measure(M, N, K, G, mode=mode, groups=groups, seed=seed, options=options, registry=_peer_registry(impls))
    if run is None:
        return
    click.echo(peer_table(run, fmt), nl=False)
    click.echo(f"results: {out}")
    _exit_if_partial(run)


def _peer_registry(impls: Sequence):
    """The implementations ``peers`` times: every registered one, or with --impl mxkernels' and those named."""
    from ...implementations.default import default_registry
    from ...implementations.registry import OURS, Registry

    if not impls:
        return None
    chosen = Registry()
    for impl in [i for i in default_registry() if i.name == OURS] + list(impls):
        chosen.add(impl, replace=True)
    return chosen
