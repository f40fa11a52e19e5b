"""Specification of the plain-torch MXFP8 reference in ``mxkernels.core.format`` against hand-worked values and the OCP
MX spec (docs/architecture.md, shared/reference/mxfp8.md section 1).

Every expected byte below is worked out by hand from the definitions:
  FLOOR byte = clamp(E(amax) - 8 + 127, 0, 254), E = unbiased fp32 exponent;
  RCEIL byte = ceil(log2(amax / 448)) + 127 from the fp32 bits of d = amax / 448 (subnormal d: 1 iff its mantissa
  exceeds 0x400000), clamped to 0..254; NaN or Inf amax -> 255.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernel_helpers import f32
from mxkernels.core.format import (
    BLOCK_SIZE,
    DATA_DTYPE,
    E4M3_MAX,
    SCALE_DTYPE,
    ScaleMode,
    dequantize_reference,
    quantize_reference,
    reciprocal_scale_reference,
    scale_bytes_reference,
)

INF, NAN = float("inf"), float("nan")
FLT_MAX = torch.finfo(torch.float32).max


def bits(value: float) -> int:
    return torch.tensor([value], dtype=torch.float32).view(torch.int32).item()


def next_up(v: float) -> float:
    return f32(bits(v) + 1)


def next_down(v: float) -> float:
    return f32(bits(v) - 1)


def byte_of(amax: float, mode: str) -> int:
    return scale_bytes_reference(torch.tensor([amax], dtype=torch.float32), mode).item()


def e4m3_byte(value: float) -> int:
    return torch.tensor([value]).to(DATA_DTYPE).view(torch.uint8).item()


def test_constants_and_modes():
    assert BLOCK_SIZE == 32
    assert E4M3_MAX == torch.finfo(DATA_DTYPE).max == 448.0
    assert ScaleMode.parse("RCEIL") is ScaleMode.RCEIL
    assert ScaleMode.parse("floor") is ScaleMode.FLOOR
    assert ScaleMode.parse(ScaleMode.FLOOR) is ScaleMode.FLOOR
    with pytest.raises(ValueError, match="mode"):
        ScaleMode.parse("round")


# amax -> FLOOR byte. E(amax) - 8 + 127 = biased exponent - 8.
FLOOR_CASES = [
    (0.0, 0),
    (2.0**-149, 0),  # smallest subnormal: biased exponent 0
    (2.0**-126, 0),  # -126 - 8 + 127 = -7, clamped
    (2.0**-119, 0),  # exactly 0
    (2.0**-118, 1),
    (1.0, 119),
    (next_down(2.0), 119),
    (2.0, 120),
    (256.0, 127),
    (448.0, 127),
    (next_down(512.0), 127),  # scaled by 2**0: 511.99997, saturates to 448 (see the saturation test)
    (512.0, 128),
    (2.0**127, 246),
    (FLT_MAX, 246),
    (INF, 255),
    (NAN, 255),
]

# amax -> RCEIL byte = ceil(log2(amax / 448)) + 127.
RCEIL_CASES = [
    (0.0, 0),
    (2.0**-149, 0),
    (448.0, 127),  # d = 1
    (next_down(448.0), 127),
    (next_up(448.0), 128),  # d = 1 + 2**-23 / 1.75 -> rounds up to 1 + 2**-23, above 1
    (224.0, 126),  # d = 2**-1
    (225.0, 127),
    (512.0, 128),  # d = 8/7
    (896.0, 128),  # d = 2
    (next_up(896.0), 129),
    (1.0, 119),  # d = 2**-8.807
    (1.75, 119),  # d = 2**-8
    (next_up(1.75), 120),
    (FLT_MAX, 247),  # log2(FLT_MAX / 448) = 119.19
    # Subnormal d = amax / 448 < 2**-126: byte 1 iff d (rounded to a multiple of 2**-149) exceeds 2**-127.
    (1.75 * 2.0**-118, 1),  # d = 2**-126, the smallest normal: E(d) + 127 = 1, mantissa 0
    (2.0**-118, 1),  # d = 2**-126 / 1.75: mantissa 0x492492 > 0x400000
    (1.75 * 2.0**-119, 0),  # d = 2**-127 exactly: mantissa 0x400000, not above
    (f32(0x04600001), 0),  # (1.75 + 2**-23) * 2**-119: d = 2**-127 + 0.29 * 2**-149 rounds down to 2**-127
    (f32(0x04600002), 1),  # (1.75 + 2**-22) * 2**-119: d = 2**-127 + 0.57 * 2**-149 rounds up
    (2.0**-119, 0),  # d = 2**-127 / 1.75
    (INF, 255),
    (NAN, 255),
]


@pytest.mark.parametrize("amax, expected", FLOOR_CASES)
def test_floor_scale_bytes(amax, expected):
    assert byte_of(amax, "floor") == expected


@pytest.mark.parametrize("amax, expected", RCEIL_CASES)
def test_rceil_scale_bytes(amax, expected):
    assert byte_of(amax, "rceil") == expected


def log_uniform_amax(n: int, seed: int) -> torch.Tensor:
    """Positive fp32 values with uniformly random bit patterns over the whole normal and subnormal range."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, 0x7F800000, (n,), generator=gen, dtype=torch.int32).view(torch.float32)


