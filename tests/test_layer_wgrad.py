"""``--wgrad bf16`` at the single-GPU layer and the map: the FP8 layer's weight gradients as bf16 grouped GEMMs.

The stage tables (no k-groups quantizer, bf16 GEMMs, the forward and dgrad untouched; the default keeps its k-groups
quantizers), the weight gradients of a layer run against an oracle written here (a loop over token copies, apart
from the layer's padded layout and from ``reference.layer_wgrad``), ``check --layer --wgrad bf16`` seeing planted
faults (the FP8 GEMM run instead; the right GEMM on the wrong operand), and the option through ``mxbench layer`` and
``mxbench map`` on a CPU (the model), the stored runs and ``compare``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from mxkernels.autograd.layer import layer_inputs, layer_outputs
from mxkernels.core.names import Category, Pass, Recipe, Wgrad
from mxkernels.stages.layer import LayerShape, layer_stages
from mxkernels.stages.layer_specs import FUSED_STAGES, NO_AMAX
from mxkernels.stages.pipeline import run_stages

from mxbench.cli import cli
from mxbench.clikit import common
from mxbench.storage.results import load_run, save_run

QUANTIZED = ("mxfp8", "fp8_rowwise")
K_GROUPS = ("quantize_a_t", "quantize_grad_out_t")  # the wgrad operands' quantizers (any suffix: _blocked, _from_amax)
SHAPES = {
    "fused gate/up, shared expert in the recipe": LayerShape(T=32, K=64, N=64, E=4, top_k=2, shared=1,
                                                             shared_in_recipe=True),
    "gate and up apart, scores last": LayerShape(T=32, K=64, N=64, E=4, top_k=2, fuse_up=False, score_before=False,
                                                 routing="router"),
}  # fmt: skip


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _base(name: str) -> str:
    return name.split(".", 1)[-1]


def _wgrad_stages(stages):
    return [s for s in stages if s.pass_name == Pass.BACKWARD_WEIGHT and s.name != "router_gate_grad"]


# ------------------------------------------------------------------------------------------------ stage tables


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("recipe", QUANTIZED)
@pytest.mark.parametrize("label", list(SHAPES))
def test_bf16_wgrad_has_bf16_gemms_and_no_k_groups_quantizer_and_the_rest_unchanged(label, recipe, fuse):
    shape = SHAPES[label]
    if fuse and not shape.fuse_up:
        pytest.skip("the fused stages need the fused gate/up layout")
    default = layer_stages(recipe, shape, fuse=fuse, backend="native")
    bf16 = layer_stages(recipe, shape, fuse=fuse, backend="native", wgrad=Wgrad.BF16)
    # the default keeps the recipe's wgrad: both k-groups quantizers and a recipe GEMM for every projection
    roles = {s.name.split(".")[0] for s in _wgrad_stages(default)}
    assert roles == ({"up", "down", "shared_up", "shared_down"} if shape.fuse_up else {"gate", "up", "down"})
    for role in roles:
        mine = [_base(s.name) for s in _wgrad_stages(default) if s.name.startswith(f"{role}.")]
        assert all(any(n.startswith(q) for n in mine) for q in K_GROUPS), (role, mine)
        gemm = next(s for s in default if s.name == f"{role}.gemm_wgrad")
        assert gemm.recipe == Recipe(recipe) and gemm.backend == "native"
    # bf16: each projection's wgrad is one bf16 GEMM of its bf16 output gradient and bf16 input, nothing else
    wgrad = _wgrad_stages(bf16)
    assert [s.name for s in wgrad] == [f"{role}.gemm_wgrad" for role in
                                       [s.name.split(".")[0] for s in _wgrad_stages(default) if "gemm" in s.name]]
    assert not any(_base(s.name).startswith(K_GROUPS) for s in bf16)
    for s in wgrad:
        assert (s.recipe, s.category, s.backend) == (Recipe.BF16, Category.GEMM, "bf16")
    operands = {s.name: s.inputs for s in wgrad}
    up = ("grad_h", "xs", "offs") if shape.fuse_up else ("grad_h3", "xs", "offs")
    assert operands["up.gemm_wgrad"] == up and operands["down.gemm_wgrad"] == ("grad_out", "act", "offs")
    if shape.shared_in_recipe:
        assert operands["shared_up.gemm_wgrad"] == ("grad_hs", "x", "shared_offs")
        assert operands["shared_down.gemm_wgrad"] == ("dy", "acts", "shared_offs")
    # the forward and the input gradients are the recipe's, stage for stage; FP8 rowwise's fused stages write no
    # column amax table (nothing reads it): their NO_AMAX twins, reading no offs
    other = lambda stages: [(s.name, s.inputs, s.outputs, s.recipe) for s in stages
                            if s.pass_name != Pass.BACKWARD_WEIGHT]  # fmt: skip
    untabled = other(default)
    if fuse and recipe == "fp8_rowwise":
        fused = {s.name for s in default if s.name in FUSED_STAGES}
        assert len(fused) == 4
        untabled = [(n + NO_AMAX, tuple(i for i in ins if i != "offs"), tuple(o for o in outs if not o.endswith("_amax")),
                     r) if n in fused else (n, ins, outs, r) for n, ins, outs, r in untabled]  # fmt: skip
    assert other(bf16) == untabled
    assert not any(o.endswith("_amax") for s in bf16 if s.pass_name != Pass.BACKWARD_WEIGHT
                   and s.category != Category.QUANTIZE for o in s.outputs)  # fmt: skip


def test_bf16_recipe_is_unchanged_by_wgrad_and_a_bad_value_is_refused():
    from mxkernels.core.errors import InputError

    shape = SHAPES["gate and up apart, scores last"]
    names = lambda stages: [(s.name, s.inputs, s.recipe) for s in stages]
    assert names(layer_stages("bf16", shape, wgrad="bf16")) == names(layer_stages("bf16", shape))
    with pytest.raises(InputError, match="wgrad must be one of recipe, bf16"):
        layer_stages("mxfp8", shape, wgrad="fp32")


# ------------------------------------------------------------------------------------------------ the gradients


def _oracle(env, shape: LayerShape) -> dict[str, torch.Tensor]:
    """Each expert weight's gradient, token copy by token copy: sum over the copies routed to expert e of
    DY[copy]^T X[copy] in fp64, DY the layer's own output gradient of the projection at the copy's row (``dest``),
    X rebuilt from x (scored before the experts) or from SwiGLU of the layer's h, rounded as the layer's bf16."""
    x, dy, top, experts, dest = env["x"], env["dy"], env["top"], env["experts"].long(), env["dest"].long()
    E, k = shape.E, shape.top_k
    h1, h3 = (env["h"][:, : shape.N], env["h"][:, shape.N :]) if shape.fuse_up else (env["h1"], env["h3"])
    act = (h1.float() * torch.sigmoid(h1.float()) * h3.float()).to(torch.bfloat16)
    names = ["grad_w13"] if shape.fuse_up else ["grad_w1", "grad_w3"]
    dys = [env["grad_h"]] if shape.fuse_up else [env["grad_h1"], env["grad_h3"]]
    sums = {n: torch.zeros(E, d.shape[1], shape.K, dtype=torch.float64) for n, d in zip(names, dys, strict=True)}
    sums["grad_w2"] = torch.zeros(E, shape.K, shape.N, dtype=torch.float64)
    for t in range(shape.T):
        for j in range(k):
            e, row, score = int(experts[t, j]), int(dest[t * k + j]), top[t, j].float()
            xt = (x[t].float() * score).to(torch.bfloat16) if shape.score_before else x[t]
            g = (dy[t].float() * score).to(torch.bfloat16) if not shape.score_before else dy[t]
            for n, d in zip(names, dys, strict=True):
                sums[n][e] += torch.outer(d[row].double(), xt.double())
            sums["grad_w2"][e] += torch.outer(g.double(), act[row].double())
    return {n: s.to(torch.bfloat16) for n, s in sums.items()}


@pytest.mark.parametrize("label, recipe", [(label, "fp8_rowwise") for label in SHAPES] + [(next(iter(SHAPES)), "mxfp8")])
def test_the_layer_under_bf16_wgrad_gives_dy_t_x_of_its_own_output_gradient(label, recipe):
    from mxkernels.core.comparison import MinSQNR, sqnr_db

    shape = replace(SHAPES[label], shared_in_recipe=False)
    inputs = layer_inputs(shape, seed=3)
    stages = layer_stages(recipe, shape, wgrad="bf16")
    env = run_stages(stages, dict(inputs))
    expected = _oracle(env, shape)
    rule = MinSQNR(50.0, per_slice=True)
    for name, want in expected.items():
        assert rule.compare(name, env[name], want) is None, (name, sqnr_db(env[name], want))
        # the layer's bf16 GEMM: each element the fp64 sum rounded once to bf16 but for rare fp32-order flips
        assert (env[name] == want).float().mean() > 0.99, name
    # autograd (what a model and the timed graph run) keeps what the bf16 wgrad reads and gives the same gradients
    got = layer_outputs(recipe, inputs, shape, stages=stages)
    for name in expected:
        if name == "grad_w13":
            assert torch.equal(torch.cat([got["grad_w1"], got["grad_w3"]], 1), env[name])
        else:
            assert torch.equal(got[name], env[name]), name


def test_the_fused_twin_under_bf16_wgrad_gives_the_same_weight_gradients():
    shape = replace(SHAPES["fused gate/up, shared expert in the recipe"], shared_in_recipe=False)
    inputs = layer_inputs(shape, seed=1)
    env = run_stages(layer_stages("fp8_rowwise", shape, fuse=True, wgrad="bf16"), dict(inputs))
    expected = _oracle(env, shape)
    for name, want in expected.items():
        assert (env[name] == want).float().mean() > 0.99, name


# ------------------------------------------------------------------------------------------------ check --layer


def _check(monkeypatch=None, plant=None):
    from mxbench.workloads.layer import check

    if plant is not None:
        real = check.layer_stages
        monkeypatch.setattr(check, "layer_stages", lambda *a, **kw: plant(real, *a, **kw))
    shape = LayerShape(T=16, K=32, N=32, E=4, top_k=2, shared=1, routing="skewed")
    return check.check_bf16_wgrad("fp8_rowwise", shape, layer_inputs(shape, seed=0), mode="rceil", where="test")


def test_check_bf16_wgrad_passes_mxkernels_stages():
    results = _check()
    assert {(r.stage, str(r.verdict)) for r in results} == {("up.gemm_wgrad", "PASS"), ("down.gemm_wgrad", "PASS")}
    assert len(results) == 4  # the chains and the fused twin


def _fp8_wgrad(real, *args, wgrad=None, **kw):
    """Planted: the option is dropped, the FP8 GEMM (and its quantizers) run the weight gradient."""
    return real(*args, **kw)


def _roundtrip(a):
    from mxkernels.quant.fp8_rowwise import quantize_fp8_rowwise_reference

    q, s = quantize_fp8_rowwise_reference(a.contiguous())
    return (q.float() * s.unsqueeze(-1)).to(a.dtype)


def _rewired(change):
    """Planted: the bf16 wgrad GEMMs' activation operand ``a`` replaced by ``change(a)``."""

    def plant(real, *args, **kw):
        stages = real(*args, **kw)
        out = []
        for s in stages:
            if s.name.endswith("gemm_wgrad") and s.recipe == Recipe.BF16:
                fn = s.fn
                s = replace(s, fn=lambda g, a, offs, fn=fn, **p: fn(g, change(a), offs, **p))
            out.append(s)
        return out

    return plant


