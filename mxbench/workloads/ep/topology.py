"""Where the ranks of an EP run sit, and which link each all-to-all byte crosses.

Every rank reports its place: torchrun's group rank (``GROUP_RANK``: the launcher, i.e. the node, it belongs to),
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the host name. Both are recorded; the link class is defined by the group
rank: two launchers on one host are two "nodes" only by torchrun's count, but that is what lets CI exercise the
multi-node path on one CPU host (a real multi-node run has one launcher per host, where the two agree; the record
says whether they do). Two ranks on the same node talk over NVLink (``LinkClass.INTRA``), ranks on different
nodes over the NIC (``LinkClass.INTER``).

An all-to-all's bytes per rank are split by class from its split sizes (rows to / from each rank) and the bytes
of one row: what a rank sends to itself crosses no link and is not counted, as in ``ep_comm.all_to_all_cost``.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

LINK_CLASS_BY = "torchrun group rank (GROUP_RANK): one launcher is one node"


class LinkClass(Enum):
    INTRA = "intra_node"  # NVLink (the datasheet link peak)
    INTER = "inter_node"  # the NIC (the datasheet NIC peak)


@dataclass(frozen=True)
class Place:
    """One rank's place in the run."""

    rank: int
    node: int  # torchrun's group rank
    local_rank: int
    local_world: int
    host: str


def my_place(rank: int) -> Place:
    """This process's place, from torchrun's environment (one node of one rank outside torchrun)."""
    env = os.environ
    return Place(rank, int(env.get("GROUP_RANK", "0")), int(env.get("LOCAL_RANK", "0")),
                 int(env.get("LOCAL_WORLD_SIZE", "1")), platform.node())  # fmt: skip


@dataclass(frozen=True)
class Topology:
    """Every rank's place, in rank order."""

    places: tuple[Place, ...]

    def __post_init__(self):
        if [p.rank for p in self.places] != list(range(len(self.places))):
            raise ValueError(f"places must be in rank order 0..{len(self.places) - 1}: {self.places}")

    @property
    def world(self) -> int:
        return len(self.places)

    @property
    def node_ids(self) -> list[int]:
        return sorted({p.node for p in self.places})

    @property
    def nodes(self) -> int:
        return len(self.node_ids)

    def node_of(self, rank: int) -> int:
        return self.places[rank].node

    @property
    def ranks_per_node(self) -> list[int]:
        return [sum(1 for p in self.places if p.node == n) for n in self.node_ids]

    def link(self, a: int, b: int) -> LinkClass:
        return LinkClass.INTRA if self.node_of(a) == self.node_of(b) else LinkClass.INTER

    @property
    def same_node_pairs(self) -> list[tuple[int, int]]:
        """Every pair of distinct ranks that shares a node (a < b)."""
        ranks = range(self.world)
        return [(a, b) for a in ranks for b in ranks if a < b and self.link(a, b) is LinkClass.INTRA]

    @property
    def hosts_agree(self) -> bool:
        """Whether group ranks and host names draw the same node boundaries."""
        by_node = {p.node: p.host for p in self.places}
        return all(by_node[p.node] == p.host for p in self.places) and len(set(by_node.values())) == self.nodes

    def to_meta(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node,
                "node_of_rank": [p.node for p in self.places], "host_of_rank": [p.host for p in self.places],
                "same_node_pairs": [list(pair) for pair in self.same_node_pairs], "link_class_by": LINK_CLASS_BY,
                "hosts_agree": self.hosts_agree, "places": [asdict(p) for p in self.places]}  # fmt: skip

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Topology:
        """A run's topology: its ``nodes`` record, or (runs made before it was recorded) one node per host."""
        if meta.get("nodes"):
            return cls(tuple(Place(**p) for p in meta["nodes"]["places"]))
        ranks = meta.get("ranks") or [{"rank": r, "host": "?"} for r in range(int(meta.get("world_size") or 1))]
        hosts = list(dict.fromkeys(r["host"] for r in ranks))
        return cls(tuple(Place(r["rank"], hosts.index(r["host"]), r.get("local_rank", 0), 0, r["host"]) for r in ranks))


def split_bytes(topo: Topology, rank: int, send_rows: Sequence[int], recv_rows: Sequence[int],
                row_bytes: int) -> dict[LinkClass, dict[str, int]]:  # fmt: skip
    """Bytes ``rank`` sends to and receives from the other ranks, per link class (module doc)."""
    out = {c: {"sent": 0, "received": 0} for c in LinkClass}
    for peer, (sent, received) in enumerate(zip(send_rows, recv_rows, strict=True)):
        if peer != rank:
            cls = out[topo.link(rank, peer)]
            cls["sent"] += sent * row_bytes
            cls["received"] += received * row_bytes
    return out


