"""What the commands share: the group that turns bad input into exit code 2, option types and helpers, the
command line as typed (for a run's metadata), the echo of a comparison, and what every command that measures asks
first (is there a GPU, which card, where its run goes by default, may that run replace what is there).

Nothing here imports torch or the kernels at import time (the imports inside the functions are there for that):
``mxbench --help`` must stay fast. The commands call the run helpers through this module (``common.has_gpu()``),
so a test that stands in for a GPU replaces them in one place.
"""

from __future__ import annotations

import copy
import math
import shlex
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ..instruments.cards import DEFAULT_CARD

FORMATS = ("markdown", "github", "csv", "plain")
"""``render.FORMATS``, stated here so that building the options imports no table code."""
COMPARE_FORMATS = (*FORMATS, "json")
"""A comparison also prints as JSON (for machines); its markdown is a CI step summary."""
RESULTS_DIR = Path("results")
"""Where runs and ceilings go unless an option says otherwise (relative to the working folder)."""


class BadInput(click.ClickException):
    """Bad input found below the option parser: exit code 2 with a one-line message, as click's usage errors."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))


class Group(click.Group):
    """The command group: ``InputError`` raised anywhere below a command exits with code 2 and its message on one
    line; any other exception is a bug and propagates with its traceback (exit 1). Ctrl-C exits 130 with one line
    naming the files this process wrote (``storage.writing.written``), from any command (``interrupted``).

    Every command added is hardened (``harden``): its float options finite, its integer options within int64, so a
    command added later (a new workload's) inherits the rules without a word in it."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        for param in cmd.params:
            harden(param)
        super().add_command(cmd, name)

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        try:  # Ctrl-C while the group's own options are parsed
            return super().make_context(info_name, args, parent=parent, **extra)
        except KeyboardInterrupt:
            interrupted()

    def invoke(self, ctx: click.Context):
        from ..storage.writing import writes

        start = writes()
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted(start)
        except click.exceptions.Abort:  # click's own Ctrl-C (a prompt): the same exit
            interrupted(start)
        except ValueError as e:
            # imported here, not at the top: mxkernels loads torch and every kernel, and `--help` must stay fast
            from mxkernels.core.errors import InputError

            if not isinstance(e, InputError):
                raise  # a bug, not bad input: its traceback says where
            raise BadInput(str(e)) from None


INTERRUPTED = 130
"""The exit code of every command stopped by Ctrl-C (128 + SIGINT), never 1 (1 means a stage SLOWER or a failed
check)."""


def interrupted(since: int = 0) -> None:
    """Say what Ctrl-C left (the files written since the command's first ``since`` writes, each complete: every
    write is atomic) and exit 130."""
    from ..storage.writing import written

    kept = written(since)
    what = f"kept {', '.join(map(str, kept))}" if kept else "no file was written"
    click.echo(f"interrupted (Ctrl-C): {what}", err=True)
    raise click.exceptions.Exit(INTERRUPTED)


INT64 = (-(2**63), 2**63 - 1)
"""The widest integer any option takes: past it numpy, torch and the file formats overflow (``harden``)."""


class FiniteFloat(click.FloatRange):
    """A float option that is a finite number in its range: nan, inf and 1e400 (inf) are refused. A NaN floor
    passes every comparison (``compare --floor-us nan`` passed a run 1.5x slower) and an infinite rate prints
    nonsense, so no float option takes them."""

    def convert(self, value, param, ctx):
        rv = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(rv, param, ctx)


class Int64(click.IntRange):
    """An integer option within int64 (and its own range): a 20-digit integer is refused with one line, not passed
    on to overflow in numpy."""

    def convert(self, value, param, ctx):
        rv = click.INT.convert(value, param, ctx)  # a 5000-digit integer: click's "not a valid integer"
        if not INT64[0] <= rv <= INT64[1]:
            self.fail(f"{str(value)[:20]}{'...' if len(str(value)) > 20 else ''} is past int64 (2**63): no size, "
                      "count or seed is that large", param, ctx)  # fmt: skip
        return super().convert(rv, param, ctx)

    def _describe_range(self) -> str:
        if self.max == INT64[1] and self.min is not None and self.min != INT64[0]:
            return f"x{'>' if self.min_open else '>='}{self.min}"
        return super()._describe_range()


class NamedPath(click.Path):
    """A path that names something: an empty one (an unset shell variable, ``--out "$DIR"``) would read as the
    working folder, and a command would write its figures there, or read it, though the user named no folder."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value == "":
            self.fail("an empty name; give a file or folder name", param, ctx)
        return super().convert(value, param, ctx)


def harden(param: click.Parameter) -> None:
    """Make ``param``'s type one that cannot lie: a float finite (``FiniteFloat``, its range kept), an integer
    within int64 (``Int64``, its range kept where narrower), a path not empty (``NamedPath``, its rules kept).
    Types already bounded are left as they are."""
    kind = param.type
    if isinstance(kind, click.Path) and not isinstance(kind, NamedPath):
        param.type = copy.copy(kind)
        param.type.__class__ = NamedPath  # the same attributes (exists, dir_okay, path_type...), one more rule
        return
    if isinstance(kind, click.types.FloatParamType) and not isinstance(kind, FiniteFloat):
        bounds = ({"min": kind.min, "max": kind.max, "min_open": kind.min_open, "max_open": kind.max_open,
                   "clamp": kind.clamp} if isinstance(kind, click.FloatRange) else {})  # fmt: skip
        param.type = FiniteFloat(**bounds)
    elif isinstance(kind, click.types.IntParamType) and not isinstance(kind, Int64):
        if isinstance(kind, click.IntRange):
            if kind.min is not None and kind.max is not None:
                return  # bounded already by its command (a seed's range, 0 <= x < 2**63, says it in words)
            lo = INT64[0] if kind.min is None else max(kind.min, INT64[0])
            hi = INT64[1] if kind.max is None else min(kind.max, INT64[1])
            param.type = Int64(lo, hi, min_open=kind.min_open, max_open=kind.max_open and kind.max is not None)
        else:
            param.type = Int64(*INT64)


class CommaList(click.ParamType):
    """A comma-separated list of ``item`` values ("16384,32768"): never empty (a filter of nothing selects
    nothing, and a check of no strategy passes), each integer within int64, each float finite. ``item``: a
    callable (``int``, ``float``, ``str``) or a click type (its range then holds for each value)."""

    name = "list"

    def __init__(self, item: Callable[[str], Any] | click.ParamType):
        self.item = item

    def _what(self) -> str:
        return getattr(self.item, "__name__", None) or getattr(self.item, "name", "")

    def _one(self, text: str, param, ctx) -> Any:
        if isinstance(self.item, click.ParamType):
            return self.item.convert(text, param, ctx)
        value = self.item(text)
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(f"{text!r} is not a finite number", param, ctx)
        if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
            self.fail(f"{text[:20]}{'...' if len(text) > 20 else ''} is past int64 (2**63): no size, count or seed is "
                      "that large", param, ctx)  # fmt: skip
        return value

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            items = list(value)
        else:
            try:
                items = [self._one(v.strip(), param, ctx) for v in str(value).split(",") if v.strip()]
            except ValueError:
                shown = f"{str(value)[:40]}..." if len(str(value)) > 40 else str(value)
                self.fail(f"{shown!r} is not a comma-separated list of {self._what()} values", param, ctx)
        if not items:
            self.fail(f"{value!r}: give at least one value (a comma-separated list of {self._what()} values)", param,
                      ctx)  # fmt: skip
        unique = list(dict.fromkeys(items))
        if len(unique) < len(items):  # a point or a recipe is measured once: say so rather than fold it silently
            repeated = ", ".join(str(v) for v in unique if items.count(v) > 1)
            where = param.get_error_hint(ctx) if param is not None else "the list"
            click.echo(f"note: {where} gives {repeated} more than once: taken once", err=True)
        return unique


class Seed(click.IntRange):
    """A seed of numpy's and torch's generators: 0 <= seed < 2**63 (torch.manual_seed's range), said in words."""

    name = "seed"

    def __init__(self):
        super().__init__(0, 2**63, max_open=True)

    def _describe_range(self) -> str:
        return "0<=x<2**63"


def unique_paths(ctx: click.Context, param: click.Parameter, paths: tuple) -> tuple:
    """A RESULTS argument's paths, each file once (the same file twice would be pooled twice: its samples counted
    double), with a note when one was given again."""
    seen: dict = {}
    for path in paths:
        seen.setdefault(path.resolve(), path)
    if len(seen) < len(paths):
        repeated = ", ".join(str(p) for p in seen.values() if sum(q.resolve() == p.resolve() for q in paths) > 1)
        click.echo(f"note: {param.human_readable_name} names {repeated} more than once: read once", err=True)
    return tuple(seen.values())


def refuse_ignored(names: tuple[str, ...], why: str, ctx: click.Context | None = None) -> None:
    """An option the chosen mode does not use, given on the command line, is bad input (exit 2) rather than dropped
    without a word: ``why`` says which mode ignores it."""
    ctx = ctx or click.get_current_context()
    for param in ctx.command.params:
        if param.name in names and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
            raise click.BadParameter(f"{why}; drop it", ctx=ctx, param=param)


def check_recipes_on(spec, recipes, option: str = "--recipe") -> None:
    """Every recipe in ``recipes`` runs on the card ``spec`` describes: FP8 recipes need FP8 tensor cores (MXFP8
    without MX ones is priced at the FP8 roof). A card without them is refused up front, not left out of the
    tables."""
    if spec is None or spec.fp8_tflops is not None:
        return
    fp8 = [r for r in recipes if r != "bf16"]
    if fp8:
        raise click.BadParameter(f"{spec.name} has no FP8 tensor cores: it cannot run {', '.join(fp8)}; give "
                                 "--recipe bf16 or another card", param_hint=option)  # fmt: skip


def filter_options(command: Callable) -> Callable:
    """The record filters every table and the history take (``frame.select``): --pass, --M, --recipe, --card."""
    options = [
        click.option("--pass", "passes", type=CommaList(str),
                     help="Passes: forward, backward_input, backward_weight, end_to_end."),
        click.option("--M", "Ms", type=CommaList(int), help="Only these M (breakdown: the one M shown)."),
        click.option("--recipe", "recipes", type=CommaList(str), help="Only these recipes."),
        click.option("--card", help="Only runs of this card."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def force_option(command):
    """--force: replace a measured run with a model run, or with a run of another card or shape (``replacing``)."""
    return click.option("--force", is_flag=True, help="Replace the measured run --out holds with this run even when "
                        "it is the model, or of another card or shape, and a figure path's file that is not a figure "
                        "of mxbench's (the old copy is kept in .replaced/ beside it). A file that is not an mxbench "
                        "run is never replaced by a run.")(command)  # fmt: skip


def replace_option(command):
    """--force of a command whose outputs are figures or tables (``plot``, ``history``, ``ep-project``)."""
    return click.option("--force", is_flag=True, help="Replace an output file that is not one mxbench wrote of its "
                        "kind (a figure, a table); the old copy is kept in .replaced/ beside it.")(command)  # fmt: skip


def project_option(command: Callable) -> Callable:
    """--project SPEC: carry each kernel's measured efficiency over to another card's roofs."""
    return click.option(
        "--project",
        metavar="SPEC",
        callback=lambda ctx, param, value: value if value is None else hardware_spec(value, "--project").key,
        help=f"Also show the run projected onto this card (e.g. {DEFAULT_CARD}): each kernel at the efficiency it "
        "reached here, against that card's datasheet roofs, beside its peak model.",
    )(command)


def command_line() -> str:
    """The running command as typed (the options given on the command line, in declaration order), for metadata."""
    return shlex.join(["mxbench", *command_words(click.get_current_context())])


def command_words(ctx: click.Context, skip: tuple[str, ...] = ()) -> list[str]:
    """The command's name and the parameters given on its command line as words (but those named in ``skip``):
    what reruns it, e.g. on every worker that ``mxbench ep --nproc`` starts."""
    words = [ctx.info_name]
    for param in ctx.command.params:
        if param.name in skip or ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name]
        if isinstance(param, click.Option) and param.multiple:
            words += [w for v in value for w in (param.opts[0], _word(v))]
        elif isinstance(param, click.Option):
            words += [param.opts[0]] if param.is_flag else [param.opts[0], _word(value)]
        else:  # an argument; nargs=-1 gives a tuple
            words += [_word(v) for v in (value if isinstance(value, tuple) else (value,))]
    return words


def _word(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(_word, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def shape_args(K: int | None, N: int | None, G: int | None, preset: str | None) -> tuple[int, int, int, str]:
    """(K, N, G, label) from --preset or --K/--N; G defaults to the preset's, else 8."""
    from ..plan.points import check_shape
    from ..plan.presets import get_preset

    if preset is not None:
        if K is not None or N is not None:
            raise click.UsageError("give either --preset or --K/--N, not both")
        p = get_preset(preset)
        K, N, G, label = p.K, p.N, p.G if G is None else G, preset
    elif K is None or N is None:
        raise click.UsageError("give --K and --N (or --preset NAME; `mxbench presets` lists them)")
    else:
        G, label = 8 if G is None else G, f"{K}x{N}"
    check_shape(N, K, G)
    return K, N, G, label


def hardware_spec(key: str, option: str = "--hardware"):
    """The hardware spec ``option`` (or a run's meta) names; an unknown key is a usage error of that option."""
    from mxkernels.core.errors import InputError

    from ..instruments.hardware import get_spec

    try:
        return get_spec(key)
    except InputError as e:
        raise click.BadParameter(str(e).strip("'\""), param_hint=option) from None


def echo_comparison(cmp, fmt: str, base: str, new: str) -> None:
    """A comparison in ``fmt`` (``compare`` and ``regress`` print alike): JSON; markdown as a CI step summary; else
    its table, the one-line summary and the code that changed between the runs. ``base``/``new`` name the runs."""
    from ..gate.compare import comparison_rows
    from ..gate.report import code_text, json_report, markdown_report, verdict_line
    from ..views.render import render

    if fmt == "json":
        click.echo(json_report(cmp, base, new), nl=False)
    elif fmt == "markdown":
        click.echo(markdown_report(cmp, base, new), nl=False)
    else:
        click.echo(render(comparison_rows(cmp), fmt), nl=False)
        click.echo(cmp.summary())
        if cmp.model_note:
            click.echo(cmp.model_note)
        if code := code_text(cmp):
            click.echo(code)
        click.echo(verdict_line(cmp))


def comparison_format(command):
    """The ``--format`` option of the commands that print a comparison (``compare``, ``regress``)."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(COMPARE_FORMATS),
        default="plain",
        show_default=True,
        help="json: one object per stage, for machines; markdown: a CI step summary.",
    )(command)


def threshold_options(command):
    """--threshold CATEGORY=PCT and --floor-us: the gate's bands and floor (``compare``, ``regress``)."""
    from ..gate.rules import DEFAULT_DELTAS, DEFAULT_FLOOR_US

    bands = ", ".join(f"{c}={d * 100:g}" for c, d in DEFAULT_DELTAS.items())
    command = click.option("--floor-us", type=float, help=f"Changes of at most this many microseconds are never "
                           f"SLOWER or FASTER. [default: {DEFAULT_FLOOR_US:g}]")(command)  # fmt: skip
    return click.option("--threshold", "thresholds", multiple=True, metavar="CATEGORY=PCT",
                        help=f"The band of a stage category in percent (repeatable; all=PCT sets every band). "
                        f"[default: {bands}]")(command)  # fmt: skip


def gate_help(summary: str) -> str:
    """A gate command's help: ``summary``, then the rules it applies (``gate.rules.rules_text``)."""
    from ..gate.rules import rules_text

    return f"{summary}\n\n{rules_text()}"


EXIT_CODES_HELP = (
    "Exit codes: 0 no stage slower; 1 a stage SLOWER (or it ran in the baseline and only errors now); 2 unusable "
    "input: a file that is not a run, runs of different cards (without --force), no comparable stage, or stages "
    "of the baseline missing from the new run (without --allow-missing). Two model runs (no samples) give ratios "
    "without statistics: their stages are MODEL, which never fails (exit 0)."
)
REGRESS_EXIT_CODES_HELP = (
    "Exit codes: 0 no stage slower; 1 a stage SLOWER again when re-measured (or it ran in the baseline and only "
    "errors now), or an --impl failed its check, or a plugin did not load; 2 unusable input: a file that is not a "
    "run, no GPU, an implementation the baseline recorded that is not registered here, no comparable stage, or "
    "stages of the baseline missing from the new run (without --allow-missing)."
)


# ---------------------------------------------------------------------------------- what a measuring command asks


def has_gpu() -> bool:
    """Whether this process has a CUDA GPU. Under torchrun (a sharded run) that is its own, ``cuda:LOCAL_RANK``,
    made the current device here, before anything else touches a GPU (``shard.local_device``)."""
    import torch

    if not torch.cuda.is_available():
        return False
    from ..measuring.shard import local_device

    local_device()
    return True


def require_gpu(what: str) -> None:
    if not has_gpu():
        raise BadInput(f"no CUDA GPU found: {what}")


def torch_device():
    """This process's current CUDA device, else the CPU (where ``check`` runs the kernels in Triton's interpreter)."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def card_dir(device: int = 0) -> str:
    """``results/<card>/``: the running card's name made path-safe, the folder its ceilings are stored in."""
    from ..instruments.hardware import card_slug

    return card_slug(card_name(device))


def detected_spec(device: int = 0) -> str | None:
    """Key of the running card's hardware spec, None for a card without one."""
    from ..instruments.hardware import detect

    spec = detect(device)
    return None if spec is None else spec.key


def card_name(device: int = 0) -> str:
    from ..instruments.hardware import device_properties

    return str(device_properties(device).get("name", "unknown"))


def spec_key(hardware: str | None, gpu: bool) -> str | None:
    """The spec a run is priced against: --hardware, else the detected card's, else (without a GPU) the default
    card the model prices."""
    return hardware or (detected_spec() if gpu else DEFAULT_CARD)


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def exit_if_partial(run) -> None:
    """Exit 130 after Ctrl-C, 1 when a rank of a sharded run failed: the partial results were saved."""
    if run.meta.get("interrupted"):
        click.echo("interrupted: the partial results above were saved", err=True)
        sys.exit(130)
    if run.meta.get("partial"):
        click.echo(f"partial results saved: {run.meta['partial']}", err=True)
        sys.exit(1)


def exit_if_fooled(run) -> None:
    """Exit 1 when a stage's time was refused (the run is saved, and shows why): IMPOSSIBLE, below the stage's
    roofline floor, or outputs of the last timed call that did not follow its inputs (``timing.StaleOutput``)."""
    fooled = [r for r in run.records if r.impossible is not None or (r.error or "").startswith("StaleOutput")]
    for r in fooled:
        click.echo(f"refused time: {r.point.label()} {r.stage} [{r.impl}]: {r.failure}", err=True)
    if fooled:
        sys.exit(1)


def check_replace(out: Path, measured: bool, card: str, points, force: bool | None, option: str = "--out") -> None:
    """Before any work: may this run (measured or the model, on ``card``, of ``points``' shapes; ``points`` None:
    not known yet) replace what ``out`` holds? (``replacing.check_replace``)"""
    from ..storage.replacing import RunIdentity
    from ..storage.replacing import check_replace as check

    shapes = None if points is None else frozenset((p.N, p.K, p.G) for p in points)
    check(out, option, RunIdentity(measured, card, shapes), force)


def check_outputs(out: Path, plot_file: Path | None, force: bool = False) -> None:
    """Where results and figures go, checked before anything is measured (bad input, exit 2); ``force``: the
    figure may replace a file that is not one of mxbench's figures."""
    from ..storage.outputs import IMAGE_SUFFIXES, check_figure_target, check_results_file

    check_results_file(out, "--out")
    if plot_file is not None:
        check_figure_target(plot_file, "--plot-file", IMAGE_SUFFIXES, force)
