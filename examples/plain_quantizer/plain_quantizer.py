"""A plain-torch MXFP8 quantizer for mxbench's ``quantize_a`` stage: the README's "Benchmark your own kernel" example.

Contract (``mxbench impls --stage quantize_a``): ``quantize_a(a, *, mode) -> (a_q, a_s)``, a (M, K) bf16; a_q (M, K)
float8_e4m3fn; a_s (M, K/32) float8_e8m0fnu, one scale per 32 values along K (OCP MX v1.0).
"""

import torch


def quantize_a(a: torch.Tensor, *, mode: str = "rceil") -> tuple[torch.Tensor, torch.Tensor]:
    x = a.float().unflatten(-1, (-1, 32))
    amax = x.abs().nan_to_num(nan=float("inf"), posinf=float("inf")).amax(-1)
    if mode == "floor":  # E(amax) - 8, biased: the largest power of two with amax / scale < 512
        byte = ((amax.view(torch.int32) >> 23) - 8).clamp(0, 254)
    else:  # rceil: ceil(log2(amax / 448)), read off the fp32 bits of the quotient
        bits = (amax / torch.full_like(amax, 448.0)).view(torch.int32)
        exp, mantissa = bits >> 23, bits & 0x7FFFFF
        byte = torch.where(exp > 0, exp + (mantissa != 0).int(), (mantissa > 0x400000).int()).clamp(0, 254)
    bad = ~torch.isfinite(amax)  # a NaN or Inf anywhere: scale 255 (NaN) and NaN data
    reciprocal = torch.ldexp(torch.ones_like(amax), (127 - byte).float())
    q = (x * reciprocal.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    q = torch.where(bad.unsqueeze(-1), torch.full_like(q, float("nan")), q)
    scales = torch.where(bad, 255, byte).to(torch.uint8).view(torch.float8_e8m0fnu)
    return q.flatten(-2), scales


def register(registry) -> None:
    """The entry point mxbench calls (group ``mxbench.implementations`` in pyproject.toml)."""
    registry.register("quantize_a", quantize_a, name="plain_quantizer")
