"""Fused stages of the MoE layer: a producer (the gather, SwiGLU, SwiGLU's backward) and the quantizer of its output
in one launch, where the layer would otherwise write a bf16 tensor and read it straight back to quantize it.

| fused call | the chain it replaces, bit for bit |
|---|---|
| ``gather_quantize_mxfp8(x, src, weight, offs, mode)`` | ``xs = gather_weighted(x, src, weight)``; ``quantize_dim0_blocked(xs, offs, mode)`` |
| ``swiglu_quantize_mxfp8(h1, h3, offs, mode)`` | ``act = swiglu(h1, h3)``; ``quantize_dim0_blocked(act, offs, mode)`` |
| ``swiglu_backward_quantize_mxfp8(grad_act, h1, h3, offs, mode)`` | ``(grad_h,) = swiglu_backward(..., packed=True)``; ``quantize_dim0_blocked(grad_h, offs, mode)`` |
| ``gather_quantize_fp8(x, src, weight, offs)`` | ``gather_weighted``; ``fp8_amax.quantize_fp8_rowwise_with_amax(xs, offs)`` |
| ``swiglu_quantize_fp8(h1, h3, offs)`` | ``swiglu``; ``quantize_fp8_rowwise_with_amax(act, offs)`` |
| ``swiglu_backward_quantize_fp8(grad_act, h1, h3, offs)`` | ``swiglu_backward`` packed; ``quantize_fp8_rowwise_with_amax(grad_h, offs)`` |

Each returns the bf16 tensor too (the weight-gradient GEMM's transposed quantizer reads it), then the quantizer's
outputs: MXFP8, the e4m3 data and the M-groups blocked scales; FP8 rowwise, the e4m3 data, the row scales and the
(G, C) column amax table, or, with ``offs=None``, no table (the chain's quantizer then ``quantize_fp8_rowwise(xs)``:
a layer whose weight gradients run in bf16 reads no column amax, and folding one costs atomics). What the fusion
saves is the quantizer's read of the bf16 tensor (2 bytes an element) and a launch; each ``*_cost`` says its bytes.

No kernel here: the quantizers' rows kernels (``quantize._quantize_rows_kernel`` with M-groups scales,
``fp8_amax._rows_amax_kernel``) take their tile from a *producer* passed as a constexpr jit function
(``block_math.load_rows``' signature), which here is the producer's own device function (``moe_rows.gather_producer``,
``swiglu.swiglu_producer``, ``swiglu.swiglu_backward_producer``): it computes the tile with the arithmetic of the
unfused kernel, writes it to the bf16 output and hands it to the quantizer, so both outputs are those of the chain,
bit for bit. The MXFP8 kernel walks the blocked buffer's rows; the rows past ``offs[-1]`` (in no group) ride in the
buffer's tail, which has room for them, so every row of the bf16 tensor is written, while their q rows are not, as
the unfused quantizer's are not. SwiGLU's backward takes ``swiglu.swiglu_backward_halves_producer`` in both
recipes' kernels (their HALVES lane order: each input column read, and its sigmoid computed, once for both halves of a
row). Launches: the quantizers' configs, passed as ``config=`` (MXFP8's backward also a ``WholeRowsConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ..core.block_math import Producer
from ..core.cost import Cost
from ..core.format import BLOCK_SIZE
from ..core.runtime import (INTERPRET, InputError, check_config, check_fields_power_of_two, check_group_offsets,
                            check_multiple, default_launch, launch_by_width)  # fmt: skip
from ..layouts.scale_layout import TILE_ROWS
from ..quant import fp8_amax, quantize, quantize_blocked
from . import swiglu
from .moe_rows import check_gather, gather_producer, gather_weighted_cost

_BF16 = torch.bfloat16

# The measured defaults (config=None): scripts/tune_layer_fused.py, first on an H100 at DeepSeek-V3's and Scout's
# widths, then on an H200 at the fine-grained models' too, with bf16 rounded by the hardware cast (numbers in
# docs/perf-log.md, "The fused layer stages at fine-grained widths"). MXFP8: one-warp programs of four 512-wide rows,
# best or near it for all three producers at every width measured (768-7168): a producer tile (a gathered row, or two
# halves of h) costs registers and loads that the plain quantizer's (32, 512) x 8 warps does not hide. FP8 rowwise
# (whole rows in registers, the column amax folded per program): up to 4096-wide rows, many small programs (one row a
# step, 16 4-warp programs an SM: ~16 elements a thread, so the hardware overlaps one program's loads with another's
# stores, as the plain rows quantizer's grid does, where a few large programs sit idle through each store); wider
# rows keep two 8-warp programs (DeepSeek-V3's 7168-wide weighted gather on the H200; Scout's widths on the H100 only).
# SwiGLU's backward (its producer computing both halves of a row from one read): 32 programs an SM up to 4096-wide
# rows, two 8-warp programs to 8192 (gpt-oss), two 16-warp programs at Scout's 16384 (the H100's). The plain
# quantizer's 80-register cap spills these producers catastrophically (Scout's backward, perf log).
MX_FUSED = quantize.RowsConfig(tile=(4, 512), num_warps=1)
# config=None under the interpreter (runtime.default_launch): a whole 128-row block per program.
_MX_LAUNCH = default_launch(MX_FUSED, quantize.INTERPRETER_ROWS)
FP8_NARROW = fp8_amax.AmaxRowsConfig(programs_per_sm=16, num_warps=4, block_rows=1)
# Rows wider than 4096: the gather's and SwiGLU's launch before (two 8-warp programs an SM; the H100's pick at
# DeepSeek-V3's and Scout's widths, DeepSeek-V3's 7168-wide weighted gather on the H200).
FP8_WIDE = fp8_amax.AmaxRowsConfig(programs_per_sm=2, num_warps=8)
FP8_SWIGLU_BWD = fp8_amax.AmaxRowsConfig(programs_per_sm=32, num_warps=4, block_rows=1)
FP8_SWIGLU_BWD_WIDE = fp8_amax.AmaxRowsConfig(programs_per_sm=2, num_warps=16)
# The launch classes by row width (``runtime.launch_by_width``).
FP8_ROWS = ((4096, FP8_NARROW), (fp8_amax.MAX_COLS, FP8_WIDE))  # the gather and SwiGLU
FP8_BACKWARD_ROWS = ((4096, FP8_SWIGLU_BWD), (8192, FP8_WIDE), (fp8_amax.MAX_COLS, FP8_SWIGLU_BWD_WIDE))
# Without the table (offs None) nothing is folded per program: 64 4-warp one-row programs an SM (a grid in waves, as
# the plain rows quantizer's) was best or within 8% of the best of every call at every width measured up to 7168
# (tune_layer_fused --recipes fp8_alone, an H200); wider rows keep the launches above (not measured).
FP8_ALONE = fp8_amax.AmaxRowsConfig(programs_per_sm=64, num_warps=4, block_rows=1)
FP8_ROWS_ALONE = ((8192, FP8_ALONE), (fp8_amax.MAX_COLS, FP8_WIDE))
FP8_BACKWARD_ROWS_ALONE = ((8192, FP8_ALONE), (fp8_amax.MAX_COLS, FP8_SWIGLU_BWD_WIDE))
_FP8_INTERPRETED = fp8_amax.AmaxRowsConfig(programs_per_sm=1)


@dataclass(frozen=True)
class WholeRowsConfig:
    """A launch of the MXFP8 rows kernel over whole rows (the tile's columns follow from the width: the next power of
    two of it): SwiGLU's backward in the kernel's HALVES lane order (``swiglu_backward_quantize_mxfp8``), the gather
    and SwiGLU in the plain one (``gather_quantize_mxfp8``, ``swiglu_quantize_mxfp8``)."""

    # Rows a program quantizes a step, a power of two (at most a 128-row block of the scales).
    block_rows: int = 1
    num_warps: int = 4
    # A program walks a whole 128-row block of the scales, block_rows a step, and looks its group up once (each
    # lookup loads and reduces the G group ends); else a program is one tile.
    walk: bool = True

    def __post_init__(self):
        check_fields_power_of_two(self, "block_rows", "num_warps")
        if self.block_rows > TILE_ROWS:
            raise InputError(f"WholeRowsConfig.block_rows must be at most {TILE_ROWS}, got {self.block_rows}")

    def rows_config(self, cols: int) -> quantize.RowsConfig:
        return quantize.RowsConfig(tile=(self.block_rows, max(triton.next_power_of_2(cols), 64)),
                                   num_warps=self.num_warps)  # fmt: skip


# SwiGLU's backward in MXFP8, computing each column once for both halves (tune_layer_fused --recipes mxfp8 --only
# swiglu_bwd on an H200; numbers in docs/perf-log.md): a program walks a 128-row block one row a step, four warps up
# to 2048-wide rows, eight above (the best of each fine-grained width measured, 64-128 groups). With few groups
# (DeepSeek-V3's 8, the one such shape measured) a one-row program's group lookup is cheap and one-row programs, four
# warps, ran faster. Under the interpreter, 32 rows a program (its time is its program count).
MX_HALVES_ROWS = ((2048, WholeRowsConfig(1, 4)), (2**30, WholeRowsConfig(1, 8)))
MX_HALVES_FEW_GROUPS = (8, ((2**30, WholeRowsConfig(1, 4, walk=False)),))
# SwiGLU's forward in MXFP8 (tune_layer_fused --recipes mxfp8 --only swiglu, an H200; numbers in docs/perf-log.md):
# whole rows of one row a step paid where the row fills its power-of-two lanes well enough: at 768 columns (128
# groups) 4-warp programs walking a scale block, 1.13x the chain against the column tiles' 0.92x; at 2048 columns
# with 8 groups, 2-warp one-row programs, 1.26x against 0.85x. At 1408 and 2880 columns (V2-Lite, gpt-oss) the
# column tiles were as fast or faster. Widths or group counts between those measured take the nearest measured class.
MX_SWIGLU_ROWS = ((1024, WholeRowsConfig(1, 4)), (2**30, MX_FUSED))
MX_SWIGLU_FEW_GROUPS = (8, ((4096, WholeRowsConfig(1, 2, walk=False)), (2**30, MX_FUSED)))
# The columns whose scales fill a row of the blocked buffer (its scale columns come in fours). The halves launch takes
# widths of whole such rows: each half whole 32-blocks, and no padding scale column for the kernel to write.
_BLOCKED_ROW = 4 * BLOCK_SIZE
_MX_HALVES_INTERPRETED = WholeRowsConfig(32, 4)


def _mx_default(few_groups, rows, offs, width: int):
    """A launch table's pick for ``width``-column rows: ``few_groups`` = (up to this many groups, their table), else
    ``rows``. The group count only picks: ``_mxfp8`` validates ``offs`` (a non-tensor fails there, with its message)."""
    few, table = few_groups
    groups = offs.numel() if isinstance(offs, torch.Tensor) else 0
    return launch_by_width(table if groups <= few else rows, width)


def _mxfp8(out: torch.Tensor, offs: torch.Tensor, mode, config, producer: Producer, halves: bool = False):
    """The MXFP8 rows kernel over the producer's rows: ``config`` a ``RowsConfig`` (column tiles) or a
    ``WholeRowsConfig`` (whole rows, in the HALVES lane order if ``halves``)."""
    check_multiple("the output", out.shape[1], BLOCK_SIZE, "its width (the blocked dim)")
    offs = check_group_offsets(offs, out, out.shape[0])
    check_config("config", config, (quantize.RowsConfig, WholeRowsConfig))
    walk = False
    if isinstance(config, WholeRowsConfig):  # the row's blocks and the blocked scales' padding column blocks
        config, walk = config.rows_config(-(-out.shape[1] // _BLOCKED_ROW) * _BLOCKED_ROW), config.walk
    q, s = quantize._quantize_rows(out, mode, config or _MX_LAUNCH, "m_groups", offs=offs, producer=producer,
                                   halves=halves, walk=walk)  # fmt: skip
    return out, q, s


def _fp8_launch(table, cols: int) -> fp8_amax.AmaxRowsConfig | None:
    """The FP8 default for rows of ``cols``: its class in ``table``; under the interpreter (whose time is its
    program count) one program an SM."""
    return _FP8_INTERPRETED if INTERPRET else launch_by_width(table, cols)


def _fp8(out: torch.Tensor, offs: torch.Tensor | None, config, producer: Producer, halves: bool = False):
    """The FP8 fused call's outputs: (out, q, scale, amax) folding ``offs``' groups; (out, q, scale) for None."""
    if offs is not None:
        offs = check_group_offsets(offs, out, out.shape[0])
    check_config("config", config, fp8_amax.AmaxRowsConfig)
    groups = 0 if offs is None else offs.numel()
    return (out, *fp8_amax._rows_with_amax(out, offs, groups, 1, config, producer, halves))


def _gather(x, src, weight) -> tuple[torch.Tensor, Producer]:
    x, src, weight = check_gather(x, src, weight)
    out = torch.empty(src.numel(), x.shape[1], dtype=_BF16, device=x.device)
    w = weight if weight is not None else src
    return out, Producer(gather_producer, x.view(torch.int16), src, w, variant=weight is not None)


def _swiglu(h1, h3) -> tuple[torch.Tensor, Producer]:
    h1, h3 = swiglu.check_halves(h1, h3)
    out = torch.empty(h1.shape, dtype=_BF16, device=h1.device)
    return out, Producer(swiglu.swiglu_producer, h1, h3, h1, h1.stride(0), h3.stride(0))


def _swiglu_backward(grad_act, h1, h3) -> tuple[torch.Tensor, Producer]:
    grad_act, h1, h3 = swiglu.check_backward(grad_act, h1, h3)
    out = torch.empty(h1.shape[0], 2 * h1.shape[1], dtype=_BF16, device=h1.device)
    return out, Producer(swiglu.swiglu_backward_producer, h1, h3, grad_act, h1.stride(0), h3.stride(0))


# ---- MXFP8: the bf16 tensor, its e4m3 data (M, C) and M-groups blocked scales ---------------------------------


def gather_quantize_mxfp8(x, src, weight, offs, mode="rceil", *,
                          config: quantize.RowsConfig | WholeRowsConfig | None = None):  # fmt: skip
    """(xs, xs_q, xs_sb): ``xs = moe_rows.gather_weighted(x, src, weight)`` (R, D) bf16 and
    ``quantize_blocked.quantize_dim0_blocked(xs, offs, mode)``. D a multiple of 32; offs int32 (G,) group ends over
    the R rows. ``config``: the rows kernel's launch, column tiles or whole rows (None: ``MX_FUSED``)."""
    out, producer = _gather(x, src, weight)
    return _mxfp8(out, offs, mode, config, producer)


