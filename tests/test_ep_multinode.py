"""EP across nodes: the link class of every all-to-all byte, and the multi-node launch path on one CPU host.

Two torchrun launchers (``mxbench ep --nproc 2 --nnodes 2 --rdzv-backend c10d --rdzv-endpoint localhost:PORT``)
are two nodes by torchrun's group rank: the run they start must check every stage across both, and record 2 nodes,
ranks (0, 1) and (2, 3) sharing one, and the bytes of each all-to-all split as counted by hand below.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mxbench.workloads.ep.check import EPOptions
from mxbench.workloads.ep.topology import LinkClass, Place, Topology, split_bytes, stage_link_bytes
from mxbench.storage.results import Point, Record

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_TIMEOUT_S = 150  # each launcher; the pair takes some 25 s on two loaded CPU cores
T, E, K, N = 64, 2, 64, 64


def two_nodes_of_two() -> Topology:
    return Topology(tuple(Place(r, r // 2, r % 2, 2, "same-host") for r in range(4)))


def test_same_node_pairs_and_link_classes_follow_the_group_rank():
    topo = two_nodes_of_two()
    assert (topo.nodes, topo.ranks_per_node, topo.same_node_pairs) == (2, [2, 2], [(0, 1), (2, 3)])
    assert topo.link(0, 1) is LinkClass.INTRA and topo.link(1, 2) is LinkClass.INTER
    assert not topo.hosts_agree  # one host, two launchers: recorded as such
    assert Topology.from_meta({"nodes": topo.to_meta()}) == topo


def test_runs_recorded_before_the_topology_place_one_node_per_host():
    meta = {"world_size": 3, "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}, {"rank": 2, "host": "a"}]}
    topo = Topology.from_meta(meta)
    assert [topo.node_of(r) for r in range(3)] == [0, 1, 0] and topo.same_node_pairs == [(0, 2)]


def test_split_bytes_leaves_out_the_own_share_and_sorts_peers_by_node():
    # rank 1 sends 5, 7, 11, 13 rows to ranks 0..3 and receives 2, 3, 4, 6; 10 bytes a row.
    split = split_bytes(two_nodes_of_two(), 1, [5, 7, 11, 13], [2, 3, 4, 6], 10)
    assert split[LinkClass.INTRA] == {"sent": 50, "received": 20}  # rank 0 only; its own 7 / 3 rows cross nothing
    assert split[LinkClass.INTER] == {"sent": 240, "received": 100}  # ranks 2 and 3


def balanced_counts(world: int) -> list:
    from mxkernels.moe.token_permute import route

    from mxbench.workloads.ep.inputs import routing

    return [route(routing(T, 1, world * E, "balanced", 0, r), world * E)["counts"].view(world, E).tolist()
            for r in range(world)]  # fmt: skip


# Hand count, 4 ranks on 2 nodes, 64 tokens per rank, top-1, balanced: every rank sends 64 / 4 = 16 rows to each
# rank; one peer shares its node (16 rows intra), two do not (32 rows inter). A bf16 row of K = N = 64 is 128 B; an
# MXFP8 row is 64 B of data + 2 B of e8m0 scales = 66 B; an FP8 rowwise row 64 B + one 4-byte fp32 scale = 68 B.
HAND = {("bf16", "dispatch"): (16 * 128, 32 * 128), ("mxfp8_a2a", "dispatch"): (16 * 66, 32 * 66),
        ("mxfp8_a2a", "combine"): (16 * 128, 32 * 128), ("mxfp8_a2a", "combine_grad"): (16 * 66, 32 * 66),
        ("fp8_rowwise", "dispatch"): (16 * 128, 32 * 128), ("fp8_rowwise_a2a", "dispatch"): (16 * 68, 32 * 68),
        ("fp8_rowwise_a2a", "combine"): (16 * 128, 32 * 128),
        ("fp8_rowwise_a2a", "combine_grad"): (16 * 68, 32 * 68)}  # fmt: skip


def test_stage_bytes_per_link_class_match_the_hand_count():
    o = EPOptions(K, N, E, T, 1, "balanced", 0)
    for (strategy, stage), (intra, inter) in HAND.items():
        per_rank = stage_link_bytes(two_nodes_of_two(), balanced_counts(4), strategy, o)[stage]
        for r in per_rank:
            assert (r["intra_node"]["sent"], r["inter_node"]["sent"]) == (intra, inter), (strategy, stage)
            assert (r["intra_node"]["received"], r["inter_node"]["received"]) == (intra, inter)


# Skewed by hand, 4 ranks on 2 nodes, 1 local expert: COUNTS[src][dst] copies. The dispatch's way, rank 1 sends
# 1, 0, 3, 4 rows to ranks 0..3 (1 intra, 7 inter) and receives 2, 0, 5, 7 (2 intra, 12 inter); the combine's way
# the other way round. Rank 3 sends rank 2 (its node) 2 rows and receives 0 from it.
COUNTS = [[[6], [2], [1], [3]], [[1], [0], [3], [4]], [[2], [5], [9], [0]], [[8], [7], [2], [5]]]


def a2a_record(sent_rows: list[int], row_bytes: int) -> Record:
    ranks = [{"rank": r, "median_us": 1.0 + r, "bytes_read": n * row_bytes} for r, n in enumerate(sent_rows)]
    return Record(Point(T, N, K, 1, "bf16"), "forward", "dispatch", "a2a", "all_to_all", bytes_read=0,
                  bytes_written=0, telemetry={"ranks": ranks, "across_ranks": {"slowest_rank": 1}})  # fmt: skip


def test_measured_records_are_split_by_the_way_their_rows_go():
    from mxbench.workloads.ep.topology import annotate_records

    # dispatch's way: rank r sends COUNTS[r][d] (off-rank rows per rank: 6, 8, 7, 17), 100 B a row
    dispatch = a2a_record([6, 8, 7, 17], 100)
    # the way back (combine): rank r sends COUNTS[d][r] (off-rank rows: 11, 14, 6, 7), 60 B a row
    combine = a2a_record([11, 14, 6, 7], 60)
    other = a2a_record([5, 5, 5, 5], 10)  # neither way: left without a split
    annotate_records([dispatch, combine, other], two_nodes_of_two(), COUNTS)
    assert dispatch.telemetry["link_bytes"] == {"intra_node": {"sent": 100, "received": 200},
                                                "inter_node": {"sent": 700, "received": 1200}}  # fmt: skip
    assert combine.telemetry["link_bytes"] == {"intra_node": {"sent": 120, "received": 60},
                                               "inter_node": {"sent": 720, "received": 420}}  # fmt: skip
    assert dispatch.telemetry["ranks"][3]["link_bytes"]["intra_node"] == {"sent": 200, "received": 0}
    assert "link_bytes" not in other.telemetry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_launcher(port: int, node: int, out: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "CUDA_VISIBLE_DEVICES": "",
           "TRITON_INTERPRET": "1"}  # fmt: skip
    args = [sys.executable, "-m", "mxbench", "ep", "--nproc", "2", "--nnodes", "2", "--node-rank", str(node),
            "--rdzv-backend", "c10d", f"--rdzv-endpoint=localhost:{port}", f"--rdzv-id=ci-{port}",
            "--check", "--K", str(K), "--N", str(N), "--experts", str(E), "--tokens", str(T),
            "--strategy", "bf16,mxfp8_a2a", "--out", str(out)]  # fmt: skip
    # a session of its own, so that a hung launcher and its workers can be ended together by this group's id
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def test_two_launchers_as_two_nodes_check_the_run_and_record_its_topology(tmp_path):
    out, port = tmp_path / "check.json", free_port()
    logs = [tmp_path / f"node{n}.log" for n in (0, 1)]
    procs = [start_launcher(port, n, out, logs[n]) for n in (0, 1)]
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=LAUNCH_TIMEOUT_S))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two launchers did not finish in {LAUNCH_TIMEOUT_S} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    text = "\n".join(log.read_text() for log in logs)
    assert codes == [0, 0], text
    assert "stages match their oracle on all 4 ranks" in text and "FAIL" not in text
    record = json.loads(out.read_text())
    nodes = record["nodes"]
    assert (nodes["nodes"], nodes["ranks_per_node"], nodes["same_node_pairs"]) == (2, [2, 2], [[0, 1], [2, 3]])
    assert nodes["node_of_rank"] == [0, 0, 1, 1] and len(set(nodes["host_of_rank"])) == 1
    assert set(record["link_bytes"]) == {"bf16", "mxfp8_a2a"}  # the strategies launched; FP8 rowwise's by hand above
    for (strategy, stage), (intra, inter) in HAND.items():
        for r in record["link_bytes"].get(strategy, {}).get(stage, []):
            assert (r["intra_node"]["sent"], r["inter_node"]["sent"]) == (intra, inter), (strategy, stage)


def test_an_all_to_all_across_nodes_reads_each_class_against_its_own_link():
    from mxbench.workloads.ep import tables
    from mxbench.storage.results import Run

    split = {"intra_node": {"sent": 300_000_000, "received": 300_000_000},
             "inter_node": {"sent": 50_000_000, "received": 50_000_000}}  # fmt: skip
    rec = Record(Point(T, N, K, E, "bf16"), "forward", "dispatch", "a2a", "all_to_all", bytes_read=350_000_000,
                 bytes_written=350_000_000, samples_us=[2000.0],
                 telemetry={"across_ranks": {}, "link_bytes": split})  # fmt: skip
    meta = {"kind": "ep", "card": "NVIDIA H100 80GB HBM3", "hardware": "h100-sxm", "world_size": 4,
            "nodes": two_nodes_of_two().to_meta(), "layer": {}, "routing": {}}  # fmt: skip
    row = tables.ep_rows(Run(meta, [rec]))[0]
    # 0.6 GB in 2 ms = 300 GB/s of 900 GB/s NVLink; 0.1 GB in 2 ms = 50 GB/s of the 100 GB/s NIC (CX-7 400 Gb/s)
    assert (row["Intra-node GB/s"], row["Intra-node % datasheet"]) == ("300", "33.3%")
    assert (row["Inter-node GB/s"], row["Inter-node % datasheet"]) == ("50", "50.0%")
    header = tables.ep_table(Run(meta, [rec]), "ep", "plain")
    assert "NIC 100 GB/s" in header and "ranks sharing a node: (0,1), (2,3)" in header
