"""MXFP8 quantizers that write their scales straight into the blocked layout the grouped GEMMs consume ("fused
scales"): bit-identical to a ``quantize`` call followed by the matching ``layouts`` rearrange, without the scales'
round trip through memory and the rearrange's launch.

| call | input | data | blocked scales (``layouts``) | unfused equivalent |
|---|---|---|---|---|
| ``quantize_dim0_blocked(x, offs)`` | (M, K), groups split M | (M, K) | M-groups ``m_groups_shape(M, K/32, G)`` | ``quantize_dim0`` + ``rearrange_m_groups`` |
| ``quantize_3d_blocked(w, "K")`` | (G, N, K) | (G, N, K) | ``blocked_3d_shape(G, N, K/32)`` | ``quantize_3d(w, "K")`` + ``rearrange_3d`` |
| ``quantize_3d_blocked(w, "N")`` | (G, N, K) | (G, K, N) | ``blocked_3d_shape(G, K, N/32)`` | ``quantize_3d(w, "N")`` + ``rearrange_3d`` |
| ``quantize_dim1_blocked(x, offs)`` | (M, K), groups split M | (K, M) | K-groups ``k_groups_shape(K, M/32, G)`` | ``quantize_dim1`` + ``rearrange_k_groups`` |

The kernels are ``quantize``'s rows and cols kernels with a blocked scale store. Their programs walk the blocked
buffer's rows (rows kernel) or columns (cols kernel) rather than the input's, so every byte of the buffer --
the zero padding of each image and the unused tail included -- is written by the launch, and group bounds are read
on the device only (no host sync: each call can be captured in a CUDA graph). Padding rows and columns read as zeros,
whose scale byte is 0 in both modes. A tile of the rows kernel lies inside one 128-row block of the buffer (tiles of
at most 128 rows), a tile of the K-groups cols kernel inside one image (at most 4 blocks, 128 rows, per tile).
Data rows (dim0) or columns (dim1) past ``offs[-1]`` belong to no group and are not written. Launches are the
``quantize`` configs (``RowsConfig``, ``ColsConfig``) passed as ``config=``; None: the defaults below.
"""

from __future__ import annotations

import torch

from ..core.cost import Cost
from ..core.format import BLOCK_SIZE, quantize_reference
from ..layouts.scale_layout import (
    blocked_3d_shape,
    k_groups_shape,
    m_groups_shape,
    rearrange_3d_reference,
    rearrange_k_groups_reference,
    rearrange_m_groups_reference,
)
from .quantize import IN_DTYPES, INTERPRETER_ROWS, RowsConfig, _quantize_rows, check_quantize_3d, quantize_2d_cost
from .quantize_cols import INTERPRETER_COLS, ColsConfig, _quantize_cols
from ..core.runtime import (
    InputError,
    check_config,
    check_group_offsets,
    check_multiple,
    check_tensor,
    default_launch,
)

# The defaults (config=None). Rows kernel: the unfused default's tile (32 rows x 512 columns, 8 warps) already lies
# inside one 128-row block. Cols kernel along N: 128-row tiles, so each column's four scale bytes of a tile are one
# aligned int32 word of the image (scripts/tune_weight_quantizers.py --mx found none faster at the fine-grained
# shapes). K-groups: 128-row tiles in three stages, so each program keeps four blocks' loads in flight; the unfused
# dim1 default (32 x 64, one stage) kept too few in flight at 512-1024-row groups (docs/perf-log.md).
ROWS_BLOCKED = RowsConfig(tile=(32, 512), num_warps=8)
ALONG_N_BLOCKED = ColsConfig(tile=(128, 64), num_warps=1, num_stages=3, group_cols=2048)
DIM1_BLOCKED = ColsConfig(tile=(128, 64), num_warps=1, num_stages=3, group_cols=512)
# config=None under the interpreter (runtime.default_launch): a whole 128-row block per rows program; the cols kernel's
# interpreter tile.
_ROWS_LAUNCH = default_launch(ROWS_BLOCKED, INTERPRETER_ROWS)
_ALONG_N_LAUNCH = default_launch(ALONG_N_BLOCKED, INTERPRETER_COLS)
_DIM1_LAUNCH = default_launch(DIM1_BLOCKED, INTERPRETER_COLS)