def swiglu_quantize_mxfp8(h1, h3, offs, mode="rceil", *, config: quantize.RowsConfig | WholeRowsConfig | None = None):
    """(act, act_q, act_sb): ``act = swiglu.swiglu(h1, h3)`` (M, N) bf16 and ``quantize_dim0_blocked(act, offs,
    mode)``. h1, h3 as ``swiglu`` takes them (views of one (M, 2N) output are fine); N a multiple of 32. ``config``:
    the rows kernel's launch (None: ``MX_SWIGLU_FEW_GROUPS``' class for up to its groups, else ``MX_SWIGLU_ROWS``'
    by N; under the interpreter ``MX_FUSED``'s)."""
    out, producer = _swiglu(h1, h3)
    if config is None and not INTERPRET:
        config = _mx_default(MX_SWIGLU_FEW_GROUPS, MX_SWIGLU_ROWS, offs, out.shape[1])
    return _mxfp8(out, offs, mode, config, producer)


def swiglu_backward_quantize_mxfp8(grad_act, h1, h3, offs, mode="rceil", *,
                                   config: quantize.RowsConfig | WholeRowsConfig | None = None):  # fmt: skip
    """(grad_h, gh_q, gh_sb): ``(grad_h,) = swiglu.swiglu_backward(grad_act, h1, h3, packed=True)`` (M, 2N) bf16 and
    ``quantize_dim0_blocked(grad_h, offs, mode)``. 2N a multiple of 32. ``config``: a ``WholeRowsConfig`` (each column
    computed once for both halves; 2N a multiple of 128) or a ``RowsConfig`` (column tiles, each half's lanes
    computed apart); None where 2N is a multiple of 128: ``MX_HALVES_FEW_GROUPS``' class for up to its groups,
    else ``MX_HALVES_ROWS``'; ``MX_FUSED`` otherwise."""
    out, producer = _swiglu_backward(grad_act, h1, h3)
    width = out.shape[1]
    check_config("config", config, (quantize.RowsConfig, WholeRowsConfig))
    if config is None and width % _BLOCKED_ROW == 0:
        config = _MX_HALVES_INTERPRETED if INTERPRET else _mx_default(MX_HALVES_FEW_GROUPS, MX_HALVES_ROWS, offs, width)
    if not isinstance(config, WholeRowsConfig):
        return _mxfp8(out, offs, mode, config, producer)
    if width % _BLOCKED_ROW:
        raise InputError(f"the halves launch takes 2N a multiple of {_BLOCKED_ROW} (each half whole 32-blocks, "
                         f"and no padding columns in the blocked scales), got 2N = {width}; "
                         "pass a RowsConfig")  # fmt: skip
    halves = producer._replace(fn=swiglu.swiglu_backward_halves_producer)
    return _mxfp8(out, offs, mode, config, halves, halves=True)


