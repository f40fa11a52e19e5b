"""Sweeps: planning points, token-group sizes, and run_sweep's records, errors, power limits and saving.

``run_sweep`` is driven here by fake instruments (pipeline, timer, NVML) so every path runs on CPU; the real
thing runs in ``test_real_sweep_on_gpu``.
"""

from __future__ import annotations

import json
import subprocess
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime

import pytest
from helpers import FakePower, FakeTelemetry, FakeTiming, fake_stage
from mxkernels.core.cost import Cost

import mxbench.plan.points
from mxbench.measuring import metadata
from mxbench.instruments import provenance
from mxbench.instruments.kit import Instruments
from mxbench.measuring.stages import SweepOptions
from mxbench.plan.points import group_sizes, plan_points, with_baselines
from mxbench.storage.results import Point, load_run
from mxbench.workloads.step.sweep import model_run, run_sweep

# ------------------------------------------------------------------------------------------------ planning


class TestPlanPoints:
    def test_cross_product_nests_power_limit_then_M_then_recipe(self):
        points = plan_points([64, 128], 64, 32, 4, ["mxfp8", "bf16"], "floor", "skewed", 3, [None, 300.0])
        assert len(points) == 2 * 2 * 2
        assert [(p.power_limit_w, p.M, p.recipe) for p in points] == [
            (w, M, r) for w in (None, 300.0) for M in (64, 128) for r in ("mxfp8", "bf16")
        ]
        assert {(p.N, p.K, p.G, p.mode, p.groups, p.seed) for p in points} == {(64, 32, 4, "floor", "skewed", 3)}

    def test_defaults_measure_mxfp8_at_the_limit_as_found(self):
        (p,) = plan_points([256], 64, 64, 2)
        assert (p.recipe, p.mode, p.groups, p.seed, p.power_limit_w) == ("mxfp8", "rceil", "balanced", 0, None)

    def test_repeated_values_give_each_point_once(self):
        assert len(plan_points([64, 64], 64, 64, 2, ["mxfp8", "mxfp8"])) == 1

    @pytest.mark.parametrize(
        "kwargs, name",
        [
            ({"N": 48}, "N"),
            ({"K": 0}, "K"),
            ({"G": 0}, "G"),
            ({"G": 513}, "G"),
            ({"Ms": [64, 0]}, "M"),
            ({"Ms": []}, "M"),
            ({"recipes": ["fp4"]}, "recipe"),
            ({"mode": "ceil"}, "mode"),
            ({"groups": "zipf"}, "groups"),
            ({"power_limits": [-5.0]}, "power limits"),
        ],
    )
    def test_bad_arguments_raise_naming_them(self, kwargs, name):
        args = {"Ms": [64], "N": 64, "K": 64, "G": 2, "recipes": ["mxfp8"], "mode": "rceil", "groups": "balanced"}
        with pytest.raises(ValueError, match=name):
            plan_points(**{**args, **kwargs})


