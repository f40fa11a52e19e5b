"""``mxbench ep``: the expert-parallel pipeline, checked (``--check``) or measured, on every process of a run.

Launch: ``torchrun --nproc-per-node N -m mxbench ep ...`` (any torchrun rendezvous, several nodes included), or
``mxbench ep --nproc N ...`` on one host, which starts the same workers through torch.distributed.run (``launch``)
and passes the rendezvous options given after it (``--master-port``, ``--rdzv-endpoint`` ...). Without either, one
process: EP degree 1. Without a GPU the workers use gloo and run the Triton kernels under the interpreter, so
``mxbench ep --nproc 2 --check --K 64 --N 64 --experts 2 --tokens 64`` works on any laptop.

Exit codes: 0 every check passed (or the run was measured), 1 a check failed or an implementation raised (one line
naming the rank, the stage and the error), 2 bad input (found before any worker starts where the launcher can tell:
a stale or garbled torchrun environment, more workers than GPUs, or than CPU cores on gloo), 130 Ctrl-C (every
worker stopped).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from ...clikit import common
from ...clikit.common import RESULTS_DIR, CommaList, Seed, command_words, force_option, refuse_ignored

DEFAULT_STRATEGIES = "bf16,mxfp8,mxfp8_a2a"
"""The default list (the FP8 rowwise strategies, ``ep.strategy``, are asked for by name: they need an FP8 card)."""


def _launcher_args(extra: list[str]) -> list[str]:
    """torchrun's rendezvous options among the words click did not know; anything else is a usage error."""
    from .launch import is_launcher_option

    expecting_value = False
    for word in extra:
        if word.startswith("-"):
            if not is_launcher_option(word):
                raise click.UsageError(f"no such option: {word} (only torchrun's rendezvous options pass through)")
            expecting_value = "=" not in word and word not in ("--standalone",)
        elif not expecting_value:
            raise click.UsageError(f"unexpected argument {word!r}")
        else:
            expecting_value = False
    return extra


def _layer(K, N, preset, whole: bool, top_k, score_func, shared) -> tuple[int, int, str, int, str, int]:
    """(K, N, label, top-k, score function, shared experts): a preset's (with its ``[layer]`` section's top-k, score
    function and shared experts under ``--layer``) or the options given; an option given wins over the preset's."""
    from ...plan.presets import get_preset

    if preset is not None:
        if K is not None or N is not None:
            raise click.UsageError("give either --preset or --K/--N, not both")
        p = get_preset(preset)
        if whole and p.layer is not None:
            shared = p.layer.shared_experts if shared is None else shared
            return p.K, p.N, preset, top_k or p.layer.top_k, score_func or p.layer.score_func, shared
        return p.K, p.N, preset, top_k or 1, score_func or "sigmoid", shared or 0
    if K is None or N is None:
        raise click.UsageError("give --K and --N (or --preset NAME; `mxbench presets` lists them)")
    return K, N, f"{K}x{N}", top_k or 1, score_func or "sigmoid", shared or 0


def _layer_options(whole: bool, score_func, score_after: bool, resolved_score_func: str, shared: int,
                   shared_in_recipe: bool, overlap: bool):  # fmt: skip
    """The router's and the shared experts' options of a --layer run; the options only the layer reads are
    refused without it, ``--overlap`` and ``--shared-in-recipe`` without shared experts."""
    from .workload import LayerOptions

    if not whole:
        for given, name in ((score_func, "--score-func"), (score_after, "--score-after"), (shared, "--shared-experts"),
                            (shared_in_recipe, "--shared-in-recipe"), (overlap, "--overlap")):  # fmt: skip
            if given:
                raise click.BadParameter("the expert projection has no router nor shared experts: give --layer",
                                         param_hint=name)  # fmt: skip
        return None
    for given, name in ((overlap, "--overlap"), (shared_in_recipe, "--shared-in-recipe")):
        if given and not shared:
            raise click.BadParameter("there are no shared experts to run (give --shared-experts N, N >= 1)",
                                     param_hint=name)  # fmt: skip
    return LayerOptions(resolved_score_func, not score_after, shared, shared_in_recipe, overlap)


def _check_shared_tokens(strategies, tokens: int, layer) -> None:
    """The shared experts run as one token group of a rank's T tokens: T a multiple of their GEMMs' alignment."""
    from mxkernels.core.names import Recipe
    from mxkernels.core.runtime import InputError
    from mxkernels.ep.strategy import get_strategy
    from mxkernels.stages.step_specs import padding_alignment

    if layer is None or not layer.shared:
        return
    for s in strategies:
        recipe = get_strategy(s).recipe if layer.shared_in_recipe else Recipe.BF16
        if tokens % padding_alignment(recipe):
            raise InputError(f"shared experts run as one group of a rank's tokens in {recipe}: --tokens must be a "
                             f"multiple of {padding_alignment(recipe)}, got {tokens}")  # fmt: skip