@pytest.mark.parametrize("plant", [
    pytest.param(_fp8_wgrad, id="the FP8 GEMM instead"),
    pytest.param(_rewired(_roundtrip), id="quantized-dequantized activations"),
    pytest.param(_rewired(lambda a: a.roll(1, 0)), id="rows of the wrong tokens"),
])  # fmt: skip
def test_check_bf16_wgrad_fails_a_planted_fault(plant, monkeypatch):
    results = _check(monkeypatch, plant)
    assert any(str(r.verdict) == "FAIL" for r in results), [(r.stage, r.verdict, r.detail) for r in results]


def test_check_wgrad_is_layer_only():
    result = invoke("check", "--wgrad", "bf16", "--K", 64, "--N", 64, "--G", 2, "--M", 16)
    assert result.exit_code == 2 and "--wgrad is --layer's" in result.output


# ------------------------------------------------------------------------------------------------ the commands


def _kgroup_stages(payload, recipe):
    return {r["stage"] for r in payload["records"] if r["point"]["recipe"] == recipe
            and _base(r["stage"]).startswith(K_GROUPS)}  # fmt: skip


def test_layer_command_stores_and_shows_the_wgrad(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "has_gpu", lambda: False)
    args = ("layer", "--K", 64, "--N", 64, "--tokens", 64, "--experts", 4, "--top-k", 2, "--recipe", "fp8_rowwise")
    base, bf16 = tmp_path / "base.json", tmp_path / "bf16.json"
    assert invoke(*args, "--out", base).exit_code == 0
    result = invoke(*args, "--wgrad", "bf16", "--out", bf16)
    assert result.exit_code == 0, result.output
    assert "fp8_rowwise (bf16 wgrad)" in result.output
    old, new = json.loads(base.read_text()), json.loads(bf16.read_text())
    # the default's files say nothing of wgrad (as before the option); bf16's say it in every recipe point
    assert '"wgrad"' not in base.read_text() and "wgrad" not in base.with_suffix(".csv").read_text().split("\n")[0]
    assert _kgroup_stages(old, "fp8_rowwise") and not _kgroup_stages(new, "fp8_rowwise")
    assert {r["point"].get("wgrad") for r in new["records"] if r["point"]["recipe"] == "fp8_rowwise"} == {"bf16"}
    assert {r["point"].get("wgrad") for r in new["records"] if r["point"]["recipe"] == "bf16"} == {None}
    assert new["meta"]["layer"]["wgrad"] == "bf16"
    assert bf16.with_suffix(".csv").read_text().splitlines()[0].endswith(",wgrad")
    assert "fp8_rowwise (bf16 wgrad)" in invoke("table", bf16, "--kind", "layer-stages").output
    # compare holds a bf16-wgrad point apart from the recipe-wgrad one: only bf16's records pair up
    from mxbench.gate.compare import MatchKey

    keys = lambda run: {MatchKey.of(r) for r in run.records}
    common_keys = keys(load_run(base)) & keys(load_run(bf16))
    assert common_keys and {k.recipe for k in common_keys} == {"bf16"}
    # a run with the option reads back and writes the same file
    again = tmp_path / "again.json"
    save_run(load_run(bf16), again)
    assert again.read_text() == bf16.read_text()


