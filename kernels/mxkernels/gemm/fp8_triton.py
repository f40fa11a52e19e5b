"""The "triton" FP8 rowwise backend: persistent Triton grouped GEMMs on fp8 tensor cores, both row scales in the
epilogue.

FP8 rowwise scales are constant along the contraction, so the main loop is a plain e4m3 x e4m3 product with fp32
accumulation (wgmma on SM90), and each output element is scaled once: out[m, n] = acc[m, n] * sa[m] * sb[n]. That
is all ``torch._scaled_grouped_mm`` computes too; what is ours is the schedule:

* persistent: ``min(tiles, SMs)`` programs walk the output tiles group after group (tile t, t + programs, ...), each
  tile's group found on the device from ``offs`` (``padding.group_bounds`` / ``locate``), so a call needs no host
  sync and is captured in a CUDA graph;
* the operand tiles come through TMA (host ``TensorDescriptor``s over the whole operands): a 2D x 3D tile reads rows
  of A that may belong to the next group (its output rows are masked off at the store) and columns past K read as
  zero; the weights of group g are rows [g * N, (g + 1) * N) of B seen as (G * N, K);
* 2D x 2D (wgrad): groups split the contraction, so a group's last partial step must not read the next group's
  columns: full BLOCK_K steps go through TMA and the remainder through masked loads, peeled off the pipelined loop
  (a group that does not start at a multiple of 16 takes the masked loads throughout: TMA boxes start at 16-byte
  multiples).
  An empty group's output is written as zeros whatever its scales hold (``where``, not a multiply by zero, which
  an inf scale would turn into NaN).

Contract (``grouped_gemm.fp8_rowwise_scaled_grouped_mm``, which checks the operands first):
2D x 3D: a_q (M, K), a_scale (M,), b_q (G, N, K), b_scale (G, N) -> (M, N); rows past offs[-1] left unwritten.
2D x 2D: a_q (N, M), a_scale (G, N), b_q (K, M), b_scale (G, K) -> (G, N, K).
TMA needs every row stride to be a multiple of 16 bytes: K (2D x 3D) and M (2D x 2D) multiples of 16, as the
native kernel needs too.

The products of e4m3 values are exact and the sums fp32, so the result differs from ``gemm_emulated`` only in the
summation order and the output's rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .backend import Backend, GemmCase, late, triton_unavailable
from .fused import _band_tile, _tile_2d3d
from ..core.names import Recipe
from ..layouts.padding import group_bounds, pick
from ..core.runtime import INTERPRET, InputError, check_int, check_tile_config, persistent_programs, tile_launch


@triton.jit
def _scaled_store(acc, out_ptr, out_rows, cols, row_ok, col_ok, sa, sb, ROW_STRIDE, nonempty):
    """out[out_rows, cols] = acc * sa[:, None] * sb[None, :] (zeros where ``nonempty`` is false), masked."""
    value = tl.where(nonempty, acc * sa[:, None] * sb[None, :], 0.0)
    at = out_ptr + out_rows.to(tl.int64)[:, None] * ROW_STRIDE + cols[None, :]
    tl.store(at, value.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _fp8_2d3d_kernel(
    a_desc, b_desc, sa_ptr, sb_ptr, offs_ptr, out_ptr, M, N, K, G, PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
    GROUP_M: tl.constexpr, STAGES: tl.constexpr, PROMOTE: tl.constexpr,
):  # fmt: skip
    """out (M, N) = (A (M, K) @ B_g (N, K)^T) * sa[:, None] * sb[g][None, :] per row group g (module doc)."""
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    m_tiles = tl.cdiv(sizes, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    for t in range(tl.program_id(0), tl.sum(m_tiles, 0) * n_tiles, PROGRAMS):
        g, start, local0, rows_left, n0 = _tile_2d3d(t, starts, sizes, m_tiles, n_tiles, BLOCK_M, BLOCK_N, BLOCK_G,
                                                     GROUP_M)  # fmt: skip
        row0 = start + local0
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            a = a_desc.load([row0, k0])
            b = b_desc.load([g * N + n0, k0])
            acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=PROMOTE)
        row_ok = r < rows_left
        col_ok = n0 + c < N
        sa = tl.load(sa_ptr + row0 + r, mask=row_ok, other=0.0)
        sb = tl.load(sb_ptr + g * N + n0 + c, mask=col_ok, other=0.0)
        _scaled_store(acc, out_ptr, row0 + r, n0 + c, row_ok, col_ok, sa, sb, N, True)


@triton.jit
def _fp8_2d2d_kernel(
    x_desc, y_desc, x_ptr, y_ptr, sx_ptr, sy_ptr, offs_ptr, out_ptr, M, X_ROWS, Y_ROWS, G, PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
    GROUP_M: tl.constexpr, STAGES: tl.constexpr, PROMOTE: tl.constexpr,
):  # fmt: skip
    """out[g] (X_ROWS, Y_ROWS) = (X[:, group g] @ Y[:, group g]^T) * sx[g][:, None] * sy[g][None, :].

    X (X_ROWS, M) = a_q, Y (Y_ROWS, M) = b_q, offs splitting M; sx (G, X_ROWS), sy (G, Y_ROWS). Every group has the
    same tiles, numbered group after group; an empty group's tiles run no step and store zeros.
    """
    starts, sizes = group_bounds(offs_ptr, G, M, BLOCK_G)
    m_tiles = tl.cdiv(X_ROWS, BLOCK_M)
    n_tiles = tl.cdiv(Y_ROWS, BLOCK_N)
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    for t in range(tl.program_id(0), G * m_tiles * n_tiles, PROGRAMS):
        g = t // (m_tiles * n_tiles)
        m_tile, n_tile = _band_tile(t % (m_tiles * n_tiles), m_tiles, n_tiles, GROUP_M)
        start = pick(starts, g, BLOCK_G)
        size = pick(sizes, g, BLOCK_G)
        m0 = m_tile * BLOCK_M
        n0 = n_tile * BLOCK_N
        # TMA boxes start at 16-byte multiples along the contraction: a group that starts elsewhere (the native
        # kernel refuses those) takes the masked path for all of its steps.
        full = tl.where(start % 16 == 0, size // BLOCK_K * BLOCK_K, 0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in tl.range(0, full, BLOCK_K, num_stages=STAGES):
            x = x_desc.load([m0, start + k0])
            y = y_desc.load([n0, start + k0])
            acc = tl.dot(x, y.T, acc, max_num_imprecise_acc=PROMOTE)
        x_rows = tl.minimum(m0 + r, X_ROWS - 1)
        y_rows = tl.minimum(n0 + c, Y_ROWS - 1)
        for k0 in range(full, size, BLOCK_K):  # the last partial step: never the next group's columns
            k = start + k0 + kk
            k_ok = (k0 + kk < size)[None, :]
            x = tl.load(x_ptr + x_rows.to(tl.int64)[:, None] * M + k[None, :], mask=k_ok, other=0.0)
            y = tl.load(y_ptr + y_rows.to(tl.int64)[:, None] * M + k[None, :], mask=k_ok, other=0.0)
            acc = tl.dot(x, y.T, acc, max_num_imprecise_acc=PROMOTE)
        row_ok = m0 + r < X_ROWS
        col_ok = n0 + c < Y_ROWS
        sx = tl.load(sx_ptr + g * X_ROWS + m0 + r, mask=row_ok, other=0.0)
        sy = tl.load(sy_ptr + g * Y_ROWS + n0 + c, mask=col_ok, other=0.0)
        _scaled_store(acc, out_ptr + g.to(tl.int64) * X_ROWS * Y_ROWS, m0 + r, n0 + c, row_ok, col_ok, sx, sy,
                      Y_ROWS, size > 0)  # fmt: skip


@dataclass(frozen=True)
class Fp8Config:
    """One launch of the FP8 rowwise kernels: tiles of block_m x block_n outputs, block_k-wide contraction steps.

    A stage holds (block_m + block_n) * block_k bytes of e4m3 in shared memory; the fp32 accumulator holds
    block_m * block_n / (32 * num_warps) registers a thread.
    """

    # Tile rows x columns, powers of two >= 16. One warpgroup issues wgmma for 64 rows: block_m = 64 * warps / 4
    # gives each warpgroup one slab of 64 rows across the whole tile width.
    block_m: int = 128
    block_n: int = 256
    # Contraction bytes per step: 128 is a whole 128-byte swizzle row of e4m3 per operand row (TMA's widest).
    block_k: int = 128
    # 4 or 8 warps: one or two warpgroups.
    num_warps: int = 8
    # TMA stages in flight: 3 x 48 KiB at 128 x 256 x 128 leaves room for the epilogue's layout conversion in the
    # 227 KiB an SM has.
    num_stages: int = 3
    # Row tiles per band of the tile order (``gemm_fused._band_tile``): programs running at once share a few row and
    # column panels in L2.
    group_m: int = 8
    # Persistent programs per SM (the grid is min(tiles, SMs * this)): two where registers and shared memory let
    # them share an SM, so that one program's fp32 promotion adds (which ptxas serializes behind its own wgmma)
    # overlap the other's tensor-core work.
    programs_per_sm: int = 1
    # Cap on the grid (None: one program per SM). Tests use a small one so a program walks several tiles and groups.
    max_programs: int | None = None
    maxnreg: int | None = None
    # Contraction elements the tensor core sums in its own accumulator before they are added into the fp32 one
    # (``tl.dot``'s max_num_imprecise_acc; None: Triton's SM90 default, never). Hopper's fp8 wgmma accumulator keeps
    # fewer mantissa bits than fp32, so a long contraction summed there loses precision that torch's kernel (two-level
    # accumulation) keeps; a promotion every block_k elements costs block_m * block_n fp32 adds a step.
    promote: int | None = 128

    def __post_init__(self):
        check_tile_config(self, ("block_m", "block_n", "block_k"), ("num_stages", "group_m", "programs_per_sm"),
                          ("max_programs",))
        if self.promote is not None:
            check_int("Fp8Config.promote", self.promote, 1, self.block_k)


# The defaults per case: the fastest of scripts/tune_fp8_gemm.py's candidates that sum as torch's kernel does
# (promotion every 128 elements: its outputs equal torch's bit for bit), at DeepSeek-V3 and Llama 4 Scout shapes on an
# H100 (docs/perf-log.md). ptxas serializes each promotion behind its wgmma (warning C7517), and 128 x 256 tiles spill
# with a second accumulator, so these run at 0.86-1.17x torch's kernel, not faster.
_DEFAULT_CONFIGS = {
    GemmCase.A2D_B3D: Fp8Config(256, 128, 128, num_warps=8, num_stages=3),
    GemmCase.A2D_B2D: Fp8Config(128, 128, 128, num_warps=8, num_stages=4),
}
# Fast accumulation (the tensor core's own accumulator throughout, as torch's use_fast_accum=True): 1.26-1.48x torch's
# default kernel and 1.05-1.23x its fast one at the same shapes, with a lower SQNR (docs/perf-log.md). Opt-in only:
# pass ``config=FAST_CONFIGS[case]``.
FAST_CONFIGS = {
    GemmCase.A2D_B3D: Fp8Config(128, 256, 128, num_warps=8, num_stages=4, promote=None),
    GemmCase.A2D_B2D: Fp8Config(128, 256, 128, num_warps=8, num_stages=3, promote=None),
}
# The interpreter runs small tiles in a few programs, so that each walks several tiles and groups.
_INTERPRETER_CONFIG = Fp8Config(32, 32, block_k=32, num_warps=4, num_stages=1, group_m=2, max_programs=3, promote=32)


def default_config(case: GemmCase | str) -> Fp8Config:
    """The ``Fp8Config`` a call uses when none is given."""
    config = _DEFAULT_CONFIGS[GemmCase.parse(case)]  # parsed on the interpreter too: a bad case is refused there
    return _INTERPRETER_CONFIG if INTERPRET else config


def _launch(kernel, tiles: int, args: tuple, G: int, config: Fp8Config, device: torch.device) -> None:
    programs = persistent_programs(tiles, device, config.programs_per_sm, config.max_programs)
    launch = {"BLOCK_K": config.block_k, "BLOCK_G": triton.next_power_of_2(G), "GROUP_M": config.group_m,
              "STAGES": config.num_stages, "PROMOTE": config.promote, **tile_launch(config)}  # fmt: skip
    # The program count is a plain argument, not a constexpr: a call at another size reuses the compiled kernel.
    kernel[(programs,)](*args, G, programs, **launch)


def run_fp8_rowwise(a_q, a_scale, b_q, b_scale, offs, out_dtype: torch.dtype, config: Fp8Config | None = None,
                    fast: bool = False, use_fast_accum: bool = False):  # fmt: skip
    """The backend on operands ``grouped_gemm`` has checked (module doc); ``fast``: ``FAST_CONFIGS`` where no config
    is given (backend "triton_fast"). ``use_fast_accum`` is the native kernel's option: here the backend (or the
    config's ``promote``) chooses the sums."""
    case = GemmCase.of_b(b_q)
    config = config or (FAST_CONFIGS[case] if fast and not INTERPRET else default_config(case))
    contraction = a_q.shape[1]
    if contraction % 16:
        raise InputError(f"triton FP8 rowwise grouped GEMM: the contraction dim's row stride ({contraction} bytes) must "
                         "be a multiple of 16 (TMA)")  # fmt: skip
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if case is GemmCase.A2D_B3D:
        (M, K), (G, N, _) = a_q.shape, b_q.shape
        out = torch.empty(M, N, dtype=out_dtype, device=a_q.device)
        if out.numel() == 0:
            return out
        a_desc = TensorDescriptor.from_tensor(a_q, [bm, bk])
        b_desc = TensorDescriptor.from_tensor(b_q.view(G * N, K), [bn, bk])
        tiles = (triton.cdiv(M, bm) + G) * triton.cdiv(N, bn)  # any group sizes
        _launch(_fp8_2d3d_kernel, tiles, (a_desc, b_desc, a_scale, b_scale, offs, out, M, N, K), G, config, a_q.device)
        return out
    (N, M), K, G = a_q.shape, b_q.shape[0], offs.numel()
    if M == 0:  # every group empty (and no rows for a descriptor to stride over)
        return torch.zeros(G, N, K, dtype=out_dtype, device=a_q.device)
    out = torch.empty(G, N, K, dtype=out_dtype, device=a_q.device)
    if out.numel() == 0:
        return out
    x_desc = TensorDescriptor.from_tensor(a_q, [bm, bk])
    y_desc = TensorDescriptor.from_tensor(b_q, [bn, bk])
    tiles = G * triton.cdiv(N, bm) * triton.cdiv(K, bn)
    _launch(_fp8_2d2d_kernel, tiles, (x_desc, y_desc, a_q, b_q, a_scale, b_scale, offs, out, M, N, K), G, config,
            a_q.device)  # fmt: skip
    return out


def _unavailable(recipe: Recipe, cap, device: torch.device) -> str | None:
    if why := triton_unavailable(recipe, cap, device):
        return why
    if cap is not None and cap < (9, 0):
        return (f"the Triton FP8 rowwise grouped GEMM reads its operands through TMA (compute capability >= 9.0), "
                f"this GPU is {cap}")
    return None


def _declare(name: str, fast: bool) -> Backend:
    # The two differ only in the default launch: "triton_fast" sums in the tensor core's accumulator throughout.
    return Backend(name, run={Recipe.FP8_ROWWISE: late(__name__, "run_fp8_rowwise", fast=fast)},
                   unavailable=_unavailable, config_type=Fp8Config)  # fmt: skip


TRITON = _declare("triton", fast=False)
TRITON_FAST = _declare("triton_fast", fast=True)
