"""``mxbench ep``: the expert-parallel pipeline, checked (``--check``) or measured, on every process of a run.

Launch: ``torchrun --nproc-per-node N -m mxbench ep ...`` (any torchrun rendezvous, several nodes included), or
``mxbench ep --nproc N ...`` on one host, which starts the same workers through torch.distributed.run (``launch``)
and passes the rendezvous options given after it (``--master-port``, ``--rdzv-endpoint`` ...). Without either, one
process: EP degree 1. Without a GPU the workers use gloo and run the Triton kernels under the interpreter, so
``mxbench ep --nproc 2 --check --K 64 --N 64 --experts 2 --tokens 64`` works on any laptop.

Exit codes: 0 every check passed (or the run was measured), 1 a check failed, 2 bad input (found before any
worker starts where the launcher can tell).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from ..cli.common import CommaList, command_words
from ..cli.run_commands import RESULTS_DIR

DEFAULT_STRATEGIES = "bf16,mxfp8,mxfp8_a2a"


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


def _layer(K, N, preset) -> tuple[int, int, str]:
    from ..presets import get_preset

    if preset is not None:
        if K is not None or N is not None:
            raise click.UsageError("give either --preset or --K/--N, not both")
        p = get_preset(preset)
        return p.K, p.N, preset
    if K is None or N is None:
        raise click.UsageError("give --K and --N (or --preset NAME; `mxbench presets` lists them)")
    return K, N, f"{K}x{N}"


@click.command("ep", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--K", "K", type=int, help="Model dim (the dispatched tokens' width); multiple of 32.")
@click.option("--N", "N", type=int, help="Expert hidden dim (the combined outputs' width); multiple of 32.")
@click.option("--preset", help="Shapes of a model (see `mxbench presets`) instead of --K/--N.")
@click.option("--experts", type=click.IntRange(1, 512), default=8, show_default=True, help="Local experts per rank.")
@click.option("--tokens", type=click.IntRange(min=1), default=131072, show_default=True, help="Tokens per rank.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=1, show_default=True,
              help="Experts per token (each token is sent top-k times).")  # fmt: skip
@click.option("--groups", type=click.Choice(["balanced", "skewed"]), default="balanced", show_default=True,
              help="Routing: every expert gets the same copies, or a skewed router (seeded).")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the routing and the inputs.")
@click.option("--strategy", "strategies", type=CommaList(str), default=DEFAULT_STRATEGIES, show_default=True,
              help="Strategies, comma list: bf16, mxfp8 (quantize before the GEMMs), mxfp8_a2a (before dispatch).")
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
@click.pass_context
def ep(ctx, K, N, preset, experts, tokens, top_k, groups, seed, strategies, mode, backend, samples, timing, out,
       plot_file, results_dir, check, impls, nproc) -> None:  # fmt: skip
    """The expert-parallel MoE expert projection on several GPUs: dispatch, permute, GEMMs, combine, per stage."""
    import torch

    from .dist import under_torchrun

    has_gpu = torch.cuda.is_available()
    if not has_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before mxkernels is imported below
    from mxkernels.ep_stages import check_layer, check_strategy, get_ep_spec
    from mxkernels.runtime import InputError

    from ..registry import parse_impl

    K, N, label = _layer(K, N, preset)
    for s in strategies:
        check_strategy(s)
    launching = nproc is not None and not under_torchrun()
    launcher = _launcher_args(ctx.args)
    if launcher and not launching:
        raise click.UsageError(f"{' '.join(launcher)}: torchrun's options go with --nproc (or to torchrun itself)")
    # The world size where it is known before the workers start (over several nodes only the workers know it).
    if launching:
        world = None if any(w.startswith("--nnodes") for w in launcher) else nproc
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    check_layer(tokens, K, N, experts, top_k if world else 1, world or 1)
    if not check and not has_gpu:
        raise InputError("no CUDA GPU found: timing needs a GPU per rank; `mxbench ep --check` runs on CPUs")
    for text in impls:  # here too, so that a bad one exits 2 before any worker starts
        parse_impl(text, "bf16", get_ep_spec)
    words = command_words(ctx, skip=("nproc",))
    if launching:
        from .launch import launch

        ctx.exit(launch(nproc, launcher, words, has_gpu, os.environ))
    from .check import EPOptions
    from .worker import MeasureOptions, run_worker

    options = EPOptions(K, N, experts, tokens, top_k, groups, seed, mode, backend)
    measure = MeasureOptions(samples, timing == "graph", out, results_dir, plot_file, label,
                             shlex.join(["mxbench", *words]))  # fmt: skip
    ctx.exit(run_worker(strategies, options, impls, check=check, measure=measure))
