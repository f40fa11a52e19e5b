"""Peers: our data-movement kernels beside torchao's Triton kernels and torch.compile of our plain-torch references.

Every quantize, rearrange and pad stage of the MXFP8 training step at one shape (M, N, K, G) runs on the same
input tensors (one eager run of the step, as ``build_step`` does) for each implementation, timed the same way
(``time_fn``: CUDA-graph replays, cold L2 by default). References that read ``offs`` on the host cannot be
captured in a graph; they are timed with eager events and their ``method`` says so.

Records are stored like any run's. One record per (stage, implementation): ``backend`` names the implementation
("mxkernels", "torchao", "torch.compile"), ``kernel`` the function that ran, and ``stage`` is
"<pipeline stage>/<implementation>" so every record has its own key when runs are compared. The cost is the
pipeline stage's, the same for every implementation (they produce the same outputs).

torchao is optional (``pip install mxbench[peers]``), imported on use; a torchao function that is missing or
fails gives an error row, never a failed run. Implementations run one after the other over all stages (ours
first), so a peer that breaks the CUDA context cannot cost us our own rows.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import click
from mxkernels.format import quantize_reference

from .instruments import Instruments
from .measure import StageTimer, SweepOptions, error_message, stage_record
from .metadata import run_metadata
from .points import point_group_sizes
from .results import Point, Record, Run, save_run

IMPLS = ("mxkernels", "torchao", "torch.compile")
CATEGORIES = ("quantize", "rearrange", "pad")
RECIPE = "mxfp8"
_MX = "torchao.prototype.mx_formats.kernels"
_MOE = "torchao.prototype.moe_training.kernels.mxfp8"


@dataclass(frozen=True)
class Context:
    """What a peer needs besides the stage's input tensors."""

    M: int
    mode: str
    alignment: int


@dataclass(frozen=True)
class Peer:
    """Another implementation of a stage's op. ``bind(inputs, ctx)`` returns a zero-argument call on the stage's
    input tensors (everything that is not the op itself, such as scale offsets, is prepared there, untimed)."""

    impl: str
    kernel: str
    bind: Callable[[Sequence, Context], Callable[[], object]]
    graph_safe: bool = True


# ---------------------------------------------------------------------------------------------------- torchao


