"""Specification of the FP8 rowwise grouped GEMM's shape classes (kernels/mxkernels/gemm/shape_classes.py) and of
the dispatch that runs them (``grouped_gemm.choose``, ``backend=None`` calls, the GEMM stages of a step and a layer).

The classes are checked against shapes worked by hand (the case; the 256-column tail against the narrow tile's
12.7%); the dispatch under the interpreter with the device's
capability patched to SM90 (the class's backend and launch reach the kernel, and the result equals the oracle on
integer operands); on the GPU (marker ``gpu``) every class's kernel and launch with ragged, empty and tiny groups at
a 2880-wide output, bit for bit against torch's ``_scaled_grouped_mm`` and against the oracle, and the dispatch
captured in a CUDA graph.
"""

import dataclasses

import pytest
import torch
from kernel_helpers import offsets
from mxkernels.core.runtime import InputError
from mxkernels.gemm import fp8_triton as F
from mxkernels.gemm import fp8_ws as W
from mxkernels.gemm import grouped_gemm as GG
from mxkernels.gemm import shape_classes as SC
from mxkernels.gemm.shape_classes import GemmShape, ShapeClass
from mxkernels.reference.gemm import fp8_rowwise_reference
from test_gemm_fp8_rowwise import _gpu_operands, assert_matches, case_2d2d, case_2d3d

TABLE = SC.SM90_FP8_ROWWISE
C = ShapeClass

# (case, M, N, K, G) in the kernel's terms: 2d3d a (M, K) x b (G, N, K); 2d2d a (N, M) x b (K, M).
HAND_WORKED = {
    "deepseek-v3 fwd": (("2d3d", 131072, 2048, 7168, 8), C.GROUPED),
    "deepseek-v3 dgrad": (("2d3d", 131072, 7168, 2048, 8), C.GROUPED),
    "deepseek-v3 wgrad": (("2d2d", 131072, 2048, 7168, 8), C.WGRAD),
    "llama4-scout fwd": (("2d3d", 131072, 8192, 5120, 8), C.GROUPED),
    "llama4-scout dgrad": (("2d3d", 131072, 5120, 8192, 8), C.GROUPED),
    # Qwen3-30B-A3B's layer at 128 experts: the warp-specialized kernel since its walk resumes (measured, H200), its
    # scales loaded early from 64 experts up (the A/B).
    "qwen3 down fwd": (("2d3d", 131072, 2048, 768, 128), C.GROUPED_MANY),
    "qwen3 up fwd": (("2d3d", 131072, 1536, 2048, 128), C.GROUPED_MANY),
    "qwen3 wgrad": (("2d2d", 131072, 768, 2048, 128), C.WGRAD),
    "gpt-oss fwd": (("2d3d", 131072, 2880, 2880, 128), C.GROUPED_MANY),
    # 128 experts of 128 rows: no class of their own (ws 3% ahead of 64-row tiles over fwd + dgrad).
    "tiny groups": (("2d3d", 16384, 768, 2048, 128), C.GROUPED_MANY),
    # The boundary: 63 experts stay, 64 (DeepSeek-V2-Lite) move.
    "63 experts": (("2d3d", 63 * 1024, 2048, 1408, 63), C.GROUPED),
    "v2-lite down fwd": (("2d3d", 98304, 2048, 1408, 64), C.GROUPED_MANY),
    # 8 experts, N 384: 256-column tiles compute 512 (33% waste), 128-column ones 384 (none): 0.33 > 0.127.
    "narrow tail": (("2d3d", 65536, 384, 7168, 8), C.GROUPED_NARROW_TAIL),
    # N 640: 768 computed at 256 (20% waste), 640 at 128 (none): 0.20 > 0.127; at 128 experts too.
    "narrow tail, many experts": (("2d3d", 65536, 640, 2048, 128), C.GROUPED_NARROW_TAIL),
    # 2880 wide: 6.7% - 2.2% < 12.7%, the wide tile stays; N 1152: 12.5% - 0 < 12.7%, just.
    "2880": (("2d3d", 65536, 2880, 2880, 8), C.GROUPED),
    "1152": (("2d3d", 65536, 1152, 2880, 8), C.GROUPED),
}


