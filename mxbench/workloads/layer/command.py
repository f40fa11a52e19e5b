"""``mxbench layer``: time (or, without a GPU, model) the whole MoE layer forward + backward, per stage and as one
graph, for each recipe beside bf16, with each recipe's accuracy.

Exit codes: 0 done, 2 bad input (nothing ran), 130 interrupted by Ctrl-C (the points measured so far are saved and
the file says the run is partial).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ...clikit import common
from ...clikit.common import (
    RESULTS_DIR,
    CommaList,
    check_recipes_on,
    command_line,
    force_option,
    hardware_spec,
    refuse_ignored,
)
from ...instruments.cards import DEFAULT_CARD

DENOMINATORS = ("datasheet", "measured")
"""``roofline.DENOMINATORS``, written out: importing roofline here would import mxkernels with the CLI, before
``check`` and ``impls`` can choose Triton's interpreter for a CPU (``registry_commands._interpreter_on_cpu``)."""

DEFAULT_TOKENS, DEFAULT_EXPERTS = 131072, 8


def _shape(K, N, preset, tokens, experts, top_k, shared, score_func, score_after, separate, routing, shared_in_recipe):
    """(LayerShape, label): the preset's layer (``shapes/*.toml`` [layer]) with any option given on top."""
    from mxkernels.stages.layer import LayerShape

    from ...plan.presets import get_preset

    if preset is not None:
        if K is not None or N is not None:
            raise click.UsageError("give either --preset or --K/--N, not both")
        p = get_preset(preset)
        if p.layer is None:
            raise click.BadParameter(f"preset {preset} has no [layer] section; give --tokens, --experts, --top-k",
                                     param_hint="--preset")  # fmt: skip
        K, N, label, layer = p.K, p.N, preset, p.layer
        tokens = layer.tokens if tokens is None else tokens
        experts = layer.experts if experts is None else experts
        top_k = layer.top_k if top_k is None else top_k
        shared = layer.shared_experts if shared is None else shared
        score_func = score_func or layer.score_func
    else:
        if K is None or N is None:
            raise click.UsageError("give --K and --N (or --preset NAME; `mxbench presets` lists them)")
        label = f"{K}x{N}"
    if shared_in_recipe and not shared:
        raise click.BadParameter("the layer has no shared experts (--shared-experts 0)", param_hint="--shared-in-recipe")
    shape = LayerShape(tokens or DEFAULT_TOKENS, K, N, experts or DEFAULT_EXPERTS, top_k or 1, shared or 0,
                       score_func or "sigmoid", not score_after, routing, not separate, shared_in_recipe)  # fmt: skip
    return shape, label


@click.command("layer")
@click.option("--preset", help="A model's layer (see `mxbench presets`): its K, N, experts, top-k, shared experts.")
@click.option("--K", "K", type=click.IntRange(min=1), help="Model dim (the tokens' width); multiple of 32.")
@click.option("--N", "N", type=click.IntRange(min=1), help="Expert hidden dim; multiple of 32.")
@click.option("--tokens", type=click.IntRange(1, 2**24), help=f"Tokens. [default: the preset's, else {DEFAULT_TOKENS}]")
@click.option("--experts", type=click.IntRange(1, 512), help=f"Experts on this GPU. [default: preset's, else {DEFAULT_EXPERTS}]")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), help="Experts per token. [default: preset's, else 1]")
@click.option("--shared-experts", "shared", type=click.IntRange(0, 16), help="Shared experts (a dense SwiGLU FFN of "
              "hidden N x this). [default: preset's, else 0]")
@click.option("--shared-in-recipe", is_flag=True, help="Run the shared experts' GEMMs in the recipe too (one-group "
              "grouped GEMMs); default: dense bf16, as torchao's layer benchmark converts the routed experts only.")
@click.option("--score-func", type=click.Choice(["sigmoid", "softmax"]), help="Router scores. [default: preset's]")
@click.option("--score-after", is_flag=True, help="Weight the experts' outputs by the scores (default: the tokens "
              "before the experts, torchtitan's default).")
