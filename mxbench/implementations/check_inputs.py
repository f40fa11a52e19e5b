"""The inputs ``mxbench check`` holds implementations to: token groups and seeded tensors with adversarial blocks.

Every quantizer blocks along some dim of its input: the row quantizers along the last dim (K of a, N of grad_out,
K of w), the transposed ones along the token dim (M of a and grad_out: quantize_a_t, quantize_grad_out_t) and the
weights' along N (quantize_w_t). The adversarial blocks are planted along **each** of those dims, so every quantizer
meets all of them: all zero, NaN, +-Inf (MXFP8 only: FP8 rowwise requires finite input), values past and at the
e4m3 limit, fp32 subnormals (scale 2**-127), huge beside tiny, and values whose quantized form lands in e4m3's
subnormal range with halfway cases (a truncating or flushing quantizer differs there).

Each check runs the step on several ``Scenario``s of token groups: the requested M and G with an empty group and
groups of sizes off the alignment, and one with fewer tokens than experts (most groups empty, the rest tiny). The
padded step never hands its GEMMs fewer rows than experts (its buffer has room for every expert's padding), so the
step without padding (``pad=False``: ``mxbench check --no-pad``) is checked on its own scenarios: aligned groups, as
a permute that aligns them itself hands them over, at the requested M and G and, where the alignment allows it,
with fewer rows than experts (one aligned block of tokens in one expert).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from mxkernels.core.errors import InputError
from mxkernels.core.format import BLOCK_SIZE
from mxkernels.core.names import Recipe
from mxkernels.stages.pipeline import group_ends
from mxkernels.stages.step_specs import padding_alignment


@dataclass(frozen=True)
class Scenario:
    """One shape the step is checked at: M tokens over G experts; ``pad``: groups off the alignment and the padded
    step, else aligned groups and the step without padding."""

    M: int
    G: int
    pad: bool = True

    def label(self) -> str:
        return f"M={self.M} G={self.G}" + ("" if self.pad else " aligned, unpadded")


def scenarios(M: int, G: int, pad: bool = True, alignment: int = 1) -> tuple[Scenario, ...]:
    """The requested shape and, with several experts, one with fewer tokens than experts: padded, G - 1 tokens (an
    empty group and groups of one token); unpadded, ``alignment`` tokens (aligned groups: one block in one expert),
    so the GEMMs get fewer rows than experts."""
    few = Scenario(G - 1, G) if pad else Scenario(alignment, G, pad=False)
    given = Scenario(M, G, pad)
    return (given,) if G < 2 or few.M >= min(M, G) else (given, few)


def check_group_sizes(M: int, G: int, alignment: int, aligned: bool = False) -> list[int]:
    """Token-group sizes summing to M: group 0 empty (when G > 1) and the others uneven, off the alignment where M
    allows it, so the padding paths are exercised. ``aligned``: every size a multiple of the alignment (M must be
    one), for the step without padding, whose GEMMs see M rows: fewer than the experts where M < G."""
    if aligned and M % alignment:
        raise InputError(f"aligned token groups (--no-pad) need M a multiple of {alignment}, got {M}")
    if G == 1:
        return [M]
    rest = G - 1
    if aligned:
        base, extra = divmod(M // alignment, rest)
        return [0] + [(base + (g < extra)) * alignment for g in range(rest)]
    base, extra = divmod(M, rest)
    sizes = [0] + [base + (g < extra) for g in range(rest)]
    if rest > 1 and sizes[1] > alignment:
        shift = min(alignment // 2 + 1, sizes[2])  # move a few rows from group 2 to group 1: both go off-grid
        sizes[1] += shift
        sizes[2] -= shift
    return sizes


def _with(block: torch.Tensor, index: int, value: float) -> torch.Tensor:
    out = block.clone()
    out[index] = value
    return out


def special_blocks(finite_only: bool, max_abs: float = float("inf")) -> list[torch.Tensor]:
    """The adversarial MX blocks (32 values each), fp32; those with a finite value past ``max_abs`` left out (a
    layer's products of products overflow on them, and a GEMM's sum of infinities is not the contract's)."""
    ramp = torch.linspace(-3.0, 3.0, BLOCK_SIZE)
    # Scale 2**3 in both modes (amax 3584 = 448 * 2**3); the rest, k * 2**-7 = k/8 * 2**-9 after scaling, are
    # e4m3 subnormals (multiples of 2**-9 below 2**-6) with halfway cases, and the smallest normals.
    subnormal_out = torch.cat([torch.tensor([3584.0, -3584.0]), torch.arange(1, BLOCK_SIZE - 1) * 2.0**-7])
    blocks = [
        torch.zeros(BLOCK_SIZE),  # all zero: zero data, the smallest scale
        torch.linspace(-500.0, 500.0, BLOCK_SIZE),  # past the e4m3 limit: FLOOR saturates to 448
        torch.tensor([448.0, -448.0] * (BLOCK_SIZE // 2)),  # exactly at the limit
        torch.arange(1, BLOCK_SIZE + 1) * 2.0**-133,  # fp32 subnormals: scale 2**-127
        torch.tensor([1e30, 1e-30] * (BLOCK_SIZE // 2)),  # huge and tiny: the tiny ones flush to zero
        subnormal_out * torch.tensor([1.0, -1.0] * (BLOCK_SIZE // 2)),  # outputs in e4m3's subnormal range
    ]
    blocks = [b for b in blocks if float(b.abs().max()) <= max_abs]
    if not finite_only:
        blocks += [_with(ramp, 3, float("nan")), _with(ramp, 7, float("inf")), _with(ramp, 0, float("-inf"))]
    return blocks


def plant(x: torch.Tensor, row: int, rows: int, finite_only: bool, max_abs: float = float("inf")) -> None:
    """Adversarial blocks in the 2D ``x`` (in place), in the ``rows`` rows from ``row`` (one group's tokens, or
    one expert's weights): along the last dim in its first rows, and along the first dim (32 rows from the next
    multiple of 32 past them, one block per column), where the rows allow it."""
    specials = special_blocks(finite_only, max_abs)
    per_row = x.shape[1] // BLOCK_SIZE
    cells = [(row + i // per_row, (i % per_row) * BLOCK_SIZE) for i in range(len(specials))]
    for (r, c), block in zip(cells, specials):
        if r < row + rows:
            x[r, c : c + BLOCK_SIZE] = block.to(x.dtype)
    down = BLOCK_SIZE  # along dim 0: the group's second 32 rows (aligned wherever the group starts a padded slot)
    if rows >= down + BLOCK_SIZE:
        for c, block in enumerate(specials[: x.shape[1]]):
            x[row + down : row + down + BLOCK_SIZE, c] = block.to(x.dtype)


def check_inputs(recipe: str, M: int, N: int, K: int, G: int, *, device, seed: int = 0, pad: bool = True):
    """(inputs, group sizes): bf16 a (M, K), w (G, N, K), grad_out (M, N), int32 offs, seeded, with adversarial
    blocks (``plant``) in the first non-empty group of a and grad_out and in the first and last expert's weights.
    Without ``pad`` the groups are aligned (``check_group_sizes``)."""
    sizes = check_group_sizes(M, G, padding_alignment(recipe), aligned=not pad)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    w = (torch.randn(G, N, K, generator=gen) * K**-0.5).to(torch.bfloat16)
    grad_out = (torch.randn(M, N, generator=gen) * 1e-2).to(torch.bfloat16)
    g = next((g for g, s in enumerate(sizes) if s), 0)
    first = sum(sizes[:g])
    finite_only = Recipe(recipe) != Recipe.MXFP8
    plant(a, first, sizes[g], finite_only)
    plant(grad_out, first, sizes[g], True)  # one source of NaN per step keeps the backward's finite outputs checkable
    plant(w[0], 0, N, True)
    plant(w[-1].t(), 0, K, True)  # the other way round: along N first (the last dim of the view), then along K
    inputs = {"a": a.to(device), "w": w.to(device), "grad_out": grad_out.to(device), "offs": group_ends(sizes, device)}
    return inputs, sizes