def _check_fp8(strategies, has_gpu: bool) -> None:
    """An FP8 rowwise strategy needs FP8 tensor cores: refused on an older card (every rank's card is the launcher's
    kind; over several nodes each worker checks its own)."""
    import torch
    from mxkernels.ep.strategy import check_fp8_capability, get_strategy

    if has_gpu and any(get_strategy(s).needs_fp8 for s in strategies):  # the card is asked only when it matters
        check_fp8_capability(strategies, torch.cuda.get_device_capability())


def _check_bounds(K: int, N: int, experts: int, tokens: int, top_k: int, world: int) -> None:
    """The sizes the kernels index (K, N up to 2**20; a rank's received rows, at most every rank's tokens x top-k,
    below 2**31) and one rank's bf16 tensors within the largest card's memory."""
    from ...plan.points import check_fits, check_shape, check_tokens

    check_shape(N, K, experts)
    check_tokens(tokens * top_k * world, "tokens x top-k x ranks (the rows one rank may receive)")
    check_fits(2 * (tokens * K + experts * N * K + tokens * top_k * (K + N)), "one rank's tensors")


def _check_outputs(out: Path | None, plot_file: Path | None, results_dir: Path, force: bool, has_gpu: bool) -> None:
    """Where a measured run goes, checked before any worker starts (``outputs``, ``replacing``)."""
    from ...storage.outputs import IMAGE_SUFFIXES, check_figure_target, check_folder, check_results_file

    check_folder(results_dir, "--results-dir")
    if out is not None:
        check_results_file(out, "--out")
        common.check_replace(out, True, common.card_name() if has_gpu else "unknown", None, force)
    if plot_file is not None:
        check_figure_target(plot_file, "--plot-file", IMAGE_SUFFIXES, force)


GLOO_MIN_WORKERS = 8
"""gloo workers allowed on any machine: the EP degrees of the GPU runs (up to 8), checked on CPUs in tests and CI."""


def _check_nproc(nproc: int, has_gpu: bool) -> None:
    """One worker per GPU with NCCL; with gloo, one per CPU core this process may use (at least the 8 of the GPU runs'
    degrees): a hundred interpreted workers on two cores exhaust the host's memory."""
    if has_gpu:
        import torch

        most, what = torch.cuda.device_count(), "GPU(s)"
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        most, what = max(GLOO_MIN_WORKERS, cores), f"CPU core(s) ({cores}; at least {GLOO_MIN_WORKERS} on gloo)"
    if nproc > most:
        raise click.BadParameter(f"{nproc} workers, but this host has {most} {what}", param_hint="--nproc")


@click.command("ep", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--K", "K", type=int, help="Model dim (the dispatched tokens' width); multiple of 32.")
@click.option("--N", "N", type=int, help="Expert hidden dim (the combined outputs' width); multiple of 32.")
@click.option("--preset", help="Shapes of a model (see `mxbench presets`) instead of --K/--N.")
@click.option("--experts", type=click.IntRange(1, 512), default=8, show_default=True, help="Local experts per rank.")
@click.option("--tokens", type=click.IntRange(min=1), default=131072, show_default=True, help="Tokens per rank.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1),
              help="Experts per token (each token is sent top-k times). [default: 1, or the preset's layer's]")
@click.option("--layer", "whole", is_flag=True,
              help="The whole MoE layer (router, gate/up, SwiGLU, down, combine) instead of one expert projection; "
              "N is the experts' hidden dim.")
@click.option("--shared-experts", "shared", type=click.IntRange(min=0),
              help="--layer: shared experts (a dense SwiGLU FFN of hidden width N x this on each rank's own tokens). "
              "[default: the preset's layer's, else 0]")
@click.option("--shared-in-recipe", is_flag=True,
              help="--layer: the shared experts' GEMMs in the strategy's recipe (default: bf16).")
@click.option("--overlap", is_flag=True,
              help="--layer: the shared experts on a second CUDA stream beside the all-to-alls; the step is timed "
              "with and without it.")
@click.option("--score-func", type=click.Choice(["sigmoid", "softmax"]),
              help="--layer: the router's score function. [default: the preset's, else sigmoid]")
@click.option("--score-after", is_flag=True, help="--layer: the scores weight the experts' outputs (default: inputs).")
@click.option("--wgrad", type=click.Choice(["recipe", "bf16"]),
              help="Weight-gradient precision: the strategy's recipe (under *_a2a the dequantized rows quantized "
              "again along the tokens) or bf16. [default: bf16 for mxfp8_a2a, recipe for the others]")
@click.option("--groups", type=click.Choice(["balanced", "skewed"]), default="balanced", show_default=True,
              help="Routing: every expert gets the same copies, or a skewed router (seeded).")  # fmt: skip
@click.option("--seed", type=Seed(), default=0, show_default=True, help="Seed of the routing and the inputs.")
@click.option("--strategy", "strategies", type=CommaList(str), default=DEFAULT_STRATEGIES, show_default=True,
              help="Strategies, comma list: bf16, mxfp8 / fp8_rowwise (quantize before the GEMMs), mxfp8_a2a / "
              "fp8_rowwise_a2a (quantize before the dispatch; FP8 rows and scales travel).")
@click.option("--mode", type=click.Choice(["rceil", "floor"]), default="rceil", show_default=True, help="MX scales.")
@click.option("--backend", help="MXFP8 GEMM backend. [default: the device's best]")
@click.option("--samples", type=click.IntRange(min=1), default=25, show_default=True, help="Samples per stage.")
@click.option("--timing", type=click.Choice(["graph", "events"]), default="graph", show_default=True,
              help="CUDA-graph replays (events where a collective cannot be captured), or events throughout.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Results JSON. [default: results/<card>/ep-<shape>-<groups>-ep<N>-<date>.json]")
@click.option("--plot-file", type=click.Path(dir_okay=False, path_type=Path), help="Also draw the figure.")
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), default=RESULTS_DIR,
              show_default=True, help="Where stored ceilings are read and runs written.")  # fmt: skip
