"""DeepGEMM's grouped FP8 GEMM as a peer (kernels/peer_deepgemm.py, scripts/peers/): its recipe (1x128 activation and
128x128 weight scales) and reference against hand-worked values on CPU, the launcher's fixed configuration against
DeepGEMM's heuristic, and on an SM90 GPU with the built library (``.peers/lib/libmxdg.so``) the kernel against the
reference at ragged-but-aligned groups, a padding block, the timed shapes' compiled instances and a CUDA graph."""

from __future__ import annotations

import ctypes
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
from mxkernels.peers import deepgemm as D
from mxkernels.core.comparison import sqnr_db

REPO = Path(__file__).resolve().parents[1]
E4M3 = torch.float8_e4m3fn
MIN_SQNR_DB = 30.0  # the floor scripts/tune_fp8_gemm.py holds every backend to


def _config_module():
    spec = importlib.util.spec_from_file_location("deepgemm_config", REPO / "scripts/peers/deepgemm_config.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


# ---- the recipe, by hand -----------------------------------------------------------------------------------------


def _f32(values) -> torch.Tensor:
    """Expected scales: amax / 448 rounded once to fp32, as the recipe divides."""
    return torch.tensor(values, dtype=torch.float32)


def test_1x128_scales_each_row_per_128_columns():
    x = torch.zeros(2, 256)
    x[0, :128], x[0, 5], x[0, 128:] = 1.0, 896.0, 0.5
    x[1, 200] = -3.0
    q, scale = D.quantize_1x128(x)
    # row 0: amax 896 -> scale 2, so 1.0 -> 0.5 and 896 -> 448; second segment amax 0.5 -> scale 0.5 / 448, q 448.
    # row 1: an all-zero segment takes the amax floor (2**-112); -3 alone in its segment -> -448.
    assert torch.equal(scale, _f32([896.0, 0.5, 2.0**-112, 3.0]).reshape(2, 2) / 448)
    assert q[0, :3].float().tolist() == [0.5] * 3 and q[0, 5].item() == 448.0 and q[0, 128:].float().eq(448).all()
    assert q[1, 200].item() == -448.0 and q[1, :128].float().eq(0).all()
    # a ragged last segment: zero padding changes no amax
    q2, s2 = D.quantize_1x128(x[:, :200])
    assert s2.shape == (2, 2) and torch.equal(s2[0], scale[0]) and torch.equal(q2.float(), q[:, :200].float())


def test_128x128_scales_each_block_and_transposes_with_the_weights():
    w = torch.ones(1, 256, 384)
    w[0, 130, 300] = -7.0  # block (1, 2): amax 7
    w[0, 0:128, 128:256] = 0.25  # block (0, 1): amax 0.25
    q, scale = D.quantize_128x128(w)
    assert torch.equal(scale, _f32([[[1, 0.25, 1], [1, 1, 7]]]) / 448)
    assert q[0, 130, 300].item() == -448.0 and q[0, 131, 300].item() == 64.0 and q[0, 5, 200].item() == 448.0
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 200, 384, generator=g) * torch.rand(2, 1, 384, generator=g)  # ragged N, uneven blocks
    q, scale = D.quantize_128x128(w)
    qt, st = D.quantize_128x128(w.transpose(-2, -1))
    assert torch.equal(qt.float(), q.transpose(-2, -1).float()) and torch.equal(st, scale.transpose(-2, -1))


def test_contiguous_layout_pads_each_group_to_128_rows():
    indices, starts = D.m_indices([130, 0, 128, 1])
    assert starts == [0, 256, 256, 384] and indices.shape == (512,) and indices.dtype == torch.int32
    assert indices[:130].eq(0).all() and indices[130:256].eq(-1).all() and indices[256:384].eq(2).all()
    assert indices[384].item() == 3 and indices[385:].eq(-1).all()
    # A's padding rows are zeroed before quantizing: the kernel computes some of them (see operands())
    ops = D.operands(torch.ones(512, 128), torch.ones(4, 16, 128), indices)
    assert ops.a[indices == -1].float().eq(0).all() and ops.a[indices != -1].float().eq(448).all()


