"""The torch-native grouped GEMMs: backend "native" (``torch._scaled_grouped_mm`` for MXFP8 and FP8 rowwise,
``torch._grouped_mm`` for bf16), with the guards that refuse or repair what these calls would get wrong on the device.

* MXFP8 ``torch._scaled_grouped_mm`` takes the blocked e8m0 scales of ``layouts`` as they are and runs on compute
  capability 10.x only. On SM90 that call is not rejected: it launches an SM100-only kernel and the CUDA context
  dies, so it is refused before any launch (``unavailable``). On 10.x it is available once a probe at its first use
  on the device (``probe_mxfp8``) has found a kernel image for the device in torch's build (``native_build``) and a
  tiny known-answer GEMM right; otherwise ``unavailable`` gives the probe's reason and the default backend is the
  next one.
* FP8 rowwise ``torch._scaled_grouped_mm`` runs on SM90 and SM100 and needs the contraction dim and the output's
  column count to be multiples of 16 (checked here, before the launch), bf16 output, and in 2D x 2D every group
  size but the last a multiple of 16 (16 bytes of e4m3; a device-side assert otherwise).
* bf16 ``torch._grouped_mm`` is graph-capturable on SM90 / SM100, where it reads offs on the device; below SM90 it
  loops over ``offs.cpu()``. Its kernel asserts on the device (the CUDA context dies) unless the groups of a
  contiguous contraction dim (2D x 2D) or of a column-major a (2D x 3D) hold multiples of 16 bytes, the last group
  excepted: the pipeline pads groups to 16 (bf16, FP8 rowwise) or 32 (MXFP8).

**The SM100 guards** (issues 16 and 23; docs/b200.md). A desk check of torch's and fbgemm's source found three ways
the native calls go wrong on compute capability 10.x. None of this has run on a B200: the tests drive the guards
with a double of the torch calls (``ops``) that misbehaves the same ways.

1. 2D x 2D (wgrad): torch allocates the output uninitialized, and the SM100 grouped kernels (fbgemm / MSLK for
   MXFP8 and FP8 rowwise; CUTLASS for bf16, pytorch#172439, CUTLASS#2674) never write a group whose contraction
   size is 0. The guard writes those groups' zeros after the call.
2. 2D x 3D with fewer rows than experts (MXFP8, FP8 rowwise): fbgemm's entry points (torch up to about 2.10)
   divide the row count by G for their heuristics and return the output unwritten when that is 0. The guard
   appends zero rows up to G (they lie past offs[-1], so no group reads them; FP8 rowwise gets as many zero row
   scales, MXFP8's scale buffer already has room) and cuts the output back to the real rows.
3. Malformed offs on the GPU (decreasing, past the operand, or 2D x 2D group sizes off the kernel's alignment) trip
   a device-side assert inside the kernel, which kills the CUDA context, and the host cannot see them without a
   sync. The guard checks them on the device: the kernel gets all-zero offs instead (every group empty, nothing
   read or written by it) and the output is filled with NaN, which every caller carries to its result (a loss, the
   check's comparison). Nothing reports them on the host: a report would be a sync, which no path that runs these
   calls (the pipeline's stages, autograd, the EP step, timed CUDA-graph replays) can make. ``torch._assert_async``
   would not do: it is itself a device-side assert.

Every guard reads offs on the device only (two small Triton kernels, no sync), so a guarded call stays
CUDA-graph capturable; like any Triton kernel's, their first call (which compiles them) must come before capture.
The MXFP8 call is guarded wherever it runs (10.x only); the FP8 rowwise and bf16 calls on 10.x only, so SM90 runs as
before. Every call here writes bf16 only. The operands come checked by ``grouped_gemm``'s operand-level dispatchers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import emulated, native_build
from .backend import FIRST, Arch, Backend, late
from ..core.format import BLOCK_SIZE, DATA_DTYPE, SCALE_DTYPE
from ..layouts.scale_layout import rearrange_3d_reference, rearrange_k_groups_reference, rearrange_m_groups_reference
from ..core.names import Recipe
from ..core.runtime import InputError

# ---------------------------------------------------------------------------------------------------------------
# The seam: the torch entry points this backend launches
# ---------------------------------------------------------------------------------------------------------------


class TorchOps:
    """The torch calls of the native backend, looked up at call time. No B200 is lent here, so the tests put a
    double in ``ops`` that misbehaves as the SM100 kernels are reported to; nothing else should replace it."""

    def scaled_grouped_mm(self, *args, **kwargs) -> torch.Tensor:
        return torch._scaled_grouped_mm(*args, **kwargs)

    def grouped_mm(self, *args, **kwargs) -> torch.Tensor:
        return torch._grouped_mm(*args, **kwargs)

    def build_config(self) -> str:
        return torch.__config__.show()


ops = TorchOps()


def capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, None for any other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def sm100_guards(device: torch.device) -> bool:
    """Whether the FP8 rowwise and bf16 calls on ``device`` need the SM100 guards (compute capability 10.x, SM10.3
    included)."""
    cap = capability(device)
    return cap is not None and cap[0] == 10


def _device_key(device: torch.device) -> str:
    """The cache key of a device: "cuda" and "cuda:<current>" are one; without CUDA (tests that fake a capability)
    the name is kept."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return str(device)


