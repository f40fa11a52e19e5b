"""Specification of the MXFP8 quantization kernels in ``mxkernels.quant.quantize``.

Every kernel must produce the bytes of the plain-torch oracle ``quantize_reference`` (scales and data), in both
scale modes and for both input dtypes. Without a GPU the kernels run on CPU tensors under the Triton interpreter on
small shapes; the ``gpu`` tests repeat the check on DeepSeek-V3 sizes and past 2**31 elements.

The tests build every input as ``t`` (n, L) with the 32-blocks along its last dim, the orientation the oracle
quantizes, and hand each kernel the layout it expects: dim0 takes t, dim1 takes t.T (so its output is t's
orientation again), quantize_3d takes t split into experts (transposed per expert along N).
"""

from __future__ import annotations

from dataclasses import replace

import mxkernels.core.runtime
import pytest
import torch
import triton
import triton.language as tl
from crosscompile import compile_ptx
from kernel_helpers import f32
from mxkernels.core.block_math import scale_byte, to_e4m3_bits
from mxkernels.core.cost import Cost
from mxkernels.core.format import (
    BLOCK_SIZE,
    DATA_DTYPE,
    SCALE_DTYPE,
    quantize_reference,
    scale_bytes_reference,
)
from mxkernels.quant.quantize import (
    ALONG_N_COLS,
    DIM1_COLS,
    ROWS_CONFIG,
    RowsConfig,
    quantize_2d_cost,
    quantize_3d,
    quantize_3d_cost,
    quantize_dim0,
    quantize_dim1,
)

MODES = ["floor", "rceil"]
DTYPES = [torch.bfloat16, torch.float32]
INF, NAN = float("inf"), float("nan")
FLT_MAX = torch.finfo(torch.float32).max


# ---------------------------------------------------------------------------------------------------------------------
# Oracle and inputs
# ---------------------------------------------------------------------------------------------------------------------