def test_reference_by_hand():
    # A: rows 0..1 of ones, scales per 128 columns; B: one group, N = 2, all ones, block scales 1 and 3 along K.
    a_q, b_q = torch.ones(3, 256).to(E4M3), torch.ones(1, 2, 256).to(E4M3)
    a_scale = torch.tensor([[1.0, 2.0], [0.5, 0.0], [9.0, 9.0]])
    b_scale = torch.tensor([[[1.0, 3.0]]])
    out = D.reference(a_q, a_scale, b_q, b_scale, torch.tensor([0, 0, -1], dtype=torch.int32))
    # row 0: 128 * 1 * 1 + 128 * 2 * 3 = 896; row 1: 128 * 0.5 = 64; row 2 pads (-1): zero.
    assert out.dtype == torch.bfloat16 and out.float().tolist() == [[896.0, 896.0], [64.0, 64.0], [0.0, 0.0]]


def test_k_grouped_layout_and_reference_by_hand():
    """wgrad: dW[g] = dY_g^T X_g; group 0 of dY all 2, group 2 all 1 (128 tokens each), X all 0.5, other groups empty."""
    ks = [128, 0, 128, 0, 0, 0, 0, 0]
    dy, x = torch.ones(256, 4), torch.full((256, 3), 0.5)
    dy[:128] = 2.0
    ops = D.k_grouped_operands(dy, x, ks)
    assert ops.a.shape == (256 * 4,) and ops.b.shape == (256 * 3,) and ops.a.float().eq(448).all()
    assert torch.equal(ops.sfa, _f32([[2.0] * 4, [1.0] * 4]) / 448)  # (sum(ks) / 128, align(4, 4))
    assert ops.sfb.shape == (2, 4) and ops.sfb[:, 3].eq(0).all()  # n = 3 padded to 4 (16 bytes) with zeros
    out = D.k_grouped_reference(ops)
    # 128 tokens * 2 * 0.5 and * 1 * 0.5, up to the scales' fp32 rounding (amax / 448 is inexact)
    assert out.shape == (8, 4, 3) and torch.allclose(out[0], torch.full((4, 3), 128.0), rtol=1e-6, atol=0)
    assert torch.allclose(out[2], torch.full((4, 3), 64.0), rtol=1e-6, atol=0)
    assert out[[1, 3, 4, 5, 6, 7]].eq(0).all()
    with pytest.raises(ValueError, match="multiple of 128"):
        D.k_grouped_operands(dy, x, [100, 156, 0, 0, 0, 0, 0, 0])


