"""Fused stages (``moe_fused``): every output, data and scale bytes, blocked padding and the rows past offs[-1]
included, bit-identical to the chain of unfused kernels it replaces (torch.equal under poisoned allocations, so an
unwritten byte shows unless the chain leaves the same byte unwritten); argument checks before launch; costs."""

import pytest
import torch
from kernel_helpers import bits_of
from mxkernels.quant import fp8_amax, fp8_rowwise
from mxkernels.moe import moe_rows
from mxkernels.quant import quantize_blocked
from mxkernels.moe import swiglu
from mxkernels.moe import moe_fused as mf
from mxkernels.core.cost import Cost
from mxkernels.core.errors import InputError
from mxkernels.quant.fp8_amax import AmaxRowsConfig
from mxkernels.quant import quantize
from mxkernels.quant.quantize import RowsConfig

# Group ends over 300 rows: an empty group, groups not multiples of 128, and 40 rows past the last end (tail rows).
OFFS = [[50, 50, 180, 260], [300], [0, 130, 300]]
# FP8 rowwise has no 128-row blocks, so its tests take ends over 72 rows: an empty group, 2 rows past the
# last end, and groups the launches' programs split (the backward's 1-row steps: 8 programs of 9 rows; the capped
# launch: 4 of 18; the forward's default launch is one program of 128 rows), so that two programs fold into one
# group's amax. The backward's default launch steps one row at a time: over 300 rows it was most of the file's time.
FP8_ROWS, FP8_OFFS = 72, [[10, 10, 50, 70], [72]]
MX_CONFIGS = [None, RowsConfig(tile=(16, 64), num_warps=2)]
# Whole rows, a program walking each 128-row scale block in 32-row steps (a 64-lane row at N = 64, 128 lanes for the
# gather's 96 columns: masked lanes and a padding scale column).
MX_WALK = mf.WholeRowsConfig(32, 4)
FP8_CONFIGS = [None, AmaxRowsConfig(programs_per_sm=1, num_warps=2, block_rows=2)]
# The GPU when there is one (the lead's GPU session runs this file), else CPU under the interpreter.
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def assert_same(fused, chain):
    assert len(fused) == len(chain)
    for i, (a, b) in enumerate(zip(fused, chain)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(bits_of(a), bits_of(b)), f"output {i} differs"


def offsets(ends):
    return torch.tensor(ends, dtype=torch.int32, device=DEV)


def gather_inputs(R=300, T=23, D=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, D, generator=g) * 4).bfloat16()
    src = torch.randint(-1, T, (R,), generator=g, dtype=torch.int32)
    src[::7] = -1
    return x.to(DEV), src.to(DEV), torch.randn(R, generator=g).to(DEV)


def swiglu_inputs(M=300, N=64, seed=0, packed=True):
    g = torch.Generator().manual_seed(seed)
    if packed:
        h1, h3 = swiglu.split_halves((torch.randn(M, 2 * N, generator=g) * 3).bfloat16().to(DEV))
    else:
        h1, h3 = ((torch.randn(M, N, generator=g) * 3).bfloat16().to(DEV) for _ in range(2))
    return (torch.randn(M, N, generator=g) * 2).bfloat16().to(DEV), h1, h3


