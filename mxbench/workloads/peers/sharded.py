"""``mxbench peers`` over every GPU of a host: the (stage, implementation) pairs dealt round robin in the order they
are timed (``measuring.shard``'s module doc)."""

from __future__ import annotations

from dataclasses import replace

from ...implementations.default import default_registry
from ...instruments.kit import Instruments
from ...measuring.shard import exchange, gathered_meta, measure_share, session, tagged
from ...measuring.stages import SweepOptions
from ...storage.results import Run, save_run
from .measure import run_peers


def sharded_peers(M: int, N: int, K: int, G: int, *, options: SweepOptions, instruments: Instruments | None = None,
                  registry=None, progress: bool = True, **kwargs) -> Run | None:  # fmt: skip
    """``peers.run_peers`` over every rank's GPU, the (stage, implementation) pairs dealt round robin: the gathered
    Run on rank 0 (saved to ``options.out``), None on the other ranks. ``kwargs`` go to ``run_peers``."""
    ins = instruments or Instruments.real(options.device, options.results_dir)
    registry = registry or default_registry()
    plan = [(M, N, K, G, [kwargs.get(k) for k in ("mode", "groups", "seed")], registry.names())]
    with session(ins, plan=plan) as s:
        note = {"partial": f"rank 0's share of a sharded peers run over {s.world} GPUs until every rank's records "
                           "are gathered"}  # fmt: skip
        local = replace(options, out=options.out if s.root else None)
        run, payload = measure_share(s, lambda: run_peers(M, N, K, G, options=local, instruments=ins,
                                                           registry=registry, progress=progress and s.root,
                                                           share=(s.rank, s.world), meta=note, **kwargs))  # fmt: skip
        parts = exchange(s, payload)
        lists = tagged(s, parts)
        # pair i went to rank i % world as its (i // world)-th: deal them back in that order
        records = [lists[r][j] for j in range(max(map(len, lists))) for r in range(s.world) if j < len(lists[r])]
        gathered = Run(gathered_meta(s, run.meta, parts, 0), records)
        if s.root and options.out is not None:
            save_run(gathered, options.out)
    return gathered if s.root else None
