"""The EP projection: the link model's bytes per class by hand, a prediction by hand, the validation on the stored
H100 EP=2 -> EP=4 runs, and bad input refused with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mxbench.workloads.ep import project
from mxbench.workloads.ep.project import AllToAll, LinkModel, Measured, StrategyRun, bytes_per_copy, predict, read_run
from mxbench.workloads.ep.topology import LinkClass
from mxbench.storage.results import load_run

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "results" / "nvidia-h100-80gb-hbm3" / "ep"
INTRA, INTER = LinkClass.INTRA, LinkClass.INTER


@pytest.mark.parametrize(
    ("ep", "max_nodes", "intra", "inter"),
    [
        # one node of 8: 7 of every 8 copies leave the rank, all over NVLink
        (8, 4, 7 / 8, 0.0),
        # EP 16 = 2 nodes of 8, top-8, M = 4: a token reaches min(4, 2, 8) = 2 nodes, its own among them, so 1 row
        # per token (1/8 per copy) crosses the NIC; NVLink carries 7 of 16 copies to the node's other GPUs plus the
        # 8 of 16 that arrive from the other node, all but 1 in 8 of them forwarded: 7/16 + 8/16 * 7/8 = 7/8
        (16, 4, 7 / 8, 1 / 8),
        # without the node limit every copy crosses on its own: 7/16 stay on the node, 8/16 leave it
        (16, 0, 7 / 16, 8 / 16),
        # EP 64 = 8 nodes, M = 4: 4 nodes per token, 4 * (1 - 1/8) = 3.5 rows per token = 7/16 per copy
        (64, 4, 7 / 64 + 56 / 64 * 7 / 8, 7 / 16),
        (64, 0, 7 / 64, 56 / 64),
        # EP 256 = 32 nodes: 4 * 31/32 rows per token
        (256, 4, 7 / 256 + 248 / 256 * 7 / 8, 4 * 31 / 32 / 8),
    ],
)
def test_bytes_per_copy_by_hand(ep, max_nodes, intra, inter):
    got = bytes_per_copy(ep, 8, 8, max_nodes)
    assert got[INTRA] == pytest.approx(intra) and got[INTER] == pytest.approx(inter)


def test_within_one_node_the_model_is_the_measured_all_to_all():
    # EP 2 and 4 on one node: (W - 1) / W of the copies leave the rank, as the stored runs' bytes say
    for ep in (2, 4):
        assert bytes_per_copy(ep, 8, 1, 4) == {INTRA: (ep - 1) / ep, INTER: 0.0}


def synthetic(groups="balanced", received=(8000, 8000)) -> Measured:
    """EP 2: one strategy, compute 100 us, one all-to-all of 1000-byte rows taking 50 us, step 140 us."""
    a2a = AllToAll("dispatch", 50.0, 1000.0, 4_000_000, 0)
    s = StrategyRun("bf16", 140.0, 100.0, (100.0, 100.0), (a2a,))
    return Measured("syn", "card", 2, 1, 1000, 8, 8, 64, 64, groups, 0, received, (s,))


def test_a_prediction_by_hand():
    model = LinkModel(8, intra_gbps=100.0, inter_gbps=10.0, max_nodes=4, latency_us=5.0)
    (p,) = predict(synthetic(), 16, model)
    # 8000 copies: intra 8000 * 7/8 * 1000 B = 7 MB at 100 GB/s = 70 us; inter 8000 * 1/8 * 1000 B = 1 MB at
    # 10 GB/s = 100 us; the slower class sets it, + 5 us latency
    assert p.a2a_us == pytest.approx(105.0) and p.compute_us == pytest.approx(100.0)
    assert (p.intra_bytes, p.inter_bytes) == (pytest.approx(7e6), pytest.approx(1e6))
    assert p.step_us == pytest.approx(140.0 * (100.0 + 105.0) / (100.0 + 50.0))
    assert p.share == pytest.approx(105.0 / 205.0) and p.nodes == 2


def test_balanced_shares_are_even_and_skewed_ones_follow_the_seeded_router():
    assert project.imbalance(project.rank_shares("balanced", 0, 16, 8)) == pytest.approx(1.0)
    shares = project.rank_shares("skewed", 0, 4, 8)
    assert shares.sum() == pytest.approx(1.0) and project.imbalance(shares) > 1.2
    # the stored EP=4 skewed run received, per rank, 4 * 131072 copies times these shares (within 0.5%)
    run = load_run(RUNS / "ep4-deepseek-v3-skewed.json")
    received = [sum(sum(src[dst]) for src in run.meta["routing"]["send_counts"]) for dst in range(4)]
    assert [r / (4 * 131072) for r in received] == pytest.approx(list(shares), rel=5e-3)


def test_a_skewed_runs_compute_follows_the_busiest_rank():
    # two ranks: 100 us for 8000 copies and 60 us for 4000: 20 us + 0.01 us per copy
    m = synthetic("skewed", (8000, 4000))
    s = m.strategies[0]
    m = Measured(**{**m.__dict__, "strategies": (StrategyRun("bf16", 140.0, 100.0, (100.0, 60.0), s.alltoalls),)})
    (p,) = predict(m, 4, LinkModel(8, 100.0, 10.0, 4))
    busiest = (4 * 8000 * project.rank_shares("skewed", 0, 4, 8)).max()
    assert p.compute_us == pytest.approx(20.0 + 0.01 * busiest)


def ep_project(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mxbench", "ep-project", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.parametrize("routing", ["", "-skewed"])
def test_ep4_predicted_from_ep2_within_10_percent(routing, tmp_path):
    figure = tmp_path / "validation.png"
    done = ep_project(str(RUNS / f"ep-deepseek-v3{routing}.json"), "--validate",
                      str(RUNS / f"ep4-deepseek-v3{routing}.json"), "--format", "json", "--plot-file",
                      str(figure))  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    rows = {r["Strategy"]: r for r in result["validation"]}
    assert set(rows) == {"bf16", "mxfp8", "mxfp8_a2a"}
    for r in rows.values():
        assert abs(float(r["Step error"].rstrip("%"))) < 10.0, r
    assert any("measured in ep-deepseek-v3" in a for a in result["assumptions"])  # the run's own NVLink rate
    assert figure.stat().st_size > 0


def test_the_validation_reads_the_measured_runs_as_stored():
    m = read_run(load_run(RUNS / "ep-deepseek-v3.json"), "ep2")
    bf16 = next(s for s in m.strategies if s.strategy == "bf16")
    # 131072 x 7168 bf16 rows, half of them to the other rank: 939524096 B = 65536 copies of 14336 B
    dispatch = next(a for a in bf16.alltoalls if a.name == "dispatch")
    assert dispatch.row_bytes == 14336 and dispatch.busiest_bytes == 939524096
    assert [a.name for a in bf16.alltoalls] == ["dispatch", "combine", "combine_grad", "dispatch_grad"]
    assert m.received == (131072, 131072) and (m.ep, m.nodes, m.top_k) == (2, 1, 1)


def test_the_projection_table_states_its_assumptions_and_marks_projections(tmp_path):
    out = tmp_path / "p.md"
    done = ep_project(str(RUNS / "ep-deepseek-v3.json"), "--top-k", "8", "--ep", "8,16,64", "--out", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "projected, not measured" in text and "Assumptions:" in text and "M = 4 nodes" in text
    assert "DeepEP README" in text and "16384 tokens per rank, top-k 8" in text
    assert "131072 copies per rank held" in text
    assert text.count("| ep-deepseek-v3 (measured EP 2, balanced) |") == 9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ep", "8,12"], "--ep: 12 spans more than one node"),
        (["--intra-gbps", "0"], "--intra-gbps"),
        (["--inter-gbps", "-5"], "--inter-gbps"),
        (["--gpus-per-node", "0"], "--gpus-per-node"),
        (["--max-nodes-per-token", "-1"], "--max-nodes-per-token"),
        (["--intra-gbps", "100", "--intra-from-run"], "not both"),
        (["--top-k", "3"], "--top-k: 3 does not divide"),
        (["--validate", str(RUNS / "ep-llama4.json")], "--validate: ep-llama4 does not time the layer"),
    ],
)
def test_bad_input_exits_2_naming_the_option(args, message):
    done = ep_project(str(RUNS / "ep-deepseek-v3.json"), *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_run_that_is_not_an_ep_run_is_refused():
    done = ep_project(str(ROOT / "results" / "nvidia-h100-80gb-hbm3" / "layer-deepseek-v3.json"))
    assert done.returncode == 2 and "not a measured EP run" in done.stderr, done.stderr


def test_a_layer_run_reads_role_named_stages_by_category():
    """A whole-layer run (``mxbench ep --layer``): any stage that is not an all-to-all is compute, whatever its name;
    the routing calls outside the step are left out."""
    from mxbench.storage.results import Point, Record, Run

    def rec(stage, category, us, sent=0, note=None):
        ranks = [{"rank": r, "median_us": us - r, "bytes_read": sent, "bytes_written": sent} for r in range(2)]
        telemetry = {"ranks": ranks, "across_ranks": {"max_us": us, "slowest_rank": 0}}
        if note:
            telemetry["note"] = note
        return Record(Point(64, 64, 64, 2, "bf16"), "forward", stage, "k", category, bytes_read=sent,
                      bytes_written=sent, samples_us=[us], telemetry=telemetry)  # fmt: skip

    records = [rec("exchange_counts", "all_to_all", 99.0, 16, note="routing"), rec("router_gate", "gemm", 10.0),
               rec("dispatch_x", "all_to_all", 20.0, 32 * 128), rec("swiglu", "elementwise", 5.0),
               rec("combine_y", "all_to_all", 30.0, 32 * 128), rec("fwd+bwd", "end_to_end", 70.0)]  # fmt: skip
    meta = {"kind": "ep", "card": "c", "world_size": 2, "strategies": ["bf16"],
            "layer": {"tokens_per_rank": 64, "top_k": 1, "experts_per_rank": 2, "K": 64, "N": 64, "part": "layer"},
            "routing": {"groups": "balanced", "seed": 0}}  # fmt: skip
    m = read_run(Run(meta, records), "layer")
    (s,) = m.strategies
    # compute: router_gate 10 + swiglu 5 (slowest ranks), per rank 10 + 5 and 9 + 4; two all-to-alls of 128 B rows
    assert (s.compute_us, s.compute_per_rank, s.a2a_us, s.step_us) == (15.0, (15.0, 13.0), 50.0, 70.0)
    assert [a.name for a in s.alltoalls] == ["dispatch_x", "combine_y"]
    assert all(a.row_bytes == 128 for a in s.alltoalls)  # 64 copies per rank, 32 of them to the other rank