@pytest.mark.parametrize("name", list(HAND_WORKED))
def test_hand_worked_shapes_get_their_class(name):
    shape, expected = HAND_WORKED[name]
    assert TABLE.classify(GemmShape(*shape)) == expected


def test_grouped_and_wgrad_run_the_ws_defaults_chosen_on_the_h100():
    """2D x 3D at every expert count and 2D x 2D run exactly the launches chosen on an H100 (docs/perf-log.md):
    128 x 256 x 128 tiles, three slots and bands of 8 in 2D x 3D, four slots and bands of 16 in 2D x 2D."""
    grouped, wgrad = TABLE.choices[C.GROUPED], TABLE.choices[C.WGRAD]
    assert (grouped.backend, grouped.config) == ("triton_ws", W.WsConfig(128, 256, 128, num_stages=3, group_m=8))
    assert (wgrad.backend, wgrad.config) == ("triton_ws", W.WsConfig(128, 256, 128, num_stages=4, group_m=16))
    assert grouped.config == W.default_config("2d3d") and wgrad.config == W.default_config("2d2d")
    narrow = TABLE.choices[C.GROUPED_NARROW_TAIL]
    assert (narrow.backend, narrow.config.block_n) == ("triton_ws", 128)
    many = TABLE.choices[C.GROUPED_MANY]  # the grouped launch, its scales early and two staging buffers
    assert many.config == W.WsConfig(128, 256, 128, num_stages=3, group_m=8, early_scales=True, staging=2)


def test_every_class_has_a_launch_its_backend_takes():
    for cls, choice in TABLE.choices.items():
        assert choice.why
        assert isinstance(choice.config, GG.CONFIG_TYPES["fp8_rowwise"][choice.backend]), cls
    with pytest.raises(InputError, match="no choice"):
        SC.ClassTable(0.1, 64, choices={C.WGRAD: TABLE.choices[C.WGRAD]})
    with pytest.raises(InputError, match="case"):
        GemmShape("3d3d", 1, 1, 1, 1)


# ---- the dispatch, under the interpreter -----------------------------------------------------------------------------


def test_only_sm90_fp8_rowwise_has_classes(monkeypatch):
    assert GG.choose("fp8_rowwise", "2d3d", 64, 32, 32, 2, "cpu").backend == "emulated"  # no table on the CPU
    monkeypatch.setattr(GG, "_capability", lambda device: (10, 0))
    assert GG.choose("fp8_rowwise", "2d3d", 131072, 2048, 768, 128, "cuda") == SC.Choice(
        GG.default_backend("fp8_rowwise", "cuda"), None, GG.choose("fp8_rowwise", "2d3d", 1, 1, 1, 1, "cuda").why)
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    assert GG.choose("fp8_rowwise", "2d3d", 131072, 2048, 768, 128, "cuda") is TABLE.choices[C.GROUPED_MANY]
    assert GG.choose("mxfp8", "2d3d", 131072, 2048, 768, 128, "cuda").config is None


@pytest.fixture
def sm90_spies(monkeypatch):
    """The device reads as SM90; both Triton backends' run functions record their launch. "triton" then runs its
    interpreter launch (the class's tiles are too slow interpreted), "triton_ws" (no interpreter) the emulation."""
    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    runs = []
    real_triton = F.run_fp8_rowwise

    def triton(*args, config=None, **kwargs):
        runs.append(("triton", config))
        return real_triton(*args, **kwargs)

    def ws(a_q, a_scale, b_q, b_scale, offs, out_dtype, config=None, **kwargs):
        runs.append(("triton_ws", config))
        return fp8_rowwise_reference(a_q, a_scale, b_q, b_scale, offs, out_dtype=out_dtype)

    monkeypatch.setattr(F, "run_fp8_rowwise", triton)
    monkeypatch.setattr(W, "run_fp8_rowwise", ws)
    return runs


