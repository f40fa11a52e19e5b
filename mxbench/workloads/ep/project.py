"""The EP projection: a measured EP run and a link model predict each strategy's step at other EP degrees.

What a run gives (``Measured``): per strategy, the fwd+bwd step, every compute stage's time on every rank (anything
that is not an all-to-all is compute; the routing calls outside the step are left out), and every all-to-all's
time and bytes of one routed copy (its bytes sent to other ranks over the copies that left their rank, from the
run's split counts). What the model adds (``LinkModel``): GPUs per node, a one-way rate per link class, and
node-limited routing (DeepSeek-V3: each token to at most M nodes).

The model, per rank of the target EP degree W (G = min(GPUs per node, W) ranks a node, n = W / G nodes, top-k k):

* Tokens per rank and experts per rank are held: every rank receives the same copies as in the run (balanced),
  so the compute stages keep their measured time. Skewed routing: the slowest rank sets the step; each rank's
  compute is a line in the copies it receives, fitted over the run's ranks, and the slowest rank at W is the one
  whose experts' shares (the run's seeded router over W x E experts) receive most.
* Per copy a rank sends, without node limit (M = 0: every copy crosses on its own, as ``mxbench ep``'s
  all_to_all_single does): (G - 1) / W of a row stays on the node (NVLink), (W - G) / W leaves it (NIC).
* With node-limited routing (M > 0) and one inter-node transfer per (token, destination node) forwarded over
  NVLink on arrival (DeepEP's normal kernels): each token reaches D = min(M, n, k) nodes (an upper bound: every
  token uses all the nodes it may), its own among them with probability D / n, so D (1 - 1/n) rows per token
  cross the NIC; NVLink carries the copies to the node's other GPUs plus the arrivals forwarded to their GPU
  ((W - G) / W of the copies, all but the 1 / G that land on their target).
* An all-to-all takes max over link classes of (bytes / rate) (+ a fixed latency per call); the bytes are a
  rank's one-way bytes (sent; received is the same when balanced), times the routing's imbalance (the largest
  rank's max(sent, received) over the balanced figure) when skewed.
* The step keeps its measured ratio to the stage sum (launch gaps and overlap scale with it).

Rates are one-way per GPU (DeepEP's convention), in GB/s = 1e9 B/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .topology import LinkClass, Topology

if TYPE_CHECKING:  # numpy is imported where it is used: `mxbench --help` loads this module for ep-project's defaults
    import numpy as np

DEEPEP_SOURCE = ("DeepEP README (github.com/deepseek-ai/DeepEP), normal kernels on H800 (NVLink ~160 GB/s) with "
                 "CX7 InfiniBand 400 Gb/s (~50 GB/s), DeepSeek-V3 pretraining setting (4096 tokens, hidden 7168, "
                 "top-4 groups, top-8 experts, FP8 dispatch, BF16 combine)")  # fmt: skip
DEFAULT_INTRA_GBPS = (153.0 + 158.0) / 2
"""DeepEP intranode (EP 8) NVLink bottleneck bandwidth: dispatch 153 GB/s, combine 158 GB/s; their mean."""
DEFAULT_INTER_GBPS = round((43.0 + 58.0 + 51.0 + 43.0 + 57.0 + 50.0) / 6, 1)
"""DeepEP internode RDMA bottleneck bandwidth at EP 16 / 32 / 64: dispatch 43 / 58 / 51, combine 43 / 57 / 50 GB/s;
their mean (50.3 GB/s)."""
DEEPSEEK_V3_MAX_NODES = 4
DEFAULT_EPS = (8, 16, 32, 64, 128, 256)
MAX_DEGREE = 65536
"""The largest EP degree projected: the skewed routing's shares are an array of degree x experts per rank."""


@dataclass(frozen=True)
class LinkModel:
    gpus_per_node: int
    intra_gbps: float
    inter_gbps: float
    max_nodes: int  # M; 0 = no node limit (every copy crosses on its own)
    latency_us: float = 0.0
    intra_source: str = DEEPEP_SOURCE
    inter_source: str = DEEPEP_SOURCE

    def rate(self, c: LinkClass) -> float:
        return self.intra_gbps if c is LinkClass.INTRA else self.inter_gbps


def check_degree(ep: int, gpus_per_node: int) -> None:
    """An EP degree the model can place: within one node, or whole nodes."""
    from mxkernels.core.errors import InputError

    if ep < 2:
        raise InputError(f"--ep: every degree must be at least 2 (at 1 nothing crosses a link), got {ep}")
    if ep > MAX_DEGREE:
        raise InputError(f"--ep: every degree must be at most {MAX_DEGREE} (past any cluster the model places), "
                         f"got {ep}")  # fmt: skip
    if ep > gpus_per_node and ep % gpus_per_node:
        raise InputError(f"--ep: {ep} spans more than one node of --gpus-per-node {gpus_per_node} but is not a "
                         "multiple of it (the model places whole nodes)")  # fmt: skip


