"""The FP8 rowwise EP strategies (``fp8_rowwise``, ``fp8_rowwise_a2a``) and the EP layer's shared experts with
``--overlap`` (issue 33) on CPUs: the stage lists and the bytes their all-to-alls move (scales counted, by hand),
the check against the single-process references in one process, planted faults (scales not sent, the shared expert
left out of the output, the side stream not joined before use), the step timed both ways, bad input refused before
any worker starts, and the issue's command on 4 gloo processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mxkernels.ep import overlap
from mxkernels.ep.wgrad import Wgrad
from mxkernels.stages import ep_layer, ep_stages
from mxkernels.stages.ep_shared import side_stage_names
from test_ep import fake_time_on_ranks, mxbench_ep

from mxbench.workloads.ep import check as ep_check
from mxbench.workloads.ep import launch, measure
from mxbench.workloads.ep.workload import LayerOptions

HERE = Path(__file__).parent
EVEN = ((16, 16), (16, 16))


def layer_stages(strategy, shared=0, **kw):
    ep = ep_stages.EPShape(T=32, K=64, N=32, E=2, top_k=1, rank=0, world=2, send_counts=EVEN, recv_counts=EVEN)
    return {s.name: s for s in ep_layer.ep_layer_stages(strategy, ep_layer.EPLayerShape(ep, shared=shared), **kw)}


def projection_stages(strategy):
    ep = ep_stages.EPShape(T=32, K=64, N=96, E=2, top_k=1, rank=0, world=2, send_counts=EVEN, recv_counts=EVEN)
    return {s.name: s for s in ep_stages.ep_step_stages(strategy, ep)}


# ---- the stage lists -----------------------------------------------------------------------------------------------


def test_fp8_rows_cross_with_one_fp32_scale_each_and_the_combine_stays_bf16():
    # rank 0 sends 16 + 16 rows and receives as many; 32 cross. Layer K = 64: bf16 128 bytes a row, FP8 64 + 4.
    a2a, plain = layer_stages("fp8_rowwise_a2a"), layer_stages("fp8_rowwise")
    for name in ("dispatch", "combine_grad"):
        assert (a2a[name].cost.bytes_read, a2a[name].cost.bytes_written) == (32 * 68, 32 * 68)
        assert plain[name].cost.bytes_read == 32 * 128  # fp8_rowwise quantizes after the all-to-all
    for name in ("combine", "dispatch_grad"):
        assert a2a[name].cost.bytes_read == 32 * 128
    # the projection: dispatch K = 64 wide, the combine's gradient N = 96 wide (96 + 4 bytes vs 192)
    p = projection_stages("fp8_rowwise_a2a")
    assert (p["dispatch"].cost.bytes_read, p["combine_grad"].cost.bytes_read) == (32 * 68, 32 * 100)
    assert p["combine"].cost.bytes_read == 32 * 192


def test_fp8_a2a_quantizes_once_before_the_dispatch_and_the_gemms_read_what_crossed():
    s = layer_stages("fp8_rowwise_a2a")
    names = list(s)
    assert names.index("quantize_xs") < names.index("dispatch") < names.index("up.gemm_fwd")
    assert "up.quantize_a" not in s and "down.quantize_grad_out" not in s  # no second quantization
    assert s["up.gemm_fwd"].inputs[:2] == s["permute"].outputs[:2] == ("up.a_q", "up.a_s")
    assert s["dispatch"].inputs == s["quantize_xs"].outputs == ("xs_q", "xs_s")
    assert s["up.gemm_fwd"].recipe == "fp8_rowwise" and s["dispatch"].recipe == "fp8_rowwise"
    # the recipe's wgrad (the default) quantizes the dequantized crossed rows along the tokens
    assert s["up.quantize_a_t"].inputs[0] == s["dequantize_a"].outputs[0] == "a_bf"
    plain = layer_stages("fp8_rowwise")  # bf16 rows cross, permuted, then quantized
    assert plain["up.quantize_a"].inputs == plain["permute"].outputs[:1] == ("a",)


def test_shared_experts_are_issued_beside_the_all_to_alls_and_joined_after():
    s = layer_stages("bf16", shared=1)
    names = list(s)
    side = [n for n in names if n in side_stage_names(s.values())]
    assert side and all(n.startswith(("shared_up.", "shared_down.", "shared.swiglu")) for n in side)
    fwd = [n for n in side if s[n].pass_name == "forward"]
    assert names.index("sort_tokens") < names.index(fwd[0]) and names.index(fwd[-1]) < names.index("dispatch")
    bwd = [n for n in side if s[n].pass_name != "forward"]
    assert names.index(bwd[-1]) < names.index("combine_grad")
    assert s["add_shared"].inputs == ("y_routed", "ys") and s["unsort_combine"].outputs == ("y_routed",)
    assert s["router_gate_grad"].inputs[-1] == "grad_x_shared"
    assert {"shared_up.gemm_fwd", "shared_down.gemm_wgrad"} <= set(side) and "add_shared" not in side
    assert s["shared_up.gemm_fwd"].recipe == "bf16"  # bf16 unless in the recipe
    inr = ep_layer.ep_layer_stages("fp8_rowwise", ep_layer.EPLayerShape(
        ep_stages.EPShape(32, 64, 32, 2, 1, 0, 2, EVEN, EVEN), shared=1, shared_in_recipe=True))  # fmt: skip
    assert {st.recipe for st in inr if st.name.startswith("shared_up.gemm")} == {"fp8_rowwise"}


# ---- the check in one process ---------------------------------------------------------------------------------------


def options(shared=1, overlap_=True, wgrad=None, T=32):
    return ep_check.EPOptions(K=64, N=32, E=3, T=T, top_k=2, groups="skewed", seed=3, wgrad=wgrad,
                              layer=LayerOptions("sigmoid", True, shared, False, overlap_))  # fmt: skip


@pytest.mark.parametrize("strategy", ["fp8_rowwise", "fp8_rowwise_a2a"])
def test_fp8_strategies_with_the_bf16_wgrad_and_an_overlapped_shared_expert_match_the_reference(world_of_one,
                                                                                                 strategy):  # fmt: skip
    report: dict = {}
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, strategy, options(wgrad=Wgrad.BF16), (),
                                                         report)  # fmt: skip
    assert [c for c in stage_checks if c.verdict != "PASS"] == []
    outputs = ["y", "grad_x", "grad_wr", "grad_w13", "grad_w2", "grad_ws13", "grad_ws2"]
    assert [c.output for c in layer_checks] == outputs and all(c.ok for c in layer_checks), layer_checks
    assert all(18 < c.vs_bf16_db < 60 for c in layer_checks), layer_checks  # the recipe's error vs the fp32 layer
    if strategy == "fp8_rowwise_a2a":  # e4m3 keeps 3 mantissa bits: about 30 dB on N(0, 1) rows
        assert 25 < report["dispatch_sqnr_db"] < 40
    else:
        assert "dispatch_sqnr_db" not in report


@pytest.mark.parametrize(("strategy", "impl", "stage"), [
    ("fp8_rowwise_a2a", "fp8_rowwise/dispatch=ep_fp8_broken:dispatch_without_scales", "dispatch"),
    ("bf16", "add_shared=ep_fp8_broken:add_shared_left_out", "add_shared"),
])  # fmt: skip
def test_planted_faults_fail_their_stage_and_the_output(world_of_one, strategy, impl, stage):
    sys.path.insert(0, str(HERE))
    from mxbench.implementations.registry import parse_impl

    parsed = parse_impl(impl, "bf16", ep_layer.get_ep_layer_spec)
    # the bf16 wgrad: the recipe's per-group column quantizer is slow under the Triton interpreter
    o = options(overlap_=False, wgrad=Wgrad.BF16)
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, strategy, o, [parsed])
    assert [c.stage for c in stage_checks if c.verdict != "PASS"] == [stage]
    assert not next(c for c in layer_checks if c.output == "y").ok


def test_a_side_stream_read_before_its_join_fails_the_layer(world_of_one, monkeypatch):
    monkeypatch.setattr(overlap, "reads_side", lambda stage, pending: False)  # the join left to the end
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, "bf16", options())
    assert [c for c in stage_checks if c.verdict != "PASS"] == []  # each stage alone is right
    assert {c.output for c in layer_checks if not c.ok} >= {"y", "grad_x"}


def test_the_overlapped_step_is_timed_both_ways(world_of_one, monkeypatch):
    calls = []

    def timed(ctx, fn, *, graph, samples):
        calls.append(fn)
        return fake_time_on_ranks(ctx, fn, graph=graph, samples=samples)

    monkeypatch.setattr(measure, "time_on_ranks", timed)
    records = measure.measure_strategy(world_of_one, "bf16", options(), graph=True, samples=3)
    step = records[-1]
    assert step.stage == "fwd+bwd" and [r.stage for r in records].count("fwd+bwd") == 1
    info = step.telemetry["overlap"]
    assert info["overlapped_us"] == step.median_us and info["gain_us"] == info["serial_us"] - info["overlapped_us"]
    assert step.telemetry["shared_experts"] == 1
    assert len(calls) == len(records) + 1  # routing (2), every stage, the step, and the step in line once more
    from mxbench.storage.results import Run
    from mxbench.workloads.ep.tables import ep_part, summary_rows

    row = summary_rows(Run({}, records), peaks={})[0]
    assert row["Overlap gain (us)"] == f"{info['gain_us']:.1f}" and row["Step fwd+bwd (us)"] == f"{step.median_us:.1f}"
    layer = {"part": "layer", "score_func": "sigmoid", "shared_experts": 1, "overlap": True}
    assert "1 shared expert(s) in bf16, overlapped on a second stream" in ep_part(Run({"layer": layer}, []))


# ---- bad input, and the command on 4 processes ------------------------------------------------------------


@pytest.mark.parametrize(("args", "capability", "message"), [
    (["--strategy", "bf16,fp8_rowwise_a2a"], (8, 0), "fp8_rowwise_a2a needs FP8 tensor cores"),
    (["--overlap"], None, "no shared experts"),
    (["--shared-in-recipe", "--shared-experts", "0"], None, "no shared experts"),
    (["--shared-experts", "1", "--tokens", "24"], None, "--tokens must be a multiple of 16"),
])  # fmt: skip
def test_bad_input_exits_2_with_one_line_before_any_worker_starts(monkeypatch, args, capability, message):
    import torch
    from click.testing import CliRunner

    from mxbench.cli import cli

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    if capability is not None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    result = CliRunner().invoke(cli, ["ep", "--nproc", "2", "--check", "--layer", "--K", "64", "--N", "32", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) <= 3  # click's usage line + one


def test_an_fp8_card_is_not_refused():
    from mxkernels.ep.strategy import check_fp8_capability

    check_fp8_capability(["fp8_rowwise", "fp8_rowwise_a2a"], (8, 9))  # Ada: FP8 tensor cores
    check_fp8_capability(["fp8_rowwise"], None)  # a CPU: gloo, emulated GEMMs
    check_fp8_capability(["mxfp8", "bf16"], (8, 0))  # the MXFP8 strategies run emulated, as before


def test_four_processes_check_bf16_and_both_fp8_strategies_with_an_overlapped_shared_expert():
    done = mxbench_ep("--nproc", "4", "--check", "--layer", "--K", "64", "--N", "32", "--experts", "1", "--tokens",
                      "32", "--strategy", "bf16,fp8_rowwise,fp8_rowwise_a2a", "--shared-experts", "1", "--overlap",
                      timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for strategy in ("bf16", "fp8_rowwise", "fp8_rowwise_a2a"):
        assert f"{strategy}: " in done.stdout
    assert done.stdout.count("stages match their oracle on all 4 ranks") == 3
    assert "FAIL" not in done.stdout and "grad_ws13" in done.stdout and "grad_ws2" in done.stdout
    assert "fp8_rowwise_a2a: the dispatched rows as the experts receive them" in done.stdout
    assert "fp8_rowwise: the dispatched rows" not in done.stdout  # bf16 rows cross there
    # the bytes of each all-to-all as the check's topology counts them: FP8 rows with their scales
    bytes_of = {tuple(line.split()[:2]): int(line.split()[2]) for line in done.stdout.splitlines()
                if line.startswith(("fp8_rowwise ", "fp8_rowwise_a2a ")) and line.split()[1] in ("dispatch", "combine")}  # fmt: skip
    assert bytes_of[("fp8_rowwise_a2a", "dispatch")] * 128 == bytes_of[("fp8_rowwise", "dispatch")] * 68
    assert bytes_of[("fp8_rowwise_a2a", "combine")] == bytes_of[("fp8_rowwise", "combine")]


# ---- the side stream on its own --------------------------------------------------------------------------------------


class _Call:
    """A stage as ``run_overlapped`` sees it: a name, the tensors it reads and writes, and a call."""

    def __init__(self, name, inputs, outputs, fn):
        self.name, self.inputs, self.outputs, self.fn = name, inputs, outputs, fn

    def call(self, env):
        return self.fn(*[env[n] for n in self.inputs])


def _side_list():
    import torch

    mm = lambda a, b: (a @ b,)
    return [
        _Call("shared_up.gemm", ("x", "w"), ("hs",), mm),  # side: x @ w, twice over
        _Call("shared_down.gemm", ("hs", "w"), ("ys",), mm),
        _Call("routed", ("x",), ("yr",), lambda x: (torch.relu(x) * 2,)),  # main, beside the side's work
        _Call("add_shared", ("yr", "ys"), ("y",), lambda a, b: (a + b,)),  # main: reads a side result
    ]


def _run(device, join=True, monkeypatch=None):
    import torch

    if not join:
        monkeypatch.setattr(overlap, "reads_side", lambda stage, pending: False)
    g = torch.Generator(device="cpu").manual_seed(0)
    x, w = (torch.randn(256, 256, generator=g).to(device) for _ in range(2))
    stages = _side_list()
    env = overlap.run_overlapped(stages, {"x": x, "w": w}, {"shared_up.gemm", "shared_down.gemm"},
                                 overlap.SideStream(device))  # fmt: skip
    return env["y"], torch.relu(x) * 2 + (x @ w) @ w


def test_a_side_result_is_read_only_after_its_join_on_a_cpu(monkeypatch):
    import torch

    got, want = _run("cpu")
    assert torch.equal(got, want)
    got, _ = _run("cpu", join=False, monkeypatch=monkeypatch)  # read before the join: the stand-in, NaN
    assert got.isnan().all()


@pytest.mark.gpu
def test_the_side_stream_overlaps_and_joins_on_a_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    got, want = _run("cuda")
    torch.testing.assert_close(got, want)
    torch.cuda.synchronize()
