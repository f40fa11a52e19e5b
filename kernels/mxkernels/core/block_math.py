"""Element and block arithmetic shared by the quantizers (``quantize``, ``quantize_blocked``, ``fp8_rowwise``,
``fp8_colwise``).

Triton device functions on tiles: exact widening to fp32, the amax of a block as fp32 bits, the e8m0 scale byte
(FLOOR and RCEIL, integer operations only, so one build runs on SM90 and SM100) and its reciprocal, the FP8 rowwise
recipe's fp32 scale and its reciprocal from a floored amax, the fp32 -> e4m3 cast (the hardware one, or an exact
integer one for the interpreter), a whole block's quantization, and loads and stores that drop their masks on tiles
that divide the tensor evenly.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from .format import E4M3_NAN_BYTE, E8M0_MAX_FINITE, E8M0_NAN

_NAN_BYTE: tl.constexpr = tl.constexpr(E4M3_NAN_BYTE)
_SCALE_NAN: tl.constexpr = tl.constexpr(E8M0_NAN)
_SCALE_MAX: tl.constexpr = tl.constexpr(E8M0_MAX_FINITE)
_F32_INF_BITS: tl.constexpr = tl.constexpr(0x7F800000)
_F32_NAN_BITS: tl.constexpr = tl.constexpr(0x7FC00000)
# fp32 bits of 448 = 1.75 * 2**8, the largest finite e4m3 value.
_F32_448_BITS: tl.constexpr = tl.constexpr(0x43E00000)
# The FP8 rowwise recipe's amax floor: it keeps 448 / amax finite (that overflows fp32 below amax ~ 2**-119) and only
# touches rows or columns of magnitude < 2**-112 (``fp8_rowwise`` says more).
AMAX_FLOOR = 2.0**-112
_AMAX_FLOOR: tl.constexpr = tl.constexpr(AMAX_FLOOR)


@triton.jit
def to_fp32(x):
    """bf16 or fp32 tile -> fp32, exactly. bf16 widens through its bits: the interpreter's bf16 cast flushes
    subnormals, and on a GPU the shift is what the cast compiles to anyway."""
    if x.dtype == tl.bfloat16:
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x


@triton.jit
def scale_byte(amax_bits, RCEIL: tl.constexpr):
    """Biased e8m0 scale byte (int32) of each block from the fp32 bits of its amax (sign clear; > +Inf is NaN).

    FLOOR: E(amax) - 8, clamped to 0..254.
    RCEIL: ceil(log2(d)) + 127 with d = fp32(amax / 448), written on amax's own bits, so no division. With
    amax = 1.m * 2**e and 448 = 1.75 * 2**8, amax / 448 is an exact power of two only when 1.m == 1.75, and the fp32
    rounding of a normal d never lands on or leaves a power of two, so byte = e - 8 + (1.m > 1.75). Below
    d = 2**-126 the format's rule takes the subnormal d's rounding: byte 1 iff mantissa(d) > 0x400000, i.e.
    d > 2**-127 after rounding to a multiple of 2**-149. The formula agrees everywhere except amax = (1.75 + 2**-23)
    * 2**-119 (bits 0x04600001), whose d = 2**-127 * (1 + 2**-23 / 1.75) rounds down to 2**-127: byte 0, not 1.
    (Both modes were checked against ``format.scale_bytes_reference`` on all 2**31 non-negative fp32 patterns.)
    """
    exp = amax_bits >> 23
    if RCEIL:
        mant = amax_bits & 0x7FFFFF
        byte = exp - 8 + (mant > 0x600000).to(tl.int32)
        byte = tl.where(amax_bits == 0x04600001, 0, byte)
    else:
        byte = exp - 8
    byte = tl.minimum(tl.maximum(byte, 0), _SCALE_MAX)
    return tl.where(amax_bits >= _F32_INF_BITS, _SCALE_NAN, byte)


@triton.jit
def reciprocal_scale(byte):
    """fp32 2**(127 - byte), built from bits: byte 254 gives the subnormal 2**-127, the NaN byte 255 gives NaN."""
    bits = tl.where(byte == _SCALE_NAN, _F32_NAN_BITS, 0x400000)
    bits = tl.where(byte < _SCALE_MAX, (_SCALE_MAX - byte) << 23, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def fp8_scale_and_reciprocal(amax):
    """(amax / 448, 448 / amax) of the floored amax (``AMAX_FLOOR``), with IEEE division: the FP8 rowwise recipe's
    fp32 scale and the factor its cast multiplies by."""
    amax = tl.maximum(amax, _AMAX_FLOOR)
    return tl.math.div_rn(amax, 448.0), tl.math.div_rn(448.0, amax)


@triton.jit
def to_e4m3_bits(y, EXACT: tl.constexpr):
    """fp32 tile -> e4m3fn bytes (uint8), round to nearest even, saturating to +-448.

    EXACT=False: the hardware cast (``cvt.rn.satfinite.e4m3x2.f32``; NaN -> 0x7F, since the NaN a multiply makes
    is the positive canonical one). EXACT=True: the same in integer arithmetic, for the interpreter.
    """
    if EXACT:
        bits = y.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = tl.minimum(bits & 0x7FFFFFFF, _F32_448_BITS)
        exp = a >> 23
        # e4m3 normals start at 2**-6 (fp32 biased exponent 121): keep 3 of the 23 mantissa bits (shift 20), the
        # exponent field rides along and a mantissa carry bumps it. Below, the result is round(|y| * 2**9), the
        # subnormal's integer mantissa (8 -> 0x08, the smallest normal): the 24-bit significand shifted right by
        # 141 - exp, capped at 25 (beyond which everything rounds to 0).
        normal = exp > 120
        mag = tl.where(normal, a, (a & 0x7FFFFF) | 0x800000)
        shift = tl.where(normal, 20, tl.minimum(141 - exp, 25))
        rounded = (mag + (1 << (shift - 1)) - 1 + ((mag >> shift) & 1)) >> shift
        q = tl.where(normal, rounded - (120 << 3), rounded) | sign
        return tl.where((bits & 0x7FFFFFFF) > _F32_INF_BITS, _NAN_BYTE, q).to(tl.uint8)
    else:
        return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def magnitude(x):
    """|x| of a bf16/fp32 tile as the integer bits of its own width (int16 for bf16, int32 for fp32): their integer
    order is the order of the magnitudes, a NaN (bits above +Inf) above all, and a bf16 tile's stay 16 bits wide
    (fewer live registers than fp32 values)."""
    if x.dtype == tl.bfloat16:
        bits = x.to(tl.int16, bitcast=True) & 0x7FFF
    else:
        bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return bits


@triton.jit
def magnitude_fp32_bits(m, FROM_BF16: tl.constexpr):
    """fp32 bit pattern (int32) of ``magnitude`` bits ``m`` (or of a max of them) of a bf16 (FROM_BF16) or fp32
    tile. Said by the caller, not read from ``m``: a reduction may already have widened bf16 bits to int32."""
    if FROM_BF16:
        bits = m.to(tl.int32) << 16
    else:
        bits = m
    return bits


@triton.jit
def abs_max_bits(x, AXIS: tl.constexpr):
    """fp32 bit pattern (int32) of max |x| along AXIS of a bf16/fp32 tile: the integer max of the ``magnitude``
    bits, so a NaN wins like +Inf. bf16 is reduced on its 16-bit patterns, so fp32 values exist only at the multiply
    that follows."""
    return magnitude_fp32_bits(tl.max(magnitude(x), axis=AXIS), x.dtype == tl.bfloat16)


@triton.jit
def quantize_blocks(x, AXIS: tl.constexpr, RCEIL: tl.constexpr, EXACT: tl.constexpr):
    """Quantize a 3D fp32 tile whose dim ``AXIS`` (length 32) runs along one block.

    Returns (data bytes uint8, same shape as x; scale bytes uint8, x's shape without AXIS). A block holding a NaN or
    an Inf gets scale 255 and data 0x7F.
    """
    byte = scale_byte(abs_max_bits(x, AXIS), RCEIL)
    # A NaN/Inf block's reciprocal scale is NaN, so all its products are NaN and the cast writes 0x7F: no
    # per-element select.
    q = to_e4m3_bits(to_fp32(x) * tl.expand_dims(reciprocal_scale(byte), AXIS), EXACT)
    return q, byte.to(tl.uint8)


@triton.jit
def halves_lanes(BLOCK: tl.constexpr, n):
    """The HALVES lane order of a row of ``n`` positions (columns, or their 32-blocks) over BLOCK lanes: lane j of the
    first BLOCK / 2 at position j, lane BLOCK / 2 + j at n / 2 + j, for a producer that computes both halves of a
    position at once (``swiglu.swiglu_backward_halves_producer``). (positions, inside: j < n / 2)."""
    lane = tl.arange(0, BLOCK)
    upper = lane >= BLOCK // 2
    j = tl.where(upper, lane - BLOCK // 2, lane)
    return tl.where(upper, j + n // 2, j), j < n // 2


@triton.jit
def to_bf16_bits(x, EXACT: tl.constexpr):
    """fp32 tile -> bf16 bits (int16), round to nearest even, overflow to Inf.

    EXACT=False: the hardware cast (``cvt.rn.bf16x2.f32``, two values an instruction; a NaN becomes the canonical
    0x7FFF, as torch's CUDA cast writes it). EXACT=True: the same in integer arithmetic (a NaN stays a quiet NaN of
    its own sign and payload, as torch's CPU cast keeps it), for the interpreter, whose float cast to bf16 truncates;
    on a GPU its ten integer operations an element made the gather and SwiGLU kernels instruction-bound."""
    if not EXACT:
        return x.to(tl.bfloat16).to(tl.int16, bitcast=True)
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return tl.where(is_nan, (bits >> 16) | 0x40, rounded).to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit
def load_rows(ptrs, rows, row_ok, cols, col_ok, n_cols, a_ptr, b_ptr, c_ptr, a_stride, b_stride,
              VARIANT: tl.constexpr, EVEN: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """The default tile producer of the quantizers' rows kernels: the tile (rows, cols) of a row-major (., n_cols)
    input, ``ptrs`` its element pointers as the caller computes them (so the kernel's address arithmetic, and its
    PTX, stay its own). A *producer* is a jit function of this signature passed to a rows kernel as a constexpr;
    the fused stages (``moe_fused``) pass one that computes the tile from the producer's inputs (a_ptr, b_ptr,
    c_ptr, the row strides a_stride, b_stride, its own VARIANT flag), stores it at ``ptrs`` as the unfused producer
    kernel would and returns it, so the quantizer's re-read of that tensor is saved. Here they are unused."""
    return masked_load(ptrs, row_ok[:, None] & col_ok[None, :], EVEN)


class Producer(NamedTuple):
    """A tile producer for a quantizer's rows kernel, as its wrapper takes it: the jit function (``load_rows``'
    signature) and the arguments it gets after n_cols. The tensor it writes is the rows kernel's input."""

    fn: object
    a: object
    b: object
    c: object
    a_stride: int = 0
    b_stride: int = 0
    variant: bool = False


def producer_args(producer: Producer | None, x) -> tuple[tuple, dict]:
    """The rows kernels' producer arguments and constexprs: ``producer``'s, or ``load_rows`` of ``x`` (None)."""
    p = producer or Producer(load_rows, x, x, x)
    return (p.a, p.b, p.c, p.a_stride, p.b_stride), {"PRODUCE": p.fn, "VARIANT": p.variant}


@triton.jit
def masked_load(ptrs, mask, EVEN: tl.constexpr):
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def masked_store(ptrs, value, mask, EVEN: tl.constexpr):
    if EVEN:
        tl.store(ptrs, value)
    else:
        tl.store(ptrs, value, mask=mask)