@pytest.mark.parametrize("ends", OFFS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_gather_quantize_mxfp8_is_the_chain(poisoned_empty, ends, weighted, mode):
    x, src, w = gather_inputs()
    w = w if weighted else None
    offs = offsets(ends)
    xs = moe_rows.gather_weighted(x, src, w)
    chain = (xs, *quantize_blocked.quantize_dim0_blocked(xs, offs, mode))
    walk = [MX_WALK] if ends == OFFS[0] and mode == "rceil" else []  # the walk over every kind of group, once
    for config in (*MX_CONFIGS, *walk):
        assert_same(mf.gather_quantize_mxfp8(x, src, w, offs, mode, config=config), chain)


@pytest.mark.parametrize("ends", OFFS)
@pytest.mark.parametrize("packed", [True, False])
def test_swiglu_quantize_mxfp8_is_the_chain(poisoned_empty, ends, packed):
    _, h1, h3 = swiglu_inputs(packed=packed)
    offs = offsets(ends)
    act = swiglu.swiglu(h1, h3)
    chain = (act, *quantize_blocked.quantize_dim0_blocked(act, offs, "rceil"))
    for config in (*MX_CONFIGS, *([MX_WALK] if ends == OFFS[0] else [])):
        assert_same(mf.swiglu_quantize_mxfp8(h1, h3, offs, "rceil", config=config), chain)


@pytest.mark.parametrize("ends", OFFS)
@pytest.mark.parametrize("N", [64, 48, 192])
def test_swiglu_backward_quantize_mxfp8_is_the_chain(poisoned_empty, ends, N):
    # N = 48: 2N = 96, so a 64-column tile straddles the two halves (no halves launch: the column-tiled default).
    # 2N a multiple of 128: the halves launch too (WholeRowsConfig, the default there), each column computed once for
    # both halves; N = 192 takes 512-lane rows whose halves end 64 lanes early (masked lanes, masked scale blocks);
    # programs walking each 128-row scale block in 32-row steps (the interpreter's default), and 8-row programs of one
    # tile, over an empty group and the tail rows past the last end. (Fewer rows a program cost the
    # interpreter time, not the test a case.)
    g, h1, h3 = swiglu_inputs(N=N)
    offs = offsets(ends)
    (grad_h,) = swiglu.swiglu_backward(g, h1, h3, packed=True)
    chain = (grad_h, *quantize_blocked.quantize_dim0_blocked(grad_h, offs, "floor"))
    # N = 192 (the interpreter's slowest case) keeps the launches the others do not cover: the default's walk and
    # one-tile programs; the column-tiled RowsConfig runs at N = 48 and 64.
    configs = [None, mf.WholeRowsConfig(8, 2, walk=False)] if N == 192 else MX_CONFIGS
    for config in configs:
        assert_same(mf.swiglu_backward_quantize_mxfp8(g, h1, h3, offs, "floor", config=config), chain)


def test_the_halves_launch_refuses_widths_it_cannot_lay_out():
    g, h1, h3 = swiglu_inputs(M=40, N=48)  # 2N = 96: a 32-block would straddle the halves
    with pytest.raises(InputError, match="multiple of 128"):
        mf.swiglu_backward_quantize_mxfp8(g, h1, h3, offsets([40]), config=mf.WholeRowsConfig())
    with pytest.raises(InputError, match="at most 128"):
        mf.WholeRowsConfig(block_rows=256)


def test_a_walking_launch_refuses_column_tiles():
    act = torch.zeros(40, 96, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(InputError, match="whole rows"):
        quantize._quantize_rows(act, "rceil", RowsConfig(tile=(16, 64), num_warps=2), "m_groups", offs=offsets([40]),
                                walk=True)  # fmt: skip


@pytest.mark.parametrize("ends", [*FP8_OFFS, [0, 36, 72]])
@pytest.mark.parametrize("weighted", [False, True])
def test_gather_quantize_fp8_is_the_chain(poisoned_empty, ends, weighted):
    # 72 rows (FP8_OFFS, and an empty first group); the default launch's 64-row steps split [50, 70) in two.
    x, src, w = gather_inputs(R=FP8_ROWS, D=80)
    w = w if weighted else None
    offs = offsets(ends)
    xs = moe_rows.gather_weighted(x, src, w)
    chain = (xs, *fp8_amax.quantize_fp8_rowwise_with_amax(xs, offs))
    for config in FP8_CONFIGS:
        assert_same(mf.gather_quantize_fp8(x, src, w, offs, config=config), chain)


@pytest.mark.parametrize("ends", FP8_OFFS)
def test_swiglu_quantize_fp8_is_the_chain(poisoned_empty, ends):
    g, h1, h3 = swiglu_inputs(M=FP8_ROWS, N=40)
    offs = offsets(ends)
    act = swiglu.swiglu(h1, h3)
    (grad_h,) = swiglu.swiglu_backward(g, h1, h3)
    for config in FP8_CONFIGS:
        assert_same(mf.swiglu_quantize_fp8(h1, h3, offs, config=config),
                    (act, *fp8_amax.quantize_fp8_rowwise_with_amax(act, offs)))  # fmt: skip
        assert_same(mf.swiglu_backward_quantize_fp8(g, h1, h3, offs, config=config),
                    (grad_h, *fp8_amax.quantize_fp8_rowwise_with_amax(grad_h, offs)))  # fmt: skip


# Without the table (offs None): every row quantized, as the plain rows quantizer does; the launches split the 72 rows
# among programs (the default steps one row at a time; the second, 2-row steps) and the persistent default among
# several programs an SM.
FP8_ALONE_CONFIGS = [None, AmaxRowsConfig(programs_per_sm=1, num_warps=2, block_rows=2),
                     AmaxRowsConfig(programs_per_sm=4, num_warps=1, block_rows=1)]  # fmt: skip


@pytest.mark.parametrize("weighted", [False, True])
def test_the_fp8_fused_calls_without_a_table_are_the_plain_chain(poisoned_empty, weighted):
    x, src, w = gather_inputs(R=FP8_ROWS, D=80)
    w = w if weighted else None
    g, h1, h3 = swiglu_inputs(M=FP8_ROWS, N=40)
    xs, act = moe_rows.gather_weighted(x, src, w), swiglu.swiglu(h1, h3)
    (grad_h,) = swiglu.swiglu_backward(g, h1, h3)
    for config in FP8_ALONE_CONFIGS:
        assert_same(mf.gather_quantize_fp8(x, src, w, None, config=config),
                    (xs, *fp8_rowwise.quantize_fp8_rowwise(xs)))  # fmt: skip
        assert_same(mf.swiglu_quantize_fp8(h1, h3, None, config=config), (act, *fp8_rowwise.quantize_fp8_rowwise(act)))
        assert_same(mf.swiglu_backward_quantize_fp8(g, h1, h3, None, config=config),
                    (grad_h, *fp8_rowwise.quantize_fp8_rowwise(grad_h)))  # fmt: skip


def test_special_values():
    # Inf and NaN in the produced tile: their blocks' scales are 255 and data 0x7F; a row's FP8 scale goes NaN/inf.
    x, src, w = gather_inputs(R=40, T=5, D=64)
    x[1, 3], x[2, 40] = float("inf"), float("nan")
    offs = offsets([10, 40])
    xs = moe_rows.gather_weighted(x, src, w)
    assert_same(mf.gather_quantize_mxfp8(x, src, w, offs), (xs, *quantize_blocked.quantize_dim0_blocked(xs, offs)))
    assert_same(mf.gather_quantize_fp8(x, src, w, offs), (xs, *fp8_amax.quantize_fp8_rowwise_with_amax(xs, offs)))


def test_empty():
    x, src, _ = gather_inputs(R=0, D=64)
    xs, q, s = mf.gather_quantize_mxfp8(x, src, None, offsets([0, 0]))
    assert xs.shape == q.shape == (0, 64) and not s.view(torch.uint8).any()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, s, h1, h3, g, o: mf.gather_quantize_mxfp8(x[:, :40].contiguous(), s, None, o), "multiple of 32"),
        (lambda x, s, h1, h3, g, o: mf.gather_quantize_mxfp8(x, s, None, o.long()), "offs"),
        pytest.param(lambda x, s, h1, h3, g, o: mf.gather_quantize_mxfp8(x, s, None, offsets([10, 301])), "offs",
                     marks=pytest.mark.skipif(DEV == "cuda", reason="CUDA offs are never read on the host")),
        (lambda x, s, h1, h3, g, o: mf.gather_quantize_mxfp8(x, s, None, o, "up"), "mode|ScaleMode"),
        (lambda x, s, h1, h3, g, o: mf.gather_quantize_mxfp8(x, s, None, o, config=FP8_CONFIGS[1]), "config"),
        (lambda x, s, h1, h3, g, o: mf.gather_quantize_fp8(x, s, torch.ones(3, device=DEV), o), "weight"),
        (lambda x, s, h1, h3, g, o: mf.gather_quantize_fp8(x, s, None, o, config=MX_CONFIGS[1]), "config"),
        (lambda x, s, h1, h3, g, o: mf.swiglu_quantize_mxfp8(h1, h3[:, :32], o), "one shape"),
        (lambda x, s, h1, h3, g, o: mf.swiglu_backward_quantize_fp8(g[:5], h1, h3, o), "grad_act"),
    ],
)
def test_bad_input_is_named_before_launch(call, match):
    x, src, _ = gather_inputs()
    g, h1, h3 = swiglu_inputs()
    with pytest.raises((InputError, ValueError), match=match):
        call(x.contiguous(), src, h1, h3, g, offsets([100, 300]))


