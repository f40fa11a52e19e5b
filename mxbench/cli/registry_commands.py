"""``mxbench impls`` and ``mxbench check``: which implementations each stage has, whether they run here, and
whether they compute what the stage's oracle computes."""

from __future__ import annotations

import os
import sys

import click

from ..clikit.common import FORMATS, CommaList, Seed, refuse_ignored, shape_args, torch_device
from ..clikit.impls import report_check
from ..workloads.registered import WORKLOADS

CHECKED = tuple(w for w in WORKLOADS if w.check is not None)
"""The workloads whose own stages ``check --<workload>`` checks (the step's are ``check``'s own)."""


def _interpreter_on_cpu() -> None:
    """Without a GPU the Triton kernels run in the interpreter, which must be chosen before mxkernels is imported:
    ``impls`` and ``check`` choose it for the user (``TRITON_INTERPRET`` already set is left as it is)."""
    import torch

    # Only the kernel modules read it (each imports mxkernels.core.runtime, which reads it once); the harness's own
    # imports of mxkernels.core.errors come earlier and read nothing.
    if not torch.cuda.is_available() and "mxkernels.core.runtime" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _registry(impl_texts, recipe):
    from ..implementations.default import default_registry
    from ..implementations.registry import with_cli_impls

    registry = default_registry()
    added = with_cli_impls(registry, impl_texts, recipe)
    return registry, added


