"""The MoE layer: the staged layer against an independent plain-torch layer, each layer stage against its oracle,
faults planted in stages caught, and ``mxbench layer`` / ``table --kind layer`` on a CPU (the model)."""

import json

import pytest
import torch
from click.testing import CliRunner
from mxkernels.stages.layer import LayerShape, layer_stages
from mxkernels.stages.layer_specs import FUSED_STAGES, NO_AMAX, layer_specs
from mxkernels.autograd.layer import layer_inputs, layer_outputs, layer_sqnr
from mxkernels.stages.pipeline import run_stages

from mxbench.cli import cli

SMALL = dict(T=36, K=64, N=64, E=4, top_k=2)  # 72 copies: balanced, 18 an expert, padded to 32 in every recipe
CONFIGS = [
    dict(),
    dict(score_before=False, shared=1, fuse_up=False, routing="router", score_func="softmax"),
    dict(routing="skewed", shared=2),
]
# bf16 throughout: only bf16 roundings separate the staged layer from the fp32 reference (measured 43-52 dB).
BF16_FLOOR_DB = 40.0
# fp8 GEMMs (e4m3 operands) on small random layers with outlier channels: measured 14-31 dB over these configs.
RECIPE_FLOOR_DB = 12.0


# FP8 rowwise's column quantizers are slow under the interpreter: one configuration of it keeps the suite in budget.
_RECIPE_CONFIGS = [(r, c) for r in ("bf16", "mxfp8") for c in range(len(CONFIGS))] + [("fp8_rowwise", 1)]


@pytest.mark.parametrize("recipe, config", [(r, CONFIGS[c]) for r, c in _RECIPE_CONFIGS],
                         ids=[f"{r}-{c}" for r, c in _RECIPE_CONFIGS])  # fmt: skip
def test_layer_matches_the_independent_reference(recipe, config, device):
    shape = LayerShape(**SMALL, **config)
    inputs = layer_inputs(shape, seed=3, device=device)
    # unaligned groups, so the layout has padding rows: a fault there (a padding row that keeps a copy's source
    # and weight) reaches the weight gradients, which the reference computes without any padding
    assert _padding_rows(recipe, shape, inputs) > 0
    reference = layer_outputs(None, inputs, shape)
    sqnr = layer_sqnr(layer_outputs(recipe, inputs, shape), reference)
    names = {"y", "grad_x", "grad_wr", "grad_w1", "grad_w3", "grad_w2"} | ({"grad_ws13", "grad_ws2"} if shape.shared else set())
    assert set(sqnr) == names
    floor = BF16_FLOOR_DB if recipe == "bf16" else RECIPE_FLOOR_DB
    assert min(sqnr.values()) >= floor, sqnr


