"""The FP8 rowwise recipe's holding kernel: column-scale quantizers for fine-grained experts and groups.

``fp8_colwise``'s kernels read each element twice (an amax pass, then the scale and cast), because a column's scale
spans all of a group's rows (2048 to all M), more than a program holds. At fine-grained shapes (128 experts of
1536-2048 rows along N; 128 token groups of ~1024 rows) a strip of a group's rows fits one program's registers
whole: 2048 rows x 16 columns x 2 bytes = 64 KiB, 64 elements a thread at 16 warps. The holding kernel reads such a
strip once, reduces, scales, casts and stores it transposed (one read: 3 bytes an element where the others move
5), and walks a longer or unaligned strip in ``fp8_colwise``'s two passes. Same arithmetic as every column kernel
(``block_math``), so bit-exact against ``fp8_rowwise``'s references.

``along_n_config(N)`` and ``k_groups_config(M, G)`` are the defaults of ``fp8_rowwise``'s 3D-along-N and k_groups
wrappers: this kernel where a strip fits, else ``fp8_colwise``'s walking / split strips launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.block_math import abs_max_bits, fp8_scale_and_reciprocal, to_e4m3_bits, to_fp32
from ..core.runtime import INTERPRET, check_fields_power_of_two, check_int, persistent_programs
from .fp8_colwise import ALONG_N_CONFIG, K_GROUPS_CONFIG, ColwiseConfig, WalkConfig, strip_of, walk_strip

# ---------------------------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _hold_strip(x_cols, q_cols, scale_ptr, col_ok, lo, hi, stride_xm, HOLD: tl.constexpr, EXACT: tl.constexpr):
    """Rows [lo, hi) (hi - lo <= HOLD) of a strip's columns, loaded once and held in registers through their column
    amax, the scale and the cast, then stored transposed (q_cols + m: the row dim contiguous). One read."""
    m = lo + tl.arange(0, HOLD)
    mask = (m < hi)[:, None] & col_ok[None, :]
    x = tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=mask, other=0.0)
    scale, recip = fp8_scale_and_reciprocal(abs_max_bits(x, 0).to(tl.float32, bitcast=True))
    tl.store(scale_ptr, scale, mask=col_ok)
    tl.store(q_cols + m.to(tl.int64)[:, None], to_e4m3_bits(to_fp32(x) * recip[None, :], EXACT), mask=mask)


@triton.jit
def _hold_kernel(
    x_ptr, offs_ptr, q_ptr, scale_ptr, rows, cols, G, PROGRAMS,
    stride_xg, stride_xm, stride_xc, stride_qg, stride_qc,
    HAS_OFFS: tl.constexpr, STRIP: tl.constexpr, HOLD: tl.constexpr, STEP: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """Per-group column scales, the output transposed (groups and strides as in ``_colwise_kernel``), by PROGRAMS
    persistent programs walking strips (STRIP columns of one group) as ``_walk_kernel`` does. A strip of at most
    HOLD rows on 16-row boundaries (every expert of fine-grained weights along N, every group of a fine-grained
    layer's padded routing) is read once and held whole (``_hold_strip``): one read from device memory, many loads
    in flight per program. A longer or unaligned strip takes the walking kernel's two passes in STEP-row steps."""
    n_strips = tl.cdiv(cols, STRIP)
    for item in range(tl.program_id(0), G * n_strips, PROGRAMS):
        g, c, col_ok, start, end, x_cols, q_cols = strip_of(item, n_strips, x_ptr, q_ptr, offs_ptr, rows, cols,
                                                            stride_xg, stride_xc, stride_qg, stride_qc, STRIP,
                                                            HAS_OFFS)  # fmt: skip
        if (end - start <= HOLD) & (start % 16 == 0) & (end % 16 == 0):
            # Rounded to say the alignment (16-byte transposed stores), as in ``strip_scale_rows``.
            _hold_strip(x_cols, q_cols, scale_ptr + g * cols + c, col_ok, start // 16 * 16, end // 16 * 16,
                        stride_xm, HOLD, EXACT)  # fmt: skip
        else:
            walk_strip(x_cols, q_cols, scale_ptr + g * cols + c, col_ok, start, end, stride_xm, STEP, 1, True, EXACT)


# ---------------------------------------------------------------------------------------------------------------
# Launch configurations and the defaults
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HoldConfig:
    """One launch of the holding kernel (``quantize_fp8_rowwise_3d(along="N")``, ``quantize_fp8_rowwise_k_groups``):
    a persistent grid of programs that each read a strip of up to ``hold_rows`` rows once and hold it in registers;
    longer strips walk in two passes, as ``WalkConfig``'s kernel."""

    # Columns of a strip, a power of two (strip_cols x 2 bytes of each bf16 row: 16 columns = one 32-byte sector).
    strip_cols: int
    # The longest strip read once and held whole, a power of two: hold_rows x strip_cols elements in registers.
    hold_rows: int
    # Rows per step of the two passes of a longer (or unaligned) strip, a power of two.
    step_rows: int = 256
    # Warps per program.
    num_warps: int = 8
    # Programs per SM in the persistent grid (SMs x this).
    programs_per_sm: int = 2

    def __post_init__(self):
        check_fields_power_of_two(self, "strip_cols", "hold_rows", "step_rows", "num_warps")
        check_int("HoldConfig.programs_per_sm", self.programs_per_sm, 1, 32)

    def holds(self, rows: int) -> bool:
        """Whether a strip of ``rows`` rows on 16-row boundaries is read once."""
        return rows <= self.hold_rows


# The holding kernel's defaults: each thread holds HOLD_PER_THREAD elements, a program up to HOLD_MAX_WARPS warps
# (32768 elements, 64 KiB of bf16); strips of 64 columns (whole 128-byte lines of each bf16 row) down to 16 (one
# 32-byte sector). At 64 a thread, 16 warps compile to 126-128 registers (sm_90, triton 3.9: 0-56 bytes of stack);
# at 128 a thread, 384 bytes of stack. Strips narrower than 32 columns are not held: a 16-column strip reads one
# 32-byte sector of each row, and those launches streamed below the walking kernels they would replace, while
# 32-column strips (64 bytes a row) were the fastest launch measured (docs/perf-log.md).
HOLD_PER_THREAD = 64
HOLD_MAX_WARPS = 16
_HOLD_STRIP_MAX, _HOLD_STRIP_MIN = 64, 32


def hold_config(rows: int) -> HoldConfig | None:
    """The holding launch for strips of up to ``rows`` rows: the widest strip (64 columns down to 16) whose
    next_pow2(rows) x strip elements fit HOLD_MAX_WARPS warps of HOLD_PER_THREAD each, as many warps as it takes
    (4 at least), two programs per SM up to 8 warps. None where even 32 columns do not fit."""
    hold = max(triton.next_power_of_2(max(rows, 1)), 16)
    most = HOLD_MAX_WARPS * 32 * HOLD_PER_THREAD
    strip = min(_HOLD_STRIP_MAX, most // hold)
    if strip < _HOLD_STRIP_MIN:
        return None
    warps = min(max(hold * strip // (32 * HOLD_PER_THREAD), 4), HOLD_MAX_WARPS)
    return HoldConfig(strip_cols=strip, hold_rows=hold, num_warps=warps, programs_per_sm=2 if warps <= 8 else 1)


def along_n_config(rows: int) -> HoldConfig | WalkConfig:
    """The default launch of 3D weights along N with ``rows`` (N) rows an expert: the holding kernel where a strip
    of the expert's N rows fits its registers (one read), else the walking kernel (``ALONG_N_CONFIG``)."""
    return hold_config(rows) or ALONG_N_CONFIG


# Room the k_groups default leaves over the average group (rows / groups). None: sized for the average, since the
# launch sized for 1.25x it (the next power of two up, narrower strips) was slower at every balanced shape measured
# than holding the average and walking the larger groups of a skewed routing in two passes (docs/perf-log.md).
K_GROUPS_HOLD_ROOM = 1.0


def k_groups_config(rows: int, groups: int) -> HoldConfig | ColwiseConfig:
    """The default k_groups launch for ``rows`` rows in ``groups`` groups (sizes unknown on the host: no sync): the
    holding kernel where a group K_GROUPS_HOLD_ROOM times the average fits its registers (fine-grained experts, ~512
    to ~2048 rows a group: one read; a larger group walks in two passes), else the split strips launch
    (``K_GROUPS_CONFIG``: groups of many thousand rows, two reads)."""
    average = -(-rows // max(groups, 1))
    return hold_config(int(average * K_GROUPS_HOLD_ROOM)) or K_GROUPS_CONFIG


# ---------------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------------


def launch_hold(x, offs, q, scale, groups, *, rows, cols, x_strides, q_strides, config: HoldConfig) -> None:
    """The holding kernel on inputs the caller has checked; groups, strides and outputs as in
    ``fp8_colwise.launch_colwise``."""
    programs = persistent_programs(groups * triton.cdiv(cols, config.strip_cols), x.device, config.programs_per_sm)
    _hold_kernel[(programs,)](
        x, offs, q.view(torch.uint8), scale, rows, cols, groups, programs, *x_strides, *q_strides,
        HAS_OFFS=offs is not None, STRIP=config.strip_cols, HOLD=config.hold_rows, STEP=config.step_rows,
        EXACT=INTERPRET, num_warps=config.num_warps,
    )  # fmt: skip
