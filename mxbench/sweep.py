"""Sweeps: shape presets, sweep points, token-group sizes, and the run that measures (or models) every point.

A sweep is a list of ``Point``s (the cross product of M, recipe and power limit for one N, K, G). For each point
``run_sweep`` times every stage of the recipe's training step, the bf16 baseline at the same point, and the
forward+backward of both autograd functions, and turns them into ``Record``s. Without a GPU, ``model_run`` turns
the same stages' declared costs into the analytic model's Records instead. Nothing here computes a cost.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import subprocess
import sys
import tomllib
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from mxkernels.runtime import MAX_GROUPS, InputError

from . import __version__
from .results import Point, Record, Run, save_run

REPO_ROOT = Path(__file__).resolve().parent.parent
SHAPES_DIR = REPO_ROOT / "shapes"
BLOCK = 32  # K and N must hold whole MX blocks
GROUP_KINDS = ("balanced", "skewed")
MODES = ("rceil", "floor")
# Concentration of the skewed (router-like) split: Dirichlet(0.5) over experts gives the heavy few and the idle
# many of an imperfectly balanced router (the largest of 8 groups typically holds 2-4x the balanced share).
SKEW_ALPHA = 0.5
SKEW_METHOD = f"dirichlet(alpha={SKEW_ALPHA}) from numpy.random.default_rng(seed), largest-remainder rounding"
BASELINE = "bf16"


# ---------------------------------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class Preset:
    """A model's MoE shapes: K = model dim, N = expert hidden dim, and a default G (local experts).

    ``keys`` maps each field to the config.json key it was read from, at ``source``.
    """

    name: str
    model: str
    source: str
    K: int
    N: int
    experts: int
    top_k: int
    G: int
    G_reason: str
    keys: dict[str, str]


PRESET_FIELDS = ("K", "N", "experts", "top_k")


def _read_preset(path: Path) -> Preset:
    try:
        d = tomllib.loads(path.read_text())
        values = {f: int(d[f]["value"]) for f in (*PRESET_FIELDS, "G")}
        keys = {f: str(d[f]["key"]) for f in PRESET_FIELDS}
        preset = Preset(d["name"], d["model"], d["source"], G_reason=str(d["G"]["reason"]), keys=keys, **values)
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"{path}: not a valid shape preset ({type(e).__name__}: {e})") from None
    if preset.name != path.stem:
        raise InputError(f"{path}: name {preset.name!r} differs from the file name")
    try:
        check_shape(preset.N, preset.K, preset.G)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    return preset


def load_presets(directory: Path = SHAPES_DIR) -> dict[str, Preset]:
    """Every ``<name>.toml`` in ``directory`` (``shapes/`` at the repository root), by name."""
    return {p.stem: _read_preset(p) for p in sorted(Path(directory).glob("*.toml"))}


def get_preset(name: str, directory: Path = SHAPES_DIR) -> Preset:
    presets = load_presets(directory)
    if name not in presets:
        raise InputError(f"unknown preset {name!r}; valid presets: {', '.join(presets) or '(none found)'}")
    return presets[name]


# ---------------------------------------------------------------------------------------------- sweep points


def check_shape(N: int, K: int, G: int) -> None:
    for name, value in (("N", N), ("K", K)):
        if value <= 0 or value % BLOCK:
            raise InputError(f"{name} must be a positive multiple of {BLOCK}, got {value}")
    if not 1 <= G <= MAX_GROUPS:
        raise InputError(f"G must be between 1 and {MAX_GROUPS}, got {G}")


def _recipes() -> tuple[str, ...]:
    from mxkernels.pipeline import RECIPES

    return RECIPES


def plan_points(
    Ms: Sequence[int],
    N: int,
    K: int,
    G: int,
    recipes: Sequence[str] = ("mxfp8",),
    mode: str = "rceil",
    groups: str = "balanced",
    seed: int = 0,
    power_limits: Sequence[float | None] = (None,),
) -> list[Point]:
    """The cross product power limit x M x recipe (in that nesting, so each limit is applied once).

    ``power_limits`` in watts; None means the card's limit as found. Duplicates are dropped, order kept.
    """
    check_shape(N, K, G)
    if not Ms or any(not isinstance(M, int) or M <= 0 for M in Ms):
        raise InputError(f"M must be one or more positive integers, got {list(Ms)}")
    known = _recipes()
    if not recipes or any(r not in known for r in recipes):
        raise InputError(f"recipe must be one or more of {', '.join(known)}; got {list(recipes)}")
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    if groups not in GROUP_KINDS:
        raise InputError(f"groups must be one of {', '.join(GROUP_KINDS)}; got {groups!r}")
    if not power_limits or any(w is not None and w <= 0 for w in power_limits):
        raise InputError(f"power limits must be positive watts or None, got {list(power_limits)}")
    points = [
        Point(M, N, K, G, recipe, mode, groups, seed, None if w is None else float(w))
        for w in power_limits
        for M in Ms
        for recipe in recipes
    ]
    return list(dict.fromkeys(points))


def group_sizes(M: int, G: int, kind: str = "balanced", seed: int = 0, alignment: int | None = None) -> list[int]:
    """Rows of each of the G token groups; they sum to exactly M.

    balanced: M split evenly, the remainder spread one row (or one ``alignment`` unit) over the first groups.
    skewed: router-like, Dirichlet(``SKEW_ALPHA``) shares drawn from ``seed``; some groups may be small or empty.
    ``alignment``: every size a multiple of it (M must be one).
    """
    if M < 0:
        raise InputError(f"M must be non-negative, got {M}")
    if not 1 <= G <= MAX_GROUPS:
        raise InputError(f"G must be between 1 and {MAX_GROUPS}, got {G}")
    unit = alignment or 1
    if unit < 1 or M % unit:
        raise InputError(f"alignment {alignment} must be a positive divisor of M={M}")
    units = M // unit
    if kind == "balanced":
        base, extra = divmod(units, G)
        sizes = [base + (g < extra) for g in range(G)]
    elif kind == "skewed":
        import numpy as np

        shares = np.random.default_rng(seed).dirichlet(np.full(G, SKEW_ALPHA))
        sizes = _largest_remainder([float(s) * units for s in shares], units)
    else:
        raise InputError(f"groups must be one of {', '.join(GROUP_KINDS)}; got {kind!r}")
    return [s * unit for s in sizes]


def _largest_remainder(quotas: Sequence[float], total: int) -> list[int]:
    """Integers summing to ``total``, each the floor of its quota, the leftover units to the largest fractions."""
    sizes = [int(q) for q in quotas]
    by_fraction = sorted(range(len(quotas)), key=lambda g: (sizes[g] - quotas[g], g))
    for g in by_fraction[: total - sum(sizes)]:
        sizes[g] += 1
    return sizes


def point_group_sizes(point: Point) -> list[int]:
    return group_sizes(point.M, point.G, point.groups, point.seed)


def with_baselines(points: Iterable[Point]) -> list[Point]:
    """``points`` with the bf16 point at the same shape after each other recipe's point, each point once."""
    out: dict[Point, None] = {}
    for p in points:
        out[p] = None
        out[dataclasses.replace(p, recipe=BASELINE)] = None
    return list(out)


