"""``mxbench map``: each recipe's forward + backward speedup over bf16 at every cell of a grid of experts on the GPU
(G) x tokens, at the MoE layer (default) or the expert projection; measured on a GPU, the analytic model without.

Exit codes: 0 done, 2 bad input (nothing ran, no file written), 130 interrupted by Ctrl-C (the cells measured so far
are saved, the file says the run is partial, and the table and figures show them).
"""

from __future__ import annotations

from pathlib import Path

import click

from ...clikit import common
from ...clikit.common import RESULTS_DIR, CommaList, Seed, check_recipes_on, command_line, force_option, hardware_spec
from ...instruments.cards import DEFAULT_CARD
from .axes import Scope, TokenAxis

PLOTS_DIR = Path("plots")
"""Where the heatmaps go unless --plot-dir says otherwise: plots/<card>/ (plots/model-<spec>/ for the model)."""
DEFAULT_EXPERTS = "8,32,128"
DEFAULT_TOKENS_PER_EXPERT = "256,512,1024,2048"


def _model(preset, K, N, scope: Scope, top_k, shared, score_func):
    """(K, N, the layer but for its size (a ``grid.LayerModel``), label) from --preset or --K/--N, with any option
    given on top."""
    from ...plan.presets import get_preset
    from .grid import LayerModel

    if preset is not None:
        if K is not None or N is not None:
            raise click.UsageError("give either --preset or --K/--N, not both")
        p = get_preset(preset)
        K, N, label, layer = p.K, p.N, preset, p.layer
        if layer is None and scope is Scope.LAYER and top_k is None:
            raise click.BadParameter(f"preset {preset} has no [layer] section; give --top-k (and --shared-experts, "
                                     "--score-func) or --scope projection", param_hint="--preset")  # fmt: skip
        top_k = top_k or (layer.top_k if layer else p.top_k)
        shared = shared if shared is not None else (layer.shared_experts if layer else 0)
        score_func = score_func or (layer.score_func if layer else None)
    elif K is None or N is None:
        raise click.UsageError("give --K and --N (or --preset NAME; `mxbench presets` lists them)")
    else:
        label = f"{K}x{N}"
    return K, N, LayerModel(top_k or 1, shared or 0, score_func or "sigmoid"), label


def _check_backend(backend: str | None, recipes, gpu: bool) -> None:
    """``--backend`` names a GEMM backend that every recipe besides bf16 has (before any work)."""
    if backend is None:
        return
    from mxkernels.gemm.grouped_gemm import BACKENDS

    for recipe in recipes:
        if recipe != "bf16" and backend not in BACKENDS[recipe]:
            raise click.BadParameter(f"{recipe}'s backends are {', '.join(BACKENDS[recipe])}; got {backend!r}",
                                     param_hint="--backend")  # fmt: skip
    if not gpu:
        raise click.BadParameter("backends are timed on a GPU; the model without one prices no backend",
                                 param_hint="--backend")  # fmt: skip


@click.command("map")
@click.option("--preset", help="A model's K and N (and its layer's top-k, shared experts, score function).")
@click.option("--K", "K", type=int, help="Model dim (the tokens' width); a multiple of 32.")
@click.option("--N", "N", type=int, help="Expert hidden dim; a multiple of 32.")
@click.option("--scope", type=click.Choice([s.value for s in Scope]), default=Scope.LAYER.value, show_default=True,
              help="The whole MoE layer (`mxbench layer`'s measurement) or the expert projection alone (the step's).")
@click.option("--experts", type=CommaList(int), default=DEFAULT_EXPERTS, show_default=True,
              help="Experts on the GPU (G), one row of the map each.")
@click.option("--tokens-per-expert", "per_expert", type=CommaList(int),
              help=f"Rows each expert gets, one column each. [default: {DEFAULT_TOKENS_PER_EXPERT}]")
@click.option("--tokens", "total", type=CommaList(int), help="Total tokens instead (the layer's T; the projection's "
              "M), one column each.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), help="Experts per token at the layer. "
              "[default: the preset's, else 1]")
@click.option("--shared-experts", "shared", type=click.IntRange(0, 16), help="Shared experts at the layer. "
              "[default: the preset's, else 0]")
@click.option("--score-func", type=click.Choice(["sigmoid", "softmax"]), help="Router scores. [default: preset's]")
@click.option("--recipe", "recipes", type=CommaList(str), default="mxfp8,fp8_rowwise", show_default=True,
              help="Recipes, each beside bf16 (always measured: the baseline).")
@click.option("--backend", help="GEMM backend of every recipe besides bf16, e.g. native (torch's "
              "_scaled_grouped_mm) to map torch's GEMM against ours. [default: the device's best]")
@click.option("--wgrad", type=click.Choice(["recipe", "bf16"]), default="recipe", show_default=True,
              help="The layer's weight-gradient GEMMs: in each recipe, or bf16 torch._grouped_mm (`mxbench layer "
              "--wgrad`); the forward and dgrad stay in the recipe.")