def _ao(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def _ao_quantizer(name: str):
    """torchao defines its Triton MXFP8 quantizers only on SM100 and newer (their RCEIL path uses an SM100-only
    instruction); elsewhere its stub asserts with a message about torch versions. Say what is really missing."""
    import torch

    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (10, 0):
        raise RuntimeError(f"torchao's {name} runs only on SM100+ (it is gated by is_sm_at_least_100)")
    return _ao(_MX, name)


def _ao_dim0(x, ctx: Context):
    f = _ao_quantizer("triton_to_mxfp8_dim0")
    return lambda: f(x, inner_block_size=32, scaling_mode=ctx.mode)


def _ao_dim1(x, ctx: Context):
    f = _ao_quantizer("triton_to_mxfp8_dim1")
    return lambda: f(x, inner_block_size=32, scaling_mode=ctx.mode)


def _experts_as_rows(w):
    """(G, N, K) weights as the (G*N, K) matrix torchao's 2D quantizers take (blocks never straddle experts:
    N is a multiple of 32)."""
    return w.reshape(-1, w.shape[-1])


def _ao_m_groups(scales, offs, ctx: Context):
    f = _ao(_MOE, "triton_mx_block_rearrange_2d_M_groups")
    return lambda: f(scales, offs)


def _ao_k_groups(scales, offs, ctx: Context):
    f = _ao(_MOE, "triton_mx_block_rearrange_2d_K_groups")
    scale_offs = offs // 32  # torchao takes group ends in scale columns
    return lambda: f(scales, scale_offs)


def _ao_3d(scales, ctx: Context):
    f = _ao(_MOE, "triton_mx_block_rearrange_per_group_3d")
    return lambda: f(scales)


# ------------------------------------------------------------------------------------ plain-torch references


def _quantize_dim1_reference(x, mode):
    return quantize_reference(x.t().contiguous(), mode)


def _quantize_3d_n_reference(w, mode):
    return quantize_reference(w.transpose(1, 2).contiguous(), mode)


def _compiled(resolve: Callable[[], Callable], *extra: Callable[[Context], object]):
    """Binder of ``torch.compile(resolve())`` on the stage inputs plus ``extra`` values taken from the context."""

    def bind(inputs: Sequence, ctx: Context):
        import torch

        f = torch.compile(resolve())
        args = (*inputs, *(e(ctx) for e in extra))
        return lambda: f(*args)

    return bind


def _kernels(module: str, name: str) -> Callable[[], Callable]:
    return lambda: getattr(importlib.import_module(f"mxkernels.{module}"), name)


def _mode(ctx: Context) -> str:
    return ctx.mode


def _peers() -> dict[str, list[Peer]]:
    """Peers by the pipeline stage's ``kernel``."""
    compiled = "torch.compile"
    return {
        "quantize_dim0": [
            Peer("torchao", "triton_to_mxfp8_dim0", lambda i, c: _ao_dim0(i[0], c)),
            Peer(compiled, "quantize_reference", _compiled(lambda: quantize_reference, _mode)),
        ],
        "quantize_dim1": [
            Peer("torchao", "triton_to_mxfp8_dim1", lambda i, c: _ao_dim1(i[0], c)),
            Peer(compiled, "quantize_reference(x.t())", _compiled(lambda: _quantize_dim1_reference, _mode)),
        ],
        "quantize_3d(along=K)": [
            Peer("torchao", "triton_to_mxfp8_dim0 of (G*N, K)", lambda i, c: _ao_dim0(_experts_as_rows(i[0]), c)),
            Peer(compiled, "quantize_reference", _compiled(lambda: quantize_reference, _mode)),
        ],
        "quantize_3d(along=N)": [
            Peer("torchao", "triton_to_mxfp8_dim1 of (G*N, K)", lambda i, c: _ao_dim1(_experts_as_rows(i[0]), c)),
            Peer(compiled, "quantize_reference(w.transpose(1, 2))", _compiled(lambda: _quantize_3d_n_reference, _mode)),
        ],
        "rearrange_m_groups": [
            Peer("torchao", "triton_mx_block_rearrange_2d_M_groups", lambda i, c: _ao_m_groups(*i, c)),
            Peer(compiled, "rearrange_m_groups_reference",
                 _compiled(_kernels("layouts", "rearrange_m_groups_reference")), graph_safe=False),
        ],
        "rearrange_k_groups": [
            Peer("torchao", "triton_mx_block_rearrange_2d_K_groups", lambda i, c: _ao_k_groups(*i, c)),
            Peer(compiled, "rearrange_k_groups_reference",
                 _compiled(_kernels("layouts", "rearrange_k_groups_reference")), graph_safe=False),
        ],
        "rearrange_3d": [
            Peer("torchao", "triton_mx_block_rearrange_per_group_3d", lambda i, c: _ao_3d(i[0], c)),
            Peer(compiled, "rearrange_3d_reference", _compiled(_kernels("layouts", "rearrange_3d_reference"))),
        ],
        "pad_token_groups": [
            Peer(compiled, "pad_token_groups_reference",
                 _compiled(_kernels("padding", "pad_token_groups_reference"), lambda c: c.alignment), graph_safe=False),
        ],
        "unpad_token_groups": [
            Peer(compiled, "unpad_token_groups_reference",
                 _compiled(_kernels("padding", "unpad_token_groups_reference"), lambda c: c.M), graph_safe=False),
        ],
    }  # fmt: skip


# --------------------------------------------------------------------------------------------------------- run


def _torchao_status() -> str | None:
    """torchao's version, or None when it is not installed."""
    if importlib.util.find_spec("torchao") is None:
        return None
    try:
        return str(importlib.import_module("torchao").__version__)
    except Exception as e:  # noqa: BLE001 -- an installed but broken torchao still gets its (error) rows
        return f"import failed: {e}"


def _steps(pipeline, point: Point) -> list[tuple[list, list]]:
    """(step, its stages to compare) pairs; each step runs once eagerly to make the stages' inputs. The first is
    the step itself; when its groups are aligned (nothing to pad) the padded step follows for its pad and unpad
    stages, which a router's groups need."""
    plan = pipeline.plan_step(RECIPE, point.M, point.N, point.K, point.G, point_group_sizes(point), mode=point.mode)
    pairs = [(plan, [s for s in plan if s.category in CATEGORIES])]
    if not any(s.category == "pad" for s in plan):
        padded = pipeline.step_stages(RECIPE, point.M, point.N, point.K, point.G, mode=point.mode, pad=True)
        pairs.append((padded, [s for s in padded if s.category == "pad"]))
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
    progress: bool = True,
    pipeline=None,
) -> Run:
    """Time every data-movement stage of the MXFP8 step at (M, N, K, G) for each implementation; see the module
    docstring. With ``options.out`` the Run is saved after each step's stages. ``instruments`` and ``pipeline``
    (``mxkernels.pipeline``) are injectable for tests."""
    if pipeline is None:
        from mxkernels import pipeline
    ins = instruments or Instruments.real(options.device, options.results_dir)
    point = Point(M, N, K, G, RECIPE, mode, groups, seed)
    timer = StageTimer(options, ins)
    torchao = _torchao_status()
    run = Run(meta={**run_metadata([point], options, ins), "kind": "peers", "implementations": list(IMPLS),
                    "torchao": torchao or "not installed (pip install mxbench[peers])"})  # fmt: skip
    impls = [i for i in IMPLS if i != "torchao" or torchao is not None]
    peers = _peers()
    ctx = Context(M, mode, pipeline.ALIGNMENT[RECIPE])
    for step, stages in _steps(pipeline, point):
        try:
            inputs = pipeline.make_inputs(M, N, K, G, point_group_sizes(point), device=f"cuda:{options.device}",
                                          seed=seed)  # fmt: skip
            env = pipeline.run_stages(step, inputs)
        except Exception as e:  # noqa: BLE001 -- no inputs for these stages: every implementation's row says why
            message = f"making the stage inputs failed: {error_message(e)}"
            run.records += [stage_record(point, replace(s, name=f"{s.name}/{impl}", backend=impl), error=message)
                            for impl in impls for s in stages]  # fmt: skip
            continue
        for impl in impls:
            for stage in stages:
                if progress:
                    click.echo(f"[peers] {impl}: {stage.pass_name}/{stage.name} {stage.shape}", err=True)
                record = _time_one(timer, point, stage, impl, peers, [env[n] for n in stage.inputs], ctx)
                if record is not None:
                    run.records.append(record)
        env = inputs = None
        ins.release()
        if options.out is not None:
            save_run(run, options.out)
    return run