@click.option("--check", is_flag=True, help="Correctness only (no timing): stages and layer against references.")
@click.option("--impl", "impls", multiple=True, help="[RECIPE/]STAGE=module:function: another implementation.")
@click.option("--nproc", type=click.IntRange(min=1), help="Start this many workers on this host (torchrun).")
@force_option
@click.pass_context
def ep(ctx, K, N, preset, experts, tokens, top_k, whole, shared, shared_in_recipe, overlap, score_func, score_after,
       wgrad, groups, seed, strategies, mode, backend, samples, timing, out, plot_file, results_dir, check, impls, nproc,
       force) -> None:  # fmt: skip
    """The expert-parallel MoE expert projection (or with --layer the whole MoE layer) on several GPUs: dispatch,
    permute, GEMMs, combine, per stage."""
    import torch

    from ...measuring.dist import under_torchrun

    has_gpu = torch.cuda.is_available()
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before mxkernels is imported below
    from mxkernels.stages.ep_layer import get_ep_layer_spec
    from mxkernels.stages.ep_stages import check_layer, check_strategy, get_ep_spec
    from mxkernels.core.names import Wgrad
    from mxkernels.core.runtime import InputError

    from ...implementations.registry import parse_impl

    K, N, label, top_k, resolved_score_func, shared = _layer(K, N, preset, whole, top_k, score_func, shared)
    layer = _layer_options(whole, score_func, score_after, resolved_score_func, shared, shared_in_recipe, overlap)
    spec_of = get_ep_spec if layer is None else get_ep_layer_spec
    for s in strategies:
        check_strategy(s)
    _check_fp8(strategies, has_gpu)
    _check_shared_tokens(strategies, tokens, layer)
    worker = under_torchrun()  # first: a stale or garbled torchrun environment is named before anything uses it
    launching = nproc is not None and not worker
    launcher = _launcher_args(ctx.args)
    if launcher and not launching:
        raise click.UsageError(f"{' '.join(launcher)}: torchrun's options go with --nproc (or to torchrun itself)")
    # The world size where it is known before the workers start (over several nodes only the workers know it).
    if launching:
        world = None if any(w.startswith("--nnodes") for w in launcher) else nproc
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    check_layer(tokens, K, N, experts, top_k if world else 1, world or 1)
    _check_bounds(K, N, experts, tokens, top_k, world or 1)
    if check:
        refuse_ignored(("plot_file", "samples", "timing", "results_dir"),
                       "--check checks correctness: nothing is timed or drawn")  # fmt: skip
        if out is None:  # --force lets the check's record replace a file that is not one: only with --out
            refuse_ignored(("force",), "--check without --out writes nothing to replace")
        if out is not None:  # the check's topology record
            from ...storage.outputs import check_output_file

            check_output_file(out, "--out", force)  # the check's record replaces only a record, unless --force
    else:
        _check_outputs(out, plot_file, results_dir, force, has_gpu)
    if not check and not has_gpu:
        raise InputError("no CUDA GPU found: timing needs a GPU per rank; `mxbench ep --check` runs on CPUs")
    for text in impls:  # here too, so that a bad one exits 2 before any worker starts
        parse_impl(text, "bf16", spec_of)
    words = command_words(ctx, skip=("nproc",))
    if launching:
        from .launch import launch

        _check_nproc(nproc, has_gpu)
        ctx.exit(launch(nproc, launcher, words, has_gpu, os.environ, echo=click.echo))
    if worker:  # it dies with its launcher (mxbench ep --nproc's torchrun, or the user's)
        from .launch import die_with_parent

        die_with_parent()
    from .check import EPOptions
    from .worker import MeasureOptions, run_worker

    options = EPOptions(K, N, experts, tokens, top_k, groups, seed, mode, backend,
                        None if wgrad is None else Wgrad(wgrad), layer)  # fmt: skip
    measure = MeasureOptions(samples, timing == "graph", out, results_dir, plot_file, label,
                             shlex.join(["mxbench", *words]))  # fmt: skip
    ctx.exit(run_worker(strategies, options, impls, check=check, measure=measure))