# ---- FP8 rowwise: the bf16 tensor, its e4m3 data, row scales (M,) and the (G, C) column amax table ------------


def _fp8_default(tables, out: torch.Tensor, offs: torch.Tensor | None) -> fp8_amax.AmaxRowsConfig | None:
    """The default launch for ``out``'s rows from ``tables`` = (with the table, without)."""
    return _fp8_launch(tables[offs is None], out.shape[1])


def gather_quantize_fp8(x, src, weight, offs, *, config: fp8_amax.AmaxRowsConfig | None = None):
    """(xs, xs_q, xs_s, xs_amax): ``xs = gather_weighted(x, src, weight)`` and
    ``fp8_amax.quantize_fp8_rowwise_with_amax(xs, offs)``; offs None: (xs, xs_q, xs_s), ``xs``'s
    ``fp8_rowwise.quantize_fp8_rowwise`` without the table (the layer whose weight gradients run in bf16 reads
    none). ``config``: that kernel's launch (None: its class of ``FP8_ROWS``, or without the table
    ``FP8_ROWS_ALONE``)."""
    out, producer = _gather(x, src, weight)
    return _fp8(out, offs, config or _fp8_default((FP8_ROWS, FP8_ROWS_ALONE), out, offs), producer)


def swiglu_quantize_fp8(h1, h3, offs, *, config: fp8_amax.AmaxRowsConfig | None = None):
    """(act, act_q, act_s, act_amax): ``act = swiglu(h1, h3)`` and ``quantize_fp8_rowwise_with_amax(act, offs)``;
    offs None: (act, act_q, act_s), no table (``gather_quantize_fp8``)."""
    out, producer = _swiglu(h1, h3)
    return _fp8(out, offs, config or _fp8_default((FP8_ROWS, FP8_ROWS_ALONE), out, offs), producer)