@click.option("--separate-gate-up", "separate", is_flag=True, help="Gate and up projections as two grouped GEMMs "
              "(default: one (E, 2N, K) GEMM).")
@click.option("--recipe", "recipes", type=CommaList(str), default="mxfp8,fp8_rowwise", show_default=True,
              help="Recipes of the grouped GEMMs, each beside bf16 (always measured: the baseline).")
@click.option("--routing", type=click.Choice(["balanced", "skewed", "router"]), default="balanced", show_default=True,
              help="Forced balanced assignment (torchao's benchmark), a seeded skewed one, or the router's own top-k.")
@click.option("--fuse", is_flag=True, help="Also measure each recipe with the fused stages (permute + quantize, "
              "SwiGLU + quantize and their backward), side by side with the chains.")
@click.option("--wgrad", type=click.Choice(["recipe", "bf16"]), default="recipe", show_default=True,
              help="Weight-gradient GEMMs: in the recipe (operands quantized along the tokens), or bf16 "
              "(torch._grouped_mm on the bf16 activations and output gradient; forward and dgrad stay in the recipe).")
@click.option("--mode", type=click.Choice(["rceil", "floor"]), default="rceil", show_default=True, help="MX scales.")
@click.option("--backend", help="MXFP8 GEMM backend. [default: the device's best]")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True, help="Inputs and routing.")
@click.option("--samples", type=click.IntRange(min=1), default=25, show_default=True, help="Samples per stage.")
@click.option("--microbatches", type=click.IntRange(min=1, max=4096), default=1, show_default=True,
              help="Gradient-accumulation microbatches per optimizer step: also report the step with the "
              "weight-only stages (the weights' quantizers) counted once per this many.")