def test_backend_none_runs_the_class_kernel_and_launch(sm90_spies):
    # 40 experts of ~3 rows, 256 columns (no tail): the warp-specialized kernel with its default launch.
    sizes = [0, 5, 1, 0, 7] * 8
    ops = case_2d3d(sizes, N=256, K=32, extra_rows=3)
    out = GG.fp8_rowwise_scaled_grouped_mm(*ops, out_dtype=torch.float32)
    assert sm90_spies == [("triton_ws", TABLE.choices[C.GROUPED].config)]
    assert_matches(out, ops, rows=sum(sizes))
    # 3 experts, the same; 48 columns would waste 81% of a 256-column tile and 62% of a 128-column one: the narrow
    # tile.
    ops = case_2d3d([40, 0, 24], N=256, K=32)
    GG.fp8_rowwise_scaled_grouped_mm(*ops, out_dtype=torch.float32)
    ops = case_2d3d([40, 0, 24], N=48, K=32)
    GG.fp8_rowwise_scaled_grouped_mm(*ops, out_dtype=torch.float32)
    ops = case_2d2d([48, 0, 32], N=32, K=48)
    GG.fp8_rowwise_scaled_grouped_mm(*ops, out_dtype=torch.float32)
    assert sm90_spies[1:] == [("triton_ws", TABLE.choices[C.GROUPED].config),
                              ("triton_ws", TABLE.choices[C.GROUPED_NARROW_TAIL].config),
                              ("triton_ws", TABLE.choices[C.WGRAD].config)]  # fmt: skip


def test_a_backend_or_launch_given_is_kept(sm90_spies):
    ops = case_2d3d([0, 5, 1, 0, 7] * 8, N=48, K=32)
    mine = W.WsConfig(num_stages=4)  # the class (narrow tail) would run 128 columns, 4 slots
    GG.fp8_rowwise_scaled_grouped_mm(*ops, config=mine, out_dtype=torch.float32)
    GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="triton", out_dtype=torch.float32)
    assert sm90_spies == [("triton_ws", mine), ("triton", None)]


def test_grouped_mm_front_door_dispatches_by_class_and_names_the_backend(sm90_spies):
    sizes = [0, 5, 1, 0, 7] * 8
    a = torch.randn(sum(sizes), 32)
    b = torch.randn(len(sizes), 32, 256)
    result = GG.grouped_mm(a, b, offsets(sizes), "fp8_rowwise")
    assert result.backend == "triton_ws" and sm90_spies == [("triton_ws", TABLE.choices[C.GROUPED].config)]


def test_the_step_and_layer_stages_name_each_gemms_class(monkeypatch):
    from mxkernels.stages.layer import LayerShape, layer_stages
    from mxkernels.stages.pipeline import step_stages

    monkeypatch.setattr(GG, "_capability", lambda device: (9, 0))
    gemms = lambda stages: {s.name: (s.backend, s.fn.keywords.get("config")) for s in stages if s.backend}
    # Qwen3's expert shape (K 2048, N 768, 128 x 512 rows) and DeepSeek-V3's: each its class's launches.
    grouped, wgrad, many = TABLE.choices[C.GROUPED], TABLE.choices[C.WGRAD], TABLE.choices[C.GROUPED_MANY]
    for shape, grouped in (((65536, 768, 2048, 128), many), ((131072, 2048, 7168, 8), grouped)):
        got = gemms(step_stages("fp8_rowwise", *shape))
        assert got == {"gemm_fwd": ("triton_ws", grouped.config), "gemm_dgrad": ("triton_ws", grouped.config),
                       "gemm_wgrad": ("triton_ws", wgrad.config)}, shape  # fmt: skip
    given = gemms(step_stages("fp8_rowwise", 65536, 768, 2048, 128, backend="triton_ws"))
    assert set(given.values()) == {("triton_ws", None)}  # a backend given runs everywhere, with its own launch
    # Qwen3-30B-A3B's layer (16384 tokens, top-8: 131072 rows; down contracts 768 into 2048 columns)
    got = gemms(layer_stages("fp8_rowwise", LayerShape(T=16384, K=2048, N=768, E=128, top_k=8)))
    assert got["down.gemm_fwd"] == ("triton_ws", many.config) and got["down.gemm_wgrad"] == ("triton_ws", wgrad.config)