def swiglu_backward_quantize_fp8(grad_act, h1, h3, offs, *, config: fp8_amax.AmaxRowsConfig | None = None):
    """(grad_h, gh_q, gh_s, gh_amax): the packed ``swiglu_backward`` and ``quantize_fp8_rowwise_with_amax(grad_h,
    offs)``; offs None: (grad_h, gh_q, gh_s), no table (``gather_quantize_fp8``)."""
    out, producer = _swiglu_backward(grad_act, h1, h3)
    halves = producer._replace(fn=swiglu.swiglu_backward_halves_producer)
    config = config or _fp8_default((FP8_BACKWARD_ROWS, FP8_BACKWARD_ROWS_ALONE), out, offs)
    return _fp8(out, offs, config, halves, halves=True)


# ---- costs: the producer's reads, and the writes of both; the chain also reads the bf16 tensor back -------------


def _fused(producer: Cost, quantizer: Cost) -> Cost:
    """The producer's reads (and re-reads) and both writes: the chain's bytes less the quantizer's read of the bf16
    tensor."""
    return Cost(producer.bytes_read, producer.bytes_written + quantizer.bytes_written,
                bytes_reread=producer.bytes_reread)  # fmt: skip


def gather_quantize_mxfp8_cost(
    R: int, D: int, G: int, tokens_rows: int, weighted: bool, *, sources: int | None = None
) -> Cost:
    """``gather_quantize_mxfp8`` of R rows of D (``tokens_rows`` copies gathered from ``sources`` distinct rows, as
    ``gather_weighted_cost``) in G groups. Saves R * D * 2 bytes (the quantizer's read of xs) against the chain."""
    return _fused(gather_weighted_cost(R, D, tokens_rows, weighted, sources=sources),
                  quantize_blocked.quantize_dim0_blocked_cost(R, D, G, _BF16))  # fmt: skip


