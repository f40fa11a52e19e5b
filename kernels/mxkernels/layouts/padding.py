"""Token groups: padding each group to an aligned slot and back, and the group arithmetic the layouts share.

Token groups are given by ``offs``, int32 (G,), the cumulative **end** row of each group: group g is rows
[offs[g-1], offs[g]) (group 0 starts at row 0), groups may be empty, and rows past the last end belong to no
group. Padding gives
group g a slot of ceil_a(size_g) rows (a = the alignment), slots back to back from row 0, its rows at the start of
the slot and zeros after them, in a buffer sized by the upper bound ceil_a(M + a*G) so that no kernel needs the group
sizes on the host. Every kernel here reads ``offs`` on the device only: no device-to-host sync, so each call can be
captured in a CUDA graph and replayed with new offsets written into the same tensor. Both copies take their launch
as a ``PadConfig`` (``config=None``: ``default_pad_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..core.cost import Cost, ceil_to
from ..core.runtime import (
    InputError,
    check_config,
    check_fields_power_of_two,
    check_host_offsets,
    check_offsets,
    check_same_device,
    check_tensor,
    default_launch,
)

ALIGNMENTS = (16, 32, 128)
# Copies move raw bits: an integer view of the same width makes every float dtype (fp8 included) a plain copy.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---- group arithmetic on the device, shared with the layouts -------------------------------------------------


@triton.jit
def group_bounds(offs_ptr, G, limit, BLOCK_G: tl.constexpr):
    """(start, size) of each group as BLOCK_G int32 lanes; lanes >= G hold (0, 0).

    Group ends are clamped to [0, limit] and sizes to >= 0, so malformed offs (never checked on the device: that
    would need a host read) give unspecified contents but never an address outside rows [0, limit).
    """
    lane = tl.arange(0, BLOCK_G)
    ends = tl.load(offs_ptr + lane, mask=lane < G, other=0)
    starts = tl.load(offs_ptr + lane - 1, mask=(lane > 0) & (lane < G), other=0)
    ends = tl.minimum(tl.maximum(ends, 0), limit)
    starts = tl.minimum(tl.maximum(starts, 0), limit)
    return starts, tl.maximum(ends - starts, 0)


@triton.jit
def pick(values, index, BLOCK_G: tl.constexpr):
    """values[index] of a BLOCK_G vector as a scalar; 0 when index >= BLOCK_G."""
    return tl.sum(tl.where(tl.arange(0, BLOCK_G) == index, values, 0), 0)


@triton.jit
def locate(lengths, pos, BLOCK_G: tl.constexpr):
    """Slots of the given lengths (>= 0) lie back to back from 0: (the slot holding ``pos``, pos - its start).

    Past the last slot the index is BLOCK_G: everything picked with it is 0 and the offset is pos itself.
    """
    ends = tl.cumsum(lengths, 0)
    index = tl.sum((ends <= pos).to(tl.int32), 0)
    return index, pos - pick(ends - lengths, index, BLOCK_G)


# ---- padding ------------------------------------------------------------------------------------------------


def padded_rows(num_tokens: int, num_groups: int, alignment: int) -> int:
    """Rows of the padded buffer: ceil_a(M + a*G), the most that G slots of ceil_a(size_g) rows can need."""
    return ceil_to(num_tokens + alignment * num_groups, alignment)


@triton.jit
def _pad_kernel(
    x_ptr, offs_ptr, out_ptr, padded_offs_ptr, M, D, G,
    ALIGN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_M padded rows x BLOCK_D columns. BLOCK_M divides ALIGN, so its rows lie in one slot.
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    slots = tl.cdiv(sizes, ALIGN) * ALIGN
    if (pid_m == 0) & (pid_d == 0):
        lane = tl.arange(0, BLOCK_G)
        tl.store(padded_offs_ptr + lane, tl.cumsum(slots, 0), mask=lane < G)
    row0 = pid_m * BLOCK_M
    g, local = locate(slots, row0, BLOCK_G)
    n_rows = pick(sizes, g, BLOCK_G) - local  # <= 0 in a slot's padding and past the last slot
    src_row = pick(starts, g, BLOCK_G) + local
    rows = tl.arange(0, BLOCK_M)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    in_cols = (cols < D)[None, :]
    src = x_ptr + (src_row + rows).to(tl.int64)[:, None] * D + cols[None, :]
    values = tl.load(src, mask=(rows < n_rows)[:, None] & in_cols, other=0)
    dst = out_ptr + (row0 + rows).to(tl.int64)[:, None] * D + cols[None, :]
    tl.store(dst, values, mask=in_cols)


@triton.jit
def _unpad_kernel(
    padded_ptr, offs_ptr, padded_offs_ptr, out_ptr, num_tokens, num_padded, D, G,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_M output rows x BLOCK_D columns; groups are unaligned, so each row finds its own group.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    lane = tl.arange(0, BLOCK_G)
    ends = tl.load(offs_ptr + lane, mask=lane < G, other=0)
    g = tl.sum(((ends[None, :] <= rows[:, None]) & (lane < G)[None, :]).to(tl.int32), 1)
    in_group = g < G  # rows past offs[-1] belong to no group: they come out zero
    previous = in_group & (g > 0)
    start = tl.load(offs_ptr + g - 1, mask=previous, other=0)
    slot_start = tl.load(padded_offs_ptr + g - 1, mask=previous, other=0)
    src_row = slot_start + rows - start
    valid = in_group & (src_row >= 0) & (src_row < num_padded)
    in_cols = (cols < D)[None, :]
    src = padded_ptr + src_row.to(tl.int64)[:, None] * D + cols[None, :]
    values = tl.load(src, mask=valid[:, None] & in_cols, other=0)
    dst = out_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :]
    tl.store(dst, values, mask=(rows < num_tokens)[:, None] & in_cols)


@dataclass(frozen=True)
class PadConfig:
    """One launch of the pad or unpad kernel: a program copies block_rows x block_cols elements."""

    # Rows per program, a power of two. Padding also needs it to divide the alignment, so that a program's rows lie
    # in one slot and it looks up one group; unpadding looks up each row's group.
    block_rows: int
    # Elements of each row per program, a power of two (the copy is a plain bit copy of 1-, 2-, 4- or 8-byte lanes).
    block_cols: int
    # Warps per program.
    num_warps: int

    def __post_init__(self):
        check_fields_power_of_two(self, "block_rows", "block_cols", "num_warps")


# The measured default (config=None): 4 KiB of each row (whole rows when narrower), 8 rows and 8 warps per program,
# for any element size. Chosen by scripts/tune_layouts.py; see docs/perf-log.md.
_ROW_BYTES, _ROWS, _WARPS = 4096, 8, 8


def default_pad_config(D: int, element_size: int) -> PadConfig:
    """The launch padding or unpadding rows of D elements of ``element_size`` bytes uses when none is given."""
    return PadConfig(_ROWS, min(triton.next_power_of_2(max(D, 1)), _ROW_BYTES // element_size), _WARPS)


def _check_alignment(alignment: int) -> int:
    if alignment not in ALIGNMENTS:
        raise InputError(f"alignment must be one of {ALIGNMENTS}, got {alignment!r}")
    return alignment


def _check_rows(x: object, name: str) -> torch.Tensor:
    x = check_tensor(name, x, ndim=2)
    if not x.dtype.is_floating_point or x.element_size() not in _BITS:
        raise InputError(f"{name} must have a floating-point dtype, got {x.dtype}")
    return x


def _launch(x: torch.Tensor, config: object, rows: int) -> PadConfig:
    """``config``, or the default; under the interpreter (``runtime.default_launch``) with ``rows`` rows a program."""
    check_config("config", config, PadConfig)
    if config is not None:
        return config
    measured = default_pad_config(x.shape[1], x.element_size())
    return default_launch(measured, replace(measured, block_rows=rows))


def pad_token_groups(
    x: torch.Tensor, offs: torch.Tensor, alignment: int = 32, *, config: PadConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy each token group of ``x`` to the start of an aligned slot.

    x: (M, D), any floating-point dtype, row-major. offs: int32 (G,) group ends (see the module docstring).
    Returns ``(padded, padded_offs)``: padded (ceil_a(M + a*G), D), x's dtype, row-major, group g's rows at the
    start of slot g (slot = ceil_a(size_g) rows, slots back to back from row 0), zero everywhere else including the
    tail after the last slot; padded_offs int32 (G,), the cumulative slot ends (computed on the device). Rows of x
    past offs[-1] are not copied. ``config``: the launch (None: ``default_pad_config``); its block_rows must divide
    the alignment.
    """
    alignment = _check_alignment(alignment)
    x = _check_rows(x, "x")
    offs = check_offsets(offs)
    check_same_device("offs", offs, x)
    check_host_offsets(offs, x.shape[0])
    config = _launch(x, config, alignment)  # at most the alignment, as a program's rows must lie in one slot
    if config.block_rows > alignment:
        raise InputError(f"config.block_rows must divide the alignment {alignment}, got {config.block_rows}")
    (M, D), G = x.shape, offs.numel()
    bits = _BITS[x.element_size()]
    padded = torch.empty(padded_rows(M, G, alignment), D, dtype=bits, device=x.device)
    padded_offs = torch.empty(G, dtype=torch.int32, device=x.device)
    # At least one column program even when D = 0: program (0, 0) writes padded_offs.
    grid = (padded.shape[0] // config.block_rows, max(triton.cdiv(D, config.block_cols), 1))
    _pad_kernel[grid](
        x.view(bits), offs, padded, padded_offs, M, D, G,
        ALIGN=alignment, BLOCK_M=config.block_rows, BLOCK_D=config.block_cols, BLOCK_G=triton.next_power_of_2(G),
        num_warps=config.num_warps,
    )  # fmt: skip
    return padded.view(x.dtype), padded_offs


def unpad_token_groups(
    padded: torch.Tensor,
    offs: torch.Tensor,
    padded_offs: torch.Tensor,
    num_tokens: int,
    *,
    config: PadConfig | None = None,
) -> torch.Tensor:
    """Inverse of ``pad_token_groups``: gather each group's rows back from its slot.

    padded: (P, D) any floating-point dtype, row-major; offs, padded_offs: int32 (G,) as given to and returned by
    ``pad_token_groups``. Returns (num_tokens, D), padded's dtype, row-major: row i of group g is padded row
    padded_offs[g-1] + (i - offs[g-1]). Rows past offs[-1] are zero. ``config``: the launch (None:
    ``default_pad_config``).
    """
    padded = _check_rows(padded, "padded")
    offs = check_offsets(offs)
    padded_offs = check_offsets(padded_offs, name="padded_offs")
    if padded_offs.shape != offs.shape:
        raise InputError(f"padded_offs must have the shape of offs {tuple(offs.shape)}, got {tuple(padded_offs.shape)}")
    if not isinstance(num_tokens, int) or num_tokens < 0:
        raise InputError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
    check_same_device("offs", offs, padded)
    check_same_device("padded_offs", padded_offs, padded)
    check_host_offsets(offs, num_tokens)
    check_host_offsets(padded_offs, padded.shape[0], name="padded_offs")
    config = _launch(padded, config, 128)
    (P, D), G = padded.shape, offs.numel()
    bits = _BITS[padded.element_size()]
    out = torch.empty(num_tokens, D, dtype=bits, device=padded.device)
    if out.numel():
        grid = (triton.cdiv(num_tokens, config.block_rows), triton.cdiv(D, config.block_cols))
        _unpad_kernel[grid](
            padded.view(bits), offs, padded_offs, out, num_tokens, P, D, G,
            BLOCK_M=config.block_rows, BLOCK_D=config.block_cols, BLOCK_G=triton.next_power_of_2(G),
            num_warps=config.num_warps,
        )  # fmt: skip
    return out.view(padded.dtype)


# ---- references ---------------------------------------------------------------------------------------------


def pad_token_groups_reference(
    x: torch.Tensor, offs: torch.Tensor, alignment: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch ``pad_token_groups`` (reads offs on the host)."""
    alignment = _check_alignment(alignment)
    ends = offs.tolist()
    padded = torch.zeros(padded_rows(x.shape[0], len(ends), alignment), x.shape[1], dtype=x.dtype, device=x.device)
    slot_ends, start, slot = [], 0, 0
    for end in ends:
        padded[slot : slot + end - start] = x[start:end]
        slot += ceil_to(end - start, alignment)
        slot_ends.append(slot)
        start = end
    return padded, torch.tensor(slot_ends, dtype=torch.int32, device=x.device)


def unpad_token_groups_reference(
    padded: torch.Tensor, offs: torch.Tensor, padded_offs: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Plain-torch ``unpad_token_groups`` (reads offs and padded_offs on the host)."""
    out = torch.zeros(num_tokens, padded.shape[1], dtype=padded.dtype, device=padded.device)
    start, slot = 0, 0
    for end, slot_end in zip(offs.tolist(), padded_offs.tolist()):
        out[start:end] = padded[slot : slot + end - start]
        start, slot = end, slot_end
    return out


# ---- costs --------------------------------------------------------------------------------------------------


def _data_rows(M: int, G: int, group_sizes) -> int:
    """Rows that lie in some group: all M unless the host-side group sizes say the groups end earlier."""
    if group_sizes is None:
        return M
    sizes = list(group_sizes)
    if len(sizes) != G or min(sizes, default=0) < 0 or sum(sizes) > M:
        raise InputError(f"group_sizes must be {G} sizes >= 0 summing to at most M = {M}, got {sizes}")
    return sum(sizes)


def pad_cost(M: int, D: int, G: int, alignment: int, elt: int, group_sizes=None) -> Cost:
    """``pad_token_groups`` of an (M, D) tensor of ``elt``-byte elements in G groups.

    Reads the rows that lie in groups (all M by default) and offs; writes the whole padded buffer, zero rows
    included, and padded_offs.
    """
    _check_alignment(alignment)
    offsets = 4 * G
    return Cost(_data_rows(M, G, group_sizes) * D * elt + offsets, padded_rows(M, G, alignment) * D * elt + offsets)


def unpad_cost(M: int, D: int, G: int, alignment: int, elt: int, group_sizes=None) -> Cost:
    """``unpad_token_groups`` back to (M, D): reads only the rows that hold data (padding rows are never touched,
    so the alignment does not change the count; it is taken for symmetry with ``pad_cost``) plus offs and
    padded_offs; writes all M rows."""
    _check_alignment(alignment)
    return Cost(_data_rows(M, G, group_sizes) * D * elt + 2 * 4 * G, M * D * elt)
