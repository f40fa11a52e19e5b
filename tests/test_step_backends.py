"""Backends compared in one invocation against one bf16 baseline (``workloads.step.backends``), on no GPU with the
fake instruments: each bf16 point is measured once and its records are the same in every backend's run."""

from __future__ import annotations

import pytest
from helpers import REPO, FakeGPU

from mxbench.measuring.stages import SweepOptions
from mxbench.plan.points import plan_points
from mxbench.storage.results import load_run
from mxbench.workloads.step.backends import compare_backends, save_backends


class CountingGPU(FakeGPU):
    """Fake instruments that count the points built per (recipe, backend) and time each build ``us`` higher than
    the last: a baseline measured twice would differ between the runs."""

    def __init__(self):
        super().__init__(us=10.0)
        self.built = []

    def build(self, recipe, M, N, K, G, sizes, *, backend, **kw):
        self.built.append((recipe, backend))
        self.us += 1.0
        return super().build(recipe, M, N, K, G, sizes, backend=backend, **kw)


def test_each_backend_divides_by_the_one_bf16_measurement(tmp_path):
    gpu = CountingGPU()
    points = plan_points([256], 2048, 7168, 8, ["fp8_rowwise"], fuse_scales=True)  # an unfused and a fused point
    runs = compare_backends(points, ["native", "triton_ws"], options=SweepOptions(samples=3),
                            instruments=gpu.instruments(), progress=False)  # fmt: skip
    assert gpu.built.count(("bf16", None)) == 1  # one shape, one baseline, measured once
    assert sorted(b for r, b in gpu.built if r != "bf16") == ["native", "native", "triton_ws", "triton_ws"]
    native, ours = runs["native"], runs["triton_ws"]
    bf16 = lambda run: [(r.stage, r.samples_us) for r in run.records if r.point.recipe == "bf16"]
    assert bf16(native) == bf16(ours) and bf16(native)
    assert native.meta["backend"] == "native" and ours.meta["backend"] == "triton_ws"
    assert "one bf16 measurement" in ours.meta["shared_baseline"]
    assert {r.backend for r in ours.records if r.point.recipe != "bf16" and r.backend} == {"triton_ws"}
    paths = save_backends(runs, tmp_path, "roofline-x-fp8_rowwise")
    assert [p.name for p in paths] == ["roofline-x-fp8_rowwise-native.json", "roofline-x-fp8_rowwise-triton_ws.json"]
    assert bf16(load_run(paths[0])) == bf16(load_run(paths[1]))


def test_one_backend_is_no_comparison():
    with pytest.raises(ValueError, match="two or more distinct backends"):
        compare_backends([], ["native", "native"], options=SweepOptions(), instruments=None)


def test_the_script_prices_the_card_it_runs_on_and_takes_only_fused_points(tmp_path, monkeypatch):
    """scripts/step_backends.py on a (faked) H200: its runs name the H200's spec, not SweepOptions' B200 default,
    and ``--fused-only`` leaves only the fused-scales points."""
    import runpy
    import sys

    import torch

    from mxbench.clikit import common
    from mxbench.storage.results import Run
    from mxbench.workloads.step import backends

    seen = {}

    def fake_compare(points, names, *, options, instruments):
        seen.update(hardware=options.hardware, points=[(p.recipe, p.fuse_scales) for p in points])
        return {name: Run(meta={}) for name in names}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common, "detected_spec", lambda device=0: "h200")
    monkeypatch.setattr(backends, "compare_backends", fake_compare)
    monkeypatch.setattr(backends, "save_backends", lambda runs, folder, stem: [])
    script = str(REPO / "scripts" / "step_backends.py")
    monkeypatch.setattr(sys, "argv", [script, "--preset", "deepseek-v3", "--M", "4096", "--fuse-scales",
                                      "--fused-only", "--out-dir", str(tmp_path)])  # fmt: skip
    with pytest.raises(SystemExit) as done:
        runpy.run_path(script, run_name="__main__")
    assert done.value.code == 0
    assert seen["hardware"] == "h200"
    assert seen["points"] == [("fp8_rowwise", True)]  # the bf16 baselines: compare_backends adds them