def bytes_per_copy(ep: int, gpus_per_node: int, top_k: int, max_nodes: int) -> dict[LinkClass, float]:
    """Rows a rank moves over each link class per token copy it sends, one way (module doc)."""
    g = min(gpus_per_node, ep)
    n = ep // g
    on_node, off_node = (g - 1) / ep, (ep - g) / ep
    if n == 1 or max_nodes == 0:
        return {LinkClass.INTRA: on_node, LinkClass.INTER: off_node}
    d = min(max_nodes, n, top_k)
    return {LinkClass.INTRA: on_node + off_node * (1 - 1 / g), LinkClass.INTER: d * (1 - 1 / n) / top_k}


def rank_shares(groups: str, seed: int, ep: int, experts_per_rank: int) -> np.ndarray:
    """Each rank's share of all copies: 1 / W balanced, the sum of its experts' router shares when skewed."""
    import numpy as np

    if groups != "skewed":
        return np.full(ep, 1.0 / ep)
    from ...plan.skew import skewed_shares  # the draw inputs.routing makes, without the torch inputs imports

    return skewed_shares(ep * experts_per_rank, seed).reshape(ep, experts_per_rank).sum(axis=1)


def imbalance(shares: np.ndarray) -> float:
    """The busiest rank's one-way all-to-all rows (max of sent and received) over the balanced figure."""
    import numpy as np

    ep = len(shares)
    busiest = np.maximum(1 - shares, (ep - 1) * shares).max()
    return float(busiest / ((ep - 1) / ep))


@dataclass(frozen=True)
class AllToAll:
    name: str
    time_us: float  # the slowest rank's median
    row_bytes: float  # bytes of one routed copy
    busiest_bytes: int  # the largest max(sent, received) of any rank: what the time is set by
    inter_bytes: int  # of those, inter-node (0 on one node)


@dataclass(frozen=True)
class StrategyRun:
    strategy: str
    step_us: float
    compute_us: float  # sum of the compute stages' slowest-rank medians
    compute_per_rank: tuple[float, ...]
    alltoalls: tuple[AllToAll, ...]

    @property
    def a2a_us(self) -> float:
        return sum(a.time_us for a in self.alltoalls)


