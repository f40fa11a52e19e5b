"""The ``mxbench`` command line (click): roofline, presets, ceilings, table, plot, compare, history, regress, peers,
impls, check, ep.

Bad input exits with code 2 and a one-line message: click's own usage errors, and ``mxkernels.core.runtime.InputError``
raised below the CLI (the harness and the kernels validate their arguments with InputErrors that name them;
``CompareError`` is one). Any other exception, a bare ``ValueError`` included, is a bug: it propagates with its
traceback and exits 1. Heavy modules (torch, the kernels, NVML) are imported inside the commands, so ``--help``
stays fast.

``run_commands`` holds the commands that measure (roofline, ceilings, regress, peers), ``report_commands`` those
that read stored results (table, plot, compare, presets), ``history_commands`` the history over commits,
``registry_commands`` those about implementations (impls, check), ``common`` what they share; ``mxbench.ep.command``
the expert-parallel pipeline (``ep``).
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from ..version import __version__
from ..workloads.ep import command as ep_command
from ..workloads.ep import project_command
from ..workloads.layer import command as layer_command
from . import history_commands, registry_commands, report_commands
from ..workloads.step import command as run_commands
from ..clikit.common import Group


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mxbench")
def cli() -> None:
    """Benchmark and roofline suite for MXFP8 mixture-of-experts grouped-GEMM training kernels."""


for _command in (
    run_commands.roofline,
    report_commands.presets,
    run_commands.ceilings,
    report_commands.table_cmd,
    report_commands.plot,
    report_commands.compare,
    history_commands.history,
    run_commands.regress,
    run_commands.peers,
    registry_commands.impls,
    registry_commands.check,
    ep_command.ep,
    project_command.ep_project,
    layer_command.layer,
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="mxbench")
