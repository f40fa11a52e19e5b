"""Specification of ``block_math.to_bf16_bits``, the fp32 -> bf16 rounding of every kernel that writes bf16 it
computed (the weighted gather and the combine, SwiGLU and its backward, and their fused stages).

Both paths round to nearest even and overflow to Inf, bit for bit as torch's cast: the integer path (EXACT, the
interpreter's) on any device, the hardware cast on a GPU. A NaN stays a NaN: the integer path keeps its sign and
payload (quieted), the hardware one writes the canonical 0x7FFF. The GPU path must compile to the hardware cast, not
to the integer arithmetic (ten operations an element, which made those kernels instruction-bound on an H200).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from crosscompile import compile_ptx
from mxkernels.core.block_math import to_bf16_bits


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EXACT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, to_bf16_bits(tl.load(x_ptr + offs, mask=mask, other=0.0), EXACT), mask=mask)


def round_bits(x: torch.Tensor, exact: bool) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.int16, device=x.device)
    block = 1 << 16 if x.device.type == "cpu" else 1024
    _round_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block, EXACT=exact)
    return out


def sweep() -> torch.Tensor:
    """fp32 bit patterns of both signs: every exponent with low halves around the tie (0x8000) and its neighbours,
    mantissas that carry into the exponent, the subnormals' first 1024 and the largest finite values (overflow to
    Inf on rounding), Inf, and 2**20 random finite patterns."""
    gen = torch.Generator().manual_seed(5)
    exps = torch.arange(0, 255, dtype=torch.int64)[:, None] << 23
    highs = torch.tensor([0, 1, 2, 0x7E, 0x7F], dtype=torch.int64)[:, None] << 16
    lows = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)
    grid = (exps[:, :, None] | highs[None, :, :] | lows[None, None, :]).flatten()
    top = 0x7F7FFFFF - torch.arange(0, 1 << 16, 7, dtype=torch.int64)
    special = torch.cat([torch.arange(0, 1024, dtype=torch.int64), top, torch.tensor([0x7F800000])])
    rand = torch.randint(0, 0x7F800000, (1 << 20,), generator=gen, dtype=torch.int64)
    pos = torch.cat([grid, special, rand]).to(torch.int32)
    return torch.cat([pos, pos | torch.tensor(-(2**31), dtype=torch.int32)]).view(torch.float32)


@pytest.mark.parametrize("exact", [True, pytest.param(False, marks=pytest.mark.gpu)], ids=["exact", "hardware"])
def test_rounding_matches_torch(exact, device):
    x = sweep()
    got = round_bits(x.to(device), exact).cpu()
    want = x.to(torch.bfloat16).view(torch.int16)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} patterns differ, first {x.view(torch.int32)[bad[:4]].tolist()}"


@pytest.mark.parametrize("exact", [True, pytest.param(False, marks=pytest.mark.gpu)], ids=["exact", "hardware"])
def test_nan_stays_nan(exact, device):
    nans = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, -0x00400000, -0x007FFFFF], dtype=torch.int32)
    got = round_bits(nans.view(torch.float32).to(device), exact).cpu().to(torch.int32) & 0xFFFF
    assert ((got & 0x7F80) == 0x7F80).all() and ((got & 0x7F) != 0).all(), [hex(v) for v in got.tolist()]
    if exact:  # sign and payload kept, quieted
        assert got.tolist() == [0x7FC0, 0x7FC0, 0x7FFF, 0xFFC0, 0xFFC0]
    else:
        assert got.tolist() == [0x7FFF] * 5


def test_gpu_path_compiles_to_the_hardware_cast():
    """SM90 PTX of the weighted gather: the hardware cast without EXACT, none with it (the integer rounding)."""
    signature = {"x_ptr": "*i16", "index_ptr": "*i32", "weight_ptr": "*fp32", "out_ptr": "*i16", "rows_out": "i32",
                 "D": "i32", "TOPK": "constexpr", "WEIGHTED": "constexpr", "BLOCK_M": "constexpr",
                 "BLOCK_D": "constexpr", "EXACT": "constexpr"}  # fmt: skip
    ptx = {exact: compile_ptx("mxkernels.moe.moe_rows", "_gather_kernel", signature,
                              {"TOPK": 1, "WEIGHTED": True, "BLOCK_M": 8, "BLOCK_D": 256, "EXACT": exact}, 90,
                              options={"enable_fp_fusion": False})
           for exact in (False, True)}  # fmt: skip
    assert "cvt.rn.bf16x2.f32" in ptx[False] or "cvt.rn.bf16.f32" in ptx[False]
    assert "cvt.rn.bf16" not in ptx[True]
