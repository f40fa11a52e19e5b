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
from mxkernels.names import MEMORY_CATEGORIES, Category, Recipe

from .implementations import COMPILED, TORCHAO, torchao_version
from .instruments import Instruments
from .measure import StageTimer, SweepOptions, error_message, stage_record
from .metadata import implementation_modules, run_metadata
from .points import point_group_sizes
from .provenance import implementations_meta
from .registry import OURS, Registry, default_registry
from .results import Point, Record, Run, save_run

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
) -> Run:
    """Time every data-movement stage of the MXFP8 step at (M, N, K, G) for each registered implementation; see
    the module docstring. With ``options.out`` the Run is saved after each step's stages. ``instruments``,
    ``registry`` and ``pipeline`` (``mxkernels.pipeline``) are injectable for tests."""
    if pipeline is None:
        from mxkernels import pipeline
    ins = instruments or Instruments.real(options.device, options.results_dir)
    registry = registry or default_registry()
    point = Point(M, N, K, G, RECIPE, mode, groups, seed)
    timer = StageTimer(options, ins)
    device = f"cuda:{options.device}"
    names = registry.names()
    meta = run_metadata([point], options, ins)
    # every registered implementation may time a stage here: each one's code is recorded, not ours alone
    meta["implementations"] = implementations_meta(implementation_modules(registry))
    run = Run(meta={**meta, "kind": "peers", "torchao": torchao_version() or "not installed (pip install mxbench[peers])"})
    for step, stages in _steps(pipeline, point):
        try:
            inputs = pipeline.make_inputs(M, N, K, G, point_group_sizes(point), device=device, seed=seed)
            env = pipeline.run_stages(step, inputs)
        except Exception as e:  # noqa: BLE001 -- no inputs for these stages: every implementation's row says why
            message = f"making the stage inputs failed: {error_message(e)}"
            run.records += [stage_record(point, replace(s, impl=i.name, kernel=i.kernel), error=message)
                            for s in stages for i in registry.of(RECIPE, s.name)]  # fmt: skip
            continue
        for name in names:
            for stage in stages:
                impl = next((i for i in registry.of(RECIPE, stage.name) if i.name == name), None)
                if impl is None:
                    continue
                if progress:
                    click.echo(f"[peers] {name}: {stage.pass_name}/{stage.name} {stage.shape}", err=True)
                run.records.append(_time_one(timer, point, stage, impl, [env[n] for n in stage.inputs], device))
        env = inputs = None
        ins.release()
        if options.out is not None:
            save_run(run, options.out)
    return run


def _time_one(timer: StageTimer, point: Point, stage, impl, inputs: list, device: str) -> Record:
    """One implementation of one stage: timed, skipped (cannot run here) or an error row (cannot be set up)."""
    tagged = replace(stage, impl=impl.name, kernel=impl.kernel, backend=None)
    reason = impl.unavailable(device)
    if reason is not None:
        return stage_record(point, tagged, skipped=reason)
    try:
        fn = impl.bind(inputs, stage.params)
    except Exception as e:  # noqa: BLE001 -- an implementation that cannot be set up is its error row
        return stage_record(point, tagged, error=error_message(e))
    return timer.time(point, tagged, fn, use_graph=None if impl.graph_safe else False)
