"""One worker of ``mxbench ep``: join the run, check or measure every strategy, write the run (rank 0), leave.

Every rank runs the same sequence (the collectives need it); only rank 0 prints, gathers and writes. Whatever
happens, the worker leaves through ``dist.leave``: explicit, bounded teardown.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import click
from mxkernels.core.runtime import InputError

from ...implementations.registry import parse_impl
from ...instruments.guarded import one_line
from ...instruments.hardware import card_slug
from ...measuring.dist import Context, gather, init, leave
from ...storage.results import Run, save_run
from ...views.render import render
from .check import EPOptions, run_check
from .inputs import ROUTING_METHOD, routing
from .topology import Topology, annotate_records, my_place


@dataclass(frozen=True)
class MeasureOptions:
    samples: int
    graph: bool
    out: Path | None
    results_dir: Path
    plot_file: Path | None
    label: str
    command: str


def run_worker(strategies: Sequence[str], o: EPOptions, impl_texts: Sequence[str], *, check: bool,
               measure: MeasureOptions, echo: Callable[[str], None] = click.echo) -> int:  # fmt: skip
    """The worker's exit code: 0 pass (or measured), 1 a check failed. Bad input raises ``InputError``."""
    from mxkernels.stages.ep_layer import get_ep_layer_spec
    from mxkernels.stages.ep_stages import get_ep_spec

    spec_of = get_ep_spec if o.layer is None else get_ep_layer_spec
    impls = [_reporting(parse_impl(t, "bf16", spec_of), t) for t in impl_texts]
    ctx, code = None, 1
    try:
        ctx = init()
        if check:
            code = run_check(ctx, strategies, o, impls, echo=echo)
            _record_check_topology(ctx, strategies, o, measure.out, echo)
        else:
            code = _measure(ctx, strategies, o, impls, measure, echo)
    except (StageFailure, KeyboardInterrupt) as e:
        where = f"rank {ctx.rank}" if ctx is not None else f"rank {os.environ.get('RANK', 0)}"
        interrupted = isinstance(e, KeyboardInterrupt)
        _report(f"{where}: interrupted" if interrupted else f"{where}: {e}")
        # no teardown: the other ranks may wait in a collective for this one; torchrun (or its death) stops them
        os._exit(130 if interrupted else 1)
    finally:
        code = leave(ctx, code)
    return code


class StageFailure(Exception):
    """An ``--impl`` raised inside the pipeline (its message names the stage, the implementation and the error)."""


def _reporting(impl, text: str):
    """``impl`` whose exceptions become one ``StageFailure`` line (not a traceback on every rank)."""
    fn, label = impl.fn, f"{impl.recipe}/{impl.stage} (--impl {text})"

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 -- the implementation under test raised: say which, once
            raise StageFailure(f"{label} raised {one_line(e)}") from e

    return replace(impl, fn=call)