def expected(t: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle bytes (uint8) of t (..., L), blocks along L."""
    q, s = quantize_reference(t, mode)
    return q.view(torch.uint8), s.view(torch.uint8)


def e4m3_grid() -> torch.Tensor:
    """Every finite non-negative e4m3 value, ascending (fp32)."""
    return torch.arange(0, 0x7F, dtype=torch.uint8).view(DATA_DTYPE).float()


def rounding_boundaries() -> torch.Tensor:
    """fp32 midpoints between consecutive e4m3 values (exact in fp32): where round-to-nearest-even decides."""
    v = e4m3_grid()
    return (v[1:] + v[:-1]) / 2


def special_blocks() -> torch.Tensor:
    """Adversarial 32-blocks (fp32 rows): zeros, NaN, +-Inf, amax around 448 and 512 at several scales, exact powers
    of two, mantissa carries into the exponent, every e4m3 rounding boundary, subnormal and huge magnitudes, the
    RCEIL subnormal-d corner."""
    gen = torch.Generator().manual_seed(7)

    def block(*values: float, fill: str | float = "small") -> torch.Tensor:
        b = torch.rand(BLOCK_SIZE, generator=gen) * 2 - 1 if fill == "small" else torch.full((BLOCK_SIZE,), fill)
        b[: len(values)] = torch.tensor(values, dtype=torch.float32)
        return b

    blocks = [
        block(fill=0.0),
        block(1.0, NAN, -3.0),
        block(INF, 2.0),
        block(-INF, 2.0),
        block(NAN, INF, -INF),
        block(NAN, fill=0.0),
        block(f32(-0x400000), -1.0),  # a negative NaN (bits 0xFFC00000)
    ]
    for amax in (448.0, f32(0x43E00001), f32(0x43DFFFFF), 464.0, 479.99, 480.0, 500.0, f32(0x43FFFFFF), 512.0,
                 f32(0x44000001), 224.0, 256.0):  # fmt: skip
        for k in (-20, 0, 30):
            blocks.append(block(amax * 2.0**k, -amax * 2.0**k / 1.07, 447.0 * 2.0**k, 0.5 * 2.0**k))
    blocks.append(torch.tensor([(-1.0) ** i * 2.0 ** (i - 20) for i in range(BLOCK_SIZE)]))  # +-2**-20 .. 2**11
    blocks.append(block(448.0, 126.6, 127.9, 239.9, 247.99, 15.9, 7.99, -126.6, -0.0, 0.9999))
    # Scale 1 (amax 448) puts each boundary and its fp32 neighbours straight into the cast.
    mids = rounding_boundaries().view(torch.int32)
    for m in (mids.view(torch.float32), (mids + 1).view(torch.float32), (mids - 1).view(torch.float32)):
        chunks = torch.cat([m, -m]).split(BLOCK_SIZE - 1)
        blocks += [torch.cat([torch.tensor([448.0]), c, torch.zeros(BLOCK_SIZE - 1 - c.numel())]) for c in chunks]
    tiny = [2.0**-149, 2.0**-140, 3 * 2.0**-137, 2.0**-136, 2.0**-133, -(2.0**-130), 2.0**-127, 5.877e-39]
    blocks.append(block(*tiny, fill=0.0))  # subnormal amax
    blocks.append(block(*tiny, 1e-30, fill=0.0))  # subnormals beside a normal amax
    blocks.append(block(*tiny, 1.5 * 2.0**-118, fill=0.0))  # amax just below 1.75 * 2**-118
    blocks.append(block(FLT_MAX, -(3.0e38), 1e38, 2.0**127, 1.0, fill=0.0))
    blocks.append(block(3.0e38, -(2.0**127), 1e30, 1e-30))
    blocks.append(block(1e30, 1e-30, -1e20, 1.0))
    for amax_bits in (0x04600000, 0x04600001, 0x04600002, 0x04DFFFFF, 0x04E00000):
        blocks.append(block(f32(amax_bits), f32(amax_bits) / 3, fill=0.0))
    return torch.stack(blocks)


def make_input(n: int, L: int, dtype: torch.dtype, seed: int, device: str) -> torch.Tensor:
    """t (n, L), blocks along L: random blocks with magnitudes 2**-30..2**30, the special blocks laid over the
    first ones (as many as fit)."""
    gen = torch.Generator().manual_seed(seed)
    nb = n * L // BLOCK_SIZE
    blocks = torch.randn(nb, BLOCK_SIZE, generator=gen) * torch.exp2(torch.randint(-30, 30, (nb, 1), generator=gen))
    special = special_blocks()[:nb]
    blocks[: special.shape[0]] = special
    return blocks.reshape(n, L).to(dtype).to(device)


def split_experts(n: int) -> int:
    return 3 if n % 3 == 0 else 2


DEFAULT_CONFIG = {"dim0": ROWS_CONFIG, "3d_K": ROWS_CONFIG, "dim1": DIM1_COLS, "3d_N": ALONG_N_COLS}


def launch_config(kernel: str, **fields):
    """The kernel's default launch configuration with the given fields replaced."""
    return replace(DEFAULT_CONFIG[kernel], **fields)


def run(kernel: str, t: torch.Tensor, mode: str, config=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``kernel`` on t's layout for it and return (q, s) bytes back in t's orientation (n, L), (n, L/32)."""
    n, L = t.shape
    if kernel == "dim0":
        q, s = quantize_dim0(t, mode, config=config)
        assert q.shape == (n, L) and s.shape == (n, L // 32) and s.is_contiguous()
    elif kernel == "dim1":
        q, s = quantize_dim1(t.t().contiguous(), mode, config=config)
        assert q.shape == (n, L) and q.is_contiguous() and s.shape == (n, L // 32) and s.stride() == (1, n)
    elif kernel == "3d_K":
        G = split_experts(n)
        q, s = quantize_3d(t.view(G, n // G, L), "K", mode, config=config)
        assert q.shape == (G, n // G, L) and s.shape == (G, n // G, L // 32) and s.is_contiguous()
    else:
        G = split_experts(n)
        w = t.view(G, n // G, L).transpose(1, 2).contiguous()  # (G, N=L, K=n/G): blocks along N
        q, s = quantize_3d(w, "N", mode, config=config)
        assert q.shape == (G, n // G, L) and s.shape == (G, n // G, L // 32) and s.is_contiguous()
    assert q.dtype == DATA_DTYPE and s.dtype == SCALE_DTYPE
    return q.view(torch.uint8).reshape(n, L), s.view(torch.uint8).reshape(n, L // 32)


def assert_bytes_equal(actual: torch.Tensor, wanted: torch.Tensor, what: str) -> None:
    if torch.equal(actual, wanted):
        return
    diff = (actual != wanted).nonzero()
    first = [(tuple(i.tolist()), actual[tuple(i)].item(), wanted[tuple(i)].item()) for i in diff[:8]]
    raise AssertionError(f"{what}: {diff.shape[0]} bytes differ; first (index, got, expected): {first}")


def check(kernel: str, t: torch.Tensor, mode: str, config=None) -> None:
    q, s = run(kernel, t, mode, config)
    q_ref, s_ref = expected(t, mode)
    assert_bytes_equal(s, s_ref, f"{kernel} scales")
    assert_bytes_equal(q, q_ref, f"{kernel} data")


# ---------------------------------------------------------------------------------------------------------------------
# Bit-exactness (interpreter on CPU, or the GPU when there is one)
# ---------------------------------------------------------------------------------------------------------------------

KERNELS = ["dim0", "dim1", "3d_K", "3d_N"]
# A small tile for each kernel: several programs per call, and tiles that divide some shapes (the unmasked path).
SMALL_TILE = {"dim0": (16, 64), "3d_K": (16, 64), "dim1": (64, 16), "3d_N": (64, 16)}
# (n, L, small tile?): L (the blocked dim) a multiple of 32, n anything; 64 x 256 divides the small tiles. Each of
# the first three shapes holds all the special blocks.
SHAPES = [(48, 96, False), (64, 256, True), (30, 160, True), (6, 32, False)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp32"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_bit_exact(kernel, dtype, mode, device):
    for i, (n, L, small) in enumerate(SHAPES):
        t = make_input(n, L, dtype, seed=i, device=device)
        config = launch_config(kernel, tile=SMALL_TILE[kernel]) if small else None
        check(kernel, t, mode, config)


@pytest.mark.parametrize("kernel, launch", [("dim0", {"tile": (1, 32), "num_warps": 1}),
                                            ("dim1", {"tile": (32, 1), "num_warps": 2}),
                                            ("3d_N", {"tile": (128, 64), "num_warps": 8}),
                                            ("3d_N", {"tile": (256, 32), "num_warps": 1}),
                                            ("dim1", {"tile": (64, 16), "num_stages": 2}),
                                            ("3d_N", {"tile": (128, 32), "num_warps": 2, "num_stages": 3}),
                                            ("3d_N", {"tile": (256, 32), "num_stages": 1}),
                                            ("3d_N", {"tile": (128, 16), "num_stages": 1, "prefetch": True}),
                                            ("3d_N", {"tile": (128, 16), "scale_words": False}),
                                            ("dim1", {"tile": (64, 16), "num_stages": 1, "prefetch": True})])  # fmt: skip
def test_other_tiles(kernel, launch, device):
    """Tiles of every height; along N, each column's scale bytes of a tile as one word (int16 to int64: a
    column's 256 rows here are 8 blocks) or bytes, and the 32-row steps pipelined or prefetched. The one-wide
    tiles (a program per row of a block, or per column) take 64-long rows, two blocks each: their scales are single
    bytes, so 256 showed nothing more at four times the programs."""
    t = make_input(30, 64 if 1 in launch["tile"] else 256, torch.bfloat16, seed=5, device=device)
    check(kernel, t, "rceil", launch_config(kernel, **launch))


@pytest.mark.parametrize("group_cols", [0, 8, 32])
@pytest.mark.parametrize("kernel", ["dim1", "3d_N"])
def test_column_groups(kernel, group_cols, device):
    """The cols kernel's program order (column tiles in groups of ``group_cols`` columns, a last partial group,
    or the whole width at 0) covers every tile exactly once. Input columns: 48 (dim1) or 30 / 3 = 10 per expert."""
    check(kernel, make_input(48 if kernel == "dim1" else 30, 96, torch.float32, seed=8, device=device), "rceil",
          launch_config(kernel, tile=(32, 8) if kernel == "dim1" else (32, 4), group_cols=group_cols))  # fmt: skip


@pytest.mark.parametrize("along", ["K", "N"])
def test_512_experts(along, device):
    t = make_input(512, 32, torch.bfloat16, seed=6, device=device)  # 512 experts of one row (K) or column (N)
    w = t.view(512, 1, 32) if along == "K" else t.view(512, 1, 32).transpose(1, 2).contiguous()
    q, s = quantize_3d(w, along, "rceil")
    q_ref, s_ref = expected(t, "rceil")
    assert_bytes_equal(q.view(torch.uint8).reshape(512, 32), q_ref, "data")
    assert_bytes_equal(s.view(torch.uint8).reshape(512, 1), s_ref, "scales")


def test_empty_inputs(device):
    q, s = quantize_dim0(torch.zeros(0, 64, device=device))
    assert q.shape == (0, 64) and s.shape == (0, 2)
    q, s = quantize_dim1(torch.zeros(64, 0, device=device))
    assert q.shape == (0, 64) and s.shape == (0, 2)


# ---------------------------------------------------------------------------------------------------------------------
# The fp32 -> e4m3 cast on its own
# ---------------------------------------------------------------------------------------------------------------------


@triton.jit
def _cast_kernel(y_ptr, q_ptr, n, BLOCK: tl.constexpr, EXACT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(q_ptr + offs, to_e4m3_bits(tl.load(y_ptr + offs, mask=mask, other=0.0), EXACT), mask=mask)


def sweep_block(device: str) -> int:
    """Elements per program of the sweep kernels: few, large programs under the interpreter; GPU-sized ones on a GPU."""
    return 1 << 18 if device == "cpu" else 1024


def cast(y: torch.Tensor, exact: bool) -> torch.Tensor:
    q = torch.empty(y.shape, dtype=torch.uint8, device=y.device)
    block = sweep_block(y.device.type)
    _cast_kernel[(triton.cdiv(y.numel(), block),)](y, q, y.numel(), BLOCK=block, EXACT=exact)
    return q


def cast_sweep() -> torch.Tensor:
    """fp32 values in [-448, 448]: +-16 ulps around every e4m3 value and every rounding boundary between two, the
    first fp32 subnormals, and 2**20 random bit patterns (every exponent about equally)."""
    gen = torch.Generator().manual_seed(3)
    anchors = torch.cat([e4m3_grid(), rounding_boundaries()]).view(torch.int32)
    near = (anchors[:, None] + torch.arange(-16, 17, dtype=torch.int32)).flatten()
    bits_448 = torch.tensor([448.0]).view(torch.int32)
    rand = torch.randint(0, bits_448.item() + 1, (1 << 20,), generator=gen, dtype=torch.int32)
    pos = torch.cat([near[(near >= 0) & (near <= bits_448)], torch.arange(0, 1024, dtype=torch.int32), rand])
    return torch.cat([pos, pos | torch.tensor(-(2**31), dtype=torch.int32)]).view(torch.float32)


@pytest.mark.parametrize("exact", [True, pytest.param(False, marks=pytest.mark.gpu)], ids=["exact", "hardware"])
def test_cast_matches_torch(exact, device):
    """The kernels' fp32 -> e4m3 cast (exact integer path; on a GPU also the hardware cvt) equals torch's
    round-to-nearest-even cast on every rounding boundary, saturates to +-448, and maps NaN to 0x7F."""
    y = cast_sweep()
    assert_bytes_equal(cast(y.to(device), exact).cpu(), y.to(DATA_DTYPE).view(torch.uint8), "cast")
    over = torch.tensor([f32(0x43E00001), 460.0, 464.0, 479.99, 480.0, 1e10, FLT_MAX, INF])
    assert cast(torch.cat([over, -over]).to(device), exact).tolist() == [0x7E] * 8 + [0xFE] * 8
    assert cast(torch.tensor([NAN], device=device), exact).tolist() == [0x7F]


@triton.jit
def _scale_byte_kernel(amax_ptr, byte_ptr, n, BLOCK: tl.constexpr, RCEIL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(byte_ptr + offs, scale_byte(tl.load(amax_ptr + offs, mask=mask, other=0), RCEIL), mask=mask)


@pytest.mark.parametrize("mode", MODES)
def test_scale_byte_matches_reference(mode, device):
    """The kernels' integer scale-byte formula against the reference on amax bit patterns: every exponent with
    mantissas around 0, 0x600000 (1.75, where amax / 448 is a power of two) and 0x7FFFFF; the subnormal-d range
    [2**-120, 2**-117) whole; 2**20 random patterns; Inf and NaNs."""
    gen = torch.Generator().manual_seed(4)
    exps = torch.arange(0, 256, dtype=torch.int32)[:, None] << 23
    mants = torch.tensor([0, 1, 2, 0x5FFFFF, 0x600000, 0x600001, 0x600002, 0x7FFFFE, 0x7FFFFF], dtype=torch.int32)
    amax_bits = torch.cat([
        (exps | mants).flatten(),
        torch.arange(0x03800000, 0x05000000, dtype=torch.int32),
        torch.randint(0, 0x7F800000, (1 << 20,), generator=gen, dtype=torch.int32),
    ])  # fmt: skip
    n, block = amax_bits.numel(), sweep_block(device)
    byte = torch.empty(n, dtype=torch.int32, device=device)
    _scale_byte_kernel[(triton.cdiv(n, block),)](amax_bits.to(device), byte, n, BLOCK=block, RCEIL=mode == "rceil")
    assert_bytes_equal(byte.cpu(), scale_bytes_reference(amax_bits.view(torch.float32), mode), "scale bytes")


# ---------------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------------

BAD_CALLS = [
    ("dtype", lambda d: quantize_dim0(torch.zeros(4, 32, dtype=torch.float16, device=d)), "x"),
    ("dtype", lambda d: quantize_dim1(torch.zeros(32, 4, dtype=torch.int32, device=d)), "x"),
    ("dtype", lambda d: quantize_3d(torch.zeros(1, 32, 32, dtype=torch.float64, device=d)), "w"),
    ("rank", lambda d: quantize_dim0(torch.zeros(2, 4, 32, device=d)), "x"),
    ("rank", lambda d: quantize_dim1(torch.zeros(32, device=d)), "x"),
    ("rank", lambda d: quantize_3d(torch.zeros(32, 32, device=d)), "w"),
    ("layout", lambda d: quantize_dim0(torch.zeros(32, 64, device=d).t()), "x"),
    ("layout", lambda d: quantize_dim1(torch.zeros(64, 32, device=d).t()), "x"),
    ("layout", lambda d: quantize_3d(torch.zeros(2, 32, 32, device=d).transpose(1, 2)), "w"),
    ("blocked dim", lambda d: quantize_dim0(torch.zeros(32, 48, device=d)), "x"),
    ("blocked dim", lambda d: quantize_dim1(torch.zeros(48, 32, device=d)), "x"),
    ("blocked dim", lambda d: quantize_3d(torch.zeros(1, 32, 48, device=d), "K"), "w"),
    ("blocked dim", lambda d: quantize_3d(torch.zeros(1, 48, 32, device=d), "N"), "w"),
    ("experts", lambda d: quantize_3d(torch.zeros(0, 32, 32, device=d)), "w"),
    ("experts", lambda d: quantize_3d(torch.zeros(513, 1, 32, device=d)), "w"),
    ("mode", lambda d: quantize_dim0(torch.zeros(4, 32, device=d), "nearest"), "mode"),
    ("mode", lambda d: quantize_dim1(torch.zeros(32, 4, device=d), mode=None), "mode"),
    ("along", lambda d: quantize_3d(torch.zeros(1, 32, 32, device=d), along="M"), "along"),
    ("tile", lambda d: quantize_dim0(torch.zeros(4, 32, device=d), config=RowsConfig((16, 16), 8)), "tile"),
    ("tile", lambda d: quantize_dim1(torch.zeros(32, 4, device=d), config=launch_config("dim1", tile=(48, 64))),
     "tile"),
    ("tile", lambda d: quantize_3d(torch.zeros(1, 32, 32, device=d), "N",
                                   config=launch_config("3d_N", tile=(16, 64))), "tile"),
    ("tile", lambda d: quantize_dim1(torch.zeros(32, 4, device=d), config=launch_config("dim1", tile=(512, 32))),
     "tile"),  # > 8 blocks per tile
    ("num_warps", lambda d: quantize_dim0(torch.zeros(4, 32, device=d), config=launch_config("dim0", num_warps=3)),
     "num_warps"),
    ("num_stages", lambda d: quantize_dim1(torch.zeros(32, 4, device=d), config=launch_config("dim1", num_stages=0)),
     "num_stages"),
    ("num_stages", lambda d: quantize_3d(torch.zeros(1, 32, 32, device=d), "K",
                                         config=launch_config("3d_N", num_stages=2)), "num_stages"),
    ("group_cols", lambda d: quantize_dim1(torch.zeros(32, 4, device=d), config=launch_config("dim1", group_cols=-1)),
     "group_cols"),
    ("prefetch", lambda d: quantize_dim1(torch.zeros(32, 4, device=d),
                                         config=launch_config("dim1", num_stages=2, prefetch=True)), "prefetch"),
    ("scale_words", lambda d: quantize_dim1(torch.zeros(32, 4, device=d),
                                            config=launch_config("dim1", scale_words=1)), "scale_words"),
    ("not a tensor", lambda d: quantize_dim0([[0.0] * 32]), "x"),
]  # fmt: skip


@pytest.mark.parametrize("what, call, name", BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_input_names_the_argument(what, call, name, device):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        call(device)


@pytest.mark.parametrize("call", [
    lambda x: quantize_dim0(x), lambda x: quantize_dim1(x), lambda x: quantize_3d(x.unsqueeze(0), "N")
])  # fmt: skip
def test_cpu_tensor_outside_the_interpreter(call, monkeypatch):
    monkeypatch.setattr(mxkernels.core.runtime, "INTERPRET", False)
    with pytest.raises(ValueError, match=r"(\bx\b|\bw\b).*cpu"):
        call(torch.zeros(32, 32))


# ---------------------------------------------------------------------------------------------------------------------
# Costs
# ---------------------------------------------------------------------------------------------------------------------


def test_costs_hand_counted():
    # (64, 96) fp32: read 64*96*4 = 24576; write 6144 e4m3 + 6144/32 = 192 scales.
    assert quantize_2d_cost(64, 96, torch.float32) == Cost(bytes_read=24576, bytes_written=6336)
    # DeepSeek-V3 A (131072, 7168) bf16: 1_879_048_192 read; 939_524_096 + 29_360_128 written.
    assert quantize_2d_cost(131072, 7168, torch.bfloat16) == Cost(1_879_048_192, 968_884_224)
    # dim1 of a (4096, 100) bf16 matrix (blocked dim 4096): 819_200 read; 409_600 + 12_800 written.
    assert quantize_2d_cost(4096, 100, torch.bfloat16) == Cost(819_200, 422_400)
    # Experts (8, 2048, 7168) bf16: 234_881_024 read; 117_440_512 + 3_670_016 written.
    cost = quantize_3d_cost(8, 2048, 7168, torch.bfloat16)
    assert cost == Cost(234_881_024, 121_110_528)
    assert cost.flops == 0 and cost.precision is None


@pytest.mark.parametrize("call", [
    lambda: quantize_2d_cost(64, 32, torch.float16),
    lambda: quantize_2d_cost(3, 5, torch.bfloat16),
    lambda: quantize_2d_cost(-32, 32, torch.bfloat16),
    lambda: quantize_3d_cost(0, 32, 32, torch.bfloat16),
])  # fmt: skip
def test_cost_bad_arguments(call):
    with pytest.raises(ValueError):
        call()


# ---------------------------------------------------------------------------------------------------------------------
# Cross-compilation (no GPU needed)
# ---------------------------------------------------------------------------------------------------------------------

_COMMON_SIG = {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*u8", "offs_ptr": "*i32", "n_rows": "i32", "n_cols": "i32",
               "G": "i32"}  # fmt: skip
_CONSTEXPR_SIG = {name: "constexpr" for name in ("BLOCK_R", "BLOCK_C", "EVEN", "RCEIL", "EXACT")}
_ROWS_SIG = {**_COMMON_SIG, "group_rows": "i32", "s_cols": "i32", "p_a": "*bf16", "p_b": "*bf16", "p_c": "*bf16",
             "p_sa": "i32", "p_sb": "i32", **_CONSTEXPR_SIG,
             **{name: "constexpr" for name in ("SCALES", "BLOCK_G", "PRODUCE", "VARIANT", "TAIL", "HALVES",
                                                  "WALK")}}  # fmt: skip
# The rows kernel's tile comes from a producer: the plain load (block_math.load_rows) here.
_LOAD = {"PRODUCE": {"jit": "mxkernels.core.block_math:load_rows"}, "VARIANT": False, "TAIL": False, "HALVES": False,
         "WALK": False}
_COLS_SIG = {**_COMMON_SIG, "grid_rows": "i32", "grid_cols": "i32", "s_stride_batch": "i32", "s_stride_col": "i32",
             "s_stride_block": "i32", **_CONSTEXPR_SIG,
             **{name: "constexpr" for name in ("GROUP", "STAGES", "PREFETCH", "SCALES", "WORDS", "BLOCK_G")}}  # fmt: skip
# (kernel, scale layout): signature, tile, extra constexprs. Scale layouts: 0 strided, 1 M-groups, 2 blocked 3D,
# 3 K-groups (the kernels' SCALES).
COMPILE_CASES = {
    ("_quantize_rows_kernel", 0): (_ROWS_SIG, ROWS_CONFIG.tile, _LOAD),
    ("_quantize_rows_kernel", 1): (_ROWS_SIG, ROWS_CONFIG.tile, _LOAD),
    ("_quantize_rows_kernel", 2): (_ROWS_SIG, ROWS_CONFIG.tile, _LOAD),
    ("_quantize_cols_kernel", 0): (
        _COLS_SIG,
        ALONG_N_COLS.tile,
        {"GROUP": 4, "STAGES": 2, "PREFETCH": False, "WORDS": True},
    ),
    ("_quantize_cols_kernel", 2): (
        _COLS_SIG,
        ALONG_N_COLS.tile,
        {"GROUP": 4, "STAGES": 1, "PREFETCH": True, "WORDS": True},
    ),
    ("_quantize_cols_kernel", 3): (
        _COLS_SIG,
        DIM1_COLS.tile,
        {"GROUP": 4, "STAGES": 1, "PREFETCH": False, "WORDS": False},
    ),
}


@pytest.mark.parametrize("cc", [90, 100])
@pytest.mark.parametrize("kernel, scales", list(COMPILE_CASES))
def test_compiles_for_sm90_and_sm100(kernel, scales, cc):
    """One kernel for both: the GPU build (EXACT=False) casts with the hardware satfinite cvt and computes RCEIL
    scales without the SM100-only ue8m0 cvt (which ptxas rejects for sm_90)."""
    signature, (rows, cols), extra = COMPILE_CASES[kernel, scales]
    constexprs = {"BLOCK_R": rows, "BLOCK_C": cols, "EVEN": False, "RCEIL": True, "EXACT": False, "SCALES": scales,
                  "BLOCK_G": 8, **extra}  # fmt: skip
    module = "mxkernels.quant.quantize_cols" if kernel == "_quantize_cols_kernel" else "mxkernels.quant.quantize"
    ptx = compile_ptx(module, kernel, signature, constexprs, cc)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert "ue8m0" not in ptx


def test_scale_words_compile_to_word_stores():
    """Along N a column's four scale bytes of a 128-row tile go out as one 32-bit store, in the row-major and the
    blocked layout: no byte stores of scales left (the data's stores are 16-byte vectors)."""
    for scales in (0, 2):
        signature, (rows, cols), extra = COMPILE_CASES["_quantize_cols_kernel", scales]
        constexprs = {"BLOCK_R": rows, "BLOCK_C": cols, "EVEN": True, "RCEIL": True, "EXACT": False,
                      "SCALES": scales, "BLOCK_G": 8, **extra}  # fmt: skip
        aligned = ("x_ptr", "q_ptr", "s_ptr", "n_rows", "n_cols", "grid_rows", "grid_cols", "s_stride_batch",
                   "s_stride_col")  # fmt: skip
        ptx = compile_ptx("mxkernels.quant.quantize_cols", "_quantize_cols_kernel", signature, constexprs, 90, aligned)
        assert "st.global.b8" not in ptx and "st.global.b32" in ptx and "st.global.v4.b32" in ptx


# ---------------------------------------------------------------------------------------------------------------------
# GPU: DeepSeek-V3 sizes, and offsets past 2**31
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def free_cuda():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def big_input(n: int, L: int, seed: int) -> torch.Tensor:
    """t (n, L) bf16 on the GPU: normal values with a random magnitude 2**-30..2**30 per 32-block, the special
    blocks in the first rows."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randn(n, L // BLOCK_SIZE, BLOCK_SIZE, device="cuda", dtype=torch.bfloat16, generator=gen)
    t *= torch.exp2(torch.randint(-30, 30, (n, L // BLOCK_SIZE, 1), device="cuda", generator=gen)).bfloat16()
    special = special_blocks().to("cuda", torch.bfloat16)
    t.view(-1, BLOCK_SIZE)[: special.shape[0]] = special
    return t.view(n, L)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kernel, n, L", [
    ("dim0", 131072, 7168),  # A (M, K), blocks along K
    ("dim1", 7168, 131072),  # A (M, K), blocks along M: t = A.T
    ("3d_K", 8 * 2048, 7168),  # weights (8, 2048, 7168) along K
    ("3d_N", 8 * 7168, 2048),  # weights (8, 2048, 7168) along N: t = per-expert transpose
])  # fmt: skip
def test_deepseek_v3_sizes(kernel, n, L, mode, free_cuda):
    """The reference runs on the GPU too; 3D uses 8 experts (the harness's G) instead of the 2/3 split above."""
    t = big_input(n, L, seed=0)
    if kernel == "dim0":
        q, s = quantize_dim0(t, mode)
    elif kernel == "dim1":
        q, s = quantize_dim1(t.t().contiguous(), mode)
    elif kernel == "3d_K":
        q, s = quantize_3d(t.view(8, n // 8, L), "K", mode)
    else:
        q, s = quantize_3d(t.view(8, n // 8, L).transpose(1, 2).contiguous(), "N", mode)
    q, s = q.view(torch.uint8).reshape(n, L), s.view(torch.uint8).reshape(n, L // BLOCK_SIZE)
    q_ref, s_ref = expected(t, mode)
    del t
    assert_bytes_equal(s, s_ref, f"{kernel} scales")
    assert_bytes_equal(q, q_ref, f"{kernel} data")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["dim0", "dim1", "3d_K", "3d_N"])
def test_offsets_past_2_31(kernel, free_cuda):
    """Inputs of ~2.16e9 elements: the last rows (dim0, 3D: the last expert) or columns (dim1) sit past 2**31
    elements in both the input and the output; they are checked against the reference."""
    if kernel in ("dim0", "dim1"):
        x = big_input(262144, 8224, seed=1)  # 2_155_872_256 elements
        assert x.numel() > 2**31
        if kernel == "dim0":
            q, s = quantize_dim0(x)
            t, q, s = x[-64:], q[-64:], s[-64:]
        else:
            q, s = quantize_dim1(x)
            t, q, s = x[:, -64:].t().contiguous(), q[-64:], s[-64:]
    else:
        w = big_input(512 * 2048, 2080, seed=2).view(512, 2048, 2080)  # 2_181_038_080 elements
        assert w.numel() > 2**31
        if kernel == "3d_K":
            q, s = quantize_3d(w, "K")
            t = w[-1]
        else:
            q, s = quantize_3d(w, "N")
            t = w[-1].t().contiguous()
        q, s = q[-1], s[-1]
    q_ref, s_ref = expected(t, "rceil")
    assert_bytes_equal(s.view(torch.uint8), s_ref, f"{kernel} scales")
    assert_bytes_equal(q.view(torch.uint8), q_ref, f"{kernel} data")