# ---------------------------------------------------------------------------------------------------------------
# The guards, on the device
# ---------------------------------------------------------------------------------------------------------------

# TMA moves a group's base address in 16-byte steps: where groups split a contiguous dim, torch asserts group sizes
# of a multiple of 16 bytes (the last group excepted) -- 8 bf16, 16 e4m3 elements.
_TMA_BYTES = 16
# The fix-up launch: BLOCK elements per store; programs per group bounded so that a call with nothing to write (the
# common case: no empty group, good offs) costs a few thousand programs that each read three int32 and exit.
_FIX_BLOCK = 4096
_FIX_PROGRAMS = 2048
_BF16_NAN_BITS = tl.constexpr(0x7FC0)  # a quiet NaN (Triton reads only constexpr globals)


@triton.jit
def _check_offs_kernel(offs_ptr, checked_ptr, G, total, multiple, EXEMPT_LAST: tl.constexpr, BLOCK_G: tl.constexpr):
    """checked[:G] = offs if they are group ends the kernel can take, else zeros; checked[G] = 1 if they were not,
    else 0. Takeable: non-decreasing from 0, within [0, total], every group size a multiple of ``multiple`` (the last
    one excepted where EXEMPT_LAST). One program."""
    lane = tl.arange(0, BLOCK_G)
    live = lane < G
    ends = tl.load(offs_ptr + lane, mask=live, other=0)
    starts = tl.load(offs_ptr + lane - 1, mask=live & (lane > 0), other=0)
    sizes = ends - starts
    aligned = sizes % multiple == 0
    if EXEMPT_LAST:
        aligned = aligned | (lane == G - 1)
    wrong = live & ((sizes < 0) | (ends > total) | ~aligned)
    bad = tl.max(wrong.to(tl.int32), 0)
    tl.store(checked_ptr + lane, tl.where(bad != 0, 0, ends), mask=live)
    tl.store(checked_ptr + G, bad)