def _kernel_view_of_sfa(sfa: torch.Tensor, m: int) -> torch.Tensor:
    """What the kernel reads as scale (m, kb): the storage at kb * align(m, 4) + m (its TMA descriptor's layout),
    whatever the tensor's own strides say (past the storage's end, zeros: on the device, whatever lies there)."""
    kb = sfa.shape[1]
    aligned = -(-m // 4) * 4
    storage = torch.as_strided(sfa, (sfa.untyped_storage().nbytes() // 4,), (1,), 0)
    storage = torch.cat([storage, storage.new_zeros(max(0, kb * aligned - storage.numel()))])
    return torch.stack([storage[j * aligned : j * aligned + m] for j in range(kb)], dim=1)


def test_a_planted_scale_layout_fault_fails_the_check():
    """The GPU check compares the kernel with ``reference`` by SQNR; a wrong A-scale layout (row-major scales where
    the kernel reads MN-major ones) must land far under the floor -- and ``_check_operands`` refuses it first."""
    g = torch.Generator().manual_seed(1)
    m, k, n = 130, 512, 256
    a = torch.randn(m, k, generator=g) * torch.logspace(-3, 3, k // 128).repeat_interleave(128)  # scales differ
    b = torch.randn(1, n, k, generator=g)
    indices = torch.zeros(m, dtype=torch.int32)
    ops = D.operands(a, b, indices)
    right = D.reference(ops.a, _kernel_view_of_sfa(ops.sfa, m), ops.b, ops.sfb, indices)
    expected = D.reference(ops.a, ops.sfa, ops.b, ops.sfb, indices)
    assert sqnr_db(right, expected) == float("inf")  # the kernel's reading of the right layout is the values
    wrong_sfa = ops.sfa.contiguous()  # the same values, row-major: the planted fault
    wrong = D.reference(ops.a, _kernel_view_of_sfa(wrong_sfa, m), ops.b, ops.sfb, indices)
    assert sqnr_db(wrong, expected) < MIN_SQNR_DB
    with pytest.raises(ValueError, match="sfa_mn_major"):
        D._check_operands(D.Operands(ops.a, wrong_sfa, ops.b, ops.sfb, indices), m, n, k, k, 1)
    with pytest.raises(ValueError, match="CUDA"):  # right layouts, but on CPU
        D._check_operands(ops, m, n, k, k, 1)


def test_load_says_why_without_the_library(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "_LOADED", None)
    monkeypatch.setenv(D.LIBRARY_ENV, str(tmp_path / "absent.so"))
    with pytest.raises(D.PeerUnavailable, match="not built"):
        D.load()


# ---- the launcher's configuration is DeepGEMM's own choice ----------------------------------------------------------


def test_the_launchers_configuration_is_deepgemms_heuristic_choice():
    source = (REPO / "scripts/peers/deepgemm_launcher.cu").read_text()
    const = lambda name: re.search(rf"\b{name} = (\w+)", source).group(1)
    config = _config_module()
    for name, shape in config.TIMED.items():
        choice = config.best(*shape)
        assert (choice.block_m, choice.block_n, choice.stages) == tuple(
            int(const(c)) for c in ("kBlockM", "kBlockN", "kStages")
        ), name
        assert choice.cluster_m * choice.cluster_n == int(const("kCluster"))
        assert str(choice.multicast_on_a).lower() == const("kMulticastOnA")
        # and the launcher has a compiled instance of each (N, K) with G = 8
        assert f"{{{shape[1]}, {shape[2]}, 8, kernel_of<{shape[1]}, {shape[2]}, 8>()}}" in source


def test_the_launchers_k_grouped_configuration_is_deepgemms_heuristic_choice():
    source = (REPO / "scripts/peers/deepgemm_launcher.cu").read_text()
    const = lambda name: int(re.search(rf"\b{name} = (\d+)", source).group(1))
    config = _config_module()
    for name, (m, n, k, g) in config.TIMED_K_GROUPED.items():
        choice = config.best_k_grouped(m, n, k, g)
        assert (choice.block_m, choice.block_n, choice.stages) == (
            const("kKgBlockM"),
            const("kKgBlockN"),
            const("kKgStages"),
        )
        assert choice.cluster_m * choice.cluster_n == 1, name  # the launcher launches no cluster for it
        assert f"{{{m}, {n}, {g}, k_grouped_kernel_of<{m}, {n}, {g}>()}}" in source


@pytest.mark.skipif(not D.library_path().is_file(), reason="the DeepGEMM launcher is not built (.peers/lib)")
def test_the_built_library_reports_that_configuration():
    config = _config_module()
    lib = D.Library(D.library_path())  # loads without a GPU: the CUDA runtime starts at the first launch
    for name, (m, n, k) in config.TIMED.items():
        got, choice = lib.config(n, k, 8), config.best(m, n, k)
        assert got["specialised"] == 1 and got["smem_bytes"] == choice.smem_bytes and got["num_sms"] == 132, name
    assert lib.config(256, 512, 4)["specialised"] == 0
    # the launcher refuses shapes it cannot run before touching the device (so, here, without one)
    status = lib._lib.mxdg_m_grouped_fp8_gemm_nt_contiguous(None, None, None, None, None, None, 100, 256, 512, 1, None)
    assert status == 1 and b"multiple of 128" in lib._lib.mxdg_last_error()
    ks = (ctypes.c_int * 8)(128, 0, 100, 0, 0, 0, 0, 0)
    status = lib._lib.mxdg_k_grouped_fp8_gemm_nt_contiguous(
        None, None, None, None, None, ks, None, None, 256, 320, 8, None
    )
    assert status == 1 and b"multiple of 128" in lib._lib.mxdg_last_error()
    for name, (m, n, k, g) in config.TIMED_K_GROUPED.items():
        got, choice = lib.k_grouped_config(m, n, g), config.best_k_grouped(m, n, k, g)
        assert got["specialised"] == 1 and got["smem_bytes"] == choice.smem_bytes and got["block_n"] == 152, name


# ---- on an SM90 GPU ------------------------------------------------------------------------------------------------


def _gpu_lib():
    try:
        return D.load()
    except D.PeerUnavailable as e:
        pytest.skip(str(e))


def _case(sizes, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    indices, _ = D.m_indices(sizes, "cuda")
    # each 128-column segment of A at its own magnitude (1e-2 .. 1e2): what 1x128 scales are for, and what makes a
    # scale read from the wrong place show (segments of one magnitude would hide it within ~20 dB)
    magnitude = torch.logspace(-2, 2, k // 128, device="cuda").repeat_interleave(128)
    a = (torch.randn(indices.numel(), k, device="cuda", generator=g) * magnitude).bfloat16()
    b = (torch.randn(len(sizes), n, k, device="cuda", generator=g) * k**-0.5).bfloat16()
    ops = D.operands(a, b, indices)
    return ops, D.reference(ops.a, ops.sfa, ops.b, ops.sfb, indices, dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("sizes", "n", "k"),
    [([256, 0, 384, 130, 128], 320, 512), ([2048, 128, 0, 1024, 640, 256, 1920, 128], 2048, 7168)],
    ids=["generic", "deepseek-v3-fwd-instance"],
)
def test_gpu_matches_the_recipe_reference(sizes, n, k):
    lib = _gpu_lib()
    ops, ref = _case(sizes, n, k)
    out = lib.gemm(ops)
    torch.cuda.synchronize()
    assert sqnr_db(out, ref) >= MIN_SQNR_DB
    pad = ops.indices == -1
    assert out[pad].eq(0).all(), "padding rows are written as zeros"
    # the planted fault, on the device: the same scales in the wrong layout (bypassing the operand check)
    bad = D.Operands(ops.a, ops.sfa.contiguous(), ops.b, ops.sfb, ops.indices)
    monkey = D._check_operands
    try:
        D._check_operands = lambda *args: None
        wrong = lib.gemm(bad)
    finally:
        D._check_operands = monkey
    torch.cuda.synchronize()
    assert sqnr_db(wrong, ref) < MIN_SQNR_DB


@pytest.mark.gpu
def test_gpu_graph_capturable():
    lib = _gpu_lib()
    ops, ref = _case([384, 256, 0, 128], 256, 512, seed=3)
    out = torch.empty(ops.a.shape[0], 256, dtype=torch.bfloat16, device="cuda")
    lib.gemm(ops, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lib.gemm(ops, out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert sqnr_db(out, ref) >= MIN_SQNR_DB


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n"), [(256, 320), (2048, 7168)], ids=["generic", "deepseek-v3-wgrad-instance"])
def test_gpu_k_grouped_matches_the_recipe_reference(m, n):
    lib = _gpu_lib()
    ks = [256, 0, 384, 128, 512, 0, 128, 640]
    g = torch.Generator(device="cuda").manual_seed(5)
    dy = torch.randn(sum(ks), m, device="cuda", generator=g).bfloat16()
    x = torch.randn(sum(ks), n, device="cuda", generator=g).bfloat16()
    ops = D.k_grouped_operands(dy, x, ks)
    ref = D.k_grouped_reference(ops, dtype=torch.float32)
    out = lib.k_grouped_gemm(ops)
    torch.cuda.synchronize()
    assert sqnr_db(out, ref) >= MIN_SQNR_DB
    assert out[1].eq(0).all() and out[5].eq(0).all(), "empty groups stay as they were (zero)"
    lib.k_grouped_gemm(ops, out)  # it accumulates: twice the product
    torch.cuda.synchronize()
    assert sqnr_db(out, 2 * ref) >= MIN_SQNR_DB


# ---- the table -----------------------------------------------------------------------------------------------------


def test_the_table_marks_the_peer_and_compares_it_with_torch_of_the_same_run(tmp_path):
    import json
    import subprocess

    stored = REPO / "results/nvidia-h100-80gb-hbm3/tuning/tune_fp8_gemm-3.json"
    run = json.loads(stored.read_text())
    native = {(r["model"], r["pass"]): r for r in run["rows"] if r["backend"] == "native"}
    model, planted = next(iter(native))[0], {"fwd": 3000.0, "dgrad": 3500.0, "wgrad": 7000.0}  # the cells are known
    added = {}
    for pass_, us in planted.items():
        base = {k: native[model, pass_][k] for k in ("model", "pass", "M", "N", "K", "G")}
        tflops = 2 * base["M"] * base["N"] * base["K"] / us / 1e6
        recipe = D.K_GROUPED_RECIPE if pass_ == "wgrad" else D.RECIPE
        added[pass_] = {**base, "backend": "deepgemm", "recipe": recipe, "us": us, "tflops": tflops}
        run["rows"].append(added[pass_])
    # a failed peer row of the other model: no cells
    other = next(m for m, _ in native if m != model)
    failed = {k: v for k, v in added["fwd"].items() if k not in ("us", "tflops")}
    run["rows"].append({**failed, "model": other, "error": "AssertionError: planted"})
    (tmp_path / "run.json").write_text(json.dumps(run))
    script = lambda *paths: subprocess.run([sys.executable, "scripts/tune_fp8_gemm.py", "--table", *map(str, paths)],
                                           capture_output=True, text=True, cwd=REPO, check=True).stdout  # fmt: skip
    with_peer, without = script(tmp_path / "run.json").splitlines(), script(stored).splitlines()
    assert with_peer[0] == without[0][:-1] + "| DeepGEMM (1x128/128x128 scales) | DeepGEMM / torch |"
    for line, old in zip(with_peer[2:], without[2:], strict=True):
        cells, before = [c.strip() for c in line.strip("|").split("|")], old.strip("|").split("|")
        assert line.startswith(old) and len(cells) == len(before) + 2  # the peer's two columns, last
        pass_ = cells[2]
        if cells[1] == model:
            mark = " (1x128/1x128 scales)" if pass_ == "wgrad" else ""  # a recipe unlike the column's is named
            assert cells[-2] == f"{added[pass_]['tflops']:.0f}{mark}"
            assert cells[-1] == f"{native[model, pass_]['us'] / planted[pass_]:.2f}x"
        else:
            assert cells[-2:] == ["-", "-"], line  # the other model: no timed peer row


def test_the_scripts_options_without_the_library(monkeypatch, tmp_path, capsys):
    """--only-deepgemm without a usable library exits saying why (nothing else to do); --deepgemm goes on without the
    peer; --deepgemm-passes takes only the three passes."""
    import argparse

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from peers import deepgemm as DG

    monkeypatch.setattr(D, "_LOADED", None)
    monkeypatch.setenv(D.LIBRARY_ENV, str(tmp_path / "absent.so"))
    parser = argparse.ArgumentParser()
    DG.add_arguments(parser)
    assert DG.passes(parser.parse_args([])) == ("fwd", "dgrad")
    assert DG.passes(parser.parse_args(["--deepgemm-passes", "wgrad"])) == ("wgrad",)
    with pytest.raises(SystemExit):
        parser.parse_args(["--deepgemm-passes", "fwd,bwd"])
    assert DG.Peer.from_args(parser.parse_args([]), None, MIN_SQNR_DB) is None
    assert DG.Peer.from_args(parser.parse_args(["--deepgemm"]), None, MIN_SQNR_DB) is None
    assert "peer skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--only-deepgemm: DeepGEMM peer unavailable: .*not built"):
        DG.Peer.from_args(parser.parse_args(["--only-deepgemm"]), None, MIN_SQNR_DB)