# ----------------------------------------------------------------------------------------------- measurement


@dataclass(frozen=True)
class SweepOptions:
    """How ``run_sweep`` measures, and what it records beside the measurements.

    ``out``: results file, rewritten after every point so an interrupted sweep keeps what it measured.
    """

    cold_l2: bool = True
    use_graph: bool = True
    samples: int = 25
    device: int = 0
    backend: str | None = None
    out: Path | None = None
    results_dir: Path = Path("results")
    hardware: str | None = "b200"
    denominator: str = "datasheet"
    command: str = ""

    def timing(self) -> dict[str, Any]:
        return {"cold_l2": self.cold_l2, "use_graph": self.use_graph, "samples": self.samples}


@dataclass
class Instruments:
    """Everything ``run_sweep`` measures with. ``Instruments.real()`` binds the GPU implementations; tests pass
    fakes. ``power`` is a ``PowerController``, made on first use (only when a point asks for a limit)."""

    plan_step: Callable[..., list]
    build_step: Callable[..., list]
    end_to_end: Callable[..., Callable[[], object]]
    time_fn: Callable[..., Any]
    telemetry: Callable[[], Any]
    snapshot: Callable[[], dict]
    device_properties: Callable[[], dict]
    ceilings: Callable[[str], Any]
    release: Callable[[], None]
    power: Any = None
    make_power: Callable[[], Any] | None = None

    def controller(self):
        if self.power is None:
            self.power = self.make_power()
        return self.power

    @classmethod
    def real(cls, device: int = 0, results_dir: Path = Path("results"), power=None) -> Instruments:
        import torch
        from mxkernels import pipeline

        from . import ceilings, hardware
        from . import power as nvml_power
        from .timing import time_fn

        def release():
            gc.collect()
            torch.cuda.empty_cache()

        return cls(
            plan_step=pipeline.plan_step,
            build_step=pipeline.build_step,
            end_to_end=pipeline.end_to_end,
            time_fn=time_fn,
            telemetry=lambda: nvml_power.TelemetrySampler(device),
            snapshot=lambda: nvml_power.snapshot(device),
            device_properties=lambda: hardware.device_properties(device),
            ceilings=lambda card: ceilings.load_ceilings(results_dir, card),
            release=release,
            power=power,
            make_power=lambda: nvml_power.PowerController(device),
        )