def swiglu_quantize_mxfp8_cost(M: int, N: int, G: int) -> Cost:
    """``swiglu_quantize_mxfp8`` of (M, N) in G groups: read h1 and h3, write act, its e4m3 and the blocked
    scales. Saves M * N * 2 bytes (the read of act)."""
    return _fused(swiglu.swiglu_cost(M, N), quantize_blocked.quantize_dim0_blocked_cost(M, N, G, _BF16))


def swiglu_backward_quantize_mxfp8_cost(M: int, N: int, G: int) -> Cost:
    """``swiglu_backward_quantize_mxfp8`` of (M, N) in G groups: read grad_act, h1, h3 (once from device memory:
    the second half's programs find them in L2), write grad_h (M, 2N), its e4m3 and the blocked scales. Saves
    M * 2N * 2 bytes (the read of grad_h)."""
    return _fused(swiglu.swiglu_backward_cost(M, N), quantize_blocked.quantize_dim0_blocked_cost(M, 2 * N, G, _BF16))


def gather_quantize_fp8_cost(
    R: int, D: int, G: int, tokens_rows: int, weighted: bool, *, sources: int | None = None
) -> Cost:
    """``gather_quantize_fp8``: the gather's reads, xs, its e4m3, R fp32 scales and the (G, D) amax table (G 0:
    offs None, no table). Saves R * D * 2 bytes."""
    return _fused(gather_weighted_cost(R, D, tokens_rows, weighted, sources=sources), fp8_amax.with_amax_cost(R, D, G, _BF16))


def swiglu_quantize_fp8_cost(M: int, N: int, G: int) -> Cost:
    """``swiglu_quantize_fp8``: read h1, h3; write act, its e4m3, M scales, the (G, N) table (G 0: none). Saves
    M * N * 2."""
    return _fused(swiglu.swiglu_cost(M, N), fp8_amax.with_amax_cost(M, N, G, _BF16))


def swiglu_backward_quantize_fp8_cost(M: int, N: int, G: int) -> Cost:
    """``swiglu_backward_quantize_fp8``: read grad_act, h1, h3; write grad_h (M, 2N), its e4m3, M scales, the
    (G, 2N) table (G 0: none). Saves M * 2N * 2."""
    return _fused(swiglu.swiglu_backward_cost(M, N), fp8_amax.with_amax_cost(M, 2 * N, G, _BF16))