def test_layer_wgrad_bf16_needs_a_quantized_recipe(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "has_gpu", lambda: False)
    result = invoke("layer", "--K", 64, "--N", 64, "--tokens", 64, "--experts", 4, "--recipe", "bf16", "--wgrad",
                    "bf16", "--out", tmp_path / "x.json")  # fmt: skip
    assert result.exit_code == 2 and "bf16's weight gradient is bf16 already" in result.output


def test_map_command_models_the_bf16_wgrad_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "has_gpu", lambda: False)
    grid = ("--experts", "2,4", "--tokens-per-expert", "32,64", "--recipe", "mxfp8", "--plot-dir", tmp_path / "plots")
    args = ("map", "--K", 64, "--N", 64, "--top-k", 2, *grid)
    base, bf16 = tmp_path / "base.json", tmp_path / "bf16.json"
    assert invoke(*args, "--out", base).exit_code == 0
    result = invoke(*args, "--wgrad", "bf16", "--out", bf16)
    assert result.exit_code == 0, result.output
    assert "mxfp8 (bf16 wgrad) forward + backward speedup over bf16" in result.output
    assert '"wgrad"' not in base.read_text()
    new = json.loads(bf16.read_text())
    assert new["meta"]["map"]["wgrad"] == "bf16"
    assert _kgroup_stages(json.loads(base.read_text()), "mxfp8") and not _kgroup_stages(new, "mxfp8")
    table = invoke("table", bf16, "--kind", "map")
    assert "mxfp8 (bf16 wgrad) forward + backward speedup" in table.output
    from PIL import Image

    from mxbench.workloads.map.figure import METADATA_KEY

    drawn = json.loads(Image.open(tmp_path / "plots" / "bf16-mxfp8.png").text[METADATA_KEY])
    assert drawn["wgrad"] == "bf16"
    refused = invoke("map", "--K", 64, "--N", 64, *grid, "--scope", "projection", "--wgrad", "bf16", "--out",
                     tmp_path / "p.json")  # fmt: skip
    assert refused.exit_code == 2 and "--wgrad bf16 is the layer's option" in refused.output


