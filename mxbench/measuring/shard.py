"""Sharded sweeps: ``roofline``, ``peers`` and ``regress`` on every GPU of a host, one process per GPU, one Run.
What every sharded run shares is here (joining, exchanging, the deterministic split, the gathered metadata); the
runs themselves are their workloads' (``workloads/step/sharded.py``, ``workloads/peers/sharded.py``).

Launched the standard way, ``torchrun --nproc-per-node N -m mxbench roofline ...`` (or ``python -m
torch.distributed.run``), every process runs the same command on its own GPU, ``cuda:LOCAL_RANK`` (the
Instruments' device; the CUDA device made current, so an ``--impl`` check runs there too), measures its share of the
work, and hands its records to the others; rank 0 writes the one results file and prints the tables, the other
ranks print nothing but errors. Every record names the device it ran on in ``telemetry["device"]`` (rank, host,
CUDA index, UUID); the metadata adds the world size and every rank's card.

The split is deterministic:

* sweep points (``roofline``, each round of ``regress``): a unit is the points of every recipe at one shape and
  condition plus their bf16 baseline, so a recipe and its baseline are timed on the same GPU and a speedup never
  divides times of two cards. Units go largest first (M x N x K per point) to the least loaded rank, ties to the
  lower rank. The split depends on the set of points only, not their order: each of regress's rounds (the same
  points in alternating order) sends every point to the same GPU, and each rank keeps the alternation on its share.
* ``peers``: the (stage, implementation) pairs, dealt round robin in the order they are timed.

torch.distributed is the engine: a gloo group (a sweep has no GPU collective; NCCL would only take GPU memory and
stream work), ``all_gather_object`` to exchange records, ``dist``'s bounded teardown to leave.

Refused before any point is measured (``InputError``, exit 2): ranks with different card models, ranks that
planned different work, more processes on a host than it has GPUs.

Power limits: each rank applies a requested limit to its own GPU (``PowerController(LOCAL_RANK)``), because a limit
is a setting of one card: every record is then measured under its own card's limit, as on one GPU, and each rank
restores its own card's limit on every exit path (the controller's guarantee).

Incomplete runs: Ctrl-C (torchrun forwards SIGINT to every worker) and SIGTERM (torchrun stops the workers with it
when one of them died) stop each rank's sweep as Ctrl-C stops one on a single GPU; a rank whose sweep raised hands in
its error instead. The ranks still exchange what they have, waiting at most ``GRACE_S`` for one another once
stopped, and rank 0 writes what it got with ``meta["partial"]`` saying what is missing (and ``interrupted``).
Until then rank 0's file holds its own share, marked partial, so even a killed run leaves that.
"""

from __future__ import annotations

import os
import platform
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from mxkernels.core.errors import InputError
from mxkernels.core.names import BASELINE

from ..instruments.kit import Instruments
from ..storage.results import Point, Record, Run
from .metadata import now
from .stages import error_message

GROUP_TIMEOUT = timedelta(hours=24)
"""How long a collective may wait: a rank that finished its share waits in the exchange for the slowest rank, which
may still have hours of sweep to go."""
GRACE_S = 10.0
"""Once stopped (Ctrl-C, SIGTERM), how long a rank waits for the others' records: they were stopped too and are on
their way; torchrun kills its workers 30 s after stopping them."""
STOPPED_BARRIER_S = 5.0
"""The leaving barrier's wait once stopped (the 30 s of ``ep.dist`` otherwise), within torchrun's 30 s."""
SPLIT = ("sweep points: a recipe's point with its bf16 baseline on one rank, largest (M*N*K) first to the least "
         "loaded rank; peers: (stage, implementation) pairs round robin in timing order")  # fmt: skip
RANK_META = ("date", "finished", "driver", "nvml", "power_snapshots")
"""What a rank's own sweep metadata adds to its entry in ``meta["ranks"]``."""


class ShardFailed(RuntimeError):
    """A rank of a sharded regress failed or was stopped: its verdicts cannot be computed without that rank."""


def launched() -> bool:
    """Whether this process is one of torchrun's workers."""
    from .dist import under_torchrun

    return under_torchrun()


def is_other_rank() -> bool:
    """A torchrun worker other than rank 0: it prints nothing but errors and writes nothing."""
    return launched() and int(os.environ["RANK"]) != 0


def local_device() -> int:
    """The CUDA index this process measures on: ``LOCAL_RANK`` under torchrun (made the current device, so "cuda"
    means it), else 0. More processes than GPUs on the host is bad input."""
    if not launched():
        return 0
    import torch

    local = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local >= count:
            raise InputError(f"LOCAL_RANK {local}: this host has {count} GPU(s); start at most {count} processes "
                             "per host (torchrun --nproc-per-node)")  # fmt: skip
        torch.cuda.set_device(local)
    return local


