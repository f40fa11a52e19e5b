"""Peers: every registered implementation of the MXFP8 step's data-movement stages, timed side by side.

The same machinery as ``roofline`` with several implementations per stage: every quantize, rearrange and pad stage
of the MXFP8 training step at one shape (M, N, K, G) runs on the same input tensors (one eager run of the step, as
``build_step`` does) for each implementation the registry has for it (mxkernels, torchao, ``torch.compile`` of the
references, and any third party's), timed the same way (``time_fn``: CUDA-graph replays, cold L2 by default). An
implementation a graph cannot capture (it reads offsets on the host) is timed with eager events and its record's
``method`` says so; one that cannot run here is a skipped row with its reason.

One record per (stage, implementation), ``impl`` naming the implementation and ``kernel`` what it ran. The cost is
the stage's, the same for every implementation (they compute the same outputs). Implementations run one after the
other over all stages (ours first), so one that breaks the CUDA context cannot cost us the others' rows.
"""

from __future__ import annotations

from dataclasses import replace

import click
from mxkernels.core.names import MEMORY_CATEGORIES, Category, Recipe

from ...implementations.builtin import COMPILED, TORCHAO, torchao_version
from ...implementations.default import default_registry
from ...implementations.registry import OURS, Registry
from ...instruments.kit import Instruments
from ...instruments.provenance import implementations_meta
from ...measuring.metadata import implementation_modules, run_metadata
from ...measuring.fresh import SECOND_SEED, FreshInputs
from ...measuring.stages import StageTimer, SweepOptions, error_message, stage_record
from ...plan.points import point_group_sizes
from ...storage.results import Point, Record, Run, save_run

BUILTIN_COLUMNS = (OURS, TORCHAO, COMPILED)
"""Columns of the peers table that are always shown (an implementation not installed shows empty cells)."""
RECIPE = Recipe.MXFP8


def _steps(pipeline, point: Point) -> list[tuple[list, list]]:
    """(step, its stages to compare) pairs; each step runs once eagerly to make the stages' inputs. The first is
    the step itself; when its groups are aligned (nothing to pad) the padded step follows for its pad and unpad
    stages, which a router's groups need."""
    plan = pipeline.plan_step(RECIPE, point.M, point.N, point.K, point.G, point_group_sizes(point), mode=point.mode)
    pairs = [(plan, [s for s in plan if s.category in MEMORY_CATEGORIES])]
    if not any(s.category == Category.PAD for s in plan):
        padded = pipeline.step_stages(RECIPE, point.M, point.N, point.K, point.G, mode=point.mode, pad=True)
        pairs.append((padded, [s for s in padded if s.category == Category.PAD]))
    return pairs


def run_peers(
    M: int,
    N: int,
    K: int,
    G: int,
    *,
    mode: str = "rceil",
    groups: str = "balanced",
    seed: int = 0,
    options: SweepOptions,
    instruments: Instruments | None = None,
    registry: Registry | None = None,
    progress: bool = True,
    pipeline=None,
    share: tuple[int, int] = (0, 1),
    meta: dict | None = None,
) -> Run:
    """Time every data-movement stage of the MXFP8 step at (M, N, K, G) for each registered implementation; see
    the module docstring. With ``options.out`` the Run is saved after each step's stages. Ctrl-C stops it: the
    partial Run is saved and returned with ``meta["interrupted"] = True``. ``instruments``, ``registry`` and
    ``pipeline`` (``mxkernels.stages.pipeline``) are injectable for tests.

    ``share`` (rank, world): of the (stage, implementation) pairs in the order they are timed, only those whose
    index is ``rank`` modulo ``world`` (one rank of a sharded run, ``shard.sharded_peers``); ``meta`` is added
    to the Run's metadata.
    """
    if pipeline is None:
        from mxkernels.stages import pipeline
    ins = instruments or Instruments.real(options.device, options.results_dir)
    registry = registry or default_registry()
    point = Point(M, N, K, G, RECIPE, mode, groups, seed)
    timer = StageTimer(options, ins)
    device = f"cuda:{options.device}"
    names = registry.names()
    torchao = torchao_version() or "not installed (pip install mxbench[peers])"
    # every registered implementation may time a stage here: each one's code is recorded, not ours alone
    run_meta = run_metadata([point], options, ins)
    run_meta["implementations"] = implementations_meta(implementation_modules(registry))
    run = Run(meta={**run_meta, "kind": "peers", "torchao": torchao, **(meta or {})})
    rank, world = share
    first = 0  # index of the step's first pair among all the steps' pairs
    try:
        for step, stages in _steps(pipeline, point):
            pairs = _pairs(registry, names, stages)
            mine = [pair for i, pair in enumerate(pairs, first) if i % world == rank]
            first += len(pairs)
            if mine:
                _time_step(pipeline, point, step, mine, timer, device, progress, into=run.records)
                ins.release()
                if options.out is not None:
                    save_run(run, options.out)
    except KeyboardInterrupt:
        run.meta["interrupted"] = True
        if options.out is not None:
            save_run(run, options.out)
    return run


