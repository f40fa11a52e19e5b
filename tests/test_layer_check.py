"""``mxbench check --layer``: the MoE layer's own stages against their oracles, with planted wrong implementations
seen to fail (each by the scenario that catches it) and mxkernels' passing."""

import pytest
from click.testing import CliRunner

from mxbench.cli import cli

WRONG = '''
import torch
from mxkernels.moe.moe_rows import combine_rows_reference, gather_weighted_reference
from mxkernels.moe.router import route_tokens_reference, router_topk_reference


def unweighted_combine(y, dest, top, *, weighted):
    return (combine_rows_reference(y, dest, None, top.shape[1]),)  # forgets the scores


def unpadded_route(experts, top, *, num_experts, alignment, rows, weighted_rows):
    return route_tokens_reference(experts, top, num_experts=num_experts, alignment=1, rows=rows,
                                  weighted_rows=weighted_rows)  # groups not padded to the GEMM's alignment


def padding_from_row_zero(x, row_src, row_w, *, weighted):
    # a padding row copies token 0 (src clamped) instead of zeros
    return (gather_weighted_reference(x, row_src.clamp(min=0), row_w if weighted else None),)


def combine_exits_3(y, dest, top, *, weighted):
    import os
    os._exit(3)  # ends whatever process calls it


def topk_ties_high(logits, *, top_k, score_func):
    # ties to the higher expert index: differs where a planted block makes every score of a token equal
    scores, top, experts = router_topk_reference(logits.flip(1), top_k=top_k, score_func=score_func)
    E = logits.shape[1]
    return scores.flip(1), top, (E - 1 - experts).to(torch.int32)
'''


@pytest.fixture
def wrong(tmp_path, monkeypatch):
    (tmp_path / "wrong_layer.py").write_text(WRONG)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def check(*args):
    return CliRunner().invoke(cli, ["check", "--layer", "--M", "256", "--mode", "rceil", *args])


def test_mxkernels_passes_every_layer_stage_of_bf16():
    result = check("--recipe", "bf16")
    assert result.exit_code == 0, result.output
    for stage in ("router_gate", "router_topk", "router_forced", "route_tokens", "permute", "swiglu", "swiglu_split",
                  "combine", "shared_up", "shared_down", "combine_grad", "combine_score_grad", "swiglu_grad",
                  "swiglu_grad_split", "add_grads", "permute_grad", "permute_score_grad", "router_grad",
                  "router_gate_grad", "shared_down_grad", "shared_up_grad"):  # fmt: skip
        assert f"\n{stage} " in "\n" + result.output, stage


def test_the_fused_stages_pass_with_nan_router_scores():
    """A NaN planted in the tokens makes a token's router scores NaN: the fused permute once let NaN * 0 into the
    blocked scales' padding columns (kernels/moe_rows.gather_tile now masks them); the check caught it."""
    # K = 96: three scale blocks a row, so the blocked scales have a padding column the tiles read as zeros
    result = check("--recipe", "mxfp8", "--stage", "permute_quantize,combine_grad_quantize", "--K", "96", "--N", "64")
    assert result.exit_code == 0, result.output
    assert "permute_quantize" in result.output and "FAIL" not in result.output


@pytest.mark.parametrize("impl, stage, finding", [
    ("combine=wrong_layer:unweighted_combine", "combine", "y: SQNR"),
    ("route_tokens=wrong_layer:unpadded_route", "route_tokens", "offs:"),
    ("permute=wrong_layer:padding_from_row_zero", "permute", "xs:"),
    ("router_topk=wrong_layer:topk_ties_high", "router_topk", "experts:"),
])  # fmt: skip
def test_a_wrong_layer_stage_exits_1_with_its_finding(wrong, impl, stage, finding):
    result = check("--recipe", "bf16", "--impl", impl)
    assert result.exit_code == 1, result.output
    assert f"FAIL {stage} / {impl.split('=')[1]}" in result.output and finding in result.output


def test_an_outside_layer_stage_runs_in_a_process_of_its_own(wrong):
    """Issue 34, item 5, for `check --layer`: an implementation that ends its process is one ERROR row naming how,
    and this process goes on to report it (in this process, os._exit would end the test run itself)."""
    result = check("--recipe", "bf16", "--impl", "combine=wrong_layer:combine_exits_3", "--timeout", "120")
    assert result.exit_code == 1, result.output
    assert "ERROR combine / wrong_layer:combine_exits_3" in result.output
    assert "exited with code 3" in result.output