# ---- on the GPU ----------------------------------------------------------------------------------------------------

# A 2880-wide output (11.25 x 256 columns, 22.5 x 128) and a 2880-long contraction (22.5 steps), 128 experts:
# ragged, runs of empty experts (at the start, the middle and the end), one-row experts.
_SIZES = ([0, 0, 1, 7, 300, 0, 0, 0, 130, 1] * 12 + [640, 0, 2, 33, 0, 96, 0, 0])
_CLASS_LAUNCHES = [(c, TABLE.choices[c]) for c in C]


def _sm90_or_skip():
    if GG.backend_unavailable("fp8_rowwise", "triton_ws", torch.device("cuda")):
        pytest.skip("the class table is SM90's")


@pytest.mark.gpu
@pytest.mark.parametrize("cls,choice", _CLASS_LAUNCHES, ids=[c.value for c, _ in _CLASS_LAUNCHES])
def test_gpu_every_class_launch_equals_torchs_bits_at_2880(cls, choice):
    _sm90_or_skip()
    sizes = _SIZES if cls != C.WGRAD else [s // 16 * 16 for s in _SIZES]  # torch's needs 16-aligned groups
    pass_ = "wgrad" if cls == C.WGRAD else "fwd"
    ops = _gpu_operands(pass_, 2880, 2880, sizes)
    ours = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend=choice.backend, config=choice.config)
    torchs = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="native")
    rows = slice(0, sum(sizes)) if pass_ == "fwd" else slice(None)
    assert torch.equal(ours[rows], torchs[rows])


@pytest.mark.gpu
@pytest.mark.parametrize("cls,choice", _CLASS_LAUNCHES, ids=[c.value for c, _ in _CLASS_LAUNCHES])
@pytest.mark.parametrize("programs", [None, 3], ids=["grid", "3-programs"])
def test_gpu_every_class_launch_exact_with_ragged_empty_tiny_groups(cls, choice, programs):
    """Integer operands: every sum exact, so the oracle's values bit for bit, with groups torch's refuses too
    (unaligned 2D x 2D groups); 3 programs walk every tile of 128 experts (the warp-specialized cursor)."""
    _sm90_or_skip()
    config = dataclasses.replace(choice.config, max_programs=programs)
    if cls == C.WGRAD:
        sizes = [0, 17, 1, 0, 300, 45, 0, 130] * 4 + [12]  # 1984 columns: a multiple of 16 (TMA row strides)
        ops = case_2d2d(sizes, N=2880 // 16, K=320, device="cuda")
        out = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend=choice.backend, config=config, out_dtype=torch.float32)
        assert_matches(out, ops)
        return
    ops = case_2d3d(_SIZES, N=2880 // 8, K=2880 // 10, device="cuda", extra_rows=40)
    out = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend=choice.backend, config=config, out_dtype=torch.float32)
    assert_matches(out, ops, rows=sum(_SIZES))


@pytest.mark.gpu
@pytest.mark.parametrize("model", [(2048, 768, 128, 512), (2880, 2880, 128, 1024), (7168, 2048, 8, 2048)],
                         ids=["qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v3"])  # fmt: skip
@pytest.mark.parametrize("pass_", ["fwd", "dgrad"])
def test_gpu_the_dispatch_equals_torchs_bits_and_is_graph_captured(model, pass_):
    """``backend=None`` at the models' shapes (fewer rows) picks by class, reads no offs on the host (a read
    would fail inside the capture) and gives torch's bits."""
    _sm90_or_skip()
    K, N, G, rows = model
    if pass_ == "dgrad":
        K, N = N, K
    sizes = [rows + (37 if g % 2 else -37) for g in range(G)]
    ops = _gpu_operands("fwd", K, N, sizes)
    eager = GG.fp8_rowwise_scaled_grouped_mm(*ops)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = GG.fp8_rowwise_scaled_grouped_mm(*ops)
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torchs = GG.fp8_rowwise_scaled_grouped_mm(*ops, backend="native")
    n = sum(sizes)
    assert torch.equal(eager[:n], torchs[:n]) and torch.equal(captured[:n], torchs[:n])
