"""The MXFP8 format (OCP Microscaling spec v1.0) and its plain-torch reference.

An MXFP8 tensor is a pair:
  * data:   ``torch.float8_e4m3fn`` elements (max 448, no inf, NaN = S.1111.111);
  * scales: one ``torch.float8_e8m0fnu`` byte per block of ``BLOCK_SIZE`` = 32 consecutive elements along the
    contraction dim. Byte e means 2**(e - 127) for e in 0..254; 255 is NaN.

``quantize_reference`` / ``dequantize_reference`` implement the spec directly and are the oracle of every test.
They are written for clarity, not speed.
"""

from __future__ import annotations

import enum

import torch

from .runtime import InputError

BLOCK_SIZE = 32
E4M3_MAX = 448.0
# log2 of the largest power of two below E4M3_MAX: the FLOOR mode subtracts it from the block's exponent.
E4M3_EMAX = 8
E8M0_BIAS = 127
E8M0_NAN = 255
E8M0_MAX_FINITE = 254
# The e4m3fn byte written for every element of a block that holds a NaN or an Inf.
E4M3_NAN_BYTE = 0x7F

DATA_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.float8_e8m0fnu


class ScaleMode(enum.Enum):
    """How a block's shared exponent is chosen from its absolute maximum ``amax``.

    FLOOR: the OCP spec. byte = clamp(E(amax) - 8 + 127, 0, 254), where E is the unbiased fp32 exponent field.
        Scaled values can reach just under 512; those in (448, 512) saturate to 448.
    RCEIL: NVIDIA / cuBLAS, the default for MoE training. byte = ceil(log2(amax / 448)) + 127, from the fp32 bits of
        amax / 448; never saturates.
    """

    FLOOR = "floor"
    RCEIL = "rceil"

    @classmethod
    def parse(cls, mode: ScaleMode | str) -> ScaleMode:
        if isinstance(mode, cls):
            return mode
        try:
            return cls(str(mode).lower())
        except ValueError:
            raise InputError(f"mode must be 'floor' or 'rceil', got {mode!r}") from None


def _fp32_fields(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(biased exponent, mantissa) of an fp32 tensor, as int32."""
    bits = x.contiguous().view(torch.int32)
    return (bits >> 23) & 0xFF, bits & 0x7FFFFF


def scale_bytes_reference(amax: torch.Tensor, mode: ScaleMode | str) -> torch.Tensor:
    """Biased e8m0 scale byte (int32, 0..255) for each fp32 block maximum ``amax`` (any shape).

    A NaN or +Inf ``amax`` gives 255.
    """
    mode = ScaleMode.parse(mode)
    amax = amax.float()
    if mode is ScaleMode.FLOOR:
        exp, _ = _fp32_fields(amax)
        byte = (exp - E4M3_EMAX).clamp(0, E8M0_MAX_FINITE)
    else:
        exp, mant = _fp32_fields(amax / E4M3_MAX)
        normal = exp + (mant != 0).int()
        subnormal = (mant > 0x400000).int()
        byte = torch.where(exp > 0, normal, subnormal).clamp(0, E8M0_MAX_FINITE)
    return torch.where(torch.isfinite(amax), byte, torch.full_like(byte, E8M0_NAN))


def reciprocal_scale_reference(byte: torch.Tensor) -> torch.Tensor:
    """fp32 2**(127 - e) for finite scale bytes e in 0..254, built exactly from fp32 bits.

    e = 254 gives the subnormal 2**-127; e = 0 gives 2**127.
    """
    byte = byte.int()
    bits = torch.where(byte < E8M0_MAX_FINITE, (254 - byte) << 23, torch.full_like(byte, 0x400000))
    return bits.view(torch.float32)


def quantize_reference(x: torch.Tensor, mode: ScaleMode | str = ScaleMode.RCEIL) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (..., K) bf16 or fp32 to MXFP8 in blocks of 32 along the last dim.

    Returns ``(q, scales)``: q (..., K) ``float8_e4m3fn`` and scales (..., K // 32) ``float8_e8m0fnu``, both
    contiguous. A block holding a NaN or an Inf gets scale byte 255 and every data byte 0x7F (NaN); an all-zero block
    gets scale byte 0 and zero data. To quantize along another dim, move that dim last first (for example
    ``quantize_reference(x.t().contiguous())`` is the dim1 quantizer's oracle).
    """
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise InputError(f"x must be bfloat16 or float32, got {x.dtype}")
    K = x.shape[-1]
    if K % BLOCK_SIZE:
        raise InputError(f"the last dim of x must be a multiple of {BLOCK_SIZE}, got {K}")
    blocks = x.float().reshape(*x.shape[:-1], K // BLOCK_SIZE, BLOCK_SIZE)
    # NaN counts as +inf in the max, so a NaN block never hides behind a finite amax. (nan_to_num would map
    # +-inf to the largest finite float unless told otherwise.)
    inf = float("inf")
    amax = torch.nan_to_num(blocks, nan=inf, posinf=inf, neginf=-inf).abs().amax(dim=-1)
    byte = scale_bytes_reference(amax, mode)
    finite = byte != E8M0_NAN
    r = reciprocal_scale_reference(torch.where(finite, byte, torch.zeros_like(byte)))
    scaled = (blocks * r.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    q = scaled.to(DATA_DTYPE).view(torch.uint8)
    q = torch.where(finite.unsqueeze(-1), q, torch.full_like(q, E4M3_NAN_BYTE))
    q = q.reshape(x.shape).view(DATA_DTYPE)
    return q, byte.to(torch.uint8).view(SCALE_DTYPE)


def dequantize_reference(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 values of an MXFP8 pair: q (..., K) e4m3fn and scales (..., K // 32) e8m0 (or their uint8 bytes)."""
    byte = scales.view(torch.uint8).int()
    scale = torch.exp2((byte - E8M0_BIAS).float())
    scale = torch.where(byte == E8M0_NAN, torch.full_like(scale, float("nan")), scale)
    blocks = q.view(DATA_DTYPE).float().reshape(*q.shape[:-1], q.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    return (blocks * scale.unsqueeze(-1)).reshape(q.shape)