@click.option("--mode", type=click.Choice(["rceil", "floor"]), default="rceil", show_default=True, help="MX scales.")
@click.option("--seed", type=Seed(), default=0, show_default=True, help="Inputs.")
@click.option("--samples", type=click.IntRange(min=1), default=10, show_default=True, help="Samples per stage.")
@click.option("--hardware", help=f"Spec of the analytic model without a GPU. [default: {DEFAULT_CARD}]")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Results JSON. [default: results/<card>/map-<preset or KxN>-<scope>[-<backend>][-bf16-wgrad]-<date>.json]")
@click.option("--plot-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder of the heatmaps, one per recipe, named after the results file. [default: plots/<card>/]")
@force_option
def map_cmd(preset, K, N, scope, experts, per_expert, total, top_k, shared, score_func, recipes, backend, wgrad, mode,
            seed, samples, hardware, out, plot_dir, force) -> None:  # fmt: skip
    """Each recipe's forward + backward speedup over bf16 at every cell of G experts x tokens (at most 64 cells),
    with a heatmap per recipe (the 1.0x line drawn) and its table; without a GPU, the analytic model (labelled so).

    Exit codes: 0 done, 2 bad input (nothing ran), 130 interrupted by Ctrl-C (the cells measured so far are saved
    and drawn, the file says the run is partial)."""
    from mxkernels.stages.pipeline import check_recipe

    from ...storage.outputs import check_folder
    from .grid import Grid, check_grid

    scope = Scope(scope)
    if per_expert is not None and total is not None:
        raise click.UsageError("give either --tokens-per-expert or --tokens, not both")
    axis = TokenAxis.TOTAL if total is not None else TokenAxis.PER_EXPERT
    default = [int(v) for v in DEFAULT_TOKENS_PER_EXPERT.split(",")]
    values = total if total is not None else (per_expert if per_expert is not None else default)
    if scope is Scope.PROJECTION:
        common.refuse_ignored(("top_k", "shared", "score_func"), "the projection has no router or shared experts")
    K, N, model, label = _model(preset, K, N, scope, top_k, shared, score_func)
    grid = Grid(K, N, tuple(experts), tuple(values), scope, axis, model, label, wgrad)
    check_grid(grid)
    recipes = [check_recipe(r).value for r in dict.fromkeys(recipes) if r != "bf16"]
    if not recipes:
        raise click.BadParameter("give one or more recipes besides bf16 (the baseline every speedup is over)",
                                 param_hint="--recipe")  # fmt: skip
    gpu = common.has_gpu()
    _check_backend(backend, recipes, gpu)
    hardware = common.spec_key(hardware, gpu)
    spec = hardware_spec(hardware) if hardware else None
    check_recipes_on(spec, recipes)
    if not gpu:
        common.refuse_ignored(("samples",), "without a GPU the analytic model is shown, which is not timed")
    folder = common.card_dir() if gpu else f"model-{spec.key}"
    stem = f"map-{label}-{scope.value}" + (f"-{backend}" if backend else "") + ("" if wgrad == "recipe" else
                                                                                   f"-{wgrad}-wgrad")  # fmt: skip
    out = out or RESULTS_DIR / folder / f"{stem}-{common.stamp()}.json"
    plot_dir = plot_dir or PLOTS_DIR / folder
    common.check_outputs(out, None)
    check_folder(plot_dir, "--plot-dir")
    points = grid.all_points(recipes, mode=mode, seed=seed)
    common.check_replace(out, gpu, common.card_name() if gpu else spec.name, points, force)
    _plan_every_cell(grid, points)
    if gpu:
        from ...instruments.kit import Instruments
        from ...measuring.stages import SweepOptions
        from .measure import run_map

        options = SweepOptions(samples=samples, out=out, results_dir=RESULTS_DIR, hardware=hardware, backend=backend,
                               command=command_line())  # fmt: skip
        run = run_map(grid, points, recipes, options, Instruments.real(0, RESULTS_DIR))
    else:
        from ...storage.results import save_run
        from .measure import model_map_run

        click.echo(f"no CUDA GPU found: showing the analytic model over the {hardware} spec (model, not measured)")
        run = model_map_run(grid, recipes, spec=spec, hardware=hardware, command=command_line(), mode=mode, seed=seed)
        save_run(run, out)
    from .figure import plot_map
    from .tables import map_table

    click.echo(map_table(run, "plain", header=False))
    click.echo(f"results: {out}" + ("" if gpu else " (model, not measured)"))
    for path in plot_map(run, plot_dir / f"{out.stem}.png"):
        click.echo(f"figure: {path}")
    common.exit_if_partial(run)


def _plan_every_cell(grid, points) -> None:
    """Every point planned before any work: a cell a recipe cannot run is bad input (exit 2), not an error row an
    hour into the sweep."""
    from mxkernels.stages.layer import layer_stages
    from mxkernels.stages.pipeline import plan_step

    from ...plan.points import point_group_sizes

    for p in points:
        backend = None if p.recipe == "bf16" else "native"
        if grid.scope is Scope.LAYER:
            layer_stages(p.recipe, grid.layer_shape(grid.cell_of(p)), mode=p.mode, backend=backend, wgrad=p.wgrad)
        else:
            plan_step(p.recipe, p.M, p.N, p.K, p.G, point_group_sizes(p), mode=p.mode, backend=backend)
