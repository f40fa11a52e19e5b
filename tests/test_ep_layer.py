"""The whole MoE layer expert-parallel (``mxbench ep --layer``) on CPUs: its stage list (names, costs declared by
the kernels' cost functions, checked here against hand-worked values), every strategy x wgrad precision against the
single-process reference (in one process, and on 2 and 3 gloo processes), planted faults, the records' wgrad, and
bad input refused before any worker starts.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mxkernels.stages import ep_layer
from mxkernels.stages import ep_stages
from mxkernels.reference.ep_layer import ep_moe_layer_reference
from mxkernels.ep.wgrad import Wgrad
from mxkernels.layouts.padding import padded_rows
from readme_runs import readme_line
from test_ep import fake_time_on_ranks, mxbench_ep

from mxbench.workloads.ep.command import DEFAULT_STRATEGIES
from mxbench.workloads.ep import check as ep_check
from mxbench.workloads.ep import launch, measure
from mxbench.workloads.ep.workload import LayerOptions, workload

HERE = Path(__file__).parent
TINY = ["--layer", "--K", "64", "--N", "32", "--experts", "2", "--tokens", "32"]
EVEN = ((16, 16), (16, 16))


def shape(recv=EVEN, score_before=True) -> ep_layer.EPLayerShape:
    ep = ep_stages.EPShape(T=32, K=64, N=32, E=2, top_k=1, rank=0, world=2, send_counts=EVEN, recv_counts=recv)
    return ep_layer.EPLayerShape(ep, score_before=score_before)


def by_name(strategy, s=None, **kw):
    return {st.name: st for st in ep_layer.ep_layer_stages(strategy, s or shape(), **kw)}


# ---- the stage list ---------------------------------------------------------------------------------------------


def test_all_to_all_bytes_are_the_rows_that_cross_in_each_strategys_format():
    # rank 0 sends 16 + 16 rows to rank 1 and receives as many; K = 64: bf16 128 bytes a row, MXFP8 64 + 2
    bf16, a2a = by_name("bf16"), by_name("mxfp8_a2a")
    for name in ("dispatch", "combine", "combine_grad", "dispatch_grad"):
        assert (bf16[name].cost.bytes_read, bf16[name].cost.bytes_written) == (32 * 128, 32 * 128)
    assert a2a["dispatch"].cost.bytes_read == a2a["combine_grad"].cost.bytes_read == 32 * 66
    assert a2a["combine"].cost.bytes_read == a2a["dispatch_grad"].cost.bytes_read == 32 * 128
    assert by_name("mxfp8")["dispatch"].cost.bytes_read == 32 * 128  # mxfp8 quantizes after the all-to-all


def test_stage_order_and_the_projections_flops():
    stages = by_name("mxfp8_a2a")
    names = list(stages)
    order = ["router_gate", "router_forced", "sort_scores", "sort_tokens", "quantize_xs", "dispatch", "permute",
             "up.gemm_fwd", "swiglu", "down.gemm_fwd", "unpermute", "combine", "unsort_combine", "sort_grad",
             "quantize_dys", "combine_grad", "permute_grad", "down.gemm_dgrad", "swiglu_grad", "up.gemm_dgrad",
             "unpermute_grad", "dispatch_grad", "unsort_grad", "permute_score_grad", "router_grad", "dequantize_a",
             "dequantize_grad_out", "up.gemm_wgrad", "down.gemm_wgrad", "router_gate_grad"]  # fmt: skip
    assert [n for n in names if n in order] == order
    assert "up.quantize_a" not in stages and "down.quantize_grad_out" not in stages  # they travel quantized
    R = 64  # rows received: the GEMMs' M
    assert stages["up.gemm_fwd"].cost.flops == 2 * R * 64 * 64  # (R, K) @ (K, 2N)
    assert stages["down.gemm_fwd"].cost.flops == 2 * R * 64 * 32  # (R, N) @ (N, K)
    assert stages["router_gate"].cost.flops == 2 * 32 * 64 * 4  # T x K x (W * E)


def test_skewed_groups_are_padded_once_around_both_projections():
    s = shape(recv=((5, 11), (20, 12)))  # groups of 25 and 23 rows: not multiples of 32
    stages = by_name("mxfp8", s)
    Rp = padded_rows(48, 2, 32)
    assert {"pad_a", "unpad_out", "pad_grad_out", "unpad_grad_a"} <= set(stages)
    assert "up.pad_a" not in stages and stages["up.gemm_fwd"].shapes[0] == (Rp, 64)
    assert stages["swiglu"].shapes[0] == (Rp, 64) and stages["down.gemm_wgrad"].inputs[-1] == "offs_p"
    assert {"pad_a_mx", "pad_grad_out_mx"} <= set(by_name("mxfp8_a2a", s))
    assert "pad_a" not in by_name("bf16", shape(recv=((8, 8), (8, 8))))  # bf16 aligns to 16


def test_scores_after_the_experts_move_the_score_gradient_to_the_combine():
    stages = by_name("bf16", shape(score_before=False))
    assert "combine_score_grad" in stages and "permute_score_grad" not in stages
    assert stages["unsort_combine"].params == {"weighted": True} and stages["sort_tokens"].params == {"weighted": False}


@pytest.mark.parametrize(("strategy", "wgrad", "precision", "reads"), [
    ("mxfp8", Wgrad.RECIPE, "mxfp8", "up.at_q"), ("mxfp8", Wgrad.BF16, "bf16", "a"),
    ("mxfp8_a2a", Wgrad.BF16, "bf16", "a_bf"), ("mxfp8_a2a", Wgrad.RECIPE, "mxfp8", "up.at_q"),
])  # fmt: skip
def test_the_wgrad_option_sets_the_weight_gradients_precision_alone(strategy, wgrad, precision, reads):
    stages = by_name(strategy, wgrad=wgrad)
    assert stages["up.gemm_wgrad"].cost.precision == precision and reads in stages["up.gemm_wgrad"].inputs
    if strategy == "mxfp8_a2a" and wgrad == Wgrad.RECIPE:  # dequantized, then quantized along the tokens
        assert stages["up.quantize_a_t"].inputs == ("a_bf",)
    forward = [n for n, st in stages.items() if st.pass_name == "forward"]
    assert forward == [n for n, st in by_name(strategy).items() if st.pass_name == "forward"]


@pytest.mark.parametrize(("strategy", "wgrad", "precision"), [
    ("mxfp8", Wgrad.BF16, "bf16"), ("mxfp8_a2a", Wgrad.RECIPE, "mxfp8"), ("mxfp8_a2a", None, "bf16"),
])  # fmt: skip
def test_the_projection_takes_the_wgrad_option_too(strategy, wgrad, precision):
    ep = shape().ep
    stages = {st.name: st for st in ep_stages.ep_step_stages(strategy, ep, wgrad=wgrad)}
    assert stages["gemm_wgrad"].cost.precision == precision


@pytest.mark.parametrize(("strategy", "wgrad"), [("mxfp8", Wgrad.BF16), ("mxfp8_a2a", Wgrad.RECIPE)])
def test_the_projection_with_the_other_wgrad_matches_its_reference_and_not_the_default_one(world_of_one, strategy,
                                                                                         wgrad):  # fmt: skip
    o = ep_check.EPOptions(K=64, N=96, E=3, T=40, top_k=2, groups="skewed", seed=3, wgrad=wgrad)
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, strategy, o)
    assert [c for c in stage_checks if c.verdict != "PASS"] == [] and all(c.ok for c in layer_checks)
    wrong = ep_check.compare_layer(strategy, [_rank_results(world_of_one, o, strategy)], replace(o, wgrad=None))
    if strategy == "mxfp8":  # against the default's reference only grad_w differs
        assert [c.output for c in wrong if not c.ok] == ["grad_w"]
    else:  # both of mxfp8_a2a's wgrad operands arrive as MXFP8 rows, and e4m3 values quantized again with another
        # power-of-two scale stay exact (but below the new block's normal range): both choices give the same grad_w.
        # The layer's wgrads have a bf16 operand each (grad_h, act), which tells the two apart there.
        assert all(c.ok for c in wrong)


def _rank_results(ctx, o, strategy):
    inputs = ep_check.rank_inputs(ctx, o)
    plan = workload(o).plan(ctx, inputs, o)
    results = ep_check.run_module(ctx, o, inputs, plan, ep_check.strategy_stages(ctx, strategy, plan, o, ()))
    return {k: v.detach() for k, v in {**inputs, **results}.items()}


# ---- the reference ----------------------------------------------------------------------------------------------


def test_reference_matches_a_dense_per_token_layer_by_hand():
    gen = torch.Generator().manual_seed(2)
    T, K, N, G = 4, 32, 32, 4
    x = [torch.randn(T, K, generator=gen).bfloat16() for _ in range(2)]
    assign = [torch.tensor([[0], [3], [2], [3]]), torch.tensor([[1], [1], [0], [2]])]
    w = {"wr": torch.randn(G, K, generator=gen).bfloat16(), "w13": torch.randn(G, 2 * N, K, generator=gen).bfloat16(),
         "w2": (torch.randn(G, K, N, generator=gen) / 8).bfloat16()}  # fmt: skip
    dy = [torch.zeros(T, K, dtype=torch.bfloat16) for _ in range(2)]
    got = ep_moe_layer_reference(x, assign, w, dy, "bf16", score_before=False)
    for r in range(2):
        for t in range(T):
            g = int(assign[r][t, 0])
            s = torch.sigmoid((x[r][t].double() @ w["wr"].double().T).bfloat16().double())[g]
            h = (x[r][t].double() @ w["w13"][g].double().T).bfloat16().double()
            act = (torch.nn.functional.silu(h[:N]) * h[N:]).bfloat16().double()
            want = (s.float() * (act @ w["w2"][g].double().T).bfloat16().float()).bfloat16()
            assert torch.allclose(got["y"][r][t].float(), want.float(), rtol=2**-7, atol=0)
    assert not got["grad_w13"].any() and not got["grad_x"][0].any()  # a zero output gradient


# ---- the check, in one process and on several ---------------------------------------------------------------------


def options(score_before=True, wgrad=None, groups="skewed"):
    return ep_check.EPOptions(K=64, N=32, E=3, T=40, top_k=2, groups=groups, seed=3, wgrad=wgrad,
                              layer=LayerOptions("sigmoid", score_before))  # fmt: skip


@pytest.mark.parametrize("strategy", DEFAULT_STRATEGIES.split(","))  # FP8 rowwise: test_ep_fp8.py
@pytest.mark.parametrize("wgrad", list(Wgrad))
def test_every_stage_and_the_whole_layer_match_their_references(world_of_one, strategy, wgrad):
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, strategy, options(wgrad=wgrad))
    assert [c for c in stage_checks if c.verdict != "PASS"] == []
    assert [c.output for c in layer_checks] == ["y", "grad_x", "grad_wr", "grad_w13", "grad_w2"]
    assert all(c.ok for c in layer_checks), layer_checks
    low, high = (40, 60) if strategy == "bf16" else (18, 30)  # the recipe's error against the fp32 layer
    assert all(low < c.vs_bf16_db < high for c in layer_checks), layer_checks


def test_the_other_wgrad_precision_fails_the_weight_gradients_check(world_of_one, monkeypatch):
    # the layer runs the MXFP8 wgrad while the reference is told bf16: only the weight gradients disagree
    from mxkernels.reference import ep_layer as ep_layer_reference

    real = ep_layer_reference.ep_moe_layer_reference
    monkeypatch.setattr(
        ep_layer_reference, "ep_moe_layer_reference", lambda *a, **k: real(*a, **{**k, "wgrad": "bf16"})
    )
    _, layer_checks = ep_check.check_strategy(world_of_one, "mxfp8", options(wgrad=Wgrad.RECIPE))
    assert {c.output for c in layer_checks if not c.ok} == {"grad_w13", "grad_w2"}


@pytest.mark.parametrize(("impl", "score_before", "stage"), [
    ("permute=ep_layer_broken:permute_off_by_one", True, "permute"),
    ("unsort_combine=ep_layer_broken:combine_without_scores", False, "unsort_combine"),
])  # fmt: skip
def test_planted_faults_fail_their_stage_and_the_layer(world_of_one, impl, score_before, stage):
    sys.path.insert(0, str(HERE))
    from mxbench.implementations.registry import parse_impl

    parsed = parse_impl(impl, "bf16", ep_layer.get_ep_layer_spec)
    stage_checks, layer_checks = ep_check.check_strategy(world_of_one, "bf16", options(score_before), [parsed])
    assert [c.stage for c in stage_checks if c.verdict != "PASS"] == [stage]
    assert not any(c.ok for c in layer_checks if c.output == "y")


@pytest.mark.parametrize("score_before", [True, False])
@pytest.mark.parametrize("stage", ["sort_tokens", "unsort_combine", "sort_grad", "unsort_grad"])
def test_a_stage_table_that_flips_a_scored_stages_weighting_fails_that_stage(world_of_one, monkeypatch, stage,
                                                                               score_before):  # fmt: skip
    # the kernel is told the wrong ``weighted``; its oracle follows the layer's score placement, not that flag
    from types import MappingProxyType

    real = ep_layer.ep_layer_stages

    def flipped(*args, **kwargs):
        return [replace(st, params=MappingProxyType({**st.params, "weighted": not st.params["weighted"]}))
                if st.name == stage else st for st in real(*args, **kwargs)]  # fmt: skip

    monkeypatch.setattr(ep_layer, "ep_layer_stages", flipped)
    stage_checks, _ = ep_check.check_strategy(world_of_one, "bf16", options(score_before))
    assert [c.stage for c in stage_checks if c.verdict != "PASS"] == [stage]


def test_scored_stage_oracles_follow_the_layers_formulas_by_hand():
    from mxkernels.reference.layer_stages import scored_oracle

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)  # 2 tokens, top-2: copies 0..3
    token_of = torch.tensor([1, 0, 0, 1], dtype=torch.int32)  # sorted copies' tokens
    row_w = torch.tensor([0.5, 2.0, 0.25, 1.0])
    assert scored_oracle("sort_tokens", True)(x, token_of, row_w, weighted=False)[0].tolist() == \
        [[1.5, 2.0], [2.0, 4.0], [0.25, 0.5], [3.0, 4.0]]  # fmt: skip
    assert scored_oracle("sort_grad", True)(x, token_of, row_w, weighted=True)[0].tolist() == \
        [[3.0, 4.0], [1.0, 2.0], [1.0, 2.0], [3.0, 4.0]]  # fmt: skip
    ys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [4.0, 8.0]], dtype=torch.bfloat16)
    pos = torch.tensor([2, 0, 3, 1], dtype=torch.int32)  # copy c sits at sorted row pos[c]
    top = torch.tensor([[0.5, 0.25], [1.0, 2.0]])  # copy-order scores
    # token 0: ys[2], ys[0]; token 1: ys[3], ys[1]
    assert scored_oracle("unsort_combine", True)(ys, pos, top, weighted=True)[0].tolist() == [[3.0, 2.0], [4.0, 9.0]]
    assert scored_oracle("unsort_combine", False)(ys, pos, top, weighted=False)[0].tolist() == \
        [[1.25, 1.0], [4.0, 10.0]]  # fmt: skip
    assert scored_oracle("unsort_grad", True)(ys, pos, top, weighted=False)[0].tolist() == [[1.25, 1.0], [4.0, 10.0]]


def test_two_processes_check_every_strategy_with_its_default_wgrad_skewed_top_2(readme_run):
    # The README's line, run once for test_readme too (readme_runs.py); each strategy's default wgrad (mxfp8_a2a's
    # bf16 one; its MXFP8 one: the three-process check below; every strategy x wgrad in one process: above).
    line = readme_line("mxbench ep --layer --nproc 2 --check ")
    assert {"--top-k 2", "--groups skewed", "--experts 2"} <= {" ".join(p) for p in zip(line.split(), line.split()[1:])}
    assert "--strategy" not in line and "--wgrad" not in line
    done = readme_run(line)
    assert done.returncode == 0, done.stdout + done.stderr
    for strategy in DEFAULT_STRATEGIES.split(","):
        assert f"{strategy}: " in done.stdout and "stages match their oracle on all 2 ranks" in done.stdout
    assert "FAIL" not in done.stdout and "grad_w13" in done.stdout


def test_three_processes_check_balanced_scores_after_with_the_mxfp8_wgrad():
    # mxfp8's bf16 wgrad is bf16's (bf16 rows cross in both); mxfp8_a2a's bf16 one: the README's line above.
    done = mxbench_ep("--nproc", "3", "--check", *TINY, "--top-k", "3", "--score-after", "--wgrad", "recipe",
                      "--strategy", "mxfp8,mxfp8_a2a", timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stages match their oracle on all 3 ranks" in done.stdout and "FAIL" not in done.stdout


def test_a_dispatch_that_drops_a_ranks_rows_fails_on_two_processes():
    done = mxbench_ep("--nproc", "2", "--check", *TINY, "--strategy", "bf16", "--impl",
                      "dispatch=ep_layer_broken:dispatch_dropping_rank_one", extra_path=str(HERE))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL bf16/dispatch on rank 0" in done.stdout and "FAIL bf16/dispatch on rank 1" in done.stdout


# ---- records and metadata --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "wgrad", "recorded", "precision"), [
    ("mxfp8", None, "recipe", "mxfp8"), ("mxfp8", Wgrad.BF16, "bf16", "bf16"), ("mxfp8_a2a", None, "bf16", "bf16"),
])  # fmt: skip
def test_records_carry_the_part_and_the_wgrad_precision_that_ran(world_of_one, monkeypatch, strategy, wgrad, recorded,
                                                                 precision):  # fmt: skip
    from mxbench.workloads.ep.worker import layer_meta

    monkeypatch.setattr(measure, "time_on_ranks", fake_time_on_ranks)
    o = options(wgrad=wgrad)
    records = measure.measure_strategy(world_of_one, strategy, o, graph=True, samples=3)
    assert {(r.telemetry["part"], r.telemetry["wgrad"]) for r in records} == {("layer", recorded)}
    wgrad_gemms = {r.precision for r in records if r.stage.endswith("gemm_wgrad")}
    assert wgrad_gemms == {precision}  # what is recorded is what ran
    assert records[-1].stage == "fwd+bwd" and records[-1].kernel == f"{strategy} EP layer (forward + backward)"
    assert next(r for r in records if r.stage == "dispatch").category == "all_to_all"
    meta = layer_meta([strategy], o)
    assert meta["part"] == "layer" and meta["wgrad"] == {strategy: recorded} and meta["shared_experts"] == 0


def test_a_layer_run_renders_labelled_tables_and_figure_and_never_joins_a_projection_run(world_of_one, monkeypatch,
                                                                                          tmp_path):  # fmt: skip
    from mxkernels.core.errors import InputError

    from mxbench.workloads.ep import tables
    from mxbench.workloads.ep.figure import plot_ep
    from mxbench.workloads.ep.metadata import ep_metadata, rank_info
    from mxbench.workloads.ep.scaling import scaling_rows
    from mxbench.workloads.ep.worker import layer_meta
    from mxbench.storage.results import Run

    monkeypatch.setattr(measure, "time_on_ranks", fake_time_on_ranks)
    o = options(score_before=False)
    records = measure.measure_strategy(world_of_one, "mxfp8_a2a", o, graph=True, samples=3)
    sizes = {"tokens_per_rank": o.T, "K": o.K, "N": o.N, "experts_per_rank": o.E, "top_k": o.top_k}
    meta = ep_metadata(world_of_one, [rank_info(world_of_one)], {**sizes, **layer_meta(["mxfp8_a2a"], o)},
                       {"groups": "skewed", "seed": 3}, ["mxfp8_a2a"], {"samples": 3}, "mxbench ep --layer")  # fmt: skip
    run = Run(meta, records)
    header = tables.ep_table(run, "ep-summary", "plain")
    assert "whole MoE layer (sigmoid scores after the experts, no shared experts)" in header
    assert "wgrad precision: mxfp8_a2a bf16" in header
    assert {"router_gate", "swiglu", "unsort_combine", "fwd+bwd"} <= {r["Stage"] for r in tables.ep_rows(run)}
    assert plot_ep(run, tmp_path / "layer.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    projection = Run({**meta, "layer": sizes, "world_size": 2}, records)  # stored before --layer: no "part"
    with pytest.raises(InputError, match="whole MoE layer.* vs cpu, expert projection"):
        scaling_rows([run, projection])


# ---- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc", "2", "--check", "--K", "64", "--N", "32", "--score-after"], "give --layer"),
        (["--nproc", "2", "--check", *TINY, "--top-k", "5"], "top-k must be between 1 and the 4 experts"),
        (["--nproc", "2", "--check", "--layer", "--K", "48", "--N", "32"], "multiple of 32"),
        (["--nproc", "2", "--check", *TINY, "--wgrad", "fp8"], "--wgrad"),
        (["--nproc", "2", "--check", *TINY, "--impl", "bf16/no_such_stage=ep_layer_broken:permute_off_by_one"],
         "no stage"),
    ],
)  # fmt: skip
def test_bad_layer_input_exits_2_before_any_worker_starts(monkeypatch, args, message):
    from click.testing import CliRunner

    from mxbench.cli import cli

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("a worker was started"))
    result = CliRunner().invoke(cli, ["ep", *args])
    assert result.exit_code == 2 and message in result.output, result.output
