"""The ``mxbench`` command line (click): roofline, presets, ceilings, table, plot, compare, history, regress, peers,
impls, check, ep.

Bad input exits with code 2 and a one-line message: click's own usage errors, and ``mxkernels.core.runtime.InputError``
raised below the CLI (the harness and the kernels validate their arguments with InputErrors that name them;
``CompareError`` is one). Any other exception, a bare ``ValueError`` included, is a bug: it propagates with its
traceback and exits 1. Heavy modules (torch, the kernels, NVML) are imported inside the commands, so ``--help``
stays fast.

Each workload brings its own commands (``roofline``, ``peers``, ``ep``, ``ep-project``, ``layer``: the workloads'
declarations, ``mxbench.workloads.registered``); the harness's are here: ``measure_commands`` (ceilings, regress),
``report_commands`` (table, plot, compare, presets), ``history_commands`` (the history over commits) and
``registry_commands`` (impls, check); ``mxbench.clikit`` what they all share.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from ..clikit.common import Group
from ..version import __version__
from ..workloads.registered import WORKLOADS
from . import history_commands, measure_commands, registry_commands, report_commands


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mxbench")
def cli() -> None:
    """Benchmark and roofline suite for MXFP8 mixture-of-experts grouped-GEMM training kernels."""


for _command in (
    report_commands.presets,
    measure_commands.ceilings,
    report_commands.table_cmd,
    report_commands.plot,
    report_commands.compare,
    history_commands.history,
    measure_commands.regress,
    registry_commands.impls,
    registry_commands.check,
    *(command for workload in WORKLOADS for command in workload.commands),
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point. Ctrl-C anywhere exits 130 (``Group`` says what was kept; here, outside any
    command, nothing was written)."""
    try:
        cli.main(args=argv, prog_name="mxbench")
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C): no file was written", file=sys.stderr)
        sys.exit(130)