def quantize_dim0_blocked(
    x: torch.Tensor, offs: torch.Tensor, mode="rceil", *, config: RowsConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_dim0(x)`` with its scales in the M-groups blocked layout (forward A, dgrad grad_out).

    x (M, K) bf16/fp32 row-major, K a multiple of 32; offs int32 (G,) group end rows. Returns q (M, K) e4m3 (rows
    past offs[-1] not written) and ``m_groups_shape(M, K/32, G)`` e8m0, equal to
    ``rearrange_m_groups(quantize_dim0(x)[1], offs)``. ``config``: the rows kernel's launch, tiles of at most 128
    rows (None: ``ROWS_BLOCKED``).
    """
    x = check_tensor("x", x, dtypes=IN_DTYPES, ndim=2)
    check_multiple("x", x.shape[1], BLOCK_SIZE, "K (dim 1, the blocked dim)")
    offs = check_group_offsets(offs, x, x.shape[0])
    check_config("config", config, RowsConfig)
    return _quantize_rows(x, mode, config or _ROWS_LAUNCH, "m_groups", offs=offs)


def quantize_3d_blocked(
    w: torch.Tensor, along: str = "K", mode="rceil", *, config: RowsConfig | ColsConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_3d(w, along)`` with each expert's scales as its blocked image.

    w (G, N, K) bf16/fp32 row-major. along="K": q (G, N, K), scales ``blocked_3d_shape(G, N, K/32)``; along="N":
    q (G, K, N), scales ``blocked_3d_shape(G, K, N/32)``; both e8m0, equal to ``rearrange_3d`` of
    ``quantize_3d(w, along)``'s scales. ``config``: a ``RowsConfig`` along K (tiles of at most 128 rows; None:
    ``ROWS_BLOCKED``), a ``ColsConfig`` along N (None: ``ALONG_N_BLOCKED``).
    """
    w = check_quantize_3d(w, along, config)
    G, N, K = w.shape
    if along == "K":
        q, s = _quantize_rows(w.view(G * N, K), mode, config or _ROWS_LAUNCH, "3d", group_rows=N)
        return q.view(G, N, K), s
    return _quantize_cols(w, mode, config or _ALONG_N_LAUNCH, "3d")


def quantize_dim1_blocked(
    x: torch.Tensor, offs: torch.Tensor, mode="rceil", *, config: ColsConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_dim1(x)`` with its scales in the K-groups blocked layout (wgrad's grad_out_t and A_t).

    x (M, K) bf16/fp32 row-major, M a multiple of 32; offs int32 (G,) group end rows, every group a multiple of 32
    rows (checked where offs can be read without a sync). Returns q (K, M) e4m3 (columns past offs[-1] not written)
    and ``k_groups_shape(K, M/32, G)`` e8m0, equal to ``rearrange_k_groups(quantize_dim1(x)[1], offs)``.
    ``config``: the cols kernel's launch, tiles of at most 128 rows (None: ``DIM1_BLOCKED``).
    """
    x = check_tensor("x", x, dtypes=IN_DTYPES, ndim=2)
    check_multiple("x", x.shape[0], BLOCK_SIZE, "M (dim 0, the blocked dim)")
    offs = check_group_offsets(offs, x, x.shape[0], BLOCK_SIZE)
    check_config("config", config, ColsConfig)
    q, s = _quantize_cols(x.unsqueeze(0), mode, config or _DIM1_LAUNCH, "k_groups", offs=offs)
    return q[0], s


# ---- references: the reference quantizer, then the reference rearrange ---------------------------------------


def quantize_dim0_blocked_reference(x: torch.Tensor, offs: torch.Tensor, mode="rceil"):
    q, s = quantize_reference(x, mode)
    return q, rearrange_m_groups_reference(s, offs)


def quantize_3d_blocked_reference(w: torch.Tensor, along: str = "K", mode="rceil"):
    q, s = quantize_reference(w if along == "K" else w.transpose(1, 2).contiguous(), mode)
    return q, rearrange_3d_reference(s)


def quantize_dim1_blocked_reference(x: torch.Tensor, offs: torch.Tensor, mode="rceil"):
    q, s = quantize_reference(x.t().contiguous(), mode)
    return q, rearrange_k_groups_reference(s, offs)


# ---- costs: the quantizer's read and data write, plus the whole blocked buffer (zero fill included) ----------


def _fused(rows: int, cols: int, in_dtype: torch.dtype, buffer: tuple[int, ...]) -> Cost:
    data = quantize_2d_cost(rows, cols, in_dtype)
    return Cost(data.bytes_read, rows * cols + int(torch.Size(buffer).numel()))


def quantize_dim0_blocked_cost(M: int, K: int, G: int, in_dtype: torch.dtype) -> Cost:
    """``quantize_dim0_blocked`` of (M, K) in G groups: read x, write q and the M-groups buffer."""
    return _fused(M, K, in_dtype, m_groups_shape(M, K // BLOCK_SIZE, G))


def quantize_3d_blocked_cost(G: int, N: int, K: int, in_dtype: torch.dtype, along: str = "K") -> Cost:
    """``quantize_3d_blocked`` of (G, N, K) weights: read w, write q and the experts' blocked images."""
    if G < 1:
        raise InputError(f"G must be >= 1, got {G}")
    rows, blocked = (N, K) if along == "K" else (K, N)
    return _fused(G * N, K, in_dtype, blocked_3d_shape(G, rows, blocked // BLOCK_SIZE))


def quantize_dim1_blocked_cost(M: int, K: int, G: int, in_dtype: torch.dtype) -> Cost:
    """``quantize_dim1_blocked`` of (M, K) in G groups: read x, write q (K, M) and the K-groups buffer."""
    check_multiple("M", M, BLOCK_SIZE, "the token count (the blocked dim)")
    return _fused(M, K, in_dtype, k_groups_shape(K, M // BLOCK_SIZE, G))