class TestGroupSizes:
    def test_balanced_spreads_the_remainder_over_the_first_groups(self):
        assert group_sizes(100, 8) == [13, 13, 13, 13, 12, 12, 12, 12]
        assert group_sizes(16384, 8) == [2048] * 8

    def test_alignment_makes_every_size_a_multiple(self):
        # 256 rows = 8 units of 32 over 3 groups: 3 + 3 + 2 units
        assert group_sizes(256, 3, alignment=32) == [96, 96, 64]
        skewed = group_sizes(4096, 8, "skewed", seed=1, alignment=32)
        assert sum(skewed) == 4096 and all(s % 32 == 0 for s in skewed)

    @pytest.mark.parametrize("M, G", [(16384, 8), (1000, 7), (131072, 256), (5, 8)])
    def test_skewed_sums_to_exactly_M(self, M, G):
        for seed in range(5):
            sizes = group_sizes(M, G, "skewed", seed)
            assert len(sizes) == G and sum(sizes) == M and min(sizes) >= 0

    def test_skewed_is_reproducible_from_its_seed(self):
        assert group_sizes(16384, 8, "skewed", 7) == group_sizes(16384, 8, "skewed", 7)
        assert group_sizes(16384, 8, "skewed", 7) != group_sizes(16384, 8, "skewed", 8)

    def test_skewed_is_imbalanced_like_a_router(self):
        balanced = 16384 // 8
        for seed in range(10):
            sizes = group_sizes(16384, 8, "skewed", seed)
            assert max(sizes) > 1.5 * balanced and min(sizes) < 0.5 * balanced

    def test_largest_remainder_rounding(self):
        # floors 1 + 2 + 3 = 6; the one unit left goes to the largest fraction (a tie: the first group)
        assert mxbench.plan.points._largest_remainder([1.5, 2.5, 3.0], 7) == [2, 2, 3]
        assert mxbench.plan.points._largest_remainder([0.2, 0.9, 1.9], 3) == [0, 1, 2]

    @pytest.mark.parametrize(
        "args, match",
        [((100, 0), "G"), ((100, 4, "zipf"), "groups"), ((100, 4, "balanced", 0, 32), "alignment"), ((-1, 4), "M")],
    )
    def test_bad_arguments(self, args, match):
        with pytest.raises(ValueError, match=match):
            group_sizes(*args)


def test_with_baselines_puts_each_bf16_point_after_its_recipe_once():
    a, b = Point(64, 64, 64, 2, "mxfp8"), Point(128, 64, 64, 2, "mxfp8")
    base_a = Point(64, 64, 64, 2, "bf16")
    assert with_baselines([a, b]) == [a, base_a, b, Point(128, 64, 64, 2, "bf16")]
    assert with_baselines([base_a, a]) == [base_a, a]


# ------------------------------------------------------------------------------------------------- fakes


def fake_plan(recipe, M, N, K, G, sizes, *, mode="rceil", backend=None):
    """A two-stage mxfp8 step and a one-GEMM bf16 step whose costs depend on M (so records can be told apart)."""
    assert sum(sizes) == M and len(sizes) == G
    gemm = fake_stage(
        "forward", "gemm_fwd", f"{recipe}_mm", "gemm", "GEMM", f"({M}, {K})", Cost(7 * M, 3 * M, 2 * M * N * K, recipe)
    )
    if recipe == "bf16":
        return [gemm]
    quant = fake_stage(
        "forward", "quantize_a", "quantize_dim0", "quantize", "Quantize A", f"({M}, {K})", Cost(2 * M * K, M * K)
    )
    return [quant, gemm]


@dataclass
class Fakes:
    """Fake instruments; ``fail`` maps (recipe, M) to the exception build_step raises there."""

    fail: dict = field(default_factory=dict)
    power: FakePower = field(default_factory=FakePower)
    built: list = field(default_factory=list)
    timed: list = field(default_factory=list)
    released: int = 0
    on_time: object = None

    def build(self, recipe, M, N, K, G, sizes, *, mode, backend, device, seed):
        self.built.append((recipe, M, self.power.current, device))
        if (recipe, M) in self.fail:
            raise self.fail[(recipe, M)]
        stages = fake_plan(recipe, M, N, K, G, sizes, mode=mode, backend=backend)
        return [replace(s, run=lambda s=s: s.name) for s in stages]

    def end_to_end(self, recipe, M, N, K, G, sizes, *, mode, backend, device, seed):
        return lambda: "step"

    def time_fn(self, fn, *, cold_l2, use_graph, samples, window=None):
        fn()  # warm-up, outside the window as in the real timer
        with window() if window else nullcontext():
            self.timed.append((fn(), cold_l2, use_graph, samples))
        if self.on_time:
            self.on_time()
        return FakeTiming([1.0, 2.0, 4.0][:samples], window_includes_flush=cold_l2 if window else None)

    def release(self):
        self.released += 1

    def instruments(self) -> Instruments:
        def no_power():
            raise AssertionError("a sweep at the limit as found must never open the power controller")

        return Instruments(
            plan_step=fake_plan, build_step=self.build, end_to_end=self.end_to_end, time_fn=self.time_fn,
            telemetry=FakeTelemetry, snapshot=lambda: {"driver_version": "999.1", "power_limit_w": 700.0},
            device_properties=lambda: {"name": "Fake GPU", "uuid": "GPU-fake"}, ceilings=lambda card: None,
            release=self.release, power=self.power, make_power=no_power,
        )  # fmt: skip