# ------------------------------------------------------------------------------------------------- the split


def unit_of(point: Point) -> Point:
    """The unit of work ``point`` belongs to, named by its bf16 baseline point (every recipe's point at the same
    shape and conditions shares it)."""
    return replace(point, recipe=BASELINE)


def assign(points: Sequence[Point], world: int) -> dict[Point, int]:
    """The rank that measures each of ``points`` (module doc: units largest first to the least loaded rank)."""
    cost: dict[Point, int] = {}
    for p in points:
        cost[unit_of(p)] = cost.get(unit_of(p), 0) + p.M * p.N * p.K
    load, owner = [0] * world, {}
    for unit in sorted(cost, key=lambda u: (-cost[u], repr(u))):  # repr: a total order that ignores input order
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[unit] = rank
        load[rank] += cost[unit]
    return {p: owner[unit_of(p)] for p in points}


def check_ranks(ranks: Sequence[dict[str, Any]]) -> None:
    """Refuse a run whose ranks have different card models, or planned different work."""
    cards = list(dict.fromkeys(str(r["card"]) for r in ranks))
    if len(cards) > 1:
        listing = ", ".join(f"rank {r['rank']}: {r['card']} ({r['host']} cuda:{r['index']})" for r in ranks)
        raise InputError(f"a sharded run measures on one card model; these ranks have {len(cards)} ({listing}): "
                         "launch it on GPUs of one model (CUDA_VISIBLE_DEVICES picks them)")  # fmt: skip
    if len({r["plan"] for r in ranks}) > 1:
        raise InputError("the ranks planned different work (a power limit in percent of each card's default that "
                         "differs between the GPUs?): give the limits in watts (--power-limit-watts)")  # fmt: skip


# ------------------------------------------------------------------------------------------------ the session


@dataclass
class Shard:
    """This process's place in a sharded run (``ctx``: an ``ep.dist.Context``) and every rank's device.

    ``stopped``: Ctrl-C or SIGTERM reached this rank; ``broken``: an exchange did not finish, so the group can be
    neither used nor left (the process exits once its results are written)."""

    ctx: Any
    ranks: list[dict[str, Any]] = field(default_factory=list)
    stopped: bool = False
    broken: bool = False

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world(self) -> int:
        return self.ctx.world

    @property
    def root(self) -> bool:
        return self.ctx.rank == 0

    def device(self, rank: int) -> dict[str, Any]:
        """What a record measured on ``rank`` names as its device."""
        return {k: self.ranks[rank][k] for k in ("rank", "host", "index", "uuid")}


def _join():
    """This process in the run's gloo group (torchrun's environment says where the others are)."""
    import torch
    import torch.distributed as dist

    from .dist import MULTICAST_OFF, Context

    for name, value in MULTICAST_OFF.items():  # nothing here opens NCCL; whatever does later keeps NVLS off
        os.environ.setdefault(name, value)  # (issue 12: honoured where given, never overridden)
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    # the collectives move pickled records between CPUs: there is no device stream to synchronize on leaving
    return Context(dist.get_rank(), dist.get_world_size(), local, "gloo", torch.device("cpu"), dist.group.WORLD)


@contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt for the duration (main thread only: Python runs handlers there), so
    torchrun's stop after another worker died ends this rank's sweep as Ctrl-C does, with its records kept."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def session(instruments: Instruments, plan: Sequence = ()) -> Iterator[Shard]:
    """Join the run, learn every rank's device, refuse what ``check_ranks`` refuses, and leave (bounded) on every
    exit path. ``plan``: the work as this rank planned it (every rank must have planned the same)."""
    from .dist import BARRIER_TIMEOUT_S, leave

    s = Shard(_join())
    code = 1
    try:
        with _sigterm_stops():
            props = dict(instruments.device_properties())
            mine = {"rank": s.rank, "host": platform.node(), "index": s.ctx.local_rank, "uuid": props.get("uuid"),
                    "card": props.get("name"), "plan": zlib.crc32(repr(list(plan)).encode())}  # fmt: skip
            s.ranks = exchange(s, mine)
            if s.stopped:
                raise KeyboardInterrupt
            if s.broken or any(r is None for r in s.ranks):
                raise ShardFailed(f"rank {s.rank}: not every rank joined the run")
            check_ranks(s.ranks)
            yield s
            code = 0
    except (KeyboardInterrupt, SystemExit):  # stopped (SIGTERM under a power limit raises ``power.Terminated``)
        s.stopped = True
        raise
    finally:
        if s.broken:  # a collective still runs in its thread: neither a barrier nor destroy could finish
            print(f"rank {s.rank}: some ranks did not answer; leaving without a teardown", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130 if s.stopped else 1)
        leave(s.ctx, code, barrier_s=STOPPED_BARRIER_S if s.stopped else BARRIER_TIMEOUT_S)