def test_costs_are_the_chain_less_the_reread():
    R, D, G, T, M, N = 4096, 7168, 8, 1024, 4096, 2048
    bf16 = torch.bfloat16
    reread = {"gather": R * D * 2, "swiglu": M * N * 2, "swiglu_backward": M * 2 * N * 2}
    pairs = [
        ("gather", mf.gather_quantize_mxfp8_cost(R, D, G, T, True),
         moe_rows.gather_weighted_cost(R, D, T, True) + quantize_blocked.quantize_dim0_blocked_cost(R, D, G, bf16)),
        ("swiglu", mf.swiglu_quantize_mxfp8_cost(M, N, G),
         swiglu.swiglu_cost(M, N) + quantize_blocked.quantize_dim0_blocked_cost(M, N, G, bf16)),
        ("swiglu_backward", mf.swiglu_backward_quantize_mxfp8_cost(M, N, G),
         swiglu.swiglu_backward_cost(M, N) + quantize_blocked.quantize_dim0_blocked_cost(M, 2 * N, G, bf16)),
        ("gather", mf.gather_quantize_fp8_cost(R, D, G, T, False),
         moe_rows.gather_weighted_cost(R, D, T, False) + fp8_amax.with_amax_cost(R, D, G, bf16)),
        ("swiglu", mf.swiglu_quantize_fp8_cost(M, N, G),
         swiglu.swiglu_cost(M, N) + fp8_amax.with_amax_cost(M, N, G, bf16)),
        ("swiglu_backward", mf.swiglu_backward_quantize_fp8_cost(M, N, G),
         swiglu.swiglu_backward_cost(M, N) + fp8_amax.with_amax_cost(M, 2 * N, G, bf16)),
        # no table (G 0): the plain rows quantizer's writes
        ("swiglu", mf.swiglu_quantize_fp8_cost(M, N, 0),
         swiglu.swiglu_cost(M, N) + fp8_rowwise.quantize_fp8_rowwise_cost(M, N, bf16)),
        ("gather", mf.gather_quantize_fp8_cost(R, D, 0, T, True),
         moe_rows.gather_weighted_cost(R, D, T, True) + fp8_rowwise.quantize_fp8_rowwise_cost(R, D, bf16)),
    ]  # fmt: skip
    for kind, fused, chain in pairs:
        assert fused == Cost(chain.bytes_read - reread[kind], chain.bytes_written)