def test_floor_matches_frexp():
    amax = log_uniform_amax(200_000, seed=1)
    _, e = torch.frexp(amax.double())  # amax = m * 2**e, m in [0.5, 1): floor(log2(amax)) = e - 1
    expected = (e - 1 - 8 + 127).clamp(0, 254)
    assert torch.equal(scale_bytes_reference(amax, "floor"), expected.int())


def test_rceil_is_the_exact_ceil_while_d_is_normal():
    """Where amax / 448 is a normal fp32, its rounding never moves it across a power of two, so the RCEIL byte is
    the exact smallest k + 127 with 448 * 2**k >= amax (checked in float64, where 448 * 2**k is exact)."""
    amax = log_uniform_amax(200_000, seed=2)
    amax = amax[amax >= 1.75 * 2.0**-118]
    a = amax.double()
    k = torch.ceil(torch.log2(a / 448.0))
    k = torch.where(torch.ldexp(torch.full_like(a, 448.0), k - 1) >= a, k - 1, k)
    k = torch.where(torch.ldexp(torch.full_like(a, 448.0), k) < a, k + 1, k)
    expected = (k + 127).clamp(0, 254).int()
    assert torch.equal(scale_bytes_reference(amax, "rceil"), expected)


@pytest.mark.parametrize("mode, low, high", [("rceil", 224.0, 448.0), ("floor", 256.0, 512.0)])
def test_scaled_block_max_range(mode, low, high):
    """RCEIL puts the scaled block max in (224, 448], so it never saturates; FLOOR puts it in [256, 512)."""
    amax = log_uniform_amax(100_000, seed=3)
    byte = scale_bytes_reference(amax, mode)
    keep = (byte >= 1) & (byte <= 253)  # away from the clamps
    scaled = amax[keep].double() * torch.exp2(127.0 - byte[keep].double())
    if mode == "rceil":
        assert (scaled > low).all() and (scaled <= high).all()
    else:
        assert (scaled >= low).all() and (scaled < high).all()


@pytest.mark.parametrize("e, expected_bits", [(0, 0x7F000000), (127, 0x3F800000), (253, 0x00800000), (254, 0x00400000)])
def test_reciprocal_scale_hand_values(e, expected_bits):
    """2**127, 1.0, 2**-126 (smallest normal) and 2**-127 (a subnormal)."""
    r = reciprocal_scale_reference(torch.tensor([e]))
    assert r.dtype == torch.float32
    assert r.view(torch.int32).item() == expected_bits


def test_reciprocal_scale_every_byte():
    e = torch.arange(0, 255)
    r = reciprocal_scale_reference(e).double()
    assert torch.equal(r, torch.tensor([math.ldexp(1.0, 127 - int(v)) for v in e], dtype=torch.float64))


def block(*values: float, fill: float = 0.0) -> torch.Tensor:
    """One (1, 32) fp32 block starting with ``values``, the rest ``fill``."""
    x = torch.full((1, BLOCK_SIZE), fill)
    x[0, : len(values)] = torch.tensor(values)
    return x


def quantize_bytes(x: torch.Tensor, mode: str) -> tuple[list[int], int]:
    q, s = quantize_reference(x, mode)
    return q.view(torch.uint8).flatten().tolist(), s.view(torch.uint8).item()


def test_output_dtypes_shapes_and_layout():
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    q, s = quantize_reference(x, "rceil")
    assert q.dtype == DATA_DTYPE and s.dtype == SCALE_DTYPE
    assert q.shape == (3, 5, 64) and s.shape == (3, 5, 2)
    assert q.is_contiguous() and s.is_contiguous()