@click.command()
@click.option("--stage", help="One stage (STAGE, or RECIPE/STAGE): print its calling contract too.")
@click.option("--recipe", type=click.Choice(["mxfp8", "fp8_rowwise", "bf16"]), help="Only this recipe's stages.")
@click.option("--impl", "impl_texts", multiple=True, metavar="STAGE=module:function", help="Register this too.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="plain", show_default=True)
def impls(stage, recipe, impl_texts, fmt) -> None:
    """Stages x implementations, with availability on this machine and the reason when one cannot run.

    Exit 1 when a plugin (entry point) did not load (it is named on stderr), else 0; 2 on bad input."""
    _interpreter_on_cpu()
    from mxkernels.stages.step_specs import PARAM_DOCS, all_specs

    from ..implementations.registry import split_stage
    from ..views.render import render

    registry, _ = _registry(impl_texts, recipe or "mxfp8")
    device = torch_device()
    wanted = split_stage(stage, recipe or "mxfp8") if stage else None
    rows = []
    for spec in all_specs().values():
        if (recipe and spec.recipe != recipe) or (wanted and spec.key != wanted):
            continue
        for impl in registry.of(spec.recipe, spec.name):
            reason = impl.unavailable(device)
            rows.append({"Recipe": str(spec.recipe), "Stage": spec.name, "Category": str(spec.category),
                         "Implementation": impl.name, "Kernel": impl.kernel,
                         "Available": "yes" if reason is None else f"no: {reason}", "From": impl.origin})  # fmt: skip
    if wanted:
        spec, prose = all_specs()[wanted], fmt == "csv"  # a CSV on stdout stays parseable: the contract to stderr
        click.echo(f"{spec.recipe}/{spec.name} ({spec.pass_}, {spec.category}): {spec.purpose}", err=prose)
        click.echo(f"  contract: {spec.signature()}; compared {spec.rule.describe()} with the oracle", err=prose)
        for what, ports in (("input", spec.inputs), ("output", spec.outputs)):
            for i, port in enumerate(ports):
                click.echo(f"  {what} {i}: {port.name}: {port.doc}", err=prose)
        for p in spec.params:
            click.echo(f"  keyword {p}: {PARAM_DOCS[p]}", err=prose)
        click.echo("", err=prose)
    click.echo(render(rows, fmt), nl=False)
    for origin, message in registry.load_errors:
        click.echo(f"not loaded: {origin}: {message}", err=True)
    if registry.load_errors:
        sys.exit(1)  # a plugin that does not load is a failure, not a footnote


def _workload_flags(command):
    """A ``--<workload>`` flag for each workload that declares a check of its own stages, after the other options."""
    for workload in reversed(CHECKED):
        command = click.option(f"--{workload.name}", is_flag=True, help=workload.check.help)(command)
    return command


CHECK_DEFAULTS = {"K": 256, "N": 128, "G": 4, "M": 512}
CHECK_FORMATS = (*FORMATS, "json")


@click.command()
@click.option("--impl", "impl_texts", multiple=True, metavar="[STAGE=]NAME|STAGE=module:function",
              help="Check this implementation (repeatable): a registered NAME (alone: every stage it implements) or "
              "module:function (a module in the current folder is found). With --impl, only these are checked "
              "unless --name.")
@click.option("--stage", "stages", type=CommaList(str), help="Only these stages (comma list). [default: all]")
@click.option("--name", "names", type=CommaList(str), help="Only implementations with these names (comma list).")
@click.option("--recipe", type=click.Choice(["mxfp8", "fp8_rowwise", "bf16"]), default="mxfp8", show_default=True)
@click.option("--K", "K", type=int, help=f"Model dim. [default: {CHECK_DEFAULTS['K']}, or the preset's]")
@click.option("--N", "N", type=int, help=f"Expert hidden dim. [default: {CHECK_DEFAULTS['N']}, or the preset's]")
@click.option("--G", "G", type=click.IntRange(1, 512), help=f"Experts. [default: {CHECK_DEFAULTS['G']}]")
# M below 2**31 as for the sweeps (points.MAX_TOKENS: int32 group ends); found by the fuzz test: 2**31 went on to
# allocate half a terabyte and crash
@click.option("--M", "M", type=click.IntRange(1, 2**31 - 1), default=CHECK_DEFAULTS["M"], show_default=True,
              help="Tokens (group 0 is empty, the others uneven); a second pass runs G-1 tokens (--no-pad: see there).")
@click.option("--preset", help="K, N, G of a model preset.")
@click.option("--pad/--no-pad", default=True, show_default=True,
              help="Token groups off the alignment, padded by the step; --no-pad: aligned groups (M a multiple of the "
                   "alignment) and the step without padding, whose GEMMs get fewer rows than experts where M < G (a "
                   "second pass gives them one aligned block of tokens where that is fewer than the experts).")
@click.option("--mode", "modes", type=CommaList(str), default="rceil,floor", show_default=True,
              help="MX scale modes to check, a comma list of rceil and floor.")
@click.option("--seed", type=Seed(), default=0, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="Seconds one implementation may take on one stage before it is an ERROR (the run goes on).")
@click.option("--format", "fmt", type=click.Choice(CHECK_FORMATS), default="plain", show_default=True,
              help="json: every result of every mode and scenario, with its findings, for machines.")
@click.option("--verbose", "-v", is_flag=True, help="Print the full traceback of every ERROR.")
@click.option("--wgrad", type=click.Choice(["recipe", "bf16"]), default="recipe", show_default=True,
              help="--layer: the layer's weight-gradient GEMMs (`mxbench layer --wgrad`); bf16 also holds each expert "
              "weight gradient to DY^T X in fp64.")
@_workload_flags
def check(impl_texts, stages, names, recipe, K, N, G, M, preset, pad, modes, seed, timeout_s, fmt, verbose, wgrad,
          **workloads) -> None:  # fmt: skip
    """Run implementations on seeded inputs with adversarial blocks and compare each with the stage's oracle.

    Every implementation gets copies of its stage's inputs at each scale mode and at two token splits (M tokens
    with an empty group and uneven groups; G-1 tokens over G experts; with --no-pad, aligned groups of M tokens and
    of one aligned block, the step unpadded); its row shows its worst verdict. An implementation that raises
    (SystemExit included), writes to its inputs or runs past --timeout is an ERROR row; a plugin (entry point)
    that does not load is reported and fails the run. A check of a GEMM stage prints first what the native
    backend decided on this device, and why.

    Exit 0 when every checked implementation passes (or deviates only in its declared way), 1 when one fails or
    raises or a plugin did not load, 2 on bad input (and when nothing could be checked here).
    """
    _interpreter_on_cpu()
    from mxkernels.core.names import Category
    from mxkernels.stages.step_specs import get_spec

    from ..implementations.check import check_step, exit_code, json_report, native_line, stages_checked
    from ..implementations.registry import split_stage

    bad = [m for m in modes if m not in ("rceil", "floor")]
    if bad or not modes:
        raise click.BadParameter(f"{','.join(bad) or 'nothing'}: give rceil, floor or rceil,floor", param_hint="--mode")
    if preset is None:  # only an absent size takes the default: --K 0 is refused (shape_args), not replaced
        K = CHECK_DEFAULTS["K"] if K is None else K
        N = CHECK_DEFAULTS["N"] if N is None else N
        G = CHECK_DEFAULTS["G"] if G is None else G
    K, N, G, _ = shape_args(K, N, G, preset)
    from ..plan.points import check_step_fits, check_tokens

    check_tokens(M, "--M")
    check_step_fits(M, N, K, G)
    for workload in (w for w in CHECKED if workloads[w.name]):
        refuse_ignored(workload.check.ignores, workload.check.why)
        sys.exit(workload.check.run(impl_texts, stages, recipe, K, N, G, M, list(dict.fromkeys(modes)), seed,
                                    timeout_s, fmt, verbose, wgrad))  # fmt: skip
    refuse_ignored(("wgrad",), "--wgrad is --layer's: the step's stages are checked one by one")
    registry, added = _registry(impl_texts, recipe)
    selected_stages = {split_stage(s, recipe)[1] for s in stages} if stages else None
    if added and not names:
        chosen = added
    else:
        chosen = [i for i in registry if i.recipe == recipe and (not names or i.name in names)]
    chosen = [i for i in chosen if selected_stages is None or i.stage in selected_stages]
    by_stage: dict[str, list] = {}
    for impl in chosen:
        by_stage.setdefault(impl.stage, []).append(impl)
    if not pad:  # the step without padding has no pad or unpad stages: left out unless asked for by name
        in_step = stages_checked(recipe, M, N, K, G, pad=False)
        by_stage = {s: found for s, found in by_stage.items() if s in in_step or selected_stages or added}
    # The native backend's verdict (for MXFP8 on SM100 its probe at first use), before the GEMM rows that follow from
    # it: first line of the plain and markdown output, stderr beside a CSV (stdout stays parseable), a field of JSON.
    native = None
    if any(get_spec(recipe, stage).category == Category.GEMM for stage in by_stage):
        native = native_line(recipe, torch_device())
        if fmt != "json":
            click.echo(native, err=fmt == "csv")
    modes = list(dict.fromkeys(modes))
    results = check_step(recipe, M, N, K, G, by_stage, modes=modes, device=torch_device(), seed=seed,
                         timeout_s=timeout_s, pad=pad)  # fmt: skip
    load_errors = registry.load_errors
    if fmt == "json":
        click.echo(json_report(results, load_errors, native), nl=False)
        sys.exit(exit_code(results, load_errors))
    sys.exit(report_check(results, load_errors, fmt, verbose))