@click.option("--hardware", help=f"Spec of the analytic model without a GPU. [default: {DEFAULT_CARD}]")
@click.option("--denominator", type=click.Choice(DENOMINATORS), default="datasheet", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Results JSON. [default: results/<card>/layer-<shape>-<date>.json]")
@click.option("--plot-file", type=click.Path(path_type=Path), help="Also draw the figure (.png).")
@click.option("--project", type=click.Choice([DEFAULT_CARD]),
              help=f"Also print the {DEFAULT_CARD.upper()} projection of the measured run.")
@click.option("--impl", "impl_texts", multiple=True, metavar="STAGE=module:function",
              help="Time another implementation of a layer stage (`mxbench check --layer` passes it first).")
@force_option
def layer(preset, K, N, tokens, experts, top_k, shared, shared_in_recipe, score_func, score_after, separate, recipes,
          routing, fuse, wgrad, mode, backend, seed, samples, microbatches, hardware, denominator, out, plot_file, project,
          impl_texts, force) -> None:  # fmt: skip
    """Time the MoE layer forward + backward per stage and as one graph, with each recipe's accuracy (SQNR against
    an fp32 run); without a GPU, print and save the analytic model."""
    from mxkernels.stages.layer import check_fuse
    from mxkernels.stages.layer_specs import FUSED_RECIPES
    from mxkernels.stages.pipeline import check_recipe

    shape, label = _shape(K, N, preset, tokens, experts, top_k, shared, score_func, score_after, separate, routing,
                          shared_in_recipe)
    from ...plan.points import check_fits

    check_fits(2 * (shape.T * shape.K + 3 * shape.E * shape.N * shape.K + shape.T * shape.top_k * (shape.K + shape.N)),
               "the layer's bf16 tokens, weights and routed rows")  # fmt: skip
    recipes = [check_recipe(r).value for r in dict.fromkeys(recipes)]
    if fuse and not any(r in FUSED_RECIPES for r in recipes):
        check_fuse(recipes[0], True)
    if wgrad != "recipe" and all(r == "bf16" for r in recipes):
        raise click.BadParameter("bf16's weight gradient is bf16 already: give a quantized --recipe",
                                 param_hint="--wgrad")  # fmt: skip
    if fuse and separate:
        raise click.BadParameter("the fused SwiGLU stages write the fused gate/up layout: drop --separate-gate-up",
                                 param_hint="--fuse")  # fmt: skip
    gpu = common.has_gpu()
    if project is not None and not gpu:
        raise click.BadParameter("a projection carries measured efficiencies over; without a GPU the model over "
                                 "--hardware prices that card directly", param_hint="--project")  # fmt: skip
    if not gpu and denominator == "measured":
        raise click.BadParameter("measured ceilings need a GPU; use datasheet", param_hint="--denominator")
    hardware = common.spec_key(hardware, gpu)
    spec = hardware_spec(hardware) if hardware else None
    check_recipes_on(spec, recipes)
    if not gpu:
        refuse_ignored(("samples", "backend"), "without a GPU the analytic model is shown, which is not timed")
    folder = common.card_dir() if gpu else f"model-{spec.key}"
    out = out or RESULTS_DIR / folder / f"layer-{label}-{common.stamp()}.json"
    common.check_outputs(out, plot_file, force)
    from .measure import layer_points, point_stages

    points = layer_points(shape, recipes, mode=mode, seed=seed, fuse=fuse, wgrad=wgrad)
    common.check_replace(out, gpu, common.card_name() if gpu else spec.name, points, force)
    impls = _checked_impls(impl_texts, recipes, shape)
    for p in points:  # every point planned before any work: a shape a recipe cannot run is bad input (exit 2)
        point_stages(p, shape, backend=None if p.recipe == "bf16" else "native")
    if gpu:
        from ...instruments.kit import Instruments
        from ...measuring.stages import SweepOptions
        from .measure import run_layer

        options = SweepOptions(samples=samples, out=out, results_dir=RESULTS_DIR, hardware=hardware, backend=backend,
                               denominator=denominator, command=command_line(), impls=impls)  # fmt: skip
        run = run_layer(shape, points, options, Instruments.real(0, RESULTS_DIR), label=label,
                        microbatches=microbatches)
    else:
        from ...storage.results import save_run
        from .measure import model_layer_run

        click.echo(f"no CUDA GPU found: showing the analytic model over the {hardware} spec (model, not measured)")
        run = model_layer_run(shape, points, spec=spec, hardware=hardware, command=command_line(), label=label,
                              microbatches=microbatches)
        save_run(run, out)
    from .tables import layer_table

    click.echo(layer_table(run, "plain", denominator=denominator if hardware else None))
    if project is not None:
        click.echo(layer_table(run, "plain", project=project, header=False))
    click.echo(f"results: {out}" + ("" if gpu else " (model, not measured)"))
    if plot_file is not None:
        from .figure import plot_layer

        for path in plot_layer(run, plot_file if plot_file.suffix else plot_file / f"layer-{label}.png"):
            click.echo(f"figure: {path}")
    common.exit_if_partial(run)


def _checked_impls(texts, recipes, shape) -> tuple:
    """The ``--impl`` implementations of layer stages, each checked against its oracle first (``check --layer`` at
    a small layer of this K, N and experts); a failing one exits 1 with its finding."""
    if not texts:
        return ()
    from ...implementations.check import Verdict, merged
    from .check import check_layer, layer_impls, parse_layer_impl

    impls = tuple(parse_layer_impl(text) for text in texts)
    for recipe in recipes:
        results = check_layer(recipe, shape.K, min(shape.N, 256), min(shape.E, 8), 32, layer_impls(impls, recipe),
                              device=common.torch_device())  # fmt: skip
        for r in merged(results):
            if r.verdict not in (Verdict.PASS, Verdict.SKIP):
                click.echo(f"--impl {r.stage}={r.impl}: {r.verdict} against the oracle: {r.finding()}", err=True)
                sys.exit(1)
    return impls