def error_message(e: BaseException) -> str:
    """One line for an error row: the exception and where it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}{at}"


def _cost_fields(stage) -> dict[str, Any]:
    c = stage.cost
    return {"bytes_read": c.bytes_read, "bytes_written": c.bytes_written, "flops": c.flops, "precision": c.precision}


def stage_record(point: Point, stage, **fields) -> Record:
    """A Record of ``stage`` at ``point`` with the stage's own cost (copied, never recomputed) and ``fields``."""
    return Record(
        point=point, pass_name=stage.pass_name, stage=stage.name, kernel=stage.kernel, category=stage.category,
        purpose=stage.purpose, shape=str(stage.shape), backend=stage.backend, **_cost_fields(stage), **fields,
    )  # fmt: skip


def _timed_fields(t, telemetry: dict) -> dict[str, Any]:
    """Record fields of a ``Timing``: its samples and method; how it was taken goes beside the telemetry
    (``window_includes_flush``: whether the energy per call counts the cold-L2 flush before each call)."""
    details = {
        "calls_per_replay": t.calls_per_replay, "flush_us": t.flush_us, "kernels_per_call": t.kernels_per_call,
        "memcpy_nodes": t.memcpy_nodes, "memset_nodes": t.memset_nodes,
        "window_includes_flush": t.window_includes_flush,
    }  # fmt: skip
    return {"method": t.method, "samples_us": list(t.samples_us), "telemetry": {**telemetry, **details}}


@dataclass
class _EndToEnd:
    """The forward+backward of a recipe's autograd function as a pseudo-stage. Its cost is the sum of the costs
    its stages declare (zero when they could not be planned)."""

    recipe: str
    shape: str
    cost: Any
    pass_name: str = "end_to_end"
    name: str = "fwd+bwd"
    category: str = "end_to_end"
    backend: str | None = None

    @property
    def kernel(self) -> str:
        return f"{self.recipe} autograd (forward + backward)"

    @property
    def purpose(self) -> str:
        return f"One forward + backward of the {self.recipe} grouped GEMM autograd function"


def _end_to_end_stage(point: Point, stages: Sequence) -> _EndToEnd:
    from mxkernels.cost import Cost

    total = sum((s.cost for s in stages), Cost(0, 0))
    return _EndToEnd(point.recipe, f"({point.M}, {point.K}) @ ({point.G}, {point.K}, {point.N})", total)