def test_an_unknown_layer_stage_is_bad_input(wrong):
    result = check("--recipe", "bf16", "--impl", "no_such_stage=wrong_layer:unweighted_combine")
    assert result.exit_code == 2 and "no stage" in result.output


def test_layer_impl_is_checked_before_any_timing(wrong, tmp_path):
    """`mxbench layer --impl`: a wrong implementation of a layer stage exits 1 with its finding before any work; a
    correct one (the reference of the stage, as an outside module would give it) is accepted."""
    (tmp_path / "right_layer.py").write_text(
        "from mxkernels.moe.moe_rows import combine_rows_reference\n\n"
        "def combine(y, dest, top, *, weighted):\n"
        "    return (combine_rows_reference(y, dest, top.reshape(-1) if weighted else None, top.shape[1]),)\n"
    )
    base = ["layer", "--K", "64", "--N", "64", "--tokens", "64", "--experts", "4", "--top-k", "2", "--recipe", "bf16",
            "--score-after"]  # fmt: skip
    bad = CliRunner().invoke(cli, [*base, "--impl", "combine=wrong_layer:unweighted_combine", "--out",
                                   str(tmp_path / "bad.json")])  # fmt: skip
    assert bad.exit_code == 1 and "FAIL against the oracle" in bad.output and not (tmp_path / "bad.json").exists()
    good = CliRunner().invoke(cli, [*base, "--impl", "combine=right_layer:combine", "--out", str(tmp_path / "ok.json")])
    assert good.exit_code == 0, good.output


@pytest.mark.parametrize("recipe, stage", [
    ("bf16", "permute"), ("bf16", "combine"), ("bf16", "combine_grad"), ("bf16", "permute_grad"),
    ("mxfp8", "permute_quantize"), ("mxfp8", "combine_grad_quantize"),
])  # fmt: skip
def test_a_stage_table_that_flips_a_scored_stages_weighting_fails_that_stage(monkeypatch, recipe, stage):
    # the kernel is told the wrong ``weighted``; its oracle follows the layer's score placement (which stage applies
    # the scores is the layer's contract: reference.layer_stages), not that flag
    from dataclasses import replace
    from types import MappingProxyType

    from mxbench.workloads.layer import check as layer_check

    real = layer_check.layer_stages

    def flipped(*args, **kwargs):
        return [replace(st, params=MappingProxyType({**st.params, "weighted": not st.params["weighted"]}))
                if st.name == stage else st for st in real(*args, **kwargs)]  # fmt: skip

    monkeypatch.setattr(layer_check, "layer_stages", flipped)
    # without the planted blocks: where they are, the tokens they make hold nearly all of a sum's energy (their scores
    # round to 1) and one SQNR over the whole output passes a wrong weighting of every other token
    monkeypatch.setattr(layer_check, "plant", lambda *args, **kwargs: None)
    impls = {key: found for key, found in layer_check.layer_impls(layer_check.layer_registry(), recipe).items()
             if key[1] == stage}  # fmt: skip
    results = layer_check.check_layer(recipe, 64, 32, 4, 16, impls)
    assert results and all(r.stage == stage for r in results)
    assert [r.verdict for r in results] == ["FAIL"] * len(results), [(r.verdict, r.where) for r in results]


@pytest.mark.parametrize("stage", ["combine", "permute_grad"])
def test_a_flipped_weighting_of_a_sum_fails_with_the_planted_blocks_in_place(monkeypatch, stage):
    # the same flip with check --layer's planted blocks: their tokens hold nearly all of the sum's energy, so the
    # whole-output SQNR alone passed it; the rule's row floor (every token's row on its own) does not
    from dataclasses import replace
    from types import MappingProxyType

    from mxbench.workloads.layer import check as layer_check

    real = layer_check.layer_stages

    def flipped(*args, **kwargs):
        return [replace(st, params=MappingProxyType({**st.params, "weighted": not st.params["weighted"]}))
                if st.name == stage else st for st in real(*args, **kwargs)]  # fmt: skip

    monkeypatch.setattr(layer_check, "layer_stages", flipped)
    impls = {key: found for key, found in layer_check.layer_impls(layer_check.layer_registry(), "bf16").items()
             if key[1] == stage}  # fmt: skip
    results = layer_check.check_layer("bf16", 64, 32, 4, 16, impls)
    # the scenario of one token is all planted block (its scores round to 1: any weighting is right there)
    many = [r for r in results if "T=16" in r.where]
    assert len(many) == 2 and [r.verdict for r in many] == ["FAIL"] * 2, [(r.verdict, r.where, r.detail) for r in results]