def test_bad_input():
    with pytest.raises(ValueError, match="x must be"):
        quantize_reference(torch.zeros(2, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_reference(torch.zeros(2, 48))


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_zero_block(mode):
    q, s = quantize_bytes(block(), mode)
    assert s == 0 and q == [0] * 32


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_nan_block(mode):
    x = torch.cat([block(1.0, NAN, 2.0), block(1.0, 2.0)], dim=1)
    q, s = quantize_reference(x, mode)
    assert s.view(torch.uint8).tolist() == [[255, 120]]  # amax 2: E = 1 (FLOOR); ceil(log2(2 / 448)) = -7 (RCEIL)
    assert q.view(torch.uint8)[0, :32].tolist() == [0x7F] * 32
    assert q.view(torch.uint8)[0, 32:34].tolist() == [0x70, 0x78]  # 1 * 2**7 = 128, 2 * 2**7 = 256


@pytest.mark.parametrize("inf", [INF, -INF])
@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_inf_block(mode, inf):
    q, s = quantize_bytes(block(1.0, inf, 2.0), mode)
    assert s == 255 and q == [0x7F] * 32


def test_floor_saturates_between_448_and_512():
    """amax 500: FLOOR byte 127 (scale 1), so 500 and 480 exceed 448 and saturate to +-448 (0x7E / 0xFE); RCEIL
    picks byte 128 (scale 2): 500 / 2 = 250 rounds to 256 (0x78), 480 / 2 = 240 (0x77) and 448 / 2 = 224 (0x76)
    are exact."""
    x = block(500.0, -500.0, 480.0, 448.0)
    q, s = quantize_bytes(x, "floor")
    assert s == 127 and q[:4] == [0x7E, 0xFE, 0x7E, 0x7E]
    q, s = quantize_bytes(x, "rceil")
    assert s == 128 and q[:4] == [0x78, 0xF8, 0x77, 0x76]


def test_mantissa_carry_into_exponent():
    """amax 448 gives scale 1 in both modes; 126.6 lies between e4m3 120 and 128 and rounds up across the exponent
    boundary to 128 (0x70); 15.5 ties between 15 (0x57) and 16 (0x58) and goes to even, 16."""
    for mode in ("floor", "rceil"):
        q, s = quantize_bytes(block(448.0, 126.6, 15.5, -126.6), mode)
        assert s == 127 and q[:4] == [0x7E, 0x70, 0x58, 0xF0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_subnormal_inputs(dtype):
    """A block of fp32/bf16 subnormals has amax < 2**-119: byte 0 in both modes, so r = 2**127 brings 2**-133 to
    2**-6 (the smallest e4m3 normal, 0x08) and 2**-130 to 2**-3 (0x20)."""
    x = block(2.0**-133, 2.0**-130, -(2.0**-133)).to(dtype)
    for mode in ("floor", "rceil"):
        q, s = quantize_bytes(x, mode)
        assert s == 0 and q[:4] == [0x08, 0x20, 0x88, 0x00]


def test_e4m3_subnormal_rounding():
    """With scale 1 (amax 448): 2**-9 is the smallest e4m3 subnormal (0x01); 1.5 * 2**-9 ties to even (0x02);
    2**-10 ties to even, 0; just above 2**-10 rounds up to 0x01."""
    q, s = quantize_bytes(block(448.0, 2.0**-9, 1.5 * 2.0**-9, 2.0**-10, next_up(2.0**-10)), "rceil")
    assert s == 127 and q[:5] == [0x7E, 0x01, 0x02, 0x00, 0x01]


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_representable_values_round_trip_exactly(mode):
    """Blocks of e4m3 values times 2**k, each holding 448 * 2**k, dequantize to exactly the input."""
    e4m3 = torch.arange(0, 0x7F, dtype=torch.uint8).view(DATA_DTYPE).float()  # every finite non-negative value
    values = torch.cat([e4m3, -e4m3, torch.full((32 - (2 * 127) % 32,), 448.0)])
    blocks = values.reshape(-1, 32)
    blocks[:, 0] = 448.0
    x = torch.cat([blocks * 2.0**k for k in (-100, -7, 0, 5, 60)])
    q, s = quantize_reference(x, mode)
    assert torch.equal(dequantize_reference(q, s), x)


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_round_trip_error_bound(mode):
    """Per element: |deq - x| <= max(|x| * 2**-4, scale * 2**-10) (half an e4m3 ulp: 3 mantissa bits, subnormal
    step 2**-9), plus, in FLOOR only, the saturation |x| - 448 * scale."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(512, 256, generator=gen) * torch.exp2(torch.randint(-60, 60, (512, 1), generator=gen).float())
    q, s = quantize_reference(x, mode)
    deq = dequantize_reference(q, s)
    scale = torch.exp2(s.view(torch.uint8).double() - 127).repeat_interleave(32, dim=1)
    bound = torch.maximum(x.double().abs() * 2.0**-4, scale * 2.0**-10)
    if mode == "floor":
        bound = bound + (x.double().abs() - 448.0 * scale).clamp(min=0)
    assert ((deq.double() - x.double()).abs() <= bound).all()


def test_dequantize_nan_scale():
    q = torch.zeros(1, 32, dtype=torch.uint8).view(DATA_DTYPE)
    s = torch.tensor([[255]], dtype=torch.uint8).view(SCALE_DTYPE)
    assert dequantize_reference(q, s).isnan().all()


def test_blocks_run_along_the_last_dim():
    """Each 32-run of the last dim gets its own scale: amax 1 -> ceil(log2(1 / 448)) = -8, byte 119; amax 2**20 ->
    ceil(20 - 8.807) = 12, byte 139; both scale their block to 256 (0x78)."""
    x = torch.ones(2, 96)
    x[1, 32:64] *= 2.0**20
    q, s = quantize_reference(x, "rceil")
    assert s.view(torch.uint8).tolist() == [[119, 119, 119], [119, 139, 119]]
    assert q.view(torch.uint8).unique().tolist() == [0x78]