class StageTimer:
    """Times stages with the options and instruments of one run and turns each into its Record."""

    def __init__(self, options: SweepOptions, ins: Instruments):
        self.options, self.ins = options, ins

    def time(
        self, point: Point, stage, fn: Callable[[], object], *, use_graph: bool | None = None, eager_fallback=False
    ) -> Record:
        """``fn`` timed with a telemetry sampler as the timer's ``window``, so the sampler sees only ``fn``'s timed
        replays (not warm-up, estimate, capture or flush-only replays) and energy per call = energy over the window
        / (replays x calls per replay). An exception becomes the record's error.

        ``use_graph`` overrides the options' for callables a CUDA graph cannot capture (host syncs). With
        ``eager_fallback`` a callable that fails under graph timing is timed again with eager events (its
        ``method`` says so and ``telemetry["graph_error"]`` why).
        """
        o = self.options
        graph = o.use_graph if use_graph is None else use_graph
        cold = o.cold_l2 or not graph  # eager event timing flushes before every call: it is always cold
        try:
            sampler = self.ins.telemetry()
            t = self.ins.time_fn(fn, cold_l2=cold, use_graph=graph, samples=o.samples, window=lambda: sampler)
            calls = len(t.samples_us) * t.calls_per_replay
            return stage_record(point, stage, **_timed_fields(t, dict(sampler.summary(calls))))
        except Exception as e:  # a kernel that fails becomes its error row; the rest of the point goes on
            if eager_fallback and graph:
                eager = self.time(point, stage, fn, use_graph=False)
                if eager.ok:
                    eager.telemetry["graph_error"] = error_message(e)
                    return eager
            return stage_record(point, stage, error=error_message(e))

    def measure(self, point: Point) -> list[Record]:
        """Every stage of ``point`` timed alone, then its forward+backward; failures become error rows."""
        sizes = point_group_sizes(point)
        args = (point.recipe, point.M, point.N, point.K, point.G, sizes)
        kw = {"mode": point.mode, "backend": None if point.recipe == BASELINE else self.options.backend}
        device = {"device": f"cuda:{self.options.device}", "seed": point.seed}
        try:
            planned = self.ins.plan_step(*args, **kw)
        except Exception as e:
            return [stage_record(point, _end_to_end_stage(point, []), error=error_message(e))]
        records = []
        try:
            stages = self.ins.build_step(*args, **kw, **device)
            records += [self.time(point, s, s.run) for s in stages]
        except Exception as e:
            records += [stage_record(point, s, error=error_message(e)) for s in planned]
        stages = None  # drop the tensors before the end-to-end call allocates its own
        e2e = _end_to_end_stage(point, planned)
        try:
            step = self.ins.end_to_end(*args, **kw, **device)
            records.append(self.time(point, e2e, step, eager_fallback=True))
        except Exception as e:
            records.append(stage_record(point, e2e, error=error_message(e)))
        return records


def _by_power_limit(points: Sequence[Point]) -> dict[float | None, list[Point]]:
    groups: dict[float | None, list[Point]] = {}
    for p in points:
        groups.setdefault(p.power_limit_w, []).append(p)
    return groups