def test_a_row_floor_finds_the_one_wrong_row_a_whole_sqnr_passes():
    import torch
    from mxkernels.core.comparison import MinSQNR

    expected = torch.ones(4, 8, dtype=torch.float64)
    expected[0] *= 1000.0  # one row holds nearly all the energy
    got = expected.clone()
    got[2] *= 0.5  # another row's weighting wrong: 10 log10(8 / 2) = 6.0 dB for that row, 66 dB over the whole
    assert MinSQNR(50.0).compare("y", got, expected) is None
    found = MinSQNR(50.0, row_floor_db=40.0).compare("y", got, expected)
    assert found is not None and found.index == (2, 0) and "6.0 dB < 40 dB in one row" in found.message
    assert MinSQNR(50.0, row_floor_db=40.0).compare("y", expected.clone(), expected) is None
    zero_row = torch.tensor([[1.0] * 4, [0.0] * 4], dtype=torch.float64)  # a row the oracle gives as zeros
    off = zero_row + torch.tensor([[0.0], [1e-3]], dtype=torch.float64)  # 60 dB over the whole
    assert MinSQNR(50.0).compare("y", off, zero_row) is None
    found = MinSQNR(50.0, row_floor_db=40.0).compare("y", off, zero_row)
    assert found is not None and found.index == (1, 0) and "-inf dB" in found.message


def test_the_layers_scored_oracles_follow_its_formulas_by_hand():
    import torch
    from mxkernels.reference.layer_stages import scored_oracle

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)  # 2 tokens, top-2
    row_src = torch.tensor([1, 0, -1, 0, 1, -1], dtype=torch.int32)  # padded rows: -1 is a padding row (zeros)
    row_w = torch.tensor([0.5, 2.0, 0.0, 0.25, 1.0, 0.0])
    # scores first: the permute scores, the combine's gradient does not; scores last: the reverse
    assert scored_oracle("permute", True)(x, row_src, row_w, weighted=False)[0].tolist() == \
        [[1.5, 2.0], [2.0, 4.0], [0.0, 0.0], [0.25, 0.5], [3.0, 4.0], [0.0, 0.0]]  # fmt: skip
    assert scored_oracle("combine_grad", True)(x, row_src, row_w, weighted=True)[0].tolist() == \
        [[3.0, 4.0], [1.0, 2.0], [0.0, 0.0], [1.0, 2.0], [3.0, 4.0], [0.0, 0.0]]  # fmt: skip
    out = torch.tensor([[1.0, 0.0], [0.0, 1.0], [9.0, 9.0], [2.0, 2.0], [4.0, 8.0], [9.0, 9.0]], dtype=torch.bfloat16)
    dest = torch.tensor([3, 0, 4, 1], dtype=torch.int32)  # copy c's padded row; rows 2 and 5 are padding
    top = torch.tensor([[0.5, 0.25], [1.0, 2.0]])
    # token 0: out[3] * 0.5 + out[0] * 0.25; token 1: out[4] * 1 + out[1] * 2
    assert scored_oracle("combine", False)(out, dest, top, weighted=False)[0].tolist() == [[1.25, 1.0], [4.0, 10.0]]
    assert scored_oracle("combine", True)(out, dest, top, weighted=True)[0].tolist() == [[3.0, 2.0], [4.0, 9.0]]
    assert scored_oracle("permute_grad", True)(out, dest, top, weighted=False)[0].tolist() == \
        [[1.25, 1.0], [4.0, 10.0]]  # fmt: skip
    assert scored_oracle("permute_grad", False)(out, dest, top, weighted=True)[0].tolist() == [[3.0, 2.0], [4.0, 9.0]]