def _pairs(registry: Registry, names: list[str], stages: list) -> list[tuple]:
    """(stage, implementation) in the order they are timed: implementation by implementation (ours first), so one
    that breaks the CUDA context cannot cost the others their rows."""
    pairs = []
    for name in names:
        for stage in stages:
            impl = next((i for i in registry.of(RECIPE, stage.name) if i.name == name), None)
            if impl is not None:
                pairs.append((stage, impl))
    return pairs


def _time_step(pipeline, point: Point, step: list, pairs: list[tuple], timer: StageTimer, device: str,
               progress: bool, into: list[Record]) -> None:  # fmt: skip
    """One record per (stage, implementation) of ``pairs`` appended to ``into`` as it is taken (Ctrl-C keeps
    those already taken), all on the inputs one eager run of ``step`` made."""
    try:
        inputs = pipeline.make_inputs(point.M, point.N, point.K, point.G, point_group_sizes(point), device=device,
                                      seed=point.seed)  # fmt: skip
        env = pipeline.run_stages(step, inputs)
        second = None
        if timer.ins.step_env is not None:  # the second input values the timed calls alternate with (fresh.py)
            second = timer.ins.step_env(step, point.M, point.N, point.K, point.G, point_group_sizes(point),
                                        device=device, seed=point.seed + SECOND_SEED)  # fmt: skip
    except Exception as e:  # noqa: BLE001 -- no inputs for these stages: every implementation's row says why
        message = f"making the stage inputs failed: {error_message(e)}"
        into += [stage_record(point, replace(s, impl=i.name, kernel=i.kernel), error=message) for s, i in pairs]
        return
    for stage, impl in pairs:
        if progress:
            click.echo(f"[peers] {impl.name}: {stage.pass_name}/{stage.name} {stage.shape}", err=True)
        values = None if second is None else tuple(second[n] for n in stage.inputs)
        into.append(_time_one(timer, point, stage, impl, [env[n] for n in stage.inputs], device, values))


def _time_one(timer: StageTimer, point: Point, stage, impl, inputs: list, device: str, second=None) -> Record:
    """One implementation of one stage: timed, skipped (cannot run here) or an error row (cannot be set up).
    ``second``: other values for ``inputs`` between the timed calls (``measuring.fresh``); not for an
    implementation with a ``prepare``, which may read copies of its inputs that it made once."""
    tagged = replace(stage, impl=impl.name, kernel=impl.kernel, backend=None)
    reason = impl.unavailable(device)
    if reason is not None:
        return stage_record(point, tagged, skipped=reason)
    try:
        fn = impl.bind(inputs, stage.params)
    except Exception as e:  # noqa: BLE001 -- an implementation that cannot be set up is its error row
        return stage_record(point, tagged, error=error_message(e))
    fresh = None
    if second is not None and impl.prepare is None:
        fresh = FreshInputs(tagged, tuple(inputs), second, impl.deviation)
    return timer.time(point, tagged, fn, use_graph=None if impl.graph_safe else False, fresh=fresh)