def exchange(s: Shard, payload: Any) -> list[Any]:
    """Every rank's ``payload`` in rank order (None for a rank that did not answer), on every rank.

    The collective runs in a thread, so this (main) thread still takes Ctrl-C and SIGTERM while a rank that finished
    early waits for the others; once stopped, the others get ``GRACE_S`` to answer.
    """
    import torch.distributed as dist

    got: list[Any] = [None] * s.world
    done = threading.Event()

    def collect():
        try:
            dist.all_gather_object(got, payload, group=s.ctx.control)
        except Exception as e:  # noqa: BLE001 -- a rank that died closed its connection: keep what is here
            got[:] = [None] * s.world
            print(f"rank {s.rank}: exchanging records failed: {error_message(e)}", file=sys.stderr)
        finally:
            done.set()

    threading.Thread(target=collect, name="shard-exchange", daemon=True).start()
    deadline = time.monotonic() + GRACE_S if s.stopped else None
    while not done.is_set() and (deadline is None or time.monotonic() < deadline):
        try:
            done.wait(None if deadline is None else deadline - time.monotonic())
        except KeyboardInterrupt:
            s.stopped = True
            deadline = deadline or time.monotonic() + GRACE_S
    s.broken = not done.is_set()
    answers = list(got) if done.is_set() else [None] * s.world
    answers[s.rank] = payload  # this rank's own is always at hand
    return answers


# ------------------------------------------------------------------------------------------ measuring a share


def measure_share(s: Shard, measure: Callable[[], Run]) -> tuple[Run, dict[str, Any]]:
    """This rank's Run of its share and what it hands in: its records, metadata, and whether it stopped or failed.
    A failure is this rank's alone: it hands in its error, and the other ranks' records are still written."""
    try:
        run, error = measure(), None
    except Exception as e:  # noqa: BLE001 -- see the docstring; the error is printed here and recorded by rank 0
        run, error = Run(meta={}), error_message(e)
        print(f"rank {s.rank}: the sweep failed: {error}", file=sys.stderr)
    stopped = bool(run.meta.get("interrupted"))
    s.stopped |= stopped
    meta = {k: run.meta[k] for k in RANK_META if k in run.meta}
    return run, {"rank": s.rank, "records": run.records, "meta": meta, "stopped": stopped, "error": error}


def tagged(s: Shard, parts: list[dict | None]) -> list[list[Record]]:
    """Each rank's records (none for a rank that did not answer), each naming the device it was measured on."""
    lists = []
    for rank, part in enumerate(parts):
        records = part["records"] if part else []
        for r in records:
            r.telemetry["device"] = s.device(rank)
        lists.append(records)
    return lists


def gathered_meta(s: Shard, meta: dict[str, Any], parts: list[dict | None], missing: int) -> dict[str, Any]:
    """Rank 0's metadata with every rank's device and snapshots; ``partial`` says what is missing (``missing``
    points not measured), ``interrupted`` whether any rank was stopped."""
    meta = {k: v for k, v in meta.items() if k != "partial"}
    ranks, snapshots, problems = [], [], []
    for rank, part in enumerate(parts):
        mine = {**{k: v for k, v in s.ranks[rank].items() if k != "plan"}, **(part["meta"] if part else {})}
        ranks.append({**mine, "answered": part is not None, "stopped": bool(part and part["stopped"]),
                      "error": part["error"] if part else None})  # fmt: skip
        snapshots += [{"rank": rank, **snap} for snap in mine.get("power_snapshots", [])]
        if part is None:
            problems.append(f"rank {rank} did not answer")
        elif part["error"]:
            problems.append(f"rank {rank} failed: {part['error']}")
        elif part["stopped"]:
            problems.append(f"rank {rank} was stopped")
    if missing:
        problems.append(f"{missing} point(s) not measured")
    meta.update(world_size=s.world, cards=sorted({str(r["card"]) for r in s.ranks}), ranks=ranks, sharding=SPLIT,
                power_snapshots=snapshots, finished=now())  # fmt: skip
    if problems:
        meta["partial"] = "; ".join(problems)
    if s.stopped or any(r["stopped"] for r in ranks):
        meta["interrupted"] = True
    return meta
