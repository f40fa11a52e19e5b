"""``mxbench peers``: our data-movement kernels timed beside torchao's and torch.compile's (or those --impl names)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from ...clikit import common
from ...clikit.common import FORMATS, RESULTS_DIR, Seed, command_line, force_option, shape_args
from ...clikit.impls import checked, impl_option, run_impls


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
    from ...plan.points import plan_points
    from ...storage.outputs import check_results_file

    K, N, G, label = shape_args(K, N, G, preset)
    if out is not None:
        check_results_file(out, "--out")
    planned = plan_points([M], N, K, G, ["mxfp8"], mode, groups, seed, [None], False)
    impls = run_impls(impl_texts, ["mxfp8"], planned)
    common.require_gpu("peers are timed on a GPU")
    impls = checked(impls, K, N, G, mode)
    from ...measuring.shard import launched, local_device
    from ...measuring.stages import SweepOptions
    from .measure import run_peers
    from .sharded import sharded_peers
    from .tables import peers_table

    out = out or RESULTS_DIR / common.card_dir() / f"peers-{label}-M{M}-{common.stamp()}.json"
    check_results_file(out, "--out")  # the default path: the working folder may not take it
    common.check_replace(out, True, common.card_name(), planned, force)
    options = SweepOptions(cold_l2=not warm_l2, samples=samples, out=out, results_dir=RESULTS_DIR,
                           hardware=common.detected_spec(), command=command_line(), device=local_device())  # fmt: skip
    measure = sharded_peers if launched() else run_peers  # under torchrun: None on ranks other than 0
    run = measure(M, N, K, G, mode=mode, groups=groups, seed=seed, options=options, registry=_peer_registry(impls))
    if run is None:
        return
    click.echo(peers_table(run, fmt), nl=False)
    click.echo(f"results: {out}")
    common.exit_if_partial(run)


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
