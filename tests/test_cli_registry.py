"""``mxbench impls``, ``mxbench check`` and ``roofline --impl`` through the command line, and a third party's
package registered by entry point after a real ``pip install``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import with_flipped_bits
from mxkernels.core.names import Recipe
from mxkernels.stages.step_specs import all_specs, specs_of
from test_cli import fake_gpu  # the fixture (a GPU run without a GPU), used by name

from mxbench.implementations import default
from mxbench.cli import cli

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "plain_quantizer"
SMALL = ("--K", "256", "--N", "128", "--G", "2", "--M", "512")


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test starts from the built-in registry (``--impl`` adds to the process-wide one)."""
    monkeypatch.setattr(default, "_DEFAULT", None)


@pytest.fixture
def plain(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    sys.modules.pop("plain_quantizer", None)
    import plain_quantizer

    flipped = with_flipped_bits(plain_quantizer.quantize_a, (33, 65), 0x40)
    monkeypatch.setattr(plain_quantizer, "flipped", flipped, raising=False)
    return plain_quantizer


def test_impls_lists_every_stage_with_the_builtin_implementations_and_reasons():
    result = invoke("impls", "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = [line.split(",", 6) for line in result.output.splitlines()[1:]]
    listed = {(r[0], r[1]) for r in rows}
    assert listed == {(str(recipe), name) for recipe, name in all_specs()}
    quantize_a = {r[3]: r[5] for r in rows if r[:2] == ["mxfp8", "quantize_a"]}
    assert set(quantize_a) == {"mxkernels", "torchao", "torch.compile"}
    assert quantize_a["mxkernels"] == "yes"  # on a CPU the interpreter runs it
    # torch.compile of the reference is a GPU peer row only; torchao's Triton MXFP8 quantizers run only on SM100
    gpu = torch.cuda.is_available()
    assert quantize_a["torch.compile"] == "yes" if gpu else quantize_a["torch.compile"].startswith("no: ")
    if not gpu or torch.cuda.get_device_capability()[0] != 10:
        assert quantize_a["torchao"].startswith("no: ")


def test_impls_of_one_stage_prints_its_calling_contract():
    result = invoke("impls", "--stage", "quantize_a")
    assert result.exit_code == 0, result.output
    assert "contract: quantize_a(a, *, mode) -> (a_q, a_s); compared bit-exact" in result.output
    assert "output 1: a_s: float8_e8m0fnu (M, K/32), row-major" in result.output
    assert "keyword mode: the MX scale mode, 'rceil' or 'floor'" in result.output
    assert "fp8_rowwise/quantize_a" in invoke("impls", "--stage", "fp8_rowwise/quantize_a").output


def test_check_passes_a_correct_plain_torch_implementation(plain):
    result = invoke("check", "--impl", "quantize_a=plain_quantizer:quantize_a", *SMALL)
    assert result.exit_code == 0, result.output
    assert "plain_quantizer:quantize_a  PASS" in result.output


def test_check_fails_one_flipped_byte_and_names_it(plain):
    result = invoke("check", "--impl", "quantize_a=plain_quantizer:flipped", *SMALL)
    assert result.exit_code == 1, result.output
    found = [x for x in result.output.splitlines() if x.startswith("FAIL ") and "M=512 G=2]" in x]
    assert [x.split("]")[0] for x in found] == [f"FAIL quantize_a / plain_quantizer:flipped: [{m}, M=512 G=2"
                                               for m in ("rceil", "floor")]  # fmt: skip
    for line in found:
        assert "a_q: 1 of" in line and "first at index (33, 65)" in line and "input a[33, 65] = " in line
        assert "expected" in line and "got" in line


def test_check_of_builtin_stages_on_a_cpu(plain):
    result = invoke("check", "--stage", "rearrange_a,pad_a", "--name", "mxkernels", *SMALL)
    assert result.exit_code == 0, result.output
    assert result.output.count("PASS") == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (("--impl", "quantize_a=plain_quantizer:nope"), "has no 'nope'"),
        (("--impl", "quantize_z=plain_quantizer:quantize_a"), "no stage 'quantize_z'"),
        (("--stage", "quantize_a", "--name", "torchao"), "nothing was checked"),
        (("--K", "100"), "multiple of 32"),
    ],
)
def test_check_bad_input_exits_2(plain, args, message):
    result = invoke("check", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_roofline_impl_is_checked_then_runs_in_the_whole_step(fake_gpu, plain):
    result = invoke("roofline", "--K", 256, "--N", 128, "--G", 2, "--M", 512,
                    "--impl", "quantize_a=plain_quantizer:quantize_a")  # fmt: skip
    assert result.exit_code == 0, result.output
    (impl,) = fake_gpu["options"].impls
    assert (impl.recipe, impl.stage, impl.name, impl.fn) == (
        Recipe.MXFP8, "quantize_a", "plain_quantizer:quantize_a", plain.quantize_a,
    )  # fmt: skip
    assert fake_gpu["options"].impls_for("mxfp8") == {"quantize_a": impl} and not fake_gpu["options"].impls_for("bf16")


def test_roofline_refuses_to_time_an_implementation_that_fails_its_check(fake_gpu, plain):
    result = invoke("roofline", "--K", 256, "--N", 128, "--G", 2, "--M", 512,
                    "--impl", "quantize_a=plain_quantizer:flipped")  # fmt: skip
    assert result.exit_code == 1
    assert "FAIL [rceil, M=512 G=2] a_q: 1 of" in result.output and "not timed" in result.output
    assert "options" not in fake_gpu  # the sweep never started


def test_an_entry_point_package_installed_with_pip_shows_up_in_impls(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(EXAMPLE)],
        check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "mxbench", "impls", "--stage", "quantize_a"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if "plain_quantizer" in line]
    assert "quantize_a" in row and " yes " in row and "entry point plain_quantizer" in row