def test_the_schema_takes_a_wgrad_point_and_refuses_another_value(tmp_path, monkeypatch):
    from mxkernels.core.errors import InputError

    from mxbench.storage.results import run_from_json

    monkeypatch.setattr(common, "has_gpu", lambda: False)
    out = tmp_path / "x.json"
    assert invoke("layer", "--K", 64, "--N", 64, "--tokens", 64, "--experts", 4, "--recipe", "mxfp8", "--wgrad",
                  "bf16", "--out", out).exit_code == 0  # fmt: skip
    text = out.read_text()
    assert {r.point.wgrad for r in run_from_json(text).records} == {"recipe", "bf16"}
    with pytest.raises(InputError, match="wgrad"):
        run_from_json(text.replace('"wgrad": "bf16"', '"wgrad": "fp32"'))


@pytest.mark.gpu
def test_a_measured_layer_with_bf16_wgrad_on_the_gpu(tmp_path):
    """On a GPU: both wgrads of one layer measured, no error row, no k-groups quantizer timed under bf16 wgrad, and
    its expert weight gradients closer to the fp32 layer's than the FP8 wgrad's (the SQNR each fwd+bwd stores)."""
    args = ("layer", "--K", 256, "--N", 128, "--tokens", 1024, "--experts", 4, "--top-k", 2, "--recipe",
            "fp8_rowwise,mxfp8", "--fuse", "--samples", 3)  # fmt: skip
    runs = {}
    for wgrad in ("recipe", "bf16"):
        out = tmp_path / f"{wgrad}.json"
        result = invoke(*args, "--wgrad", wgrad, "--out", out)
        assert result.exit_code == 0, result.output
        runs[wgrad] = json.loads(out.read_text())
        assert runs[wgrad]["meta"]["measured"] is True and not [r for r in runs[wgrad]["records"] if r.get("error")]
    for recipe in QUANTIZED:
        assert _kgroup_stages(runs["recipe"], recipe) and not _kgroup_stages(runs["bf16"], recipe)
        sqnr = {w: [r["telemetry"]["sqnr_db"] for r in runs[w]["records"]
                    if r["stage"] == "fwd+bwd" and r["point"]["recipe"] == recipe] for w in runs}  # fmt: skip
        for fp8, bf16 in zip(sqnr["recipe"], sqnr["bf16"], strict=True):
            for name in ("grad_w1", "grad_w3", "grad_w2"):
                assert bf16[name] > fp8[name], (recipe, name, fp8[name], bf16[name])
            assert abs(bf16["y"] - fp8["y"]) < 0.05  # the forward is the recipe's either way