def test_fused_gather_costs_keep_the_gathers_dram_rule():
    """The fused gathers read each of ``sources`` token rows once (the rest re-reads), as the plain gather."""
    R, D, G, copies, T = 4096, 7168, 8, 2048, 512
    for fused, quantizer in ((mf.gather_quantize_mxfp8_cost, quantize_blocked.quantize_dim0_blocked_cost),
                             (mf.gather_quantize_fp8_cost, fp8_amax.with_amax_cost)):  # fmt: skip
        cost = fused(R, D, G, copies, True, sources=T)
        assert cost == Cost(T * D * 2 + R * 8, R * D * 2 + quantizer(R, D, G, torch.bfloat16).bytes_written,
                            bytes_reread=(copies - T) * D * 2)  # fmt: skip


# ---- no FMA contraction: the interpreter cannot show one (numpy rounds a * b + c twice), so check the launches ----


class _Recorder:
    """Stands in for a jit kernel: records the launch keywords instead of running."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append(kwargs)


def _fused_calls():
    x, src, w = gather_inputs(R=40, D=64)
    g, h1, h3 = swiglu_inputs(M=40, N=32)
    o = offsets([40])
    return [
        lambda: mf.gather_quantize_mxfp8(x, src, w, o), lambda: mf.swiglu_quantize_mxfp8(h1, h3, o),
        lambda: mf.swiglu_backward_quantize_mxfp8(g, h1, h3, o), lambda: mf.gather_quantize_fp8(x, src, w, o),
        lambda: mf.swiglu_quantize_fp8(h1, h3, o), lambda: mf.swiglu_backward_quantize_fp8(g, h1, h3, o),
        lambda: swiglu.swiglu(h1, h3), lambda: swiglu.swiglu_backward(g, h1, h3),
        lambda: moe_rows.gather_weighted(x, src, w), lambda: moe_rows.combine_rows(x, src.clamp(min=0), w, 4),
    ]  # fmt: skip


def test_every_arithmetic_launch_disables_fp_fusion(monkeypatch):
    from mxkernels.quant import quantize

    recorders = {}
    kernels = [(quantize, "_quantize_rows_kernel"), (fp8_amax, "_rows_amax_kernel"), (swiglu, "_swiglu_kernel"),
               (swiglu, "_swiglu_backward_kernel"), (moe_rows, "_gather_kernel")]  # fmt: skip
    for module, name in kernels:
        recorders[name] = _Recorder()
        monkeypatch.setattr(module, name, recorders[name])
    for call in _fused_calls():
        try:
            call()
        except (TypeError, AttributeError):
            pass  # the fp8 wrapper reads the amax table back as float32 after the (skipped) launch
    launches = [kw for r in recorders.values() for kw in r.launches]
    assert len(launches) == 10
    assert all(kw.get("enable_fp_fusion") is False for kw in launches)


@pytest.mark.parametrize("producer", ["swiglu_producer", "swiglu_backward_producer"])
def test_producer_arithmetic_compiles_without_fma(producer):
    """With fusion off, SM90 PTX of the M-groups rows kernel fed by a SwiGLU producer has no fp32 FMA of its own
    (libdevice's expf keeps its .ftz ones), IEEE divisions, and libdevice's exp; with fusion on, one appears: the
    launch option is what keeps the arithmetic the unfused kernel's."""
    from crosscompile import compile_ptx

    signature = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "offs_ptr": "*i32", "n_rows": "i32", "n_cols": "i32",
                 "G": "i32", "group_rows": "i32", "s_cols": "i32", "p_a": "*bf16", "p_b": "*bf16", "p_c": "*bf16",
                 "p_sa": "i32", "p_sb": "i32"}  # fmt: skip
    constexprs = {"BLOCK_R": 32, "BLOCK_C": 512, "EVEN": False, "RCEIL": True, "EXACT": False, "SCALES": 1,
                  "BLOCK_G": 8, "PRODUCE": {"jit": f"mxkernels.moe.swiglu:{producer}"}, "VARIANT": False,
                  "TAIL": True, "HALVES": False, "WALK": False}  # fmt: skip
    signature.update({name: "constexpr" for name in constexprs})
    ptx = {fusion: compile_ptx("mxkernels.quant.quantize", "_quantize_rows_kernel", signature, constexprs, 90,
                               options={"enable_fp_fusion": fusion}) for fusion in (False, True)}  # fmt: skip
    assert "fma.rn.f32" not in ptx[False] and "div.rn.f32" in ptx[False] and "div.full" not in ptx[False]
    assert "ex2.approx.ftz.f32" in ptx[False] and "fma.rm.ftz.f32" in ptx[False]  # libdevice's expf
    if producer == "swiglu_backward_producer":
        assert "fma.rn.f32" in ptx[True]
