"""``mxbench layer --microbatches N``: the weight-only stages (declared on their specs) counted once per N."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from mxkernels.stages.layer import LayerShape, layer_stages

from mxbench.cli import cli


def test_weight_only_stages_are_the_weights_quantizers():
    """The declaration picks exactly the weights' quantize / rearrange stages, none that reads tokens."""
    shape = LayerShape(256, 64, 32, 4, 2)
    fp8 = {s.name for s in layer_stages("fp8_rowwise", shape) if s.weights_only}
    assert fp8 == {"up.quantize_w", "up.quantize_w_t", "down.quantize_w", "down.quantize_w_t"}
    mx = {s.name for s in layer_stages("mxfp8", shape) if s.weights_only}
    assert mx == {f"{p}.{s}" for p in ("up", "down") for s in ("quantize_w", "rearrange_w", "quantize_w_t",
                                                                  "rearrange_w_t")}  # fmt: skip
    assert not any(s.weights_only for s in layer_stages("bf16", shape))


def _layer(tmp_path, monkeypatch, *extra):
    """The layer's analytic model (no GPU, even on a machine with one)."""
    from mxbench.clikit import common

    monkeypatch.setattr(common, "has_gpu", lambda: False)
    out = tmp_path / "layer.json"
    args = ["layer", "--K", "1024", "--N", "512", "--experts", "8", "--tokens", "4096", "--top-k", "2",
            "--recipe", "fp8_rowwise", "--out", str(out), *extra]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def test_amortized_step_counts_weight_stages_once_per_microbatches(tmp_path, monkeypatch):
    run, output = _layer(tmp_path, monkeypatch, "--microbatches", "4")
    assert run["meta"]["layer"]["microbatches"] == 4
    rec = lambda recipe: [r for r in run["records"] if r["point"]["recipe"] == recipe]
    step = lambda recipe: next(r["model_us"] for r in rec(recipe) if r["stage"] == "fwd+bwd")
    # hand count: the four weight quantizers of the two projections, by name
    weights = sum(r["model_us"] for r in rec("fp8_rowwise") if r["stage"].split(".")[-1] in ("quantize_w", "quantize_w_t"))
    assert weights > 0
    amortized = step("fp8_rowwise") - 0.75 * weights
    table = CliRunner().invoke(cli, ["table", str(tmp_path / "layer.json"), "--kind", "layer", "--format", "csv"])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Model,"))  # after the header block
    header, row = lines[at : at + 2]
    cells = dict(zip(header.split(","), row.split(",")))
    assert float(cells["amortized recipe (ms)"]) == pytest.approx(amortized / 1e3, abs=1e-3)
    assert float(cells["amortized bf16 (ms)"]) == pytest.approx(step("bf16") / 1e3, abs=1e-3)
    assert cells["amortized speedup"] == f"{step('bf16') / amortized:.3f}x"


def test_one_microbatch_stores_and_shows_nothing_new(tmp_path, monkeypatch):
    run, output = _layer(tmp_path, monkeypatch)
    assert "microbatches" not in run["meta"]["layer"] and "amortized" not in output


def test_bad_microbatches_is_refused(tmp_path):
    result = CliRunner().invoke(cli, ["layer", "--preset", "qwen3-30b-a3b", "--microbatches", "0",
                                      "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert result.exit_code == 2 and not (tmp_path / "x.json").exists()


def test_amortized_step_of_an_overlapped_step_counts_only_what_the_cached_microbatches_skip():
    # The layer runs of 6bb05da overlapped the weight stages and stored the in-order step. Hand-worked: the first
    # microbatch takes the overlapped step (900 us), the three others the step with the weight stages in order
    # (1000 us) less those stages (100 + 200 us): (900 + 3 * 700) / 4 = 750 us. Subtracting the weight stages from
    # the overlapped step (900 - 0.75 * 300 = 675 us) would count the hidden part twice.
    from mxbench.storage.results import Point, Record
    from mxbench.workloads.layer.amortize import amortized_us

    p = Point(M=64, N=64, K=64, G=4, recipe="fp8_rowwise")
    rec = lambda stage, us: Record(p, "forward", stage, "k", "quantize", samples_us=[us])
    records = [rec("up.quantize_w_amax", 100.0), rec("down.quantize_w_amax", 200.0), rec("up.gemm_fwd", 400.0)]
    assert amortized_us(900.0, records, 4, in_order_us=1000.0) == pytest.approx(750.0)
    assert amortized_us(900.0, records, 4) == pytest.approx(675.0)  # in order: the step less 3/4 of the stages
    assert amortized_us(900.0, records, 1, in_order_us=1000.0) == pytest.approx(900.0)
    assert amortized_us(None, records, 4, in_order_us=1000.0) is None
