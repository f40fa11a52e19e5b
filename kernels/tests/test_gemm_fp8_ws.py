"""Specification of the "triton_ws" FP8 rowwise backend (kernels/gemm_fp8_ws.py: Gluon, warp-specialized, SM90).

The oracle is ``gemm_reference.fp8_rowwise_reference`` (dequantize in fp64, multiply group by group). Gluon has no
interpreter, so on CPU the SM90 build is checked by cross-compilation (its schedule: e4m3 wgmma, TMA, register
reallocation, no spills, and none of ptxas's wgmma serialization warnings); on the GPU (marker ``gpu``) integer-valued
operands make every sum exact, so the kernel must equal the oracle bit for bit with ragged, empty, tiny and unaligned
groups. At DeepSeek-V3 and Llama 4 Scout sizes its SQNR must be at least torch's on the same inputs
(``test_gemm_fp8_rowwise.test_gpu_model_sizes_at_least_torchs_sqnr``, which holds both our backends to it).
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from mxkernels.gemm import fp8_ws as W
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.reference.gemm import fp8_rowwise_reference
from mxkernels.core.runtime import InputError
from test_gemm_fp8_rowwise import assert_matches, case_2d2d, case_2d3d

NAN_E4M3 = 0x7F  # e4m3fn's NaN (it has no infinities)


@pytest.fixture(autouse=True)
def _sm90_only(request):
    """The GPU tests need an SM90 card: elsewhere they skip, saying why."""
    if "gpu" in request.keywords and torch.cuda.is_available():
        why = GG.backend_unavailable("fp8_rowwise", "triton_ws", torch.device("cuda"))
        if why:
            pytest.skip(why)


def ws(ops, config=None, out_dtype=torch.float32):
    return GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="triton_ws", out_dtype=out_dtype, config=config)


# ---- configuration and availability ----------------------------------------------------------------------------------


def test_config_is_checked():
    with pytest.raises(InputError, match="2d3d"):
        W.default_config("3d3d")
    for fields, match in (({"block_m": 64}, "128 rows"), ({"block_n": 64}, "128 rows"), ({"num_stages": 0}, "num_stages"),
                          ({"consumer_regs": 236}, "multiple of 8"), ({"producer_regs": 16}, "producer_regs"),
                          ({"early_scales": 1}, "bool"), ({"staging": 0}, "WsConfig.staging"),
                          ({"staging": 3}, "WsConfig.staging"),
                          ({"num_stages": 4, "staging": 2}, "shared memory")):  # fmt: skip
        with pytest.raises(InputError, match=match):
            W.WsConfig(**fields)


def test_only_sm90_runs_it_and_there_it_is_the_default(monkeypatch):
    why = GG.backend_unavailable("fp8_rowwise", "triton_ws", torch.device("cpu"))
    assert why and "SM90" in why
    assert GG.default_backend("fp8_rowwise", "cpu") == "emulated"
    for cap, default in (((9, 0), "triton_ws"), ((10, 0), "native")):
        monkeypatch.setattr(GG, "_capability", lambda device, cap=cap: cap)
        assert GG.default_backend("fp8_rowwise", torch.device("cuda")) == default
        assert ("triton_ws" in GG.available_backends("fp8_rowwise", torch.device("cuda"))) == (cap == (9, 0))


# ---- the SM90 build ------------------------------------------------------------------------------------------------

_BUILD = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime import driver
    from mxkernels.gemm import fp8_ws as W

    class Sm90:  # compile only: the active "device" is an SM90 GPU
        def __init__(self, real): self.real = real
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
        def get_current_device(self): return 0
        def get_current_stream(self, device=None): return 0
        def get_active_torch_device(self): return torch.device("cpu")
        def __getattr__(self, name): return getattr(self.real, name)

    desc = lambda dtype, gl_type, block: TensorDescriptor.from_tensor(
        torch.empty(1024, 1024, dtype=dtype), block, gl.NVMMASharedLayout.get_default_for(block, gl_type))
    f32 = torch.empty(1024)
    driver.set_active(Sm90(CudaDriver.__new__(CudaDriver)))
    built = []
    for case, fields in json.loads(sys.argv[1]):  # every build in this one process: one import of torch and triton
        c = W.WsConfig(**fields)
        fp8 = lambda rows: desc(torch.float8_e4m3fn, gl.float8e4nv, [rows, c.block_k])
        out = desc(torch.bfloat16, gl.bfloat16, [c.block_m // 2, min(c.block_n, 128)])
        k = W._fp8_ws.warmup(fp8(c.block_m), fp8(c.block_n), out, f32, f32, torch.empty(4, dtype=torch.int32),
                          torch.empty(1024, dtype=torch.bfloat16), 1024, 256, 1024, 4, 132, WGRAD=case == "2d2d",
                          STAGES=c.num_stages,
                          GROUP_M=c.group_m, TMA_STORE=c.tma_store, PRODUCER_REGS=c.producer_regs,
                          CONSUMER_REGS=c.consumer_regs, STAGING=c.staging, EARLY_SCALES=c.early_scales, num_warps=4, grid=(1,))
        built.append({"ptx": k.asm["ptx"], "shared": k.metadata.shared})
    sys.stdout.write(json.dumps(built))
    """
)