@triton.jit
def _fix_output_kernel(out_ptr, checked_ptr, G, group_numel, ZERO_EMPTY: tl.constexpr, BLOCK: tl.constexpr):
    """Rewrite a native call's bf16 output (as int16 bits) where torch leaves it wrong: every element NaN when the
    offs were malformed (checked[G] != 0), else, with ZERO_EMPTY (2D x 2D), zeros in the groups that are empty.
    Program (i, g): every num_programs(0)-th block of group g's ``group_numel`` elements."""
    g = tl.program_id(1)
    bad = tl.load(checked_ptr + G) != 0
    write = bad
    if ZERO_EMPTY:
        end = tl.load(checked_ptr + g)
        start = tl.where(g > 0, tl.load(checked_ptr + tl.maximum(g - 1, 0)), 0)
        write = write | (end == start)
    if write:
        values = tl.full([BLOCK], 0, tl.int16) + tl.where(bad, _BF16_NAN_BITS, 0).to(tl.int16)
        base = out_ptr + g.to(tl.int64) * group_numel
        for first in range(tl.program_id(0).to(tl.int64) * BLOCK, group_numel, tl.num_programs(0) * BLOCK):
            index = first + tl.arange(0, BLOCK)
            tl.store(base + index, values, mask=index < group_numel)


def checked_offsets(offs: torch.Tensor, total: int, multiple: int = 1, exempt_last: bool = False) -> torch.Tensor:
    """(G + 1,) int32 on offs' device: [:G] the offs to hand the kernel (offs, or zeros where they are malformed),
    [G] 1 where they were malformed. Reads offs on the device only (no sync)."""
    G = offs.numel()
    checked = torch.empty(G + 1, dtype=torch.int32, device=offs.device)
    _check_offs_kernel[(1,)](
        offs, checked, G, total, multiple, EXEMPT_LAST=exempt_last, BLOCK_G=triton.next_power_of_2(G), num_warps=1
    )
    return checked


