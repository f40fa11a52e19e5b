"""The FP8 rowwise recipe's holding kernel: column-scale quantizers for fine-grained experts and groups.

``fp8_colwise``'s kernels read each element twice (an amax pass, then the scale and cast), because a column's scale
spans all of a group's rows (2048 to all M), more than a program holds. At fine-grained shapes (128 experts of
1536-2048 rows along N; 128 token groups of ~1024 rows) a strip of a group's rows fits one program's registers
whole: 2048 rows x 16 columns x 2 bytes = 64 KiB, 64 elements a thread at 16 warps. The holding kernel reads such a
strip once, reduces, scales, casts and stores it transposed (one read: 3 bytes an element where the others move
5), and walks a longer or unaligned strip in ``fp8_colwise``'s two passes. Same arithmetic as every column kernel
(``block_math``), so bit-exact against ``fp8_rowwise``'s references, whatever the launch.

A program that holds a strip has no loads in flight while it reduces, exchanges and stores it, so the launch options
(``HoldConfig``) are ways to keep reads going meanwhile: several programs an SM (``persistent=False``: one program a
strip, fewer registers; ``max_registers``), the next strip's loads issued first (``prefetch``), bf16 pairs held as
words (``packed``). ``scripts/tune_weight_quantizers.py`` times them at the fine-grained shapes.

``along_n_config(N)`` and ``k_groups_config(M, G)`` are the defaults of ``fp8_rowwise``'s 3D-along-N and k_groups
wrappers, read from two small tables by shape class (``ALONG_N_DEFAULTS``, ``K_GROUPS_DEFAULTS``): this kernel where
a strip fits, else ``fp8_colwise``'s walking / split strips launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..core.block_math import abs_max_bits, fp8_scale_and_reciprocal, to_e4m3_bits, to_fp32
from ..core.runtime import INTERPRET, InputError, check_fields_power_of_two, check_int, persistent_programs
from .fp8_colwise import ALONG_N_CONFIG, K_GROUPS_CONFIG, ColwiseConfig, WalkConfig, strip_of, walk_strip

# ---------------------------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _strip_rows(item, items, n_strips, x_ptr, q_ptr, offs_ptr, rows, cols, stride_xg, stride_xc, stride_qg,
                stride_qc, STRIP: tl.constexpr, HOLD: tl.constexpr, HAS_OFFS: tl.constexpr):  # fmt: skip
    """Work item ``item`` as ``strip_of`` gives it (looked up at the last item where ``item`` is past them all), and
    the rows [lo, hi) held: all of the strip's where they fit HOLD and lie on 16-row boundaries (16-byte transposed
    stores; said by rounding, as in ``strip_scale_rows``), none (hi == lo) where the item does not exist or its
    strip walks."""
    g, c, col_ok, start, end, x_cols, q_cols = strip_of(tl.minimum(item, items - 1), n_strips, x_ptr, q_ptr,
                                                        offs_ptr, rows, cols, stride_xg, stride_xc, stride_qg,
                                                        stride_qc, STRIP, HAS_OFFS)  # fmt: skip
    held = (end - start <= HOLD) & (start % 16 == 0) & (end % 16 == 0) & (item < items)
    lo = start // 16 * 16
    hi = tl.where(held, end // 16 * 16, lo)
    return g, c, col_ok, start, end, x_cols, q_cols, held, lo, hi


@triton.jit
def _fetch(item, items, n_strips, x_ptr, xw_ptr, q_ptr, offs_ptr, rows, cols, stride_xg, stride_xm, stride_xc,
           stride_wg, stride_wm, stride_qg, stride_qc, STRIP: tl.constexpr, HOLD: tl.constexpr,
           HAS_OFFS: tl.constexpr, PACKED: tl.constexpr):  # fmt: skip
    """The loads of work item ``item``'s held rows, issued and not waited for: a (HOLD, STRIP) tile of x, or with
    PACKED a (HOLD, STRIP / 2) tile of 32-bit words, each two neighbouring bf16 columns (xw_ptr: x viewed as int32,
    strides in words). Rows not held (a walking strip, an item past the last) are masked off: no traffic."""
    g, _, col_ok, _, _, x_cols, _, _, lo, hi = _strip_rows(
        item, items, n_strips, x_ptr, q_ptr, offs_ptr, rows, cols, stride_xg, stride_xc, stride_qg, stride_qc, STRIP,
        HOLD, HAS_OFFS)  # fmt: skip
    m = lo + tl.arange(0, HOLD)
    if PACKED:
        j = (tl.minimum(item, items - 1) % n_strips) * (STRIP // 2) + tl.arange(0, STRIP // 2)
        ptrs = xw_ptr + g.to(tl.int64) * stride_wg + j.to(tl.int64)[None, :] + m.to(tl.int64)[:, None] * stride_wm
        # j < cols / 2, not 2 j < cols: the compiler sees the mask constant over runs of j, so the loads stay 16 bytes.
        tile = tl.load(ptrs, mask=(m < hi)[:, None] & (j < cols // 2)[None, :], other=0)
    else:
        tile = tl.load(x_cols + m.to(tl.int64)[:, None] * stride_xm, mask=(m < hi)[:, None] & col_ok[None, :],
                       other=0.0)  # fmt: skip
    return tile


@triton.jit
def _finish(tile, item, items, n_strips, x_ptr, q_ptr, scale_ptr, offs_ptr, rows, cols, stride_xg, stride_xm,
            stride_xc, stride_qg, stride_qc, STRIP: tl.constexpr, HOLD: tl.constexpr, STEP: tl.constexpr,
            HAS_OFFS: tl.constexpr, PACKED: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """Work item ``item`` from its fetched ``tile``: a held strip reduced, scaled, cast and stored transposed from
    registers (one read); a strip not held walks in two STEP-row passes (``walk_strip``)."""
    g, c, col_ok, start, end, x_cols, q_cols, held, lo, hi = _strip_rows(
        item, items, n_strips, x_ptr, q_ptr, offs_ptr, rows, cols, stride_xg, stride_xc, stride_qg, stride_qc, STRIP,
        HOLD, HAS_OFFS)  # fmt: skip
    scales = scale_ptr + g * cols + c
    if held:
        m = lo + tl.arange(0, HOLD)
        rows_ok = (m < hi)[:, None]
        if PACKED:
            # Little-endian words: the low half is the even column. Magnitudes and amax on 15-bit fields, widened to
            # fp32 bits as ``abs_max_bits`` does; values widened as ``to_fp32`` does (bf16 bits in the high half).
            j = (item % n_strips) * (STRIP // 2) + tl.arange(0, STRIP // 2)
            even = g * cols + 2 * j
            ok = j < cols // 2
            q_even = q_ptr + g.to(tl.int64) * stride_qg + (2 * j).to(tl.int64)[None, :] * stride_qc
            q_even += m.to(tl.int64)[:, None]
            _scale_cast_store(tile << 16, tl.max(tile & 0x7FFF, axis=0) << 16, q_even, scale_ptr + even, ok,
                              rows_ok & ok[None, :], EXACT)  # fmt: skip
            _scale_cast_store((tile >> 16) << 16, tl.max((tile >> 16) & 0x7FFF, axis=0) << 16, q_even + stride_qc,
                              scale_ptr + even + 1, ok, rows_ok & ok[None, :], EXACT)  # fmt: skip
        else:
            scale, recip = fp8_scale_and_reciprocal(abs_max_bits(tile, 0).to(tl.float32, bitcast=True))
            tl.store(scales, scale, mask=col_ok)
            q = to_e4m3_bits(to_fp32(tile) * recip[None, :], EXACT)
            tl.store(q_cols + m.to(tl.int64)[:, None], q, mask=rows_ok & col_ok[None, :])
    else:
        walk_strip(x_cols, q_cols, scales, col_ok, start, end, stride_xm, STEP, 1, True, EXACT)


@triton.jit
def _scale_cast_store(bits, amax_bits, q_ptrs, scale_ptr, ok, mask, EXACT: tl.constexpr):
    """One column of each packed pair: ``bits`` the fp32 bit patterns (int32) of its bf16 values, ``amax_bits`` of
    its column amaxes; the scale stored (``ok`` columns) and the e4m3 bytes stored transposed under ``mask``."""
    scale, recip = fp8_scale_and_reciprocal(amax_bits.to(tl.float32, bitcast=True))
    tl.store(scale_ptr, scale, mask=ok)
    tl.store(q_ptrs, to_e4m3_bits(bits.to(tl.float32, bitcast=True) * recip[None, :], EXACT), mask=mask)


@triton.jit
def _hold_kernel(
    x_ptr, xw_ptr, offs_ptr, q_ptr, scale_ptr, rows, cols, G, PROGRAMS,
    stride_xg, stride_xm, stride_xc, stride_wg, stride_wm, stride_qg, stride_qc,
    HAS_OFFS: tl.constexpr, STRIP: tl.constexpr, HOLD: tl.constexpr, STEP: tl.constexpr, PACKED: tl.constexpr,
    PREFETCH: tl.constexpr, PERSISTENT: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    """Per-group column scales, the output transposed (groups and strides as in ``_colwise_kernel``), by PROGRAMS
    persistent programs walking strips (STRIP columns of one group) as ``_walk_kernel`` does. A strip of at most
    HOLD rows on 16-row boundaries (every expert of fine-grained weights along N, every group of a fine-grained
    layer's padded routing) is read once and held whole: one read from device memory, many loads in flight per
    program. A longer or unaligned strip takes the walking kernel's two passes in STEP-row steps. PACKED: held as
    32-bit words of two bf16 columns (half the registers). PREFETCH: the next item's loads are issued before this
    item is reduced and stored (two strips in registers), so a program's loads overlap its own stores. Not
    PERSISTENT: one program a work item (PROGRAMS = the items), no loop (the loop costs ~70-110 registers a thread,
    sm_90; why is not known, per-element offsets hoisted out of it the suspect), so more programs fit an SM and the
    hardware overlaps them."""
    n_strips = tl.cdiv(cols, STRIP)
    items = G * n_strips
    if not PERSISTENT:
        tile = _fetch(tl.program_id(0), items, n_strips, x_ptr, xw_ptr, q_ptr, offs_ptr, rows, cols, stride_xg,
                      stride_xm, stride_xc, stride_wg, stride_wm, stride_qg, stride_qc, STRIP, HOLD, HAS_OFFS,
                      PACKED)  # fmt: skip
        _finish(tile, tl.program_id(0), items, n_strips, x_ptr, q_ptr, scale_ptr, offs_ptr, rows, cols, stride_xg,
                stride_xm, stride_xc, stride_qg, stride_qc, STRIP, HOLD, STEP, HAS_OFFS, PACKED, EXACT)  # fmt: skip
    elif PREFETCH:
        tile = _fetch(tl.program_id(0), items, n_strips, x_ptr, xw_ptr, q_ptr, offs_ptr, rows, cols, stride_xg,
                      stride_xm, stride_xc, stride_wg, stride_wm, stride_qg, stride_qc, STRIP, HOLD, HAS_OFFS,
                      PACKED)  # fmt: skip
        for item in range(tl.program_id(0), items, PROGRAMS):
            after = _fetch(item + PROGRAMS, items, n_strips, x_ptr, xw_ptr, q_ptr, offs_ptr, rows, cols, stride_xg,
                           stride_xm, stride_xc, stride_wg, stride_wm, stride_qg, stride_qc, STRIP, HOLD, HAS_OFFS,
                           PACKED)  # fmt: skip
            _finish(tile, item, items, n_strips, x_ptr, q_ptr, scale_ptr, offs_ptr, rows, cols, stride_xg, stride_xm,
                    stride_xc, stride_qg, stride_qc, STRIP, HOLD, STEP, HAS_OFFS, PACKED, EXACT)  # fmt: skip
            tile = after
    else:
        for item in range(tl.program_id(0), items, PROGRAMS):
            tile = _fetch(item, items, n_strips, x_ptr, xw_ptr, q_ptr, offs_ptr, rows, cols, stride_xg, stride_xm,
                          stride_xc, stride_wg, stride_wm, stride_qg, stride_qc, STRIP, HOLD, HAS_OFFS, PACKED)  # fmt: skip
            _finish(tile, item, items, n_strips, x_ptr, q_ptr, scale_ptr, offs_ptr, rows, cols, stride_xg, stride_xm,
                    stride_xc, stride_qg, stride_qc, STRIP, HOLD, STEP, HAS_OFFS, PACKED, EXACT)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Launch configurations and the defaults
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HoldConfig:
    """One launch of the holding kernel (``quantize_fp8_rowwise_3d(along="N")``, ``quantize_fp8_rowwise_k_groups``):
    a persistent grid of programs that each read a strip of up to ``hold_rows`` rows once and hold it in registers;
    longer strips walk in two passes, as ``WalkConfig``'s kernel. Every field changes speed only, never bits."""

    # Columns of a strip, a power of two: strip_cols x 2 bytes of each bf16 row read together (16 columns = one
    # 32-byte sector, 64 = a whole 128-byte line). Wider strips read whole lines; narrower ones hold more rows.
    strip_cols: int
    # The longest strip read once and held whole, a power of two: hold_rows x strip_cols elements in registers
    # (one 32-bit register an element, half that with ``packed``). Longer strips walk (two reads).
    hold_rows: int
    # Rows per step of the two passes of a longer (or unaligned) strip, a power of two.
    step_rows: int = 256
    # Warps per program: with hold_rows x strip_cols they set the elements a thread holds (64 a thread compiles to
    # ~128 registers unpacked), hence how many programs an SM can run.
    num_warps: int = 8
    # Programs per SM in the persistent grid (SMs x this). More than one lets one program's loads run while another
    # reduces and stores (a lone program's loads stop while it does); only as many as registers allow run at once.
    programs_per_sm: int = 2
    # Hold bf16 as 32-bit words of two neighbouring columns (one register per two elements, not one per element):
    # twice the rows, or two programs an SM, or a prefetched next strip, in the same registers. Applies to bf16
    # inputs with unit column stride, an even column count and even strides; others run the plain path.
    packed: bool = False
    # Issue the next strip's loads before reducing and storing this one (a register double buffer): a program's
    # reads stay in flight through its own stores. Costs a second strip's registers.
    prefetch: bool = False
    # False: one program a strip (a grid of every strip, no loop): ~94 registers a thread at 64 elements where the
    # persistent loop takes ~165-206 (sm_90, triton 3.6), so two or more programs share an SM and the hardware
    # overlaps one's loads with another's stores. programs_per_sm and prefetch then play no part.
    persistent: bool = True
    # ptxas register cap (maxnreg), 0: the compiler's choice. A cap of 65536 / (32 x warps x programs_per_sm) lets
    # that many programs share an SM, at the price of spills if the strip does not fit.
    max_registers: int = 0

    def __post_init__(self):
        check_fields_power_of_two(self, "strip_cols", "hold_rows", "step_rows", "num_warps")
        check_int("HoldConfig.programs_per_sm", self.programs_per_sm, 1, 32)
        check_int("HoldConfig.max_registers", self.max_registers, 0, 255)
        for flag in ("packed", "prefetch", "persistent"):
            if not isinstance(getattr(self, flag), bool):
                raise InputError(f"HoldConfig.{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.packed and self.strip_cols < 2:
            raise InputError(f"HoldConfig.strip_cols must be at least 2 when packed, got {self.strip_cols}")
        if self.prefetch and not self.persistent:
            raise InputError("HoldConfig.prefetch needs persistent=True (a program prefetches its next strip)")

    def holds(self, rows: int) -> bool:
        """Whether a strip of ``rows`` rows on 16-row boundaries is read once."""
        return rows <= self.hold_rows

    def label(self) -> str:
        """A short name: ``hold 32x1024 w16 1/SM`` (``grid`` for one program a strip) plus ``packed``, ``prefetch``,
        ``r<cap>`` where set."""
        extra = [f for f in ("packed", "prefetch") if getattr(self, f)] + (
            [f"r{self.max_registers}"] if self.max_registers else []
        )
        grid = f"{self.programs_per_sm}/SM" if self.persistent else "grid"
        return " ".join([f"hold {self.strip_cols}x{self.hold_rows} w{self.num_warps} {grid}", *extra])


# The holding kernel's rule for strips of few rows: each thread holds HOLD_PER_THREAD elements, a program up to
# HOLD_MAX_WARPS warps (32768 elements, 64 KiB of bf16); strips of 64 columns (whole 128-byte lines of each bf16 row)
# down to 32. At 64 a thread, 16 warps compile to 126-128 registers (sm_90, triton 3.9: 0-56 bytes of stack); at 128
# a thread, 384 bytes of stack. Strips narrower than 32 columns are not held: a 16-column strip reads one 32-byte
# sector of each row, and those launches streamed below the walking kernels they would replace, while 32-column
# strips (64 bytes a row) were the fastest launch measured (docs/perf-log.md).
HOLD_PER_THREAD = 64
HOLD_MAX_WARPS = 16
_HOLD_STRIP_MAX, _HOLD_STRIP_MIN = 64, 32


def hold_config(rows: int) -> HoldConfig | None:
    """The holding launch for strips of up to ``rows`` rows: the widest strip (64 columns down to 32) whose
    next_pow2(rows) x strip elements fit HOLD_MAX_WARPS warps of HOLD_PER_THREAD each, as many warps as it takes
    (4 at least), two programs per SM up to 8 warps. None where even 32 columns do not fit."""
    hold = max(triton.next_power_of_2(max(rows, 1)), 16)
    most = HOLD_MAX_WARPS * 32 * HOLD_PER_THREAD
    strip = min(_HOLD_STRIP_MAX, most // hold)
    if strip < _HOLD_STRIP_MIN:
        return None
    warps = min(max(hold * strip // (32 * HOLD_PER_THREAD), 4), HOLD_MAX_WARPS)
    return HoldConfig(strip_cols=strip, hold_rows=hold, num_warps=warps, programs_per_sm=2 if warps <= 8 else 1)


# The defaults, one row per shape class: (the most rows a strip's scale spans in the class, its launch). Along N the
# rows are an expert's N; for k_groups, the average group (M / G: sizes are on the device, unknown here). The first
# row whose bound the rows do not exceed applies; RULE there means ``hold_config(rows)`` where it holds, else the
# class's fallback (walking along N, split strips for k_groups). ``scripts/tune_weight_quantizers.py`` prints the
# rows to paste here from a measurement (the classes below are its shapes': Qwen3-30B-A3B 512 / 1024-row groups and
# 1536 / 2048-row experts, gpt-oss-120b 2880 / 5760, DeepSeek-V3 4096 / 7168 and 16384-row groups).
RULE = "rule"
ALONG_N_DEFAULTS: tuple[tuple[int, object], ...] = (
    (1024, RULE),  # hold 64 x <=512 (w16 1/SM at 512), 32 x 1024 w16 1/SM
    (2048, ALONG_N_CONFIG),  # Qwen3-30B-A3B's 1536 / 2048: walking (16-column holds measured slower)
    # gpt-oss-120b's 2880, DeepSeek-V3's 4096: 64-column strips walked 256 rows a step, two programs an SM, the next
    # step's loads issued before this one's stores (the fastest over the class's two cases, bit-exact: perf-log)
    (4096, WalkConfig(strip_cols=64, step_rows=256, num_warps=8, programs_per_sm=2, prefetch=True, num_stages=1,
                      max_registers=128)),  # fmt: skip
    # gpt-oss-120b's 5760, DeepSeek-V3's 7168: the same walk
    (1 << 31, WalkConfig(strip_cols=64, step_rows=256, num_warps=8, programs_per_sm=2, prefetch=True, num_stages=1,
                         max_registers=128)),  # fmt: skip
)
K_GROUPS_DEFAULTS: tuple[tuple[int, object], ...] = (
    # Qwen3-30B-A3B at 65536 routed rows (128 groups of 512): a program a 32 x 512 strip (no loop), 8 warps capped at
    # 80 registers so more programs share an SM (the fastest measured at both of the class's widths)
    (512, HoldConfig(strip_cols=32, hold_rows=512, step_rows=256, num_warps=8, programs_per_sm=1, packed=False,
                     prefetch=False, persistent=False, max_registers=80)),  # fmt: skip
    # 128 groups of 1024 (Qwen3, gpt-oss-120b at 131072): a program a 16 x 1024 strip, 8 warps (measured fastest)
    (1024, HoldConfig(strip_cols=16, hold_rows=1024, step_rows=256, num_warps=8, programs_per_sm=1, packed=False,
                      prefetch=False, persistent=False, max_registers=0)),  # fmt: skip
    (1 << 31, K_GROUPS_CONFIG),  # DeepSeek-V3's 16384-row groups: split strips
)


def _from_table(table, rows: int, fallback):
    for bound, launch in table:
        if rows <= bound:
            return (hold_config(rows) or fallback) if launch == RULE else launch
    return fallback


def along_n_config(rows: int) -> HoldConfig | WalkConfig:
    """The default launch of 3D weights along N with ``rows`` (N) rows an expert: ``ALONG_N_DEFAULTS``' row for
    ``rows``."""
    return _from_table(ALONG_N_DEFAULTS, rows, ALONG_N_CONFIG)


# Room the k_groups default leaves over the average group (rows / groups). 1.0: sized for the average, since the
# launch sized for 1.25x it (the next power of two up, narrower strips) was slower at every balanced shape measured
# than holding the average and walking the larger groups of a skewed routing in two passes (docs/perf-log.md).
K_GROUPS_HOLD_ROOM = 1.0


def k_groups_config(rows: int, groups: int) -> HoldConfig | ColwiseConfig:
    """The default k_groups launch for ``rows`` rows in ``groups`` groups (sizes unknown on the host: no sync):
    ``K_GROUPS_DEFAULTS``' row for K_GROUPS_HOLD_ROOM times the average group (fine-grained experts, ~512 to ~1024
    rows a group: held, one read; a larger group of a skewed routing walks in two passes), else the split strips
    launch (``K_GROUPS_CONFIG``: groups of many thousand rows, two reads)."""
    average = -(-rows // max(groups, 1))
    return _from_table(K_GROUPS_DEFAULTS, int(average * K_GROUPS_HOLD_ROOM), K_GROUPS_CONFIG)


# ---------------------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------------------


def _words(x: torch.Tensor, cols: int, x_strides) -> tuple[torch.Tensor, tuple[int, int]] | None:
    """x viewed as 32-bit words of two bf16 columns and its (group, row) strides in words, or None where x cannot
    be (not bf16, columns not unit-stride, an odd column count, an odd stride or offset)."""
    stride_g, stride_m, stride_c = x_strides
    if x.dtype != torch.bfloat16 or stride_c != 1 or cols % 2 or stride_g % 2 or stride_m % 2:
        return None
    if x.storage_offset() % 2 or x.data_ptr() % 4:
        return None
    flat = torch.as_strided(x, (x.untyped_storage().nbytes() // 2 - x.storage_offset(),), (1,))
    return flat[: flat.numel() // 2 * 2].view(torch.int32), (stride_g // 2, stride_m // 2)


def launch_hold(x, offs, q, scale, groups, *, rows, cols, x_strides, q_strides, config: HoldConfig) -> None:
    """The holding kernel on inputs the caller has checked; groups, strides and outputs as in
    ``fp8_colwise.launch_colwise``."""
    items = groups * triton.cdiv(cols, config.strip_cols)
    programs = persistent_programs(items, x.device, config.programs_per_sm) if config.persistent else items
    words = _words(x, cols, x_strides) if config.packed else None
    xw, (stride_wg, stride_wm) = words if words is not None else (x, (0, 0))
    cap = {"maxnreg": config.max_registers} if config.max_registers and not INTERPRET else {}
    _hold_kernel[(programs,)](
        x, xw, offs, q.view(torch.uint8), scale, rows, cols, groups, programs, *x_strides, stride_wg, stride_wm,
        *q_strides, HAS_OFFS=offs is not None, STRIP=config.strip_cols, HOLD=config.hold_rows, STEP=config.step_rows,
        PACKED=words is not None, PREFETCH=config.prefetch, PERSISTENT=config.persistent, EXACT=INTERPRET,
        num_warps=config.num_warps, **cap,
    )  # fmt: skip