def _ptxas() -> Path | None:
    """The ptxas this triton assembles SM90 kernels with, if it ships one."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        path = Path(get_ptxas(90).path)
    except Exception:  # noqa: BLE001 -- a triton without the tool (or its lookup) skips the register report
        return None
    return path if path.exists() else None


CASES, VARIANTS = ["2d3d", "2d2d"], ["default", "128-no-tma-store", "early-scales"]


def _build_config(case: str, variant: str) -> W.WsConfig:
    config = W.default_config(case)
    if variant == "early-scales":  # the many-experts class's launch (2D x 2D's four slots leave room for one buffer)
        return dataclasses.replace(config, early_scales=True, staging=2 if case == "2d3d" else 1)
    return config if variant == "default" else dataclasses.replace(config, block_n=128, tma_store=False)


@pytest.fixture(scope="module")
def sm90_builds():
    """Every (case, variant)'s SM90 build, ptx and shared bytes, from one subprocess."""
    keys = [(case, variant) for case in CASES for variant in VARIANTS]
    specs = [(case, dataclasses.asdict(_build_config(case, variant))) for case, variant in keys]
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", _BUILD, json.dumps(specs)], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(keys, json.loads(done.stdout)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES)
def test_sm90_build_overlaps_the_warpgroups(case, variant, tmp_path, sm90_builds):
    """The schedule the module promises, read from the SM90 build: e4m3 wgmma of m64 x 128 x 32 (one warpgroup's
    half of a 128-row tile) fed by TMA; setmaxnreg (the producer gives registers to the consumers); each partial
    retired with wait_group 0 before it is added; and ptxas serializes no wgmma (C7514/C7515/C7517) and spills
    nothing: what made the single-warpgroup kernels slow."""
    config = _build_config(case, variant)
    built = sm90_builds[case, variant]
    ptx = built["ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "setmaxnreg.dec" in ptx and "setmaxnreg.inc" in ptx
    assert "wgmma.wait_group.sync.aligned 0" in ptx and "wgmma.wait_group.sync.aligned 1" not in ptx
    assert built["shared"] >= config.num_stages * (config.block_m + config.block_n) * config.block_k
    assert ("stmatrix" in ptx) == config.tma_store  # the staging buffer's fill (TMA stores)
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("this triton ships no ptxas: the PTX checks above ran, the register report did not")
    (tmp_path / "k.ptx").write_text(ptx)
    report = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
    assert "0 bytes spill stores, 0 bytes spill loads" in report.stderr
    for warning in ("C7514", "C7515", "C7517"):
        assert warning not in report.stderr, report.stderr


# ---- on the GPU ----------------------------------------------------------------------------------------------------

# The default; a program walking several tiles and groups; 128-column tiles with stores from registers.
CONFIGS = [None, W.WsConfig(max_programs=3), W.WsConfig(block_n=128, tma_store=False, max_programs=5),
           W.WsConfig(early_scales=True, staging=2, max_programs=3)]
IDS = ["default", "3-programs", "128-no-tma-store-5-programs", "early-scales-2-staging-3-programs"]


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("N,K", [(256, 512), (320, 448)], ids=["whole-tiles", "partial-n-and-k"])
def test_gpu_2d3d_exact_with_ragged_empty_tiny_groups(config, N, K):
    ops = case_2d3d([300, 0, 517, 1, 1230], N=N, K=K, device="cuda", extra_rows=40)
    assert_matches(ws(ops, config), ops, rows=2048)
    # bf16 output: the exact values rounded once, as the oracle rounds its own
    bf16 = ws(ops, config, out_dtype=torch.bfloat16)[:2048]
    assert torch.equal(bf16, fp8_rowwise_reference(*ops, out_dtype=torch.bfloat16)[:2048])


@pytest.mark.gpu
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("sizes", [[304, 0, 512, 16, 1232], [300, 0, 517, 1, 1230, 16]], ids=["aligned", "unaligned"])
def test_gpu_2d2d_exact_with_ragged_empty_unaligned_groups(config, sizes):
    ops = case_2d2d(sizes, N=192, K=320, device="cuda")  # partial row and column tiles; M a multiple of 16 (TMA)
    assert_matches(ws(ops, config), ops)
    assert torch.equal(ws(ops, config, out_dtype=torch.bfloat16), fp8_rowwise_reference(*ops, out_dtype=torch.bfloat16))


@pytest.mark.gpu
def test_gpu_2d2d_neighbouring_groups_never_reach_a_group():
    """Every column outside group 2 holds NaN: group 2 (starting off a 16-column boundary, ending inside a step) must
    still equal the oracle, so the edge steps' columns of groups 1 and 3 are zeroed before any product."""
    sizes = [300, 0, 517, 45, 130]
    ops = list(case_2d2d(sizes, N=128, K=128, device="cuda"))
    start, end = 300, 817
    for i in (0, 2):
        bits = ops[i].view(torch.uint8)
        bits[:, :start] = NAN_E4M3
        bits[:, end:] = NAN_E4M3
    out = ws(tuple(ops))
    ref = fp8_rowwise_reference(*ops, out_dtype=torch.float32)
    assert torch.equal(out[2], ref[2])


@pytest.mark.gpu
def test_gpu_empty_groups_are_zero_whatever_their_scales():
    ops = list(case_2d2d([256, 0, 128], N=128, K=128, device="cuda"))
    ops[1][1] = float("inf")
    ops[3][1] = float("nan")
    out = ws(tuple(ops))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.gpu
def test_gpu_the_comparison_catches_planted_faults():
    """Wrong implementations built from the kernel itself, one per fault the exact comparison claims to catch: each
    must fail it."""
    ops = case_2d3d([300, 0, 517, 1, 1230], N=256, K=512, device="cuda")
    a, sa, b, sb, offs = ops
    late = offs.clone()
    late[2] += 1  # a group boundary one row late
    faults = {
        "boundary one row late": ws((a, sa, b, sb, late)),
        "next group's weights": ws((a, sa, b.view(torch.uint8).roll(1, 0).view(b.dtype), sb, offs)),
        "a scale ignored": ws((a, torch.ones_like(sa), b, sb, offs)),
    }
    ops2 = case_2d2d([300, 0, 517, 45, 130], N=128, K=128, device="cuda")
    x, sx, y, sy, _ = ops2
    whole = torch.tensor([384, 384, 896, 896, 992], dtype=torch.int32, device="cuda")  # ends past the true ones
    faults["wgrad reading the next group's columns"] = ws((x, sx, y, sy, whole))
    for name, out in faults.items():
        case = ops2 if name.startswith("wgrad") else ops
        with pytest.raises(AssertionError):
            assert_matches(out, case, rows=None if case is ops2 else 2048)
            pytest.fail(f"the comparison passed {name}")


@pytest.mark.gpu
def test_gpu_graph_capturable():
    ops = case_2d2d([304, 0, 517, 16, 1227], N=256, K=384, device="cuda")
    ws(ops)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ws(ops)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(out, ops)
