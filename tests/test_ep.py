"""The expert-parallel pipeline on CPUs: kernels against references, the layer against its single-process reference,
the harness's records and tables, and ``mxbench ep --nproc N --check`` end to end (gloo, Triton interpreter).

Every expectation comes from an independent computation: plain-torch gathers, host-loop chunk reorders, a dense
per-token product for the layer reference, and the reference layer for the distributed one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import FakeTiming
from readme_runs import readme_line
from mxkernels.ep import comm
from mxkernels.reference import ep as ep_reference
from mxkernels.stages import ep_stages
from mxkernels.moe import token_permute
from mxkernels.core import vjp
from mxkernels.core.comparison import sqnr_db
from mxkernels.layouts.padding import padded_rows
from mxkernels.stages.step_specs import all_specs, get_spec

from mxbench.workloads.ep.command import DEFAULT_STRATEGIES
from mxbench.workloads.ep import check as ep_check
from mxbench.workloads.ep import launch, measure, rank_timing, tables
from mxbench.measuring.dist import Context
from mxbench.storage.results import Run

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--K", "64", "--N", "64", "--experts", "2", "--tokens", "32"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16}[t.element_size()])


# ---- kernels ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e8m0fnu])
def test_gather_rows_moves_rows_bit_for_bit(dtype, device):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 255, (29, 70), generator=gen, dtype=torch.uint8)
    x = (x.view(torch.int16).view(torch.bfloat16) if dtype == torch.bfloat16 else x.view(dtype)).to(device)
    index = torch.randint(0, x.shape[0], (45,), generator=gen, dtype=torch.int32).to(device)
    got = token_permute.gather_rows(x, index)
    assert torch.equal(bits(got), bits(x)[index.long()])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy, on purpose
@pytest.mark.parametrize("top_k", [2, 3])
def test_gather_rows_sums_top_k_in_fp32_and_rounds_to_nearest_even(top_k, device):
    gen = torch.Generator().manual_seed(top_k)
    x = torch.randn(40, 96, generator=gen).to(torch.bfloat16)
    x[0, :4] = torch.tensor([1.0, 2.0**-8, 3.0e38, float("nan")])  # a tie that rounds to even, overflow, NaN
    x[1, :4] = torch.tensor([2.0**-8, 2.0**-8, 3.0e38, 1.0])
    index = torch.randint(0, 40, (60 * top_k,), generator=gen, dtype=torch.int32)
    index[:2] = torch.tensor([0, 1], dtype=torch.int32)
    x, index = x.to(device), index.to(device)
    got = token_permute.gather_rows(x, index, top_k=top_k)
    picked = x.float()[index.long()].view(60, top_k, 96)
    total = picked[:, 0]
    for j in range(1, top_k):  # fp32 sums in choice order, as the contract says; torch rounds fp32 -> bf16 RNE
        total = total + picked[:, j]
    want = total.to(torch.bfloat16)
    assert torch.equal(bits(got)[~want.isnan()], bits(want)[~want.isnan()]) and bool(got[want.isnan()].isnan().all())


def test_chunk_transpose_index_reorders_chunks_and_its_transpose_undoes_it():
    counts = torch.tensor([[3, 0, 2], [1, 4, 0], [0, 2, 5]], dtype=torch.int32)
    x = torch.arange(17 * 2, dtype=torch.float32).view(17, 2)
    index, ends = token_permute.chunk_transpose_index(counts, 17)
    # by hand: chunk (a, b) rows, a-major: (0,0) 0-2, (0,2) 3-4, (1,0) 5, (1,1) 6-9, (2,1) 10-11, (2,2) 12-16;
    # b-major: b = 0 takes (0,0) (1,0), b = 1 takes (1,1) (2,1), b = 2 takes (0,2) (2,2)
    rows = [0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 3, 4, 12, 13, 14, 15, 16]
    assert index.tolist() == rows and ends.tolist() == [4, 10, 17]
    reference, ref_ends = token_permute.chunk_transpose_reference(x, counts)
    assert torch.equal(x[index.long()], reference) and torch.equal(ends, ref_ends)
    back, _ = token_permute.chunk_transpose_index(counts.t().contiguous(), 17)
    assert torch.equal(reference[back.long()], x)


def test_route_sorts_copies_stably_by_expert():
    experts = torch.tensor([[2, 0], [1, 2], [0, 3], [2, 1]])
    r = token_permute.route(experts, 5)
    flat = experts.reshape(-1)
    order = r["order"].long()
    assert flat[order].tolist() == sorted(flat.tolist())
    assert all(order[i] < order[i + 1] for i in range(len(order) - 1) if flat[order[i]] == flat[order[i + 1]])
    assert torch.equal(r["token_of"].long(), order // 2)
    assert torch.equal(order[r["pos"].long()], torch.arange(8))
    assert r["counts"].tolist() == [2, 2, 3, 1, 0]


def test_all_to_all_cost_counts_only_other_ranks_rows():
    # rank 1 of 3 sends 4 / 5 / 6 rows (5 stay local) and receives 1 / 5 / 2; MXFP8 rows of K = 64: 64 + 2 bytes
    cost = comm.all_to_all_cost([4, 5, 6], [1, 5, 2], rank=1, row_bytes=66)
    assert (cost.bytes_read, cost.bytes_written) == (10 * 66, 3 * 66)


# ---- the reference and the layer -----------------------------------------------------------------------------


def test_layer_reference_is_a_per_token_product():
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(6, 32, generator=gen).bfloat16() for _ in range(2)]
    experts = [torch.tensor([[0], [3], [1], [3], [2], [0]]), torch.tensor([[3], [3], [0], [1], [1], [2]])]
    w = torch.randn(4, 64, 32, generator=gen).bfloat16()
    dys = [torch.randn(6, 64, generator=gen).bfloat16() for _ in range(2)]
    ys, grad_xs, grad_w = ep_reference.ep_layer_reference(xs, experts, w, dys, "bf16")
    for r in range(2):
        for t in range(6):
            e = int(experts[r][t, 0])
            assert torch.equal(ys[r][t], (xs[r][t].double() @ w[e].double().T).bfloat16())
            assert torch.equal(grad_xs[r][t], (dys[r][t].double() @ w[e].double()).bfloat16())
    dense = sum(torch.outer(dys[r][t].double(), xs[r][t].double()) for r in range(2) for t in range(6)
                if int(experts[r][t, 0]) == 2)  # fmt: skip
    assert torch.equal(grad_w[2], dense.bfloat16())


OPTIONS = ep_check.EPOptions(K=64, N=96, E=3, T=40, top_k=2, groups="skewed", seed=3)


def test_every_stage_matches_its_oracle_and_the_layer_its_reference(world_of_one):
    # in one process (the all-to-alls copy locally); every strategy runs on 2 and 4 processes below
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, "mxfp8_a2a", OPTIONS)
    assert [c for c in stage_checks if c.verdict != "PASS"] == []
    assert {c.stage for c in stage_checks} >= {"dispatch", "permute", "pad_a_mx", "combine", "dequantize_a"}
    assert all(c.ok for c in layer_checks), layer_checks
    # MXFP8 is ~28 dB from bf16: the MXFP8 reference is not the bf16 one under another name
    assert all(20 < c.vs_bf16_db < 35 for c in layer_checks), layer_checks


def test_the_checks_backward_hands_the_layer_dy_bit_for_bit():
    seen = []

    class Spy(torch.autograd.Function):  # the layer's autograd function, recording the gradient it is handed
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(g)
            return g

    gen = torch.Generator().manual_seed(5)
    dy = torch.randn(6, 8, generator=gen).bfloat16()
    dy[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 2.0**-133])  # NaN, inf, -0, a subnormal
    x = torch.randn(6, 8, generator=gen).bfloat16().requires_grad_()
    vjp.backward(Spy.apply(x), dy)
    assert torch.equal(bits(seen[0]), bits(dy)) and torch.equal(bits(x.grad), bits(dy))
    (g,) = vjp.grad(Spy.apply(x), x, dy)
    assert torch.equal(bits(seen[1]), bits(dy)) and torch.equal(bits(g), bits(dy))
    with pytest.raises(RuntimeError, match="shape"):  # a dy that does not fit y: torch's own error, as before
        vjp.backward(Spy.apply(x), dy[:5])
    with pytest.raises(RuntimeError, match="shape"):
        vjp.grad(Spy.apply(x), x, dy[:5])
    wide = torch.randn(6, 8, generator=gen, dtype=torch.float64)  # another dtype: torch rounds it to y's, as before
    (g,) = vjp.grad(Spy.apply(x), x, wide)
    assert torch.equal(bits(g), bits(wide.bfloat16()))


def test_a_swapped_permutation_fails_stage_and_layer_checks(world_of_one):
    sys.path.insert(0, str(Path(__file__).parent))
    from mxbench.implementations.registry import parse_impl

    impl = parse_impl("permute=ep_broken:swapped_permute", "bf16", ep_stages.get_ep_spec)
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, "bf16", OPTIONS, [impl])
    assert [c.stage for c in stage_checks if c.verdict == "FAIL"] == ["permute"]
    assert not all(c.ok for c in layer_checks)


def test_mxfp8_a2a_sends_about_half_the_bytes_of_bf16():
    shape = ep_stages.EPShape(T=64, K=7168, N=2048, E=2, top_k=1, rank=0, world=2, send_counts=((16, 16), (16, 16)),
                              recv_counts=((16, 16), (16, 16)))  # fmt: skip
    sent = {s: {st.name: st.cost.bytes_read for st in ep_stages.ep_step_stages(s, shape) if st.category == "all_to_all"}
            for s in ("bf16", "mxfp8_a2a")}  # fmt: skip
    assert sent["bf16"]["dispatch"] == 32 * 2 * 7168
    assert sent["mxfp8_a2a"]["dispatch"] == 32 * (7168 + 7168 // 32)  # 0.52x: data + e8m0 scales
    assert sent["mxfp8_a2a"]["combine_grad"] == 32 * (2048 + 64) and sent["mxfp8_a2a"]["combine"] == 32 * 2 * 2048
    assert sent["mxfp8_a2a"]["dispatch_grad"] == sent["bf16"]["dispatch_grad"]  # the dispatch's gradient is bf16


# ---- measurement path and tables, with a fake timer ------------------------------------------------------------


def fake_time_on_ranks(ctx, fn, *, graph, samples):
    fn()  # every timed call must run on its bound inputs
    return rank_timing.RankTiming(ctx.rank, [10.0 + ctx.rank, 12.0, 11.0], "graph", {"calls_per_replay": 1})


def test_measured_records_carry_costs_and_per_rank_statistics(world_of_one, monkeypatch, tmp_path):
    monkeypatch.setattr(measure, "time_on_ranks", fake_time_on_ranks)
    records = measure.measure_strategy(world_of_one, "mxfp8_a2a", OPTIONS, graph=True, samples=3)
    stages = [s.name for s in ep_stages.ep_step_stages("mxfp8_a2a", _plan_shape(world_of_one))]
    assert [r.stage for r in records] == ["route", "exchange_counts", *stages, "fwd+bwd"]
    assert all(r.ok and r.telemetry["across_ranks"]["median_us"] == 11.0 for r in records)
    dispatch = next(r for r in records if r.stage == "dispatch")
    assert dispatch.category == "all_to_all" and dispatch.bytes == 0  # one rank: nothing crosses a link
    gemm = next(r for r in records if r.stage == "gemm_fwd")
    # the GEMM runs on the padded buffer (skewed groups are not multiples of 32), whose rows it is charged for
    rows = padded_rows(OPTIONS.T * OPTIONS.top_k, OPTIONS.E, 32)
    assert gemm.flops == 2 * rows * OPTIONS.N * OPTIONS.K and gemm.shapes[0] == (rows, OPTIONS.K)
    from mxbench.workloads.ep.metadata import ep_metadata, rank_info

    layer = {"tokens_per_rank": OPTIONS.T, "K": OPTIONS.K, "N": OPTIONS.N, "experts_per_rank": OPTIONS.E, "top_k": 2}
    meta = ep_metadata(world_of_one, [rank_info(world_of_one)], layer, {"groups": "skewed", "seed": 3},
                       ["mxfp8_a2a"], {"samples": 3}, "mxbench ep --check")  # fmt: skip
    assert (meta["kind"], meta["world_size"], meta["backend"], meta["card"]) == ("ep", 1, "gloo", "cpu")
    run = Run(meta, records)
    assert {r["Stage"] for r in tables.ep_rows(run)} >= {"route", "exchange_counts", "dispatch", "pad_a_mx", "fwd+bwd"}
    assert "EP degree 1 (gloo" in tables.ep_table(run, "ep-summary", "plain")
    from mxbench.workloads.ep.figure import plot_ep

    assert plot_ep(run, tmp_path / "ep.png").stat().st_size > 0


def _plan_shape(ctx):
    from mxkernels.autograd.ep_projection import plan_routing

    experts = ep_check.rank_inputs(ctx, OPTIONS)["experts"]
    return plan_routing(experts, experts_per_rank=OPTIONS.E, K=OPTIONS.K, N=OPTIONS.N).shape


def synthetic_ep_run() -> Run:
    """A stored EP run by hand: one dispatch of 0.45 GB each way in 2 ms, and the steps of two strategies."""
    from mxbench.storage.results import Point, Record

    record = Record(Point(64, 64, 64, 2, "bf16"), "forward", "dispatch", "a2a", "all_to_all", bytes_read=450_000_000,
                    bytes_written=450_000_000, samples_us=[2000.0], telemetry={"across_ranks": {}})  # fmt: skip
    steps = [Record(Point(64, 64, 64, 2, s), "end_to_end", "fwd+bwd", "", "end_to_end", samples_us=[us])
             for s, us in (("bf16", 3000.0), ("mxfp8_a2a", 2400.0))]  # fmt: skip
    ceiling = {"card": "NVIDIA H100 80GB HBM3", "world_size": 2, "bidirectional_gbps": 600.0, "nccl": "2.28.9"}
    meta = {"kind": "ep", "card": "NVIDIA H100 80GB HBM3", "hardware": "h100-sxm", "alltoall_ceiling": ceiling,
            "world_size": 2, "layer": {"K": 64, "N": 64}, "routing": {"groups": "balanced", "seed": 0}}  # fmt: skip
    return Run(meta, [record, *steps])


def test_all_to_all_rows_read_against_both_link_roofs():
    run = synthetic_ep_run()
    row = tables.ep_rows(run)[0]
    # 0.9 GB over 2 ms = 450 GB/s both directions: 50% of 900 GB/s NVLink, 75% of the measured 600 GB/s
    assert (row["Achieved"], row["% datasheet"], row["% measured"]) == ("450 GB/s", "50.0%", "75.0%")
    assert tables.ep_rows(run)[-1]["Speedup vs bf16"] == "1.250x"
    summary = {r["Strategy"]: r for r in tables.summary_rows(run)}
    assert summary["bf16"]["All-to-all GB/s (both dirs)"] == "450" and summary["mxfp8_a2a"]["Speedup vs bf16"]


def test_table_kinds_ep_render_stored_ep_runs_only(tmp_path):
    from click.testing import CliRunner

    from mxbench.cli import cli
    from mxbench.storage.results import save_run

    path, _ = save_run(synthetic_ep_run(), tmp_path / "ep.json")
    result = CliRunner().invoke(cli, ["table", str(path), "--kind", "ep-summary", "--format", "plain"])
    assert result.exit_code == 0 and "1.250x" in result.output and "NVLink 900 GB/s" in result.output, result.output
    other, _ = save_run(Run({"card": "x"}, synthetic_ep_run().records), tmp_path / "roofline.json")  # no kind: a roofline
    result = CliRunner().invoke(cli, ["table", str(other), "--kind", "ep"])
    assert result.exit_code == 2 and "needs a run of `mxbench ep`" in result.output


# ---- the launcher ------------------------------------------------------------------------------------------------


def test_workers_keep_multicast_off_without_overriding_a_set_value():
    env = launch.worker_env({"PATH": "/bin"}, has_gpu=False)
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"], env["TRITON_INTERPRET"]) == ("0", "1", "1")
    kept = launch.worker_env({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "7"}, has_gpu=True)
    assert kept["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "7" and "TRITON_INTERPRET" not in kept


def test_launcher_command_passes_rendezvous_options_and_defaults_to_standalone():
    cmd = launch.launcher_command(2, [], ["ep", "--check"])
    assert cmd[1:] == ["-m", "mxbench.workloads.ep.torchrun", "--nproc-per-node=2", "--standalone", "-m", "mxbench", "ep",
                       "--check"]  # fmt: skip
    assert "--standalone" not in launch.launcher_command(2, ["--master-port=29601"], ["ep"])


def mxbench_ep(*args: str, extra_path: str | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    # The CPU path (gloo, the Triton interpreter) on any machine: a GPU box hides its GPUs from these workers (its
    # NCCL path is what the GPU runs measure; several ranks cannot share one GPU there).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (*sys.path, extra_path) if p),
           "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "mxbench", "ep", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def test_two_processes_check_every_strategy_with_skewed_top_k_routing(readme_run):
    # The README's line, run once for test_readme too (readme_runs.py): every default strategy, skewed top-2 routing.
    line = readme_line("mxbench ep --nproc 2 --check ")
    assert {"--top-k 2", "--groups skewed", "--experts 2"} <= {" ".join(p) for p in zip(line.split(), line.split()[1:])}
    assert "--strategy" not in line and "--layer" not in line
    done = readme_run(line)
    assert done.returncode == 0, done.stdout + done.stderr
    for strategy in DEFAULT_STRATEGIES.split(","):  # the FP8 rowwise ones: tests/test_ep_fp8.py
        assert f"{strategy}: " in done.stdout and "stages match their oracle on all 2 ranks" in done.stdout
    assert "FAIL" not in done.stdout


def test_two_processes_fail_the_check_of_a_broken_permutation():
    done = mxbench_ep("--nproc", "2", "--check", *TINY, "--strategy", "bf16", "--impl",
                      "permute=ep_broken:swapped_permute", extra_path=str(Path(__file__).parent))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL bf16/permute on rank 0" in done.stdout and "FAIL bf16/permute on rank 1" in done.stdout


def test_eight_processes_check_that_world_sizes_paths():
    """The EP degree of the 8-GPU runs, on gloo (the 4-GPU runs' degree: test_ep_fp8's four-process layer check; each
    rank costs a torch import and its pipeline's interpreted run, so one world size above 3 here)."""
    world = 8
    done = mxbench_ep("--nproc", str(world), "--check", *TINY, "--top-k", "3", "--groups", "skewed", "--seed", "1",
                      "--strategy", "mxfp8_a2a", timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"stages match their oracle on all {world} ranks" in done.stdout and "FAIL" not in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc", "2", "--check", "--K", "48", "--N", "64"], "multiple of 32"),
        (["--nproc", "2", "--check", *TINY, "--strategy", "fp4"], "strategy must be one of"),
        (["--nproc", "2", "--check", *TINY, "--top-k", "5"], "top-k must be between 1 and the 4 experts"),
        (["--nproc", "2", *TINY], "no CUDA GPU"),
        (["--check", *TINY, "--tokns", "3"], "no such option"),
        (["--check", *TINY, "--master-port", "29600"], "go with --nproc"),
        (["--nproc", "2", "--check", *TINY, "--impl", "permute=no_such_module:f"], "cannot import"),
        (["--nproc", "2", "--check", *TINY, "--impl", "bf16/no_such_stage=ep_broken:swapped_permute"], "no stage"),
    ],
)
def test_bad_input_exits_2_before_any_worker_starts(monkeypatch, args, message):
    if torch.cuda.is_available() and message == "no CUDA GPU":
        pytest.skip("this machine has a GPU")
    from click.testing import CliRunner

    from mxbench.cli import cli

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    result = CliRunner().invoke(cli, ["ep", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_ep_specs_are_declared_apart_from_the_single_gpu_step():
    assert ep_stages.get_ep_spec("mxfp8", "dispatch").signature() == (
        "dispatch(xs_q, xs_s, *, send_splits, recv_splits, group) -> (xr_q, xr_s)"
    )
    assert ep_stages.get_ep_spec("bf16", "unsort_grad").params == ("top_k",)
    assert ep_stages.get_ep_spec("mxfp8", "gemm_fwd") is get_spec("mxfp8", "gemm_fwd")  # the step's own GEMM
    assert not set(ep_stages.ep_specs()) & set(all_specs())


def test_sqnr_floor_is_far_below_what_a_correct_layer_reaches_and_above_a_swapped_row():
    # one swapped pair of rows among 128: the swapped rows' error is twice their signal
    y = torch.randn(128, 64, dtype=torch.float64)
    swapped = y.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert sqnr_db(swapped, y) < ep_check.LAYER_FLOOR_DB < sqnr_db(y.bfloat16().double(), y)


# ---- timing in step across ranks (the logic; the GPU work is faked) ---------------------------------------------


@pytest.fixture
def cuda_context(world_of_one):
    """The one-process group, posing as a rank with a GPU so that ``time_on_ranks`` takes its GPU path."""
    return Context(0, 1, 0, "nccl", torch.device("cuda", 0), world_of_one.control)


def fake_time_fn(log, fail_graph=False):
    def time_fn(fn, *, cold_l2, use_graph, samples, agree=None):
        log.append(("graph" if use_graph else "events", agree(5.0) if agree else None))
        if use_graph and fail_graph:
            raise RuntimeError("captured nothing")
        return FakeTiming([1.0, 2.0, 3.0], "graph-cold" if use_graph else "events-cold", 4 if use_graph else 1)

    return time_fn


def test_ranks_agree_on_calls_per_replay_when_graphs_capture(cuda_context, monkeypatch):
    log = []
    monkeypatch.setattr(rank_timing, "_probe_capture", lambda fn: None)
    monkeypatch.setattr(rank_timing, "time_fn", fake_time_fn(log))
    t = rank_timing.time_on_ranks(cuda_context, lambda: None, graph=True, samples=3)
    assert log == [("graph", 5.0)] and t.method == "graph" and t.summary()["median_us"] == 2.0


def test_every_rank_times_with_events_when_a_capture_fails(cuda_context, monkeypatch):
    log = []
    monkeypatch.setattr(rank_timing, "_probe_capture", lambda fn: "RuntimeError: operation not permitted")
    monkeypatch.setattr(rank_timing, "time_fn", fake_time_fn(log))
    t = rank_timing.time_on_ranks(cuda_context, lambda: None, graph=True, samples=3)
    assert log == [("events", None)] and t.method == "events" and "not permitted" in t.details["graph_error"]


def test_a_graph_timing_that_fails_after_capture_is_retried_with_events(cuda_context, monkeypatch):
    log = []
    monkeypatch.setattr(rank_timing, "_probe_capture", lambda fn: None)
    monkeypatch.setattr(rank_timing, "time_fn", fake_time_fn(log, fail_graph=True))
    t = rank_timing.time_on_ranks(cuda_context, lambda: None, graph=True, samples=3)
    assert [m for m, _ in log] == ["graph", "events"] and t.method == "events" and t.error is None
    assert "captured nothing" in t.details["graph_error"]


def test_alltoall_ceilings_are_stored_per_card_and_world_size(tmp_path):
    from mxbench.workloads.ep import ceiling

    entry = {"card": "NVIDIA H200", "world_size": 2, "bidirectional_gbps": 660.0, "nccl": "2.28.9"}
    ceiling.save_alltoall_ceiling(entry, tmp_path)
    ceiling.save_alltoall_ceiling({**entry, "world_size": 4, "bidirectional_gbps": 700.0}, tmp_path)
    ceiling.save_alltoall_ceiling({**entry, "bidirectional_gbps": 670.0}, tmp_path)  # replaces the 2-rank entry
    assert ceiling.load_alltoall_ceiling(tmp_path, "NVIDIA H200", 2)["bidirectional_gbps"] == 670.0
    assert ceiling.load_alltoall_ceiling(tmp_path, "nvidia-h200", 4)["bidirectional_gbps"] == 700.0
    assert ceiling.load_alltoall_ceiling(tmp_path, "NVIDIA H200", 8) is None
    assert ceiling.alltoall_peak(entry).value == 0.66


def test_a_measured_all_to_all_ceiling_that_the_run_beats_is_replaced_by_the_runs_best():
    from mxbench.storage.results import Point, Record, Run

    p = Point(1024, 64, 64, 2, "bf16")
    fast = Record(p, "forward", "dispatch", "a2a", "all_to_all", bytes_read=600_000, samples_us=[1.0])  # 0.6 TB/s
    slow = Record(p, "forward", "combine", "a2a", "all_to_all", bytes_read=100_000, samples_us=[1.0])

    def measured_link(gbps):
        ceiling = {"card": "X", "world_size": 2, "bidirectional_gbps": gbps, "nccl": "2.28.9"}
        return tables.ep_peaks(Run({"card": "X", "alltoall_ceiling": ceiling}, [fast, slow]))["measured_link"]

    assert measured_link(700.0).value == pytest.approx(0.7)  # held: kept
    beaten = measured_link(500.0)
    assert beaten.value == pytest.approx(0.6) and "this run's fastest, dispatch (bf16)" in beaten.label