@dataclass(frozen=True)
class Measured:
    """What the projection reads of one run (module doc)."""

    label: str
    card: str
    ep: int
    nodes: int
    T: int
    top_k: int
    E: int
    K: int | None
    N: int | None
    groups: str
    seed: int
    received: tuple[int, ...]  # copies each rank received
    strategies: tuple[StrategyRun, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def intra_rate_gbps(self) -> float:
        """The run's own all-to-all rate, one way: busiest-rank bytes over time, summed over every all-to-all."""
        stages = [a for s in self.strategies for a in s.alltoalls]
        return sum(a.busiest_bytes for a in stages) / sum(a.time_us for a in stages) / 1e3


@dataclass(frozen=True)
class Prediction:
    label: str
    strategy: str
    ep: int
    nodes: int
    step_us: float
    compute_us: float
    a2a_us: float
    intra_bytes: float  # per rank, one way, all of the step's all-to-alls
    inter_bytes: float

    @property
    def share(self) -> float:
        return self.a2a_us / (self.compute_us + self.a2a_us)


def _compute_at(s: StrategyRun, received: Sequence[int], target_received: np.ndarray) -> float:
    """The compute of the slowest rank at the target (module doc): the measured sum of per-stage maxima, scaled by
    the fitted line's slowest target rank over its slowest measured rank."""
    import numpy as np

    r, c = np.asarray(received, dtype=float), np.asarray(s.compute_per_rank, dtype=float)
    if np.ptp(r) == 0:  # every rank received the same: the measured work is the held work
        return s.compute_us * (1.0 if np.ptp(target_received) == 0 else float(target_received.max() / r[0]))
    slope, intercept = np.polyfit(r, c, 1)
    return s.compute_us * float((intercept + slope * target_received).max() / c.max())


def predict(m: Measured, ep: int, model: LinkModel) -> list[Prediction]:
    """Every strategy of ``m`` at EP degree ``ep`` (module doc)."""
    check_degree(ep, model.gpus_per_node)
    shares = rank_shares(m.groups, m.seed, ep, m.E)
    copies = m.T * m.top_k
    target_received = ep * copies * shares
    per_copy = bytes_per_copy(ep, model.gpus_per_node, m.top_k, model.max_nodes)
    skew = imbalance(shares)
    nodes = max(1, ep // model.gpus_per_node)
    out = []
    for s in m.strategies:
        a2a_us, moved = 0.0, dict.fromkeys(LinkClass, 0.0)
        for a in s.alltoalls:
            b = {c: copies * f * a.row_bytes * skew for c, f in per_copy.items()}
            a2a_us += max(b[c] / (model.rate(c) * 1e3) for c in LinkClass) + model.latency_us
            moved = {c: moved[c] + b[c] for c in LinkClass}
        compute = _compute_at(s, m.received, target_received)
        step = s.step_us * (compute + a2a_us) / (s.compute_us + s.a2a_us)
        out.append(Prediction(m.label, s.strategy, ep, nodes, step, compute, a2a_us, moved[LinkClass.INTRA],
                              moved[LinkClass.INTER]))  # fmt: skip
    return out


def with_top_k(m: Measured, top_k: int) -> Measured:
    """``m`` read as a layer of ``top_k`` experts per token with the same copies per rank (T x top-k held, so
    every stage that moves or multiplies copies keeps its work; the few that act on tokens before they are copied
    keep theirs too: an upper bound on their time)."""
    from mxkernels.core.errors import InputError

    copies = m.T * m.top_k
    if copies % top_k:
        raise InputError(f"--top-k: {top_k} does not divide the run's {copies} copies per rank")
    note = f"top-k {top_k} projected from the run's top-k {m.top_k}: {copies} copies per rank held"
    return replace(m, T=copies // top_k, top_k=top_k, notes=(*m.notes, note))


A2A, STEP = "all_to_all", "end_to_end"


def _off_rank_copies(meta, ep: int, copies: int) -> tuple[int, tuple[int, ...]]:
    """(copies that left their rank, summed over ranks; copies each rank received) from the run's split counts
    (balanced without them: every rank keeps 1 / W of its copies)."""
    counts = (meta.get("routing") or {}).get("send_counts")
    if not counts:
        return ep * (copies - copies // ep), (copies,) * ep
    import numpy as np

    c = np.asarray(counts)  # [src][dst][local expert]
    per_pair = c.sum(axis=2)
    return int(per_pair.sum() - np.trace(per_pair)), tuple(int(v) for v in per_pair.sum(axis=0))


def _rank_values(r, key: str, fallback: float) -> dict[int, float]:
    ranks = r.telemetry.get("ranks") or []
    return {x["rank"]: x[key] for x in ranks if x.get(key) is not None} or {0: fallback}


def _alltoall(r, off_rank: int) -> AllToAll:
    sent, received = _rank_values(r, "bytes_read", r.bytes_read), _rank_values(r, "bytes_written", r.bytes_written)
    busiest = max(sent, key=lambda k: max(sent[k], received.get(k, 0)))
    ranks = {x["rank"]: x for x in r.telemetry.get("ranks") or []}
    split = (ranks.get(busiest) or {}).get("link_bytes") or r.telemetry.get("link_bytes") or {}
    inter = split.get("inter_node") or {}
    total_sent = sum(sent.values()) if len(sent) > 1 else r.bytes_read * max(1, len(ranks))
    return AllToAll(r.stage, r.median_us, total_sent / off_rank, int(max(sent[busiest], received.get(busiest, 0))),
                    int(max(inter.get("sent", 0), inter.get("received", 0))))  # fmt: skip


def read_run(run, label: str) -> Measured:
    """What the projection needs of a stored EP run (``mxbench ep``, or the layer under ``mxbench ep --layer``:
    its stages carry role names, and anything not an all-to-all is compute). Refuses (``InputError``) a run that
    is not an EP run or moved nothing between ranks."""
    from mxkernels.core.errors import InputError

    meta = run.meta
    kind = str(meta.get("kind", ""))
    if not kind.startswith("ep") or kind == "ep-check":
        raise InputError(f"{label}: not a measured EP run (kind {kind or 'none'}): the projection reads runs of "
                         "`mxbench ep`")  # fmt: skip
    ep, layer = int(meta.get("world_size") or 1), meta.get("layer") or {}
    if ep < 2:
        raise InputError(f"{label}: an EP run at degree {ep} moved nothing between ranks: nothing to project from")
    T, k, E = int(layer["tokens_per_rank"]), int(layer.get("top_k", 1)), int(layer["experts_per_rank"])
    off_rank, received = _off_rank_copies(meta, ep, T * k)
    strategies = []
    for name in meta.get("strategies") or dict.fromkeys(r.point.recipe for r in run.records):
        mine = [r for r in run.records if r.point.recipe == name and r.ok]
        step = next((r for r in mine if r.category == STEP), None)
        stages = [r for r in mine if r.category != STEP and not r.telemetry.get("note")]
        if step is None or not stages:
            continue
        compute = [r for r in stages if r.category != A2A]
        per_rank = [0.0] * ep
        for r in compute:
            values = _rank_values(r, "median_us", r.median_us)
            for rank in range(ep):
                per_rank[rank] += values.get(rank, r.median_us)
        strategies.append(StrategyRun(name, step.median_us, sum(r.median_us for r in compute), tuple(per_rank),
                                      tuple(_alltoall(r, off_rank) for r in stages if r.category == A2A)))  # fmt: skip
    if not strategies or not any(s.alltoalls for s in strategies):
        raise InputError(f"{label}: no measured step with all-to-all stages: nothing to project from")
    routing = meta.get("routing") or {}
    return Measured(label, run.card, ep, Topology.from_meta(meta).nodes, T, k, E, layer.get("K"), layer.get("N"),
                    str(routing.get("groups", "balanced")), int(routing.get("seed", 0)), received,
                    tuple(strategies))  # fmt: skip
