"""mxbench peers: every data-movement stage for each implementation on the same inputs, stored as a run, and the
peers table. Driven by a fake pipeline and fake instruments on CPU; the real thing in ``test_peers_on_gpu``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import FakePower, FakeTelemetry, FakeTiming, fake_stage
from mxkernels.core.cost import Cost
from mxkernels.core.errors import InputError
from mxkernels.core.names import Recipe

from mxbench.implementations import builtin as implementations
from mxbench.instruments.kit import Instruments
from mxbench.measuring.stages import SweepOptions
from mxbench.workloads.peers.measure import BUILTIN_COLUMNS, run_peers
from mxbench.implementations.default import builtin_registry
from mxbench.implementations.registry import Implementation, Registry
from mxbench.storage.results import Point, Record, Run, load_run
from mxbench.workloads.peers.tables import peer_rows
from mxbench.workloads.step.tables import TableOptions

COST = Cost(300, 100)


def stage(pass_name, name, kernel, category, inputs, outputs):
    fn = lambda *args, **kw: tuple(f"{name}({', '.join(map(str, args))})" for _ in outputs)
    return fake_stage(pass_name, name, kernel, category, name.replace("_", " "), "(64, 32)", COST, None, inputs,
                      outputs, fn)  # fmt: skip


class FakePipeline:
    """An mxfp8 step of one quantize, one rearrange and a GEMM; the padded step adds pad and unpad."""

    def __init__(self):
        self.ran = []

    def plan_step(self, recipe, M, N, K, G, sizes, *, mode):
        return self.step_stages(recipe, M, N, K, G, mode=mode, pad=False)

    def step_stages(self, recipe, M, N, K, G, *, mode, pad):
        a = "a_p" if pad else "a"
        body = [
            stage("forward", "quantize_a", "quantize_dim0", "quantize", (a,), ("a_q", "a_s")),
            stage("forward", "rearrange_a", "rearrange_m_groups", "rearrange", ("a_s", "offs"), ("a_sb",)),
            stage("forward", "gemm_fwd", "mxfp8_scaled_grouped_mm", "gemm", ("a_q", "a_sb"), ("out",)),
        ]
        if not pad:
            return body
        return [
            stage("forward", "pad_a", "pad_token_groups", "pad", ("a", "offs"), ("a_p", "offs_p")),
            *body,
            stage("forward", "unpad_out", "unpad_token_groups", "pad", ("out", "offs", "offs_p"), ("out_u",)),
        ]

    def make_inputs(self, M, N, K, G, sizes, *, device, seed):
        return {"a": f"A[{M}x{K}]", "offs": "offs"}

    def run_stages(self, stages, env):
        for s in stages:
            self.ran.append(s.name)
            env.update(zip(s.outputs, s.fn(*[env[i] for i in s.inputs]), strict=True))
        return env


class PeerFakes:
    """Instruments whose timer records (use_graph, fn) instead of calling fn."""

    def __init__(self):
        self.timed = []

    def time_fn(self, fn, *, cold_l2, use_graph, samples, window=None):
        self.timed.append((use_graph, fn))
        return FakeTiming([3.0, 4.0, 5.0])

    def instruments(self):
        return Instruments(
            plan_step=None, build_step=None, end_to_end=None, time_fn=self.time_fn, telemetry=FakeTelemetry,
            snapshot=lambda: {"driver_version": "1"}, device_properties=lambda: {"name": "Fake GPU"},
            ceilings=lambda card: None, release=lambda: None, power=FakePower(),
        )  # fmt: skip


def echo(name):
    """An implementation that returns what it was called with (so a test sees its inputs)."""
    return lambda *args, **kwargs: (name, args, kwargs)


def fake_registry(*, peer_available=None, compiled_graph_safe=False) -> Registry:
    """mxkernels for every stage of the fake step, a "peer" for quantize_a and rearrange_a (available unless
    ``peer_available`` gives a reason), and a host-syncing "reference" for every stage."""
    registry = Registry()
    for name in ("quantize_a", "rearrange_a", "pad_a", "unpad_out", "gemm_fwd"):
        registry.add(Implementation(Recipe.MXFP8, name, "mxkernels", echo(f"ours:{name}"), f"ours_{name}"))
    for name in ("quantize_a", "rearrange_a"):
        registry.add(Implementation(Recipe.MXFP8, name, "peer", echo(f"peer:{name}"), f"peer_{name}",
                                    available=lambda d: peer_available))  # fmt: skip
    for name in ("quantize_a", "rearrange_a", "pad_a", "unpad_out"):
        registry.add(Implementation(Recipe.MXFP8, name, "reference", echo(f"ref:{name}"), f"ref_{name}",
                                    graph_safe=name == "quantize_a" or compiled_graph_safe))  # fmt: skip
    return registry


def run(fakes, tmp_path=None, registry=None, pipeline=None):
    options = SweepOptions(samples=3, out=None if tmp_path is None else tmp_path / "peers.json")
    return run_peers(64, 64, 32, 2, options=options, instruments=fakes.instruments(), registry=registry or
                     fake_registry(), pipeline=pipeline or FakePipeline(), progress=False)  # fmt: skip


def test_every_data_movement_stage_for_each_implementation_ours_first():
    result = run(PeerFakes())
    got = [(r.impl, r.stage, r.kernel) for r in result.records]
    assert got == [
        ("mxkernels", "quantize_a", "ours_quantize_a"),
        ("mxkernels", "rearrange_a", "ours_rearrange_a"),
        ("peer", "quantize_a", "peer_quantize_a"),
        ("peer", "rearrange_a", "peer_rearrange_a"),
        ("reference", "quantize_a", "ref_quantize_a"),
        ("reference", "rearrange_a", "ref_rearrange_a"),
        # aligned groups: the padded step contributes its pad and unpad stages (no GEMM anywhere)
        ("mxkernels", "pad_a", "ours_pad_a"),
        ("mxkernels", "unpad_out", "ours_unpad_out"),
        ("reference", "pad_a", "ref_pad_a"),
        ("reference", "unpad_out", "ref_unpad_out"),
    ]
    assert all(r.ok and (r.bytes_read, r.bytes_written) == (300, 100) for r in result.records)
    # every registered implementation's code, once per run, keyed by the names the records carry
    implementations = result.meta["implementations"]
    assert result.meta["kind"] == "peers" and list(implementations) == ["mxkernels", "peer", "reference"]
    assert [e["module"] for e in implementations.values()] == ["mxkernels", __name__, __name__]


def test_an_implementation_that_cannot_run_here_is_a_skipped_row_with_its_reason():
    fakes = PeerFakes()
    result = run(fakes, registry=fake_registry(peer_available="needs SM100"))
    skipped = [r for r in result.records if r.skipped]
    assert [(r.impl, r.stage, r.skipped) for r in skipped] == [
        ("peer", "quantize_a", "needs SM100"), ("peer", "rearrange_a", "needs SM100"),
    ]  # fmt: skip
    assert all(r.error is None and not r.ok for r in skipped)
    assert len(fakes.timed) == len(result.records) - 2  # never timed
    (row, _) = peer_rows(result)[:2]
    assert row["peer (us)"] == "skipped"


def test_host_syncing_implementations_are_timed_without_a_graph():
    fakes = PeerFakes()
    result = run(fakes)
    graph = {(r.stage, r.impl): use_graph for r, (use_graph, _) in zip(result.records, fakes.timed, strict=True)}
    assert graph["rearrange_a", "reference"] is False and graph["pad_a", "reference"] is False
    assert graph["quantize_a", "reference"] is True and graph["quantize_a", "mxkernels"] is True


def test_every_implementation_runs_on_the_stage_inputs_of_one_eager_step():
    fakes = PeerFakes()
    result = run(fakes)
    fns = {(r.stage, r.impl): fn for r, (_, fn) in zip(result.records, fakes.timed, strict=True)}
    assert fns["quantize_a", "peer"]() == ("peer:quantize_a", ("A[64x32]",), {})
    assert fns["rearrange_a", "mxkernels"]() == ("ours:rearrange_a", ("quantize_a(A[64x32])", "offs"), {})
    assert fns["pad_a", "reference"]()[1] == ("A[64x32]", "offs")


def test_an_implementation_that_cannot_be_set_up_is_an_error_row(tmp_path):
    registry = fake_registry()

    def broken(inputs, params):
        raise ImportError("cannot import name 'kernel'")

    registry.add(replace(registry.get("mxfp8", "quantize_a", "peer"), prepare=broken), replace=True)
    result = run(PeerFakes(), tmp_path, registry=registry)
    (bad,) = [r for r in result.records if not r.ok]
    assert (bad.impl, bad.stage) == ("peer", "quantize_a") and "ImportError: cannot import name" in bad.error
    assert len(load_run(tmp_path / "peers.json").records) == len(result.records)


def test_a_step_that_cannot_run_gives_error_rows_for_its_stages():
    class Broken(FakePipeline):
        def run_stages(self, stages, env):
            if any(s.category == "pad" for s in stages):
                raise RuntimeError("CUDA out of memory")
            return super().run_stages(stages, env)

    result = run(PeerFakes(), pipeline=Broken())
    failed = [r for r in result.records if not r.ok]
    assert {(r.stage, r.impl) for r in failed} == {
        (s, i) for s in ("pad_a", "unpad_out") for i in ("mxkernels", "reference")
    }
    assert all("CUDA out of memory" in r.error for r in failed)


def test_real_pipeline_ours_and_the_oracles_agree_on_every_data_movement_stage():
    """The real step on CPU (kernels under the interpreter): mxkernels and the plain-torch oracle, registered as an
    implementation, each called once on the same inputs, compute the same bytes."""
    from types import SimpleNamespace

    from mxkernels.stages import pipeline
    from mxkernels.core.names import MEMORY_CATEGORIES
    from mxkernels.stages.step_specs import all_specs

    registry = Registry()
    for spec in all_specs().values():
        if spec.recipe == Recipe.MXFP8 and spec.category in MEMORY_CATEGORIES:
            registry.add(Implementation(spec.recipe, spec.name, "mxkernels", spec.impl, spec.kernel))
            registry.add(Implementation(spec.recipe, spec.name, "oracle", spec.oracle, "reference", graph_safe=False))
    ran = []

    def call_once(fn, *, cold_l2, use_graph, samples, window=None):
        ran.append(fn())
        return FakeTiming([1.0])

    fakes = PeerFakes()
    fakes.time_fn = call_once
    on_cpu = SimpleNamespace(
        **{k: getattr(pipeline, k) for k in ("plan_step", "step_stages", "run_stages")},
        make_inputs=lambda *a, device, seed: pipeline.make_inputs(*a, device="cpu", seed=seed),
    )
    result = run_peers(64, 64, 64, 2, options=SweepOptions(samples=1), instruments=fakes.instruments(),
                       registry=registry, pipeline=on_cpu, progress=False)  # fmt: skip
    assert all(r.ok for r in result.records), [r.error or r.skipped for r in result.records if not r.ok]
    out = {(r.stage, r.impl): o for r, o in zip(result.records, ran, strict=True)}
    for name in ("quantize_a", "rearrange_a", "quantize_w_t", "rearrange_a_t", "pad_a", "unpad_grad_a"):
        ours, ref = out[name, "mxkernels"], out[name, "oracle"]
        assert torch.equal(ours[0].view(torch.uint8), ref[0].view(torch.uint8)), name
    assert {r.category for r in result.records} == {"quantize", "rearrange", "pad"}


# ---- the torchao adapters ------------------------------------------------------------------------------------


def test_torchao_k_groups_takes_group_ends_in_scale_columns_converted_untimed(monkeypatch):
    calls = []
    monkeypatch.setattr(implementations, "_ao", lambda module, name: lambda *a: calls.append(a) or "blocked")
    offs = torch.tensor([64, 64, 320], dtype=torch.int32)
    call = implementations._ao_k_groups_prepared(("scales", offs), {})
    assert call() == ("blocked",)
    ((scales, scale_offs),) = calls
    assert scales == "scales" and scale_offs.tolist() == [2, 2, 10]


def test_torchao_says_why_it_cannot_run(monkeypatch):
    registry = builtin_registry()
    quantizer = registry.get("mxfp8", "quantize_a", "torchao")
    rearrange = registry.get("mxfp8", "rearrange_a", "torchao")
    monkeypatch.setattr(implementations, "torchao_version", lambda: None)
    assert "not installed" in quantizer.unavailable("cpu")
    monkeypatch.setattr(implementations, "torchao_version", lambda: "0.17.0")
    assert "CUDA" in quantizer.unavailable("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert "only on SM100" in quantizer.unavailable(torch.device("cuda", 0))
    assert rearrange.unavailable(torch.device("cuda", 0)) is None
    assert quantizer.deviation is not None and rearrange.deviation is None


def peer_run() -> Run:
    p = Point(131072, 2048, 7168, 8)
    cost = {"bytes_read": 2_000_000, "bytes_written": 1_000_000}

    def rec(impl, us, error=None):
        return Record(p, "forward", "quantize_a", "k", "quantize", "Quantize A", "(131072, 7168)", impl=impl,
                      samples_us=[] if error else [us], error=error, **cost)  # fmt: skip

    return Run(
        meta={"card": "Fake GPU"},
        records=[rec("mxkernels", 10.0), rec("torchao", 20.0), rec("torch.compile", 0, "boom")],
    )


def test_peer_rows_pivot_implementations_per_stage():
    (row,) = peer_rows(peer_run())
    assert row["Stage"] == "quantize_a" and row["Input shape"] == "(131072, 7168)"
    assert [row[f"{i} (us)"] for i in BUILTIN_COLUMNS] == ["10.0", "20.0", "error"]
    assert row["mxkernels GB/s"] == "300"  # 3 MB in 10 us
    assert row["Best peer / ours"] == "2.00x"  # the fastest peer that ran, 20 us, over our 10 us


def test_peer_rows_filter_by_M_names_the_M_held():
    with pytest.raises(InputError, match="no records with M=1024; the run has M in 131072"):
        peer_rows(peer_run(), TableOptions(M=1024))


@pytest.mark.gpu
def test_peers_on_gpu(tmp_path):
    options = SweepOptions(samples=5, out=tmp_path / "peers.json")
    result = run_peers(4096, 256, 512, 4, options=options, progress=False)
    ours = [r for r in result.records if r.impl == "mxkernels"]
    assert ours and all(r.ok for r in ours), [r.error for r in ours if not r.ok]
    compiled = [r for r in result.records if r.impl == "torch.compile"]
    assert compiled and all(r.ok for r in compiled), [r.error for r in compiled if not r.ok]
    assert {r.category for r in ours} == {"quantize", "rearrange", "pad"}
    assert peer_rows(load_run(tmp_path / "peers.json"))