def _report(line: str) -> None:
    """The worker's one line: into the launcher's reports folder (``launch`` prints the first once), else stderr."""
    folder = os.environ.get("MXBENCH_EP_REPORTS")
    if folder:
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(folder, f"rank{rank}"), "w") as f:
            f.write(line)
    else:
        print(line, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()


def _quiet(_: str) -> None:
    pass


def _measure(ctx: Context, strategies, o: EPOptions, impls, m: MeasureOptions, echo) -> int:
    from ...instruments.ceiling_store import load_ceilings
    from ...measuring.metadata import implementation_modules
    from ...instruments.provenance import implementations_meta
    from .ceiling import load_alltoall_ceiling
    from .measure import measure_strategy
    from .metadata import ep_metadata, rank_info
    from .tables import ep_header, ep_peaks, ep_rows, summary_rows

    if ctx.device.type != "cuda":
        raise InputError("no CUDA GPU: timing needs a GPU per rank (NCCL); `mxbench ep --check` runs on CPUs")
    ranks = gather(ctx, rank_info(ctx))
    counts = gather(ctx, _send_counts(ctx, o))
    places = gather(ctx, my_place(ctx.rank))
    progress = (lambda text: click.echo(f"[rank 0] {text}", err=True)) if ctx.root else _quiet
    records = []
    for strategy in strategies:
        found = measure_strategy(ctx, strategy, o, graph=m.graph, samples=m.samples, impls=impls, progress=progress)
        records += found or []
    if not ctx.root:
        return 0
    layer = {"tokens_per_rank": o.T, "K": o.K, "N": o.N, "experts_per_rank": o.E, "top_k": o.top_k, "mode": o.mode,
             "backend": o.backend, **layer_meta(strategies, o)}  # fmt: skip
    routing = {"groups": o.groups, "seed": o.seed, "method": ROUTING_METHOD[o.groups], "send_counts": counts}
    timing = {"samples": m.samples, "method": "graph-cold per record (events-cold where a collective could not be "
              "captured: the record's method says which)", "requested": "graph" if m.graph else "events"}  # fmt: skip
    meta = ep_metadata(ctx, ranks, layer, routing, list(strategies), timing, m.command)
    topo = Topology(tuple(places))
    meta["nodes"] = topo.to_meta()  # which ranks share a node: the link class of every all-to-all byte
    annotate_records(records, topo, counts)
    meta["implementations"] = implementations_meta(implementation_modules(impls))  # the code each record names
    stored = load_ceilings(m.results_dir, meta["card"])
    meta["ceilings"] = asdict(stored) if stored is not None else None
    meta["alltoall_ceiling"] = load_alltoall_ceiling(m.results_dir, meta["card"], ctx.world)
    run = Run(meta, records)
    what = "ep" if o.layer is None else "ep-layer"
    out = m.out or m.results_dir / card_slug(meta["card"]) / f"{what}-{m.label}-{o.groups}-ep{ctx.world}-{_stamp()}.json"
    json_path, _ = save_run(run, out)
    peaks = ep_peaks(run)
    echo(ep_header(run, peaks, "plain"))
    echo(render(summary_rows(run, peaks=peaks), "plain"))
    echo(render(ep_rows(run, peaks=peaks), "plain"))
    echo(f"wrote {json_path}")
    if m.plot_file is not None:
        from .figure import plot_ep

        echo(f"wrote {plot_ep(run, m.plot_file)}")
    return 0


def layer_meta(strategies: Sequence[str], o: EPOptions) -> dict:
    """What the run ran beyond the sizes: the part (projection or whole layer), each strategy's resolved wgrad
    precision, and the layer's router and shared-expert options."""
    from mxkernels.ep.wgrad import resolve_wgrad

    from .workload import workload

    meta = {"part": workload(o).part.value, "wgrad": {s: resolve_wgrad(s, o.wgrad).value for s in strategies}}
    if o.layer is not None:
        meta.update(score_func=o.layer.score_func, score_before=o.layer.score_before, shared_experts=o.layer.shared,
                    shared_in_recipe=o.layer.shared_in_recipe, overlap=o.layer.overlap)
    return meta


def _record_check_topology(ctx: Context, strategies, o: EPOptions, out: Path | None, echo) -> None:
    """After ``--check``: rank 0 prints the run's nodes and each all-to-all's bytes per link class, and writes them
    to ``out`` when given (the record CI reads to see a multi-node run placed and split as it should be)."""
    from .topology import check_record, describe, link_rows

    places, counts = gather(ctx, my_place(ctx.rank)), gather(ctx, _send_counts(ctx, o))
    if not ctx.root:
        return
    topo = Topology(tuple(places))
    echo(describe(topo))
    record = check_record(topo, counts, strategies, o)
    echo(render(link_rows(record), "plain"))
    if out is not None:
        from ...storage.marks import Output
        from ...storage.writing import write_output

        # the one write path: atomic, a record's predecessor kept and named, anything else refused without --force
        write_output(out, json.dumps(record, indent=1) + "\n", Output.TEXT)
        echo(f"wrote {out}")


def _send_counts(ctx: Context, o: EPOptions) -> list[list[int]]:
    """This rank's copies per (rank, local expert), for the metadata."""
    from mxkernels.moe.token_permute import route

    experts = routing(o.T, o.top_k, ctx.world * o.E, o.groups, o.seed, ctx.rank)
    return route(experts, ctx.world * o.E)["counts"].view(ctx.world, o.E).tolist()


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