def fix_output(out: torch.Tensor, checked: torch.Tensor, zero_empty: bool) -> torch.Tensor:
    """``out`` (bf16, contiguous) after a guarded call: NaN everywhere if ``checked`` flags the offs malformed,
    else with ``zero_empty`` (2D x 2D, out (G, N, K)) zeros in the empty groups. In place, on the device; returns
    ``out``."""
    if out.numel() == 0:
        return out
    G = checked.numel() - 1
    groups = G if zero_empty else 1
    group_numel = out.numel() // groups
    grid = (min(triton.cdiv(group_numel, _FIX_BLOCK), max(1, _FIX_PROGRAMS // groups)), groups)
    _fix_output_kernel[grid](out.view(torch.int16), checked, G, group_numel, ZERO_EMPTY=zero_empty,
                             BLOCK=_FIX_BLOCK, num_warps=4)  # fmt: skip
    return out


def rows_for_every_expert(x: torch.Tensor, G: int) -> torch.Tensor:
    """Guard 2: ``x`` (a 2D x 3D call's rows, or their row scales) with zero rows appended up to G rows, so that a
    kernel that divides the row count by G for its heuristics gets at least 1. ``x`` itself when it has G rows."""
    if x.shape[0] >= G:
        return x
    padded = x.new_zeros(G, *x.shape[1:])
    padded[: x.shape[0]] = x
    return padded


def guarded_call(call: Callable[[torch.Tensor], torch.Tensor], offs: torch.Tensor, total: int, *, rows: int | None,
                 multiple: int = 1, exempt_last: bool = False) -> torch.Tensor:  # fmt: skip
    """``call(checked offs)`` under guards 1 and 3: offs checked on the device against ``total`` (the length of the
    dim they split) and the group ``multiple``; then the output fixed up. ``rows``: a 2D x 3D call's real row count
    (its output is cut back to it, past guard 2's rows); None for 2D x 2D, whose empty groups are zeroed."""
    checked = checked_offsets(offs, total, multiple, exempt_last)
    out = call(checked[: offs.numel()])
    if rows is not None:
        out = out[:rows]
    return fix_output(out, checked, zero_empty=rows is None)


# ---------------------------------------------------------------------------------------------------------------
# Availability, and the probe at first use
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Whether the native backend can run a recipe on a device, and why: what native MXFP8's probe found, or why
    it failed or was refused."""

    available: bool
    reason: str


# Per device: the probe's verdict.
_PROBES: dict[str, Verdict] = {}


def _known_answer_cases() -> dict[str, tuple[tuple[torch.Tensor, ...], torch.Tensor, int]]:
    """Three tiny MXFP8 grouped GEMMs built on the host: name -> ((a_q, a_sb, b_q, b_sb), offs, output rows
    compared). Every output is exact in bf16, so a right kernel matches the emulation bit for bit whatever its
    summation order or rounding: each 32-block of a holds one nonzero (+-1 or +-2) and every scale is 2**-1, 2**0
    or 2**1, so an output is a sum of two signed powers of two. They cover an empty group in both cases, 2D x 2D
    group starts past the first scale image, and fewer rows than experts (guard 2)."""
    gen = torch.Generator().manual_seed(16)

    def data(shape, sparse):
        values = torch.tensor([-2.0, -1.0, 1.0, 2.0])[torch.randint(0, 4, shape, generator=gen)]
        if sparse:
            where = torch.randint(0, BLOCK_SIZE, (*shape[:-1], shape[-1] // BLOCK_SIZE), generator=gen)
            values = values * torch.nn.functional.one_hot(where, BLOCK_SIZE).reshape(shape)
        return values.to(DATA_DTYPE)

    def scales(*shape):
        return torch.randint(126, 129, shape, generator=gen, dtype=torch.uint8)

    def ends(*sizes):
        return torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)

    cases = {}
    for name, M, G, sizes in (("2D x 3D", 128, 3, (40, 0, 88)), ("2D x 3D, fewer rows than experts", 2, 4,
                                                                  (1, 0, 1, 0))):  # fmt: skip
        K, N, offs = 64, 32, ends(*sizes)
        a_s, b_s = scales(M, K // BLOCK_SIZE), scales(G, N, K // BLOCK_SIZE)
        operands = (data((M, K), True), rearrange_m_groups_reference(a_s, offs), data((G, N, K), False),
                    rearrange_3d_reference(b_s))  # fmt: skip
        cases[name] = operands, offs, sum(sizes)
    N, K, offs = 32, 32, ends(64, 0, 64)
    M = int(offs[-1])
    a_s, b_s = scales(N, M // BLOCK_SIZE), scales(K, M // BLOCK_SIZE)
    operands = (data((N, M), True), rearrange_k_groups_reference(a_s, offs), data((K, M), False),
                rearrange_k_groups_reference(b_s, offs))  # fmt: skip
    cases["2D x 2D"] = operands, offs, 3
    return cases


def probe_mxfp8(device: torch.device) -> Verdict:
    """Whether the MXFP8 call can be trusted on ``device`` (a CUDA device of compute capability 10.x), and why.

    Checks that torch's build has a kernel image for the device (``native_build``: its gencode targets), then runs
    the guarded call on ``_known_answer_cases`` and compares it with the emulation bit for bit. It syncs and it
    launches: run it outside CUDA-graph capture (``unavailable`` runs it once per device, at first use)."""
    cap = capability(device)
    build = native_build.read_build(ops.build_config())
    cases = _known_answer_cases()
    refusal = build.refusal(cap)
    if refusal is not None:
        return Verdict(False, refusal)
    for name, (operands, offs, rows) in cases.items():
        try:
            got = run_mxfp8(*(t.to(device) for t in operands), offs.to(device), torch.bfloat16)[:rows].cpu()
        # Whatever torch raises here (no kernel image for this card, a build without the MX kernels, ...), the
        # backend is unusable on this device and the message is the reason.
        except Exception as e:  # noqa: BLE001
            message = " ".join(str(e).split())
            return Verdict(False, f"{build.finding(cap)}, but the known-answer MXFP8 grouped GEMM ({name}) raised on "
                                f"{device}: {type(e).__name__}: {message}")  # fmt: skip
        want = emulated.run_mxfp8(*operands, offs, torch.bfloat16)[:rows]
        wrong = got.view(torch.int16) != want.view(torch.int16)
        if bool(wrong.any()):
            return Verdict(False, f"{build.finding(cap)}, but the known-answer MXFP8 grouped GEMM ({name}) on {device} "
                                f"got {int(wrong.sum())} of {wrong.numel()} outputs wrong")  # fmt: skip
    return Verdict(True, f"{build.finding(cap)}, and the known-answer MXFP8 grouped GEMMs on {device} ("
                       f"{'; '.join(cases)}) match the emulation bit for bit")  # fmt: skip


def probed(device: torch.device) -> Verdict | None:
    """The verdict of the probe on ``device`` (a 10.x CUDA device), run at the first question; None inside CUDA-graph
    capture, where it is not run (it launches and syncs) until a question outside one."""
    key = _device_key(device)
    if key not in _PROBES:
        if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None
        _PROBES[key] = probe_mxfp8(device)
    return _PROBES[key]


def verdict(recipe: str, cap: tuple[int, int] | None, device: torch.device) -> Verdict:
    """Whether the native backend can run ``recipe`` on ``device`` of compute capability ``cap`` (None: not a CUDA
    device), and why. For MXFP8 on 10.x the first question on a device runs ``probe_mxfp8`` (outside CUDA-graph
    capture)."""
    guards = " with the SM100 guards" if cap is not None and cap[0] == 10 else ""
    if recipe == "bf16":
        # Graph-safe on SM90/SM100, a host loop over offs elsewhere.
        return Verdict(True, f"torch._grouped_mm{guards}")
    if cap is None:
        return Verdict(False, f"torch._scaled_grouped_mm needs a CUDA device, got {device}")
    if recipe == "fp8_rowwise":
        if cap == (9, 0) or cap[0] == 10:
            return Verdict(True, f"FP8 rowwise torch._scaled_grouped_mm on compute capability {cap}{guards}")
        return Verdict(False, f"FP8 rowwise torch._scaled_grouped_mm runs on compute capability 9.0 and 10.x, "
                              f"not {cap}")  # fmt: skip
    if cap[0] != 10:
        return Verdict(False, (
            f"MXFP8 torch._scaled_grouped_mm needs compute capability 10.x (SM100), this GPU is {cap}: on SM90 "
            "it launches an SM100-only kernel and the CUDA context dies; use backend 'triton_fp8', 'triton' "
            "or 'emulated'"
        ))  # fmt: skip
    probe = probed(device)
    if probe is None:
        return Verdict(False, "native MXFP8 is probed at its first use on a device, which must come before CUDA-graph "
                              "capture; call it once outside the capture")  # fmt: skip
    if probe.available:
        return Verdict(True, f"native MXFP8 passed its probe at first use: {probe.reason}")
    return Verdict(False, f"native MXFP8 failed its probe at first use: {probe.reason}")


def unavailable(recipe: str, cap: tuple[int, int] | None, device: torch.device) -> str | None:
    """Why the native backend cannot run ``recipe`` on ``device`` (``verdict``), or None if it can."""
    found = verdict(recipe, cap, device)
    return None if found.available else found.reason


# ---------------------------------------------------------------------------------------------------------------
# The calls
# ---------------------------------------------------------------------------------------------------------------


def run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype: torch.dtype) -> torch.Tensor:
    """MXFP8 ``torch._scaled_grouped_mm`` on checked TN operands with blocked scales, with the SM100 guards."""
    sa, sb = a_sb.view(SCALE_DTYPE), b_sb.view(SCALE_DTYPE)
    G = offs.numel()
    if b_q.dim() == 3:
        a, b, sb = rows_for_every_expert(a_q, G), b_q.transpose(-2, -1), sb.reshape(G, -1)
        call = lambda checked: ops.scaled_grouped_mm(a, b, sa, sb, offs=checked, out_dtype=out_dtype)
        return guarded_call(call, offs, a_q.shape[0], rows=a_q.shape[0])
    call = lambda checked: ops.scaled_grouped_mm(a_q, b_q.t(), sa, sb, offs=checked, out_dtype=out_dtype)
    return guarded_call(call, offs, a_q.shape[1], rows=None, multiple=BLOCK_SIZE)  # no MX block across two experts


def run_fp8_rowwise(
    a_q, a_scale, b_q, b_scale, offs, out_dtype: torch.dtype, use_fast_accum: bool = False
) -> torch.Tensor:
    """FP8 rowwise ``torch._scaled_grouped_mm`` on checked TN operands with fp32 scales, with the SM100 guards on
    10.x; refuses (``InputError``, before the launch) a contraction dim or output column count that is not a
    multiple of 16. In 2D x 2D torch reads the per-group scales flattened group-major."""
    if b_q.dim() == 3:
        contraction, out_cols = b_q.shape[2], b_q.shape[1]
    else:
        contraction, out_cols = a_q.shape[1], b_q.shape[0]
    for what, value in (("the contraction dim", contraction), ("the output's column count", out_cols)):
        if value % 16:
            raise InputError(f"native FP8 rowwise grouped GEMM: {what} ({value}) must be a multiple of 16")
    if b_q.dim() == 3:
        b_t = b_q.transpose(-2, -1)
    else:
        b_t, a_scale, b_scale = b_q.t(), a_scale.reshape(-1), b_scale.reshape(-1)

    def launch(a, sa, checked):
        return ops.scaled_grouped_mm(a, b_t, sa, b_scale, offs=checked, out_dtype=out_dtype,
                                     use_fast_accum=use_fast_accum)  # fmt: skip

    if not sm100_guards(a_q.device):
        return launch(a_q, a_scale, offs)
    if b_q.dim() == 3:
        G, M = offs.numel(), a_q.shape[0]
        a, sa = rows_for_every_expert(a_q, G), rows_for_every_expert(a_scale, G)
        return guarded_call(lambda checked: launch(a, sa, checked), offs, M, rows=M)
    # TN: both operands are contiguous along the split dim, so every group but the last moves their TMA bases by a
    # multiple of 16 bytes.
    return guarded_call(lambda checked: launch(a_q, a_scale, checked), offs, a_q.shape[1], rows=None,
                        multiple=_TMA_BYTES // a_q.element_size(), exempt_last=True)  # fmt: skip


def run_bf16(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """bf16 ``torch._grouped_mm`` in its own operand form (2D x 3D: a (M, K), b (G, K, N); 2D x 2D: a (N, M),
    b (M, K)), with the SM100 guards on compute capability 10.x (the "triton_dequant" backend comes through here
    too)."""
    if not sm100_guards(a.device):
        return ops.grouped_mm(a, b, offs=offs)
    # The alignment torch asserts: along a dim that moves a TMA base from group to group (mirrors its checks).
    if b.dim() == 3:
        total, rows, moves = a.shape[0], a.shape[0], a.stride(-1) != 1
    else:
        total, rows, moves = a.shape[1], None, a.stride(-1) == 1 or b.stride(-1) != 1
    multiple = _TMA_BYTES // a.element_size() if moves else 1
    return guarded_call(lambda checked: ops.grouped_mm(a, b, offs=checked), offs, total, rows=rows,
                        multiple=multiple, exempt_last=True)  # fmt: skip


BACKEND = Backend(
    "native",
    run={Recipe.MXFP8: late(__name__, "run_mxfp8"), Recipe.FP8_ROWWISE: late(__name__, "run_fp8_rowwise"),
         Recipe.BF16: late(__name__, "run_bf16")},
    unavailable=unavailable,
    out_dtypes=(torch.bfloat16,),
    # torch's own kernels go first wherever they run (bf16 on a CPU too), but on SM90, where triton_ws is faster.
    preference={Arch.CPU: FIRST, Arch.SM100: FIRST, Arch.OTHER: FIRST},
)
