"""mxbench peers: every data-movement stage for each implementation on the same inputs, stored as a run, and the
peers table. Driven by a fake pipeline and fake instruments on CPU; the real thing in ``test_peers_on_gpu``."""

from __future__ import annotations

import pytest
import torch
from helpers import FakePower, FakeTelemetry, FakeTiming
from mxkernels.cost import Cost
from mxkernels.pipeline import Stage

from mxbench import peers
from mxbench.instruments import Instruments
from mxbench.measure import SweepOptions
from mxbench.peers import IMPLS, peer_rows, run_peers
from mxbench.results import Point, Record, Run, load_run

COST = Cost(300, 100)


def stage(pass_name, name, kernel, category, inputs, outputs):
    return Stage(pass_name, name, kernel, category, name.replace("_", " "), "(64, 32)", COST, None, inputs, outputs,
                  lambda *args: tuple(f"{name}({', '.join(map(str, args))})" for _ in outputs))  # fmt: skip


class FakePipeline:
    """An mxfp8 step of one quantize, one rearrange and a GEMM; the padded step adds pad and unpad."""

    ALIGNMENT = {"mxfp8": 32}

    def __init__(self):
        self.ran = []

    def plan_step(self, recipe, M, N, K, G, sizes, *, mode):
        return self.step_stages(recipe, M, N, K, G, mode=mode, pad=False)

    def step_stages(self, recipe, M, N, K, G, *, mode, pad):
        a = "a_p" if pad else "a"
        body = [
            stage("forward", "quantize_a", "quantize_dim0", "quantize", (a,), ("a_q", "a_s")),
            stage("forward", "rearrange_a", "rearrange_m_groups", "rearrange", ("a_s", "offs"), ("a_sb",)),
            stage("forward", "gemm", "mxfp8_grouped_mm", "gemm", ("a_q", "a_sb"), ("out",)),
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
    """Instruments whose timer records (stage name, use_graph, fn) instead of calling fn."""

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


@pytest.fixture(autouse=True)
def no_compile(request, monkeypatch):
    """torch.compile as the identity on CPU (compiling is the GPU test's business, and slow to import)."""
    if "gpu" not in request.keywords:
        monkeypatch.setattr(torch, "compile", lambda f: f)


@pytest.fixture
def fake_torchao(monkeypatch):
    """torchao "installed": every torchao function records its arguments."""
    calls = []

    def ao(module, name):
        return lambda *args, **kwargs: calls.append((name, args, kwargs))

    monkeypatch.setattr(peers, "_torchao_status", lambda: "9.9-test")
    monkeypatch.setattr(peers, "_ao", ao)
    monkeypatch.setattr(peers, "_ao_quantizer", lambda name: ao(peers._MX, name))
    return calls


def test_torchao_quantizers_below_sm100_say_why(monkeypatch):
    """torchao defines its Triton MXFP8 quantizers only on SM100+: a Hopper row names that, not torchao's stub."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with pytest.raises(RuntimeError, match="only on SM100"):
        peers._ao_quantizer("triton_to_mxfp8_dim0")


def run(fakes, tmp_path=None):
    options = SweepOptions(samples=3, out=None if tmp_path is None else tmp_path / "peers.json")
    return run_peers(64, 64, 32, 2, options=options, instruments=fakes.instruments(), pipeline=FakePipeline(),
                     progress=False)  # fmt: skip


def test_every_data_movement_stage_for_each_implementation(fake_torchao):
    result = run(PeerFakes())
    got = [(r.backend, r.stage, r.kernel) for r in result.records]
    assert got == [
        ("mxkernels", "quantize_a/mxkernels", "quantize_dim0"),
        ("mxkernels", "rearrange_a/mxkernels", "rearrange_m_groups"),
        ("torchao", "quantize_a/torchao", "triton_to_mxfp8_dim0"),
        ("torchao", "rearrange_a/torchao", "triton_mx_block_rearrange_2d_M_groups"),
        ("torch.compile", "quantize_a/torch.compile", "quantize_reference"),
        ("torch.compile", "rearrange_a/torch.compile", "rearrange_m_groups_reference"),
        # aligned groups: the padded step contributes its pad and unpad stages
        ("mxkernels", "pad_a/mxkernels", "pad_token_groups"),
        ("mxkernels", "unpad_out/mxkernels", "unpad_token_groups"),
        ("torch.compile", "pad_a/torch.compile", "pad_token_groups_reference"),
        ("torch.compile", "unpad_out/torch.compile", "unpad_token_groups_reference"),
    ]
    assert all(r.ok and (r.bytes_read, r.bytes_written) == (300, 100) for r in result.records)
    assert result.meta["kind"] == "peers" and result.meta["torchao"] == "9.9-test"


def test_host_syncing_references_are_timed_without_a_graph(fake_torchao):
    fakes = PeerFakes()
    result = run(fakes)
    graph = {r.stage: use_graph for r, (use_graph, _) in zip(result.records, fakes.timed, strict=True)}
    assert graph["rearrange_a/torch.compile"] is False and graph["pad_a/torch.compile"] is False
    assert graph["quantize_a/torch.compile"] is True and graph["quantize_a/mxkernels"] is True


def test_every_implementation_runs_on_the_stage_inputs_of_one_eager_step(fake_torchao):
    fakes = PeerFakes()
    result = run(fakes)
    fns = {r.stage: fn for r, (_, fn) in zip(result.records, fakes.timed, strict=True)}
    assert fns["quantize_a/mxkernels"]() == ("quantize_a(A[64x32])", "quantize_a(A[64x32])")
    fns["quantize_a/torchao"]()
    fns["rearrange_a/torchao"]()
    assert fake_torchao == [
        ("triton_to_mxfp8_dim0", ("A[64x32]",), {"inner_block_size": 32, "scaling_mode": "rceil"}),
        ("triton_mx_block_rearrange_2d_M_groups", ("quantize_a(A[64x32])", "offs"), {}),
    ]


def test_torchao_k_groups_takes_group_ends_in_scale_columns(fake_torchao):
    offs = torch.tensor([64, 64, 320], dtype=torch.int32)
    fn = peers._ao_k_groups("scales", offs, peers.Context(320, "rceil", 32))
    fn()
    (_, (scales, scale_offs), _) = fake_torchao[0]
    assert scales == "scales" and scale_offs.tolist() == [2, 2, 10]


def test_without_torchao_there_are_no_torchao_rows(monkeypatch):
    monkeypatch.setattr(peers, "_torchao_status", lambda: None)
    result = run(PeerFakes())
    assert "torchao" not in {r.backend for r in result.records}
    assert result.meta["torchao"].startswith("not installed")


def test_a_torchao_function_that_is_missing_gives_error_rows(monkeypatch, tmp_path):
    def missing(module, name):
        raise ImportError(f"cannot import name {name!r} from {module!r}")

    monkeypatch.setattr(peers, "_torchao_status", lambda: "0.1-old")
    monkeypatch.setattr(peers, "_ao", missing)
    result = run(PeerFakes(), tmp_path)
    ao = [r for r in result.records if r.backend == "torchao"]
    assert len(ao) == 2 and all("ImportError: cannot import name" in r.error for r in ao)
    assert all(r.ok for r in result.records if r.backend != "torchao")
    assert len(load_run(tmp_path / "peers.json").records) == len(result.records)


def test_real_pipeline_every_implementation_runs_on_its_stage_inputs(monkeypatch):
    """The real step (kernels under the interpreter on CPU): each implementation is called once on its inputs."""
    from types import SimpleNamespace

    from mxkernels import pipeline

    monkeypatch.setattr(peers, "_torchao_status", lambda: None)
    ran = []

    def call_once(fn, *, cold_l2, use_graph, samples, window=None):
        ran.append(fn())
        return FakeTiming([1.0])

    fakes = PeerFakes()
    fakes.time_fn = call_once
    on_cpu = SimpleNamespace(
        **{k: getattr(pipeline, k) for k in ("ALIGNMENT", "plan_step", "step_stages", "run_stages")},
        make_inputs=lambda *a, device, seed: pipeline.make_inputs(*a, device="cpu", seed=seed),
    )
    result = run_peers(64, 64, 64, 2, options=SweepOptions(samples=1), instruments=fakes.instruments(),
                       pipeline=on_cpu, progress=False)  # fmt: skip
    assert all(r.ok for r in result.records), [r.error for r in result.records if not r.ok]
    by_stage = {r.stage: out for r, out in zip(result.records, ran, strict=True)}
    # ours and the plain-torch reference agree on what they computed (bit-exact quantizers and layouts)
    for name in ("quantize_a", "rearrange_a", "quantize_w_t", "rearrange_a_t", "pad_a"):
        ours, ref = by_stage[f"{name}/mxkernels"], by_stage[f"{name}/torch.compile"]
        ours, ref = (ours if isinstance(ours, tuple) else (ours,)), (ref if isinstance(ref, tuple) else (ref,))
        assert torch.equal(ours[0].view(torch.uint8), ref[0].view(torch.uint8)), name
    assert {r.category for r in result.records} == {"quantize", "rearrange", "pad"}


def test_a_step_that_cannot_run_gives_error_rows_for_its_stages(monkeypatch):
    class Broken(FakePipeline):
        def run_stages(self, stages, env):
            if any(s.category == "pad" for s in stages):
                raise RuntimeError("CUDA out of memory")
            return super().run_stages(stages, env)

    monkeypatch.setattr(peers, "_torchao_status", lambda: None)
    result = run_peers(64, 64, 32, 2, options=SweepOptions(), instruments=PeerFakes().instruments(), pipeline=Broken(),
                       progress=False)  # fmt: skip
    failed = [r for r in result.records if not r.ok]
    assert {r.stage for r in failed} == {
        f"{s}/{i}" for s in ("pad_a", "unpad_out") for i in ("mxkernels", "torch.compile")
    }
    assert all("CUDA out of memory" in r.error for r in failed)
    assert sum(r.ok for r in result.records) == 4  # the unpadded step's stages, ours and the references


def peer_run() -> Run:
    p = Point(131072, 2048, 7168, 8)
    cost = dict(bytes_read=2_000_000, bytes_written=1_000_000)

    def rec(impl, us, error=None):
        return Record(p, "forward", f"quantize_a/{impl}", "k", "quantize", "Quantize A", "(131072, 7168)",
                      backend=impl, samples_us=[] if error else [us], error=error, **cost)  # fmt: skip

    return Run(
        meta={"card": "Fake GPU"},
        records=[rec("mxkernels", 10.0), rec("torchao", 20.0), rec("torch.compile", 0, "boom")],
    )


def test_peer_rows_pivot_implementations_per_stage():
    (row,) = peer_rows(peer_run())
    assert row["Stage"] == "quantize_a" and row["Input shape"] == "(131072, 7168)"
    assert [row[f"{i} (us)"] for i in IMPLS] == ["10.0", "20.0", "error"]
    assert row["mxkernels GB/s"] == "300"  # 3 MB in 10 us
    assert row["Best peer / ours"] == "2.00x"  # the fastest peer that ran, 20 us, over our 10 us


def test_peer_rows_filter_by_M():
    assert peer_rows(peer_run(), M=1024) == []


@pytest.mark.gpu
def test_peers_on_gpu(tmp_path):
    options = SweepOptions(samples=5, out=tmp_path / "peers.json")
    result = run_peers(4096, 256, 512, 4, options=options, progress=False)
    ours = [r for r in result.records if r.backend == "mxkernels"]
    assert ours and all(r.ok for r in ours), [r.error for r in ours if not r.ok]
    compiled = [r for r in result.records if r.backend == "torch.compile"]
    assert compiled and all(r.ok for r in compiled), [r.error for r in compiled if not r.ok]
    assert {r.category for r in ours} == {"quantize", "rearrange", "pad"}
    assert peer_rows(load_run(tmp_path / "peers.json"))