def as_record(split: Mapping[LinkClass, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """The JSON form of ``split_bytes`` (link class values as keys)."""
    return {c.value: dict(v) for c, v in split.items()}


def _shape(counts: Sequence, rank: int, o):
    from mxkernels.stages.ep_stages import EPShape

    world = len(counts)
    return EPShape(o.T, o.K, o.N, o.E, o.top_k, rank, world, tuple(tuple(row) for row in counts[rank]),
                   tuple(tuple(counts[src][rank]) for src in range(world)))  # fmt: skip


def stage_link_bytes(topo: Topology, counts: Sequence, strategy: str, o) -> dict[str, list[dict]]:
    """Per all-to-all stage of ``strategy``: every rank's bytes per link class (``as_record`` form).

    ``counts[src][dst][e]``: copies rank src sends to local expert e of rank dst (every rank's ``send_counts``).
    The stages are those of ``mxkernels.stages.ep_stages`` (``ep_layer`` for a ``--layer`` run) bound to each rank's
    shape; their split sizes and their cost (bytes sent to other ranks) give the bytes of one row."""
    from mxkernels.ep.comm import remote_rows
    from mxkernels.stages.ep_stages import ep_step_stages
    from mxkernels.core.names import Category

    def stages_of(rank):
        shape = _shape(counts, rank, o)
        if getattr(o, "layer", None) is None:
            return ep_step_stages(strategy, shape, mode=o.mode, backend=o.backend)
        from mxkernels.stages.ep_layer import EPLayerShape, ep_layer_stages

        L = o.layer
        return ep_layer_stages(strategy, EPLayerShape(shape, L.score_func, L.score_before, L.shared, L.shared_in_recipe),
                               mode=o.mode, backend=o.backend)  # fmt: skip

    out: dict[str, list[dict]] = {}
    for rank in range(topo.world):
        stages = stages_of(rank)
        for st in stages:
            if st.category is not Category.ALL_TO_ALL:
                continue
            send, recv = st.params["send_splits"], st.params["recv_splits"]
            # the bytes of one row from the stage's cost (bytes sent to other ranks, or received where it sends none)
            sent, received = remote_rows(send, rank), remote_rows(recv, rank)
            row_bytes = st.cost.bytes_read // sent if sent else (st.cost.bytes_written // received if received else 0)
            out.setdefault(st.name, []).append(as_record(split_bytes(topo, rank, send, recv, row_bytes)))
    return out


def _rows(counts: Sequence, forward: bool) -> list[list[int]]:
    """rows[src][dst] of an all-to-all that moves the routing's copies (dispatch's way) or sends them back."""
    pairs = [[sum(experts) for experts in row] for row in counts]
    return pairs if forward else [list(col) for col in zip(*pairs, strict=True)]


def record_split(topo: Topology, counts: Sequence, sent: Mapping[int, int]) -> list[dict] | None:
    """Every rank's bytes per link class of a measured all-to-all from its bytes sent to other ranks per rank:
    its rows per peer are the routing's copies one way or the other, the way whose bytes a row agree on every
    rank (the two agree when routing is balanced). None when neither way fits (not a copy-moving all-to-all)."""
    world = topo.world
    for forward in (True, False):
        rows = _rows(counts, forward)
        off = {r: sum(rows[r]) - rows[r][r] for r in sent}
        if any(sent[r] % off[r] if off[r] else sent[r] for r in sent):
            continue
        row_bytes = {sent[r] // off[r] for r in sent if off[r]}
        if len(row_bytes) <= 1:
            b = row_bytes.pop() if row_bytes else 0
            recv = [[rows[s][r] for s in range(world)] for r in range(world)]
            return [as_record(split_bytes(topo, r, rows[r], recv[r], b)) for r in range(world)]
    return None


def annotate_records(records: Sequence, topo: Topology, counts: Sequence) -> None:
    """Add every rank's bytes per link class to each all-to-all record of the step (``telemetry["ranks"][i]
    ["link_bytes"]``, and the slowest rank's as ``telemetry["link_bytes"]``); the routing's count exchange and any
    all-to-all that does not move the routing's copies are left as they are."""
    for r in records:
        if r.category != "all_to_all" or r.telemetry.get("note"):
            continue
        ranks = r.telemetry.get("ranks") or []
        per_rank = record_split(topo, counts, {s["rank"]: s["bytes_read"] for s in ranks if "bytes_read" in s})
        if per_rank is None:
            continue
        for stats in ranks:
            stats["link_bytes"] = per_rank[stats["rank"]]
        r.telemetry["link_bytes"] = per_rank[(r.telemetry.get("across_ranks") or {}).get("slowest_rank", 0)]


def describe(topo: Topology) -> str:
    pairs = ", ".join(f"({a},{b})" for a, b in topo.same_node_pairs) or "none"
    hosts = "" if topo.hosts_agree else " (host names draw other boundaries: several launchers share a host)"
    return (f"topology: {topo.nodes} node(s) by torchrun group rank{hosts}, ranks per node {topo.ranks_per_node}, "
            f"hosts {sorted({p.host for p in topo.places})}; ranks sharing a node: {pairs}")  # fmt: skip


def check_record(topo: Topology, counts: Sequence, strategies: Sequence[str], o) -> dict[str, Any]:
    """What ``mxbench ep --check --out`` writes: the nodes, the routing and every all-to-all's bytes per link class
    and rank (a check times nothing: the bytes are those of the stages it checked)."""
    return {"kind": "ep-check", "world_size": topo.world, "nodes": topo.to_meta(),
            "layer": {"tokens_per_rank": o.T, "K": o.K, "N": o.N, "experts_per_rank": o.E, "top_k": o.top_k},
            "routing": {"groups": o.groups, "seed": o.seed, "send_counts": [list(map(list, c)) for c in counts]},
            "link_bytes": {s: stage_link_bytes(topo, counts, s, o) for s in strategies}}  # fmt: skip


def link_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per strategy and all-to-all stage: the bytes all ranks send over each link class."""
    return [{"Strategy": s, "Stage": stage,
             **{f"{c.value} bytes sent (all ranks)": sum(r[c.value]["sent"] for r in ranks) for c in LinkClass}}
            for s, stages in record["link_bytes"].items() for stage, ranks in stages.items()]  # fmt: skip