def test_a_plain_check_on_a_clean_cpu_install_exits_0(tmp_path):
    """``mxbench check`` as a new user types it (defaults: both modes, both token splits, every implementation):
    what cannot be judged here is skipped with its reason, nothing fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run([sys.executable, "-m", "mxbench", "check"], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    native, *table = done.stdout.splitlines()  # the native backend's verdict first: GEMM stages are checked
    assert native.startswith("native mxfp8 on cpu: unavailable: ")
    rows = [line.split()[:3] for line in table[2:]]
    assert {verdict for _, _, verdict in rows} == {"PASS", "SKIP"}
    ours = {stage for stage, name, verdict in rows if name == "mxkernels" and verdict == "PASS"}
    assert ours == {s.name for s in specs_of("mxfp8")}  # every stage of ours, the fused-scale quantizers too
    fused = [line for line in done.stdout.splitlines() if line.split()[1:3] == ["mxkernels:triton_fused", "SKIP"]]
    assert len(fused) == 3 and all("checked on a GPU only" in line for line in fused)  # fwd, dgrad, wgrad


def test_check_json_carries_the_native_verdict_when_it_checks_a_gemm():
    """The line plain output prints first (the native backend's verdict) is the ``native`` field of the JSON; null
    when no GEMM stage is checked."""
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"  # as check chooses it
    args = ["check", "--name", "mxkernels", "--K", "64", "--N", "64", "--G", "2", "--M", "64", "--mode", "rceil"]
    gemm = CliRunner().invoke(cli, [*args, "--stage", "gemm_fwd", "--format", "json"])
    assert gemm.exit_code == 0, gemm.output
    assert json.loads(gemm.output)["native"].startswith(f"native mxfp8 on {device}: ")
    quantize = CliRunner().invoke(cli, [*args, "--stage", "quantize_a", "--format", "json"])
    assert quantize.exit_code == 0 and json.loads(quantize.output)["native"] is None
    assert CliRunner().invoke(cli, [*args, "--stage", "gemm_fwd"]).output.startswith(f"native mxfp8 on {device}: ")


def test_check_no_pad_checks_every_stage_of_the_step_without_padding():
    """``--no-pad`` without ``--stage``: the pad and unpad stages (not in that step) are left out, not refused."""
    args = ["check", "--name", "mxkernels", "--K", "64", "--N", "64", "--G", "2", "--M", "64", "--mode", "rceil"]
    result = CliRunner().invoke(cli, [*args, "--no-pad"])
    assert result.exit_code == 0, result.output
    stages = {line.split()[0] for line in result.output.splitlines()[3:]}
    assert "gemm_wgrad" in stages and not {"pad_a", "unpad_out"} & stages
    refused = CliRunner().invoke(cli, [*args, "--no-pad", "--stage", "pad_a"])
    assert refused.exit_code == 2 and "without padding (--no-pad)" in refused.output