def _time_one(timer: StageTimer, point: Point, stage, impl: str, peers, inputs: list, ctx: Context) -> Record | None:
    """One implementation of one stage, or None when that implementation has no version of the op."""
    if impl == "mxkernels":
        return timer.time(point, replace(stage, name=f"{stage.name}/{impl}", backend=impl), lambda: stage.fn(*inputs))
    peer = next((p for p in peers.get(stage.kernel, []) if p.impl == impl), None)
    if peer is None:
        return None
    tagged = replace(stage, name=f"{stage.name}/{impl}", kernel=peer.kernel, backend=impl)
    try:
        fn = peer.bind(inputs, ctx)
    except Exception as e:  # noqa: BLE001 -- a peer that cannot be bound is its error row
        return stage_record(point, tagged, error=error_message(e))
    return timer.time(point, tagged, fn, use_graph=None if peer.graph_safe else False)


# ------------------------------------------------------------------------------------------------------- table


def peer_rows(run: Run, *, M: int | Sequence[int] | None = None) -> list[dict]:
    """One row per stage: each implementation's median time, our bandwidth, and best peer time / ours (> 1:
    ours is faster). Cells of an implementation that failed say "error"; absent ones are empty."""
    from .roofline import achieved_tbps
    from .tables import PASS_TITLES

    Ms = {M} if isinstance(M, int) else (set(M) if M else None)
    table: dict[tuple, dict[str, Record]] = {}
    for r in run.records:
        if r.backend in IMPLS and (Ms is None or r.point.M in Ms):
            key = (r.point, r.pass_name, r.stage.rsplit("/", 1)[0])
            table.setdefault(key, {})[r.backend] = r
    many_M = len({k[0].M for k in table}) > 1
    rows = []
    for (point, pass_name, stage), by_impl in table.items():
        any_record = next(iter(by_impl.values()))
        row = {"M": str(point.M)} if many_M else {}
        row.update({"Pass": PASS_TITLES.get(pass_name, pass_name), "Stage": stage, "Input shape": any_record.shape})
        for impl in IMPLS:
            r = by_impl.get(impl)
            row[f"{impl} (us)"] = None if r is None else (f"{r.median_us:.1f}" if r.ok else "error")
        ours = by_impl.get("mxkernels")
        peer_us = [r.median_us for i, r in by_impl.items() if i != "mxkernels" and r.ok]
        ok = ours is not None and ours.ok
        row["mxkernels GB/s"] = f"{achieved_tbps(ours.bytes, ours.median_us) * 1e3:.0f}" if ok else None
        row["Best peer / ours"] = f"{min(peer_us) / ours.median_us:.2f}x" if ok and peer_us else None
        rows.append(row)
    return rows
