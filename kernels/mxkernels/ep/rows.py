"""The calling contracts of the EP stages that move rows (``stages.ep_stages`` declares them): payload tensors, then
an index or counts tensor; each with the plain-torch oracle it is checked against. FP8 rowwise scales (M,) move as
rows of one fp32 (``rows``); MXFP8 and FP8 rowwise payloads are (data, scales) pairs moved together. And the
dequantizations of the *_a2a strategies' crossed rows (for their weight gradient).
"""

from __future__ import annotations

import torch

from ..core.cost import ceil_to
from ..core.format import BLOCK_SIZE, dequantize_reference
from ..gemm import dequant
from ..layouts import padding, scale_layout
from ..moe.token_permute import chunk_transpose_index, chunk_transpose_reference, gather_rows, gather_rows_reference


def rows(x: torch.Tensor) -> torch.Tensor:
    """A 2D row view: FP8 rowwise scales (M,) move as rows of one fp32."""
    return x.unsqueeze(1) if x.dim() == 1 else x


def like(r: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``r`` (2D rows) back in ``x``'s rank (1D scales stay 1D)."""
    return r.view(-1) if x.dim() == 1 else r


def gather(*args, top_k=1):
    *xs, index = args
    return tuple(like(gather_rows(rows(x), index, top_k), x) for x in xs)


def gather_reference(*args, top_k=1):
    *xs, index = args
    return tuple(like(gather_rows_reference(rows(x), index, top_k), x) for x in xs)


def permute(*args):
    *xs, counts = args
    index, ends = chunk_transpose_index(counts, xs[0].shape[0])
    return (*(like(gather_rows(rows(x), index), x) for x in xs), ends)


def permute_reference(*args):
    *xs, counts = args
    moved = [(like(y, x), ends) for x in xs for y, ends in (chunk_transpose_reference(rows(x), counts),)]
    return (*(x for x, _ in moved), moved[0][1])


def unpermute(x, counts):
    return permute(x, counts.t().contiguous())[:1]


def unpermute_reference(x, counts):
    return permute_reference(x, counts.t().contiguous())[:1]


def pad_pair(q, s, offs, *, alignment):
    q_p, offs_p = padding.pad_token_groups(q, offs, alignment)
    return q_p, like(padding.pad_token_groups(rows(s), offs, alignment)[0], s), offs_p


def pad_pair_reference(q, s, offs, *, alignment):
    q_p, offs_p = padding.pad_token_groups_reference(q, offs, alignment)
    return q_p, like(padding.pad_token_groups_reference(rows(s), offs, alignment)[0], s), offs_p


def dequantize_mx(q, sb, offs):
    return (dequant.dequantize_blocked(q, sb, offs, layout="m_groups"),)


def dequantize_mx_reference(q, sb, offs):
    """Each group's scales unblocked from its image (group g's from row sum_{j<g} ceil_128(size_j)), then the
    format's dequantization rounded to bf16; rows past offs[-1] zero."""
    out = torch.zeros(q.shape, dtype=torch.bfloat16, device=q.device)
    cols, image, start = q.shape[1] // BLOCK_SIZE, 0, 0
    for end in offs.tolist():
        rows = end - start
        scales = scale_layout.from_blocked(sb[image : image + ceil_to(rows, 128)], rows, cols)
        out[start:end] = dequantize_reference(q[start:end], scales).to(torch.bfloat16)
        image, start = image + ceil_to(rows, 128), end
    return (out,)


# ---------------------------------------------------------------------------------------------------------------


def dequantize_fp8(q, s):
    """q * scale in fp32, rounded to bf16 (the product of an e4m3 value and an fp32 scale is rounded twice: to fp32,
    then to bf16, as the GEMM's epilogue-free dequantization here does)."""
    return ((q.to(torch.float32) * s.unsqueeze(1)).to(torch.bfloat16),)


def dequantize_fp8_reference(q, s):
    """Written from the format: each e4m3 byte's value from its sign, exponent and mantissa bits (a 256-entry
    table), times its row's scale in fp32, rounded to bf16."""
    bits = torch.arange(256, dtype=torch.int32)
    sign = torch.where(bits >= 128, -1.0, 1.0).double()
    exp, man = (bits >> 3) & 0xF, (bits & 0x7).double()
    value = torch.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * torch.pow(2.0, (exp - 7).double())) * sign
    table = value.float().to(q.device)  # every e4m3 value is exact in fp32 (0x7f / 0xff are NaN: never produced)
    return ((table[q.view(torch.uint8).long()] * s.unsqueeze(1)).to(torch.bfloat16),)