def sweep_points(Ms=(64, 128), limits=(None,)):
    return [Point(M, 64, 32, 2, "mxfp8", power_limit_w=w) for w in limits for M in Ms]


def records_of(run, recipe, M):
    return [r for r in run.records if r.point.recipe == recipe and r.point.M == M]


# ---------------------------------------------------------------------------------------------- run_sweep


class TestRunSweep:
    def test_each_point_gives_its_stages_its_bf16_baseline_and_both_end_to_ends(self):
        f = Fakes()
        run = run_sweep(sweep_points(), options=SweepOptions(samples=3), progress=False, instruments=f.instruments())
        assert [(r.point.recipe, r.point.M, r.pass_name, r.stage) for r in run.records] == [
            (recipe, M, p, s)
            for M in (64, 128)
            for recipe, stages in (("mxfp8", ("quantize_a", "gemm_fwd")), ("bf16", ("gemm_fwd",)))
            for p, s in [*(("forward", s) for s in stages), ("end_to_end", "fwd+bwd")]
        ]
        assert all(r.ok and r.samples_us == [1.0, 2.0, 4.0] and r.method == "graph-cold" for r in run.records)

    def test_records_copy_the_stage_costs(self):
        f = Fakes()
        run = run_sweep(sweep_points([64]), options=SweepOptions(), progress=False, instruments=f.instruments())
        quant, gemm, e2e = records_of(run, "mxfp8", 64)
        assert (quant.kernel, quant.category, quant.shape) == ("quantize_dim0", "quantize", "(64, 32)")
        assert (quant.bytes_read, quant.bytes_written, quant.flops) == (2 * 64 * 32, 64 * 32, 0)
        assert (gemm.flops, gemm.precision) == (2 * 64 * 64 * 32, "mxfp8")
        # the end-to-end row moves and computes what its stages declare, together
        assert (e2e.category, e2e.bytes_read, e2e.bytes_written) == (
            "end_to_end",
            2 * 64 * 32 + 7 * 64,
            64 * 32 + 3 * 64,
        )
        assert e2e.flops == gemm.flops
        (base_gemm, base_e2e) = records_of(run, "bf16", 64)
        assert base_gemm.kernel == "bf16_mm" and base_e2e.pass_name == "end_to_end"

    def test_timing_options_and_telemetry_reach_each_record(self):
        f = Fakes()
        options = SweepOptions(cold_l2=False, use_graph=True, samples=2)
        run = run_sweep(sweep_points([64]), options=options, progress=False, instruments=f.instruments())
        assert {(cold, graph, n) for _, cold, graph, n in f.timed} == {(False, True, 2)}
        # each stage timed its own run(); the end-to-end rows their step
        assert [t[0] for t in f.timed] == ["quantize_a", "gemm_fwd", "step", "gemm_fwd", "step"]
        telemetry = run.records[0].telemetry
        assert telemetry["calls"] == 2 * 10  # samples x calls per replay
        assert (telemetry["calls_per_replay"], telemetry["flush_us"], telemetry["sm_clock_mhz"]) == (10, 0.5, 1980.0)
        assert (telemetry["memcpy_nodes"], telemetry["window_includes_flush"]) == (0, False)

    def test_energy_per_call_is_the_timers_window_over_its_calls(self):
        # the sampler is the timer's window: entered once, around the timed calls only, and summarized over
        # replays x calls per replay (3 x 10), not over the warm-up the fake timer runs outside it
        f = Fakes()
        run = run_sweep(
            sweep_points([64]), options=SweepOptions(samples=3), progress=False, instruments=f.instruments()
        )
        assert all(r.telemetry["energy_j_per_call"] == FakeTelemetry.WINDOW_J / (3 * 10) for r in run.records)
        assert all(r.telemetry["window_includes_flush"] is True for r in run.records)  # cold: flush in the window

    def test_a_failing_point_becomes_error_rows_and_the_sweep_goes_on(self):
        f = Fakes(fail={("mxfp8", 64): RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")})
        run = run_sweep(sweep_points(), options=SweepOptions(), progress=False, instruments=f.instruments())
        failed = records_of(run, "mxfp8", 64)
        stages = [r for r in failed if r.pass_name != "end_to_end"]
        assert [r.stage for r in stages] == ["quantize_a", "gemm_fwd"]  # the planned stages, each with the message
        assert all("RuntimeError: CUDA out of memory" in r.error and not r.ok for r in stages)
        assert stages[1].flops == 2 * 64 * 64 * 32  # error rows still say what the stage would have cost
        assert [r.ok for r in records_of(run, "bf16", 64)] == [True, True]
        assert all(r.ok for r in records_of(run, "mxfp8", 128) + records_of(run, "bf16", 128))
        assert f.released == 4  # memory released after every point, failed or not

    def test_a_failing_kernel_errors_only_its_own_row(self):
        f = Fakes()

        def flaky(fn, **kw):
            if fn() == "quantize_a":
                raise ValueError("launch failed")
            return Fakes.time_fn(f, fn, **kw)

        ins = f.instruments()
        ins.time_fn = flaky
        run = run_sweep(sweep_points([64]), options=SweepOptions(), progress=False, instruments=ins)
        quant, gemm, e2e = records_of(run, "mxfp8", 64)
        assert quant.error.startswith("ValueError: launch failed") and gemm.ok and e2e.ok

    def test_an_end_to_end_step_a_graph_cannot_capture_is_timed_eagerly(self):
        f = Fakes()

        def no_graphs(fn, *, use_graph, **kw):
            if use_graph and fn() == "step":
                raise RuntimeError("operation not permitted when stream is capturing")
            return Fakes.time_fn(f, fn, use_graph=use_graph, **kw)

        ins = f.instruments()
        ins.time_fn = no_graphs
        options = SweepOptions(cold_l2=False)
        run = run_sweep(sweep_points([64]), options=options, progress=False, instruments=ins)
        e2e = [r for r in run.records if r.pass_name == "end_to_end"]
        assert len(e2e) == 2 and all(r.ok and "stream is capturing" in r.telemetry["graph_error"] for r in e2e)
        # eager event timing is always cold (the timer refuses warm eager timing)
        assert [(cold, graph) for fn, cold, graph, _ in f.timed if fn == "step"] == [(True, False), (True, False)]

    def test_each_power_limit_is_applied_once_around_its_points(self):
        f = Fakes()
        points = sweep_points(limits=(None, 300.0, 250.0))
        run = run_sweep(points, options=SweepOptions(), progress=False, instruments=f.instruments())
        assert f.power.events == [("set", 300.0), ("restore", 300.0), ("set", 250.0), ("restore", 250.0)]
        # every build ran under its own point's limit; the None points with the limit untouched
        assert [(M, limit) for _, M, limit, _ in f.built] == [
            (M, w) for w in (None, 300.0, 250.0) for M in (64, 64, 128, 128)
        ]
        assert {r.point.power_limit_w for r in run.records} == {None, 300.0, 250.0}
        assert [s["requested_w"] for s in run.meta["power_snapshots"]] == [None, 300.0, 250.0]

    def test_a_sweep_without_limits_never_opens_the_power_controller(self):
        f = Fakes()
        ins = f.instruments()
        ins.power = None  # make_power raises if called
        run_sweep(sweep_points(), options=SweepOptions(), progress=False, instruments=ins)

    def test_results_are_saved_after_every_point(self, tmp_path):
        out = tmp_path / "run.json"
        f = Fakes()
        seen = []
        f.on_time = lambda: seen.append(len(load_run(out).records) if out.exists() else 0)
        run_sweep(sweep_points(), options=SweepOptions(out=out), progress=False, instruments=f.instruments())
        # while a point is timed, the file holds every earlier point: 3 records per mxfp8 point, 2 per bf16 one
        assert sorted(set(seen)) == [0, 3, 5, 8]
        assert len(load_run(out).records) == 10 and out.with_suffix(".csv").exists()

    def test_ctrl_c_stops_the_sweep_and_keeps_what_was_measured(self, tmp_path):
        out = tmp_path / "run.json"
        f = Fakes(fail={("mxfp8", 128): KeyboardInterrupt()})
        run = run_sweep(sweep_points(), options=SweepOptions(out=out), progress=False, instruments=f.instruments())
        stored = load_run(out)
        assert run.meta["interrupted"] is True and stored.meta["interrupted"] is True
        assert {(r.point.recipe, r.point.M) for r in stored.records} == {("mxfp8", 64), ("bf16", 64)}

    def test_ctrl_c_restores_the_power_limit_first(self):
        f = Fakes(fail={("mxfp8", 64): KeyboardInterrupt()})
        run = run_sweep(
            sweep_points(limits=(300.0,)), options=SweepOptions(), progress=False, instruments=f.instruments()
        )
        assert f.power.events == [("set", 300.0), ("restore", 300.0)] and run.meta["interrupted"]

    def test_metadata(self):
        f = Fakes()
        options = SweepOptions(samples=3, hardware="h100-sxm", command="mxbench roofline --K 32 --N 64")
        run = run_sweep(sweep_points(), options=options, progress=False, instruments=f.instruments())
        m = run.meta
        assert (m["card"], m["uuid"], m["driver"], m["hardware"], m["measured"]) == (
            "Fake GPU",
            "GPU-fake",
            "999.1",
            "h100-sxm",
            True,
        )
        assert m["command"] == "mxbench roofline --K 32 --N 64" and m["seeds"] == [0]
        assert m["timing"] == {"cold_l2": True, "use_graph": True, "samples": 3}
        assert m["nvml"]["power_limit_w"] == 700.0
        import torch
        import triton

        import mxbench

        assert (m["torch"], m["triton"], m["mxbench"]) == (torch.__version__, triton.__version__, mxbench.__version__)
        assert "git_commit" in m
        assert datetime.fromisoformat(m["date"]).utcoffset().total_seconds() == 0
        assert {(g["M"], g["G"], g["groups"], g["seed"]): g["sizes"] for g in m["group_sizes"]} == {
            (64, 2, "balanced", 0): [32, 32],
            (128, 2, "balanced", 0): [64, 64],
        }
        json.dumps(m)  # a Run's metadata must be storable

    def test_progress_lines_when_not_on_a_terminal(self, capsys):
        f = Fakes()
        run_sweep(sweep_points(), options=SweepOptions(), progress=True, instruments=f.instruments())
        lines = capsys.readouterr().err.splitlines()
        assert lines == [f"[{i}/4] {p.label()}" for i, p in enumerate(with_baselines(sweep_points()), 1)]


# --------------------------------------------------------------------------------------------------- model


def test_model_run_prices_every_stage_of_the_recipe_and_its_baseline():
    from mxkernels.stages.pipeline import plan_step

    from mxbench.instruments.hardware import get_spec

    points = plan_points([16384], 2048, 7168, 8)
    run = model_run(points, spec=get_spec("b200"), hardware="b200", command="test")
    assert run.meta["measured"] is False and run.meta["label"] == "model, not measured"
    for recipe in ("mxfp8", "bf16"):
        records = [r for r in run.records if r.point.recipe == recipe]
        stages = plan_step(recipe, 16384, 2048, 7168, 8, [2048] * 8, mode="rceil")
        assert [(r.pass_name, r.stage) for r in records if r.pass_name != "end_to_end"] == [
            (s.pass_name, s.name) for s in stages
        ]
        assert all(not r.measured and r.model_us > 0 and r.error is None for r in records)
        assert sum(r.pass_name == "end_to_end" for r in records) == 1


# ----------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_real_sweep_on_gpu(tmp_path):
    out = tmp_path / "run.json"
    points = plan_points([1024, 4096], 256, 512, 4, ["mxfp8", "fp8_rowwise"], groups="skewed")
    run = run_sweep(points, options=SweepOptions(samples=5, out=out), progress=False)
    errors = [f"{r.point.label()} {r.pass_name}/{r.stage}: {r.error}" for r in run.records if not r.ok]
    assert not errors, "\n".join(errors)
    assert {r.point.recipe for r in run.records} == {"mxfp8", "fp8_rowwise", "bf16"}
    assert sum(r.pass_name == "end_to_end" for r in run.records) == 2 * 3
    assert load_run(out).meta["card"] == run.meta["card"]


def test_git_commit_without_a_checkout_comes_from_the_environment(monkeypatch):
    """A tree copied to a GPU machine has no .git: the session names the commit it shipped."""

    def no_git(cwd, *args):
        raise subprocess.CalledProcessError(128, ["git", *args])

    monkeypatch.setattr(provenance, "_git", no_git)
    monkeypatch.delenv("MXBENCH_GIT_COMMIT", raising=False)
    assert metadata.git_commit() is None
    monkeypatch.setenv("MXBENCH_GIT_COMMIT", "abc123")
    assert metadata.git_commit() == "abc123"


def test_fuse_scales_measures_each_scaled_point_beside_its_fused_twin_and_one_baseline():
    points = plan_points([64], 64, 32, 2, ["mxfp8", "fp8_rowwise", "bf16"], fuse_scales=True)
    assert [(p.recipe, p.fuse_scales) for p in points] == [
        ("mxfp8", False), ("mxfp8", True), ("fp8_rowwise", False), ("fp8_rowwise", True), ("bf16", False),
    ]  # fmt: skip
    assert [(p.recipe, p.fuse_scales) for p in with_baselines(points)] == [
        ("mxfp8", False), ("bf16", False), ("mxfp8", True), ("fp8_rowwise", False), ("fp8_rowwise", True),
    ]  # fmt: skip
    assert "fused scales" in points[1].label() and "fused" not in points[0].label()


def test_a_fused_point_plans_builds_and_runs_end_to_end_with_fused_scales():
    seen = []

    class Recording(Fakes):
        def build(self, recipe, M, N, K, G, sizes, *, mode, backend, device, seed, fuse_scales=False):
            seen.append(("build", fuse_scales))
            return super().build(recipe, M, N, K, G, sizes, mode=mode, backend=backend, device=device, seed=seed)

        def end_to_end(self, recipe, M, N, K, G, sizes, *, mode, backend, device, seed, fuse_scales=False):
            seen.append(("e2e", fuse_scales))
            return lambda: "step"

    f = Recording()
    ins = f.instruments()
    ins.plan_step = lambda *a, fuse_scales=False, **kw: (seen.append(("plan", fuse_scales)), fake_plan(*a, **kw))[1]
    run_sweep([Point(64, 64, 32, 2, "mxfp8", fuse_scales=True)], options=SweepOptions(samples=3), progress=False,
              instruments=ins)  # fmt: skip
    assert seen[:3] == [("plan", True), ("build", True), ("e2e", True)]
    assert seen[3:] == [("plan", False), ("build", False), ("e2e", False)]  # the bf16 baseline


def test_fused_fp8_rowwise_scales_past_the_amax_kernels_width_are_refused_before_any_work():
    from mxkernels.core.errors import InputError
    from mxkernels.quant.fp8_amax import MAX_COLS

    with pytest.raises(InputError, match="fuse-scales"):
        plan_points([64], 128, MAX_COLS + 32, 2, ["fp8_rowwise"], fuse_scales=True)