class _Progress:
    """A click progress bar over the points on a terminal; one plain line per point otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done = total, enabled, 0
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = click.progressbar(
                length=total, label="sweep", file=sys.stderr, item_show_func=lambda p: p.label() if p else ""
            )

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def start(self, point: Point) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.current_item = point
            self.bar.render_progress()
        elif self.enabled:
            click.echo(f"[{self.done}/{self.total}] {point.label()}", err=True)

    def finish(self, point: Point) -> None:
        if self.bar is not None:
            self.bar.update(1, point)


def run_sweep(
    points: Sequence[Point], *, options: SweepOptions, progress: bool = True, instruments: Instruments | None = None
) -> Run:
    """Measure every point (plus its bf16 baseline) and return the Run; see the module docstring.

    Points are grouped by power limit and each limit is applied once through ``PowerController.applied`` (a None
    limit is never touched). After each point GPU memory is released and, with ``options.out``, the Run saved.
    Ctrl-C stops the sweep: the limit is restored, the partial Run saved and returned with
    ``meta["interrupted"] = True``.
    """
    ins = instruments or Instruments.real(options.device, options.results_dir)
    work = with_baselines(points)
    run = Run(meta=run_metadata(work, options, ins))
    timer = StageTimer(options, ins)
    try:
        with _Progress(len(work), progress) as bar:
            for limit, group in _by_power_limit(work).items():
                with nullcontext() if limit is None else ins.controller().applied(limit):
                    run.meta.setdefault("power_snapshots", []).append({"requested_w": limit, **ins.snapshot()})
                    for point in group:
                        bar.start(point)
                        run.records += timer.measure(point)
                        ins.release()
                        _save(run, options.out)
                        bar.finish(point)
    except KeyboardInterrupt:
        run.meta["interrupted"] = True
    run.meta["finished"] = _now()
    _save(run, options.out)
    return run


def _save(run: Run, out: Path | None) -> None:
    if out is not None:
        save_run(run, out)


# ---------------------------------------------------------------------------------------------- the model


def model_run(
    points: Sequence[Point],
    *,
    spec,
    hardware: str,
    command: str = "",
    plan_step: Callable[..., list] | None = None,
    model_records: Callable[..., list[Record]] | None = None,
) -> Run:
    """The analytic model of every point (plus its bf16 baseline): the stages' declared costs over ``spec``.

    Records carry ``measured=False``; the Run's meta says "model, not measured".
    """
    if plan_step is None:
        from mxkernels.pipeline import plan_step
    if model_records is None:
        from .roofline import model_records
    work = with_baselines(points)
    run = Run(meta={**_common_metadata(work, command), "hardware": hardware, "measured": False,
                    "label": "model, not measured"})  # fmt: skip
    for p in work:
        try:
            stages = plan_step(p.recipe, p.M, p.N, p.K, p.G, point_group_sizes(p), mode=p.mode)
            run.records += model_records(p, stages, spec)
        except Exception as e:
            run.records.append(stage_record(p, _end_to_end_stage(p, []), measured=False, error=error_message(e)))
    return run


# --------------------------------------------------------------------------------------------- metadata


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def git_commit() -> str | None:
    """The repository's HEAD commit (with "+dirty" when tracked files changed); without a git checkout (a copy of
    the tree shipped to a GPU machine) the ``MXBENCH_GIT_COMMIT`` environment variable names it; else None."""
    try:
        sha = _git("rev-parse", "HEAD")
        return sha + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("MXBENCH_GIT_COMMIT") or None


def _versions() -> dict[str, Any]:
    import torch
    import triton

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "mxbench": __version__, "git_commit": git_commit(), "python": sys.version.split()[0]}  # fmt: skip


def _common_metadata(points: Sequence[Point], command: str) -> dict[str, Any]:
    """What any run records: versions, date, command line, seeds and the token-group sizes of every point."""
    sizes = {(p.M, p.G, p.groups, p.seed): None for p in points}
    return {
        "date": _now(),
        "command": command or " ".join(sys.argv),
        **_versions(),
        "seeds": sorted({p.seed for p in points}),
        "group_sizes_method": {"balanced": "even split, remainder over the first groups", "skewed": SKEW_METHOD},
        "group_sizes": [
            {"M": M, "G": G, "groups": kind, "seed": seed, "sizes": group_sizes(M, G, kind, seed)}
            for M, G, kind, seed in sizes
        ],
    }


def run_metadata(points: Sequence[Point], options: SweepOptions, ins: Instruments) -> dict[str, Any]:
    """Metadata of a measured run: the common part plus the card, its clocks and limits, and the options."""
    props = dict(ins.device_properties())
    card = str(props.get("name") or "unknown")
    nvml = dict(ins.snapshot())
    return {
        "card": card,
        "uuid": props.get("uuid"),
        "driver": nvml.get("driver_version"),
        "device_properties": props,
        **_common_metadata(points, options.command),
        "nvml": nvml,
        "timing": options.timing(),
        "backend": options.backend,
        "hardware": options.hardware,
        "denominator": options.denominator,
        "ceilings": _plain(ins.ceilings(card)),
        "measured": True,
    }


def _plain(value: Any) -> Any:
    """JSON-ready form of a dataclass (or None / a plain value)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