def _padding_rows(recipe, shape, inputs) -> int:
    """Rows of padding the layer's expert groups get in ``recipe``, from the routing the reference takes."""
    from mxkernels.stages.step_specs import padding_alignment

    experts = inputs.get("assign")
    if experts is None:  # the router's own top-k, as the reference computes it
        z = (inputs["x"].float() @ inputs["wr"].float().t())
        scores = torch.sigmoid(z) if shape.score_func == "sigmoid" else torch.softmax(z, dim=1)
        experts = torch.topk(scores, shape.top_k, dim=1).indices
    counts = torch.bincount(experts.reshape(-1).long().cpu(), minlength=shape.E)
    align = padding_alignment(recipe)
    return int(((counts + align - 1) // align * align - counts).sum())


def _wrong(name, fn):
    """An implementation of a layer stage in the registry's shape (name, kernel, fn)."""
    return type("Wrong", (), {"name": f"wrong_{name}", "kernel": "planted", "fn": staticmethod(fn)})()


def _unweighted_combine(y, dest, top, *, weighted):
    from mxkernels.moe.moe_rows import combine_rows_reference

    return (combine_rows_reference(y, dest, None, top.shape[1]),)  # forgets the scores


def _shifted_permute(x, row_src, row_w, *, weighted):
    from mxkernels.moe.moe_rows import gather_weighted_reference

    return (gather_weighted_reference(x, row_src.roll(1), row_w if weighted else None),)  # rows off by one


def _no_router_grad(grad_top, scores, experts, *, score_func):
    return (torch.zeros(scores.shape, dtype=torch.bfloat16, device=scores.device),)


@pytest.mark.parametrize("stage, fn, config, output", [
    ("combine", _unweighted_combine, dict(score_before=False), "y"),
    ("permute", _shifted_permute, dict(), "y"),
    ("router_grad", _no_router_grad, dict(), "grad_wr"),
])  # fmt: skip
def test_a_wrong_stage_is_caught_by_the_reference(stage, fn, config, output, device):
    shape = LayerShape(**SMALL, **config)
    inputs = layer_inputs(shape, seed=1, device=device)
    reference = layer_outputs(None, inputs, shape)
    sqnr = layer_sqnr(layer_outputs("bf16", inputs, shape, impls={stage: _wrong(stage, fn)}), reference)
    assert sqnr[output] < 10.0, sqnr


@pytest.mark.parametrize("config", CONFIGS[:2], ids=["default", "after-shared-split"])
@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_every_layer_stage_matches_its_oracle(recipe, config, device):
    shape = LayerShape(**SMALL, **config)
    stages = layer_stages(recipe, shape)
    env = run_stages(stages, dict(layer_inputs(shape, seed=2, device=device)))
    checked = 0
    for s in stages:
        if s.spec.key not in layer_specs() and s.spec.name.split(".")[-1] not in ("swiglu", "swiglu_grad"):
            continue  # the projections' stages: the step's own specs, checked by tests of their kernels
        args = [env[n] for n in s.inputs]
        assert s.spec.compare(s.fn(*args, **s.params), s.spec.oracle(*args, **s.params), args) is None, s.name
        checked += 1
    assert checked >= 10


def test_route_tokens_pads_each_group_to_the_alignment(device):
    shape = LayerShape(T=37, K=64, N=64, E=5, top_k=3, routing="skewed")
    stages = layer_stages("mxfp8", shape)
    route = next(s for s in stages if s.name == "route_tokens")
    inputs = layer_inputs(shape, seed=4, device=device)
    experts = inputs["assign"]
    top = torch.rand(experts.shape, device=device)
    dest, row_src, row_w, offs, copy_token = route.fn(experts, top, **route.params)
    counts = torch.bincount(experts.reshape(-1).long().cpu(), minlength=5)
    sizes = (counts + 31) // 32 * 32
    assert offs.tolist() == sizes.cumsum(0).tolist()
    assert (row_src[dest.long()] == copy_token).all() and (row_w[dest.long()] == top.reshape(-1)).all()
    assert int((row_src >= 0).sum()) == 37 * 3 and (row_w[row_src < 0] == 0).all()
    expected = route.spec.oracle(experts, top, **route.params)
    assert all(torch.equal(a, b) for a, b in zip((dest, row_src, row_w, offs, copy_token), expected, strict=True))
    # planted: a layout that ignores the alignment fails the spec
    wrong = route.spec.oracle(experts, top, **{**route.params, "alignment": 1})
    assert route.spec.compare(wrong, expected, [experts, top]) is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path (on a GPU the command measures)")
def test_layer_cli_models_without_a_gpu_and_tables_render(tmp_path):
    out = tmp_path / "layer.json"
    result = CliRunner().invoke(cli, ["layer", "--preset", "deepseek-v3", "--fuse", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "model, not measured" in result.output and "1.148x" in result.output
    run = json.loads(out.read_text())
    assert run["meta"]["kind"] == "layer" and run["meta"]["layer"]["tokens"] == 131072
    points = {(r["point"]["recipe"], r["point"]["fuse_scales"]) for r in run["records"]}
    assert points == {("bf16", False), ("mxfp8", False), ("mxfp8", True), ("fp8_rowwise", False), ("fp8_rowwise", True)}
    # the model's layer time is the sum of its stages' model times
    step = [r for r in run["records"] if r["stage"] == "fwd+bwd" and r["point"]["recipe"] == "bf16"][0]
    stages = [r for r in run["records"] if r["stage"] != "fwd+bwd" and r["point"]["recipe"] == "bf16"]
    assert step["model_us"] == pytest.approx(sum(r["model_us"] for r in stages))
    table = CliRunner().invoke(cli, ["table", str(out), "--kind", "layer"])
    assert table.exit_code == 0 and "DeepSeekV3 (seed: B200, torchao)" in table.output
    stages_table = CliRunner().invoke(cli, ["table", str(out), "--kind", "layer-stages", "--format", "csv"])
    assert stages_table.exit_code == 0 and "permute_quantize" in stages_table.output
    wrong_kind = CliRunner().invoke(cli, ["table", str(out), "--kind", "breakdown"])
    assert wrong_kind.exit_code == 2


@pytest.mark.parametrize("recipe, config, wgrad", [("mxfp8", dict(), "recipe"),
                                                   ("mxfp8", dict(score_before=False, shared=1), "recipe"),
                                                   ("fp8_rowwise", dict(score_before=False, shared=1), "recipe"),
                                                   ("fp8_rowwise", dict(), "bf16")],
                         ids=["mxfp8-before", "mxfp8-after-shared", "fp8_rowwise-after-shared",
                              "fp8_rowwise-bf16-wgrad"])  # fmt: skip
def test_fused_layer_is_bit_identical_to_the_chains(recipe, config, wgrad, device):
    """The four fused stages replace their chains without changing one bit of y or of any gradient (with bf16
    weight gradients, FP8 rowwise's without the column amax table, as the chain's plain quantizer)."""
    shape = LayerShape(**SMALL, routing="skewed", **config)
    inputs = layer_inputs(shape, seed=5, device=device)
    staged = lambda fuse: layer_stages(recipe, shape, fuse=fuse, wgrad=wgrad)
    chains = layer_outputs(recipe, inputs, shape, stages=staged(False))
    fused = layer_outputs(recipe, inputs, shape, stages=staged(True))
    assert set(chains) == set(fused) and all(torch.equal(chains[k], fused[k]) for k in chains)
    names = {s.name for s in staged(True)}
    suffix = NO_AMAX if wgrad == "bf16" else ""
    assert {f"{n}{suffix}" for n in FUSED_STAGES} <= names
    assert not any(n.endswith(("quantize_a_blocked", "quantize_a_amax")) for n in names if n.startswith(("up.", "down.")))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["bf16", "fp8_rowwise", "mxfp8"])
def test_layer_on_the_gpu_at_a_realistic_size(recipe):
    """A layer of real width on the GPU: within the floors of the fp32 reference; fused equal to the chains."""
    shape = LayerShape(T=4096, K=2048, N=768, E=8, top_k=2, shared=1, routing="skewed")
    inputs = layer_inputs(shape, seed=6, device="cuda")
    reference = layer_outputs(None, inputs, shape)
    got = layer_outputs(recipe, inputs, shape)
    sqnr = layer_sqnr(got, reference)
    assert min(sqnr.values()) >= (BF16_FLOOR_DB if recipe == "bf16" else RECIPE_FLOOR_DB), sqnr
    if recipe != "bf16":
        fused = layer_outputs(recipe, inputs, shape, fuse=True)
        assert all(torch.equal(got[k], fused[k]) for k in got)


@pytest.mark.parametrize("args, message", [
    (["--K", "64", "--N", "64", "--experts", "4", "--top-k", "5"], "top-k"),
    (["--K", "48", "--N", "64"], "multiple of 32"),
    (["--K", "64", "--N", "64", "--recipe", "bf16", "--fuse"], "no fused layer stages"),
    (["--preset", "deepseek-v3", "--K", "64"], "either --preset"),
    (["--preset", "mixtral-8x7b"], "no [layer] section"),
])  # fmt: skip
def test_layer_bad_input_exits_2_naming_it(args, message, tmp_path):
    result = CliRunner().invoke(cli, ["layer", *args, "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "x.json").exists()


def test_a_measured_layer_projects_each_mxfp8_gemm_at_its_bf16_twin(tmp_path):
    """The B200 projection of a layer run: a routed MXFP8 GEMM takes its own bf16 twin's efficiency (a layer has
    several GEMMs a pass); the shared experts' grouped GEMMs, which have no bf16 twin, their pass's pooled one."""
    from dataclasses import replace as dc_replace

    from mxbench.workloads.layer.measure import layer_points, model_layer_run
    from mxbench.instruments.hardware import get_spec
    from mxbench.workloads.step.projection import project

    shape = LayerShape(T=4096, K=1024, N=512, E=8, top_k=2, shared=1, shared_in_recipe=True)
    run = model_layer_run(shape, layer_points(shape, ["mxfp8"], mode="rceil", seed=0, fuse=False),
                          spec=get_spec("h100-sxm"), hardware="h100-sxm", command="test")  # fmt: skip
    # measured at the model's times, except that the bf16 GEMMs ran at half their model speed
    run.records = [dc_replace(r, measured=True, samples_us=[r.model_us * (2.0 if r.point.recipe == "bf16"
                                                                           and r.category == "gemm" else 1.0)] * 3,
                              model_us=None) for r in run.records]  # fmt: skip
    run.meta["measured"] = True
    df = project(run, "b200")
    mx = df[(df["recipe"] == "mxfp8") & (df["category"] == "gemm")].set_index("stage")
    assert (mx.loc[["up.gemm_fwd", "down.gemm_dgrad", "up.gemm_wgrad"], "carried_from"] == "bf16 GEMM").all()
    assert (mx.loc[["shared_up.gemm_fwd", "shared_down.gemm_wgrad"], "carried_from"] == "bf16 GEMMs of the pass").all()
    bf16 = df[(df["recipe"] == "bf16") & (df["category"] == "gemm")].set_index("stage")
    assert mx.loc["up.gemm_fwd", "carried_pct"] == pytest.approx(bf16.loc["up.gemm_fwd", "carried_pct"])
    assert mx.loc["up.gemm_fwd", "carried_pct"] != pytest.approx(bf16.loc["router_gate", "carried_pct"])


def test_regress_re_measures_a_layer_baseline_as_its_layer(tmp_path, monkeypatch):
    """`mxbench regress` of a `mxbench layer` baseline re-measures that layer (its shape read back from the run's
    metadata), not roofline points: the same numbers pass, a stage 1.5x slower fails."""
    from dataclasses import replace as dc_replace

    import mxbench.instruments.kit
    import mxbench.workloads.layer.measure as layer_measure
    from mxbench.clikit import common
    from mxbench.instruments.hardware import get_spec
    from mxbench.workloads.layer.measure import layer_points, model_layer_run
    from mxbench.storage.results import save_run

    shape = LayerShape(T=256, K=64, N=64, E=4, top_k=2, shared=1, routing="skewed")
    base = model_layer_run(shape, layer_points(shape, ["mxfp8"], mode="rceil", seed=0, fuse=False),
                           spec=get_spec("h100-sxm"), hardware="h100-sxm", command="test", label="tiny")  # fmt: skip
    base.records = [dc_replace(r, measured=True, model_us=None,
                               samples_us=[r.model_us * (1 + 0.001 * i) for i in range(5)]) for r in base.records]
    base.meta.update(measured=True, card="NVIDIA H100 80GB HBM3", timing={"samples": 5})
    save_run(base, tmp_path / "base.json")
    seen, slow = {}, {"factor": 1.0}

    def fake_run_layer(shape_, points, options, instruments, *, label="", progress=True):
        seen.update(shape=shape_, points=list(points), label=label)
        run = type(base)(meta=dict(base.meta), records=[dc_replace(r, samples_us=[
            u * (slow["factor"] if r.stage == "permute" else 1.0) for u in r.samples_us]) for r in base.records])
        return run

    monkeypatch.setattr(common, "has_gpu", lambda: True)
    monkeypatch.setattr(mxbench.instruments.kit.Instruments, "real", classmethod(lambda cls, *a, **k: None))
    monkeypatch.setattr(layer_measure, "run_layer", fake_run_layer)
    same = CliRunner().invoke(cli, ["regress", "--baseline", str(tmp_path / "base.json"), "--rounds", "1"])
    assert same.exit_code == 0, same.output
    assert seen["shape"] == shape and seen["label"] == "tiny" and {p.recipe for p in seen["points"]} == {"bf16", "mxfp8"}
    slow["factor"] = 1.5
    slower = CliRunner().invoke(cli, ["regress", "--baseline", str(tmp_path / "base.json"), "--rounds", "1"])
    assert slower.exit_code == 1, slower.output
    assert "permute" in slower.output and "SLOWER" in slower.output
