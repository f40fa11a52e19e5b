"""Moving token rows for expert parallelism: gathers by a row index, and the indices an EP step needs.

Every data movement of the expert-parallel step outside the all-to-alls is a row gather, ``out[i] = x[index[i]]``:

* sorting a rank's routed token copies by global expert before the dispatch (``index`` = the token of each copy);
* permuting the rows a dispatch received, which arrive grouped [source rank][local expert], into expert-major order
  [local expert][source rank] for the grouped GEMM, and back (``chunk_transpose_index``);
* unsorting the combine's output back to copy order, and, in the backward, the mirror of each.

``gather_rows`` copies raw bits (an integer view of the row's dtype), so bf16 rows, e4m3 data rows and their e8m0
scale rows all move through one kernel, bit for bit. With ``top_k`` > 1 it sums the ``top_k`` rows each output row
gathers (the backward of sending one token to ``top_k`` experts), in fp32 and in index order, then rounds once to
bf16, round to nearest even in integer arithmetic: exact under the Triton interpreter too, where a float cast
to bf16 truncates.

The indices are computed on the device from device tensors (``route``; ``chunk_transpose_index``, which needs only
the host-known row count): no device-to-host sync, so each call can be captured in a CUDA graph. Each kernel
declares its cost beside it (``gather_rows_cost``); every function has a plain-torch reference (``*_reference``).
"""

from __future__ import annotations

import torch

from ..core.cost import Cost
from ..core.runtime import check_tensor
from .moe_rows import INDEX_DTYPE, distinct_rows, launch_gather

_INDEX_BYTES = 4


def _check_index(index: object, name: str = "index") -> torch.Tensor:
    return check_tensor(name, index, dtypes=(INDEX_DTYPE,), ndim=1)


def gather_rows(x: torch.Tensor, index: torch.Tensor, top_k: int = 1) -> torch.Tensor:
    """``out[i] = x[index[i]]`` over the rows of a row-major 2D ``x`` of any dtype, bit for bit (``top_k`` 1).

    ``top_k`` > 1 (bf16 ``x`` only): ``out[i] = sum_j x[index[i * top_k + j]]`` for j < top_k, summed in fp32 in
    that order and rounded once to bf16 (nearest even). index: int32, ``top_k`` entries per output row, each in
    [0, rows of x) (not checked on the device). Returns (index.numel() // top_k, D) in x's dtype.
    """
    x = check_tensor("x", x, ndim=2)
    index = _check_index(index)
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    if top_k > 1 and x.dtype != torch.bfloat16:
        raise ValueError(f"summing top_k={top_k} rows needs bf16 rows, got {x.dtype}")
    if index.numel() % top_k:
        raise ValueError(f"index holds {index.numel()} entries, not a multiple of top_k={top_k}")
    if index.device != x.device:
        raise ValueError(f"index is on {index.device} but x is on {x.device}")
    return launch_gather(x, index, None, top_k, None)


def gather_rows_reference(x: torch.Tensor, index: torch.Tensor, top_k: int = 1) -> torch.Tensor:
    """Plain-torch ``gather_rows``: ``index_select``, and for ``top_k`` > 1 an fp32 sum in j order."""
    picked = x.index_select(0, index.long())
    if top_k == 1:
        return picked
    picked = picked.view(-1, top_k, x.shape[1]).float()
    total = picked[:, 0]
    for j in range(1, top_k):
        total = total + picked[:, j]
    return total.to(x.dtype)


def gather_rows_cost(rows_out: int, D: int, elt: int, top_k: int = 1, *, sources: int | None = None) -> Cost:
    """Every output row written once, the int32 index of every gathered row read, and each distinct source row
    read once (``sources`` of them, e.g. T token rows for T * top_k copies; None: each gathered row a row of its
    own). The other reads of a source row are ``bytes_reread`` (``core.cost``: DRAM bytes only in ``bytes_read``)."""
    copies = rows_out * top_k
    distinct = distinct_rows(copies, sources)
    return Cost(bytes_read=distinct * D * elt + copies * _INDEX_BYTES, bytes_written=rows_out * D * elt,
                bytes_reread=(copies - distinct) * D * elt)


# ---- routing: which copy goes where ----------------------------------------------------------------------------


def route(experts: torch.Tensor, num_experts: int) -> dict[str, torch.Tensor]:
    """The sort of one rank's routed token copies by global expert, on the device.

    experts: (T, top_k) integer global expert ids in [0, num_experts), distinct within a row (not checked); copy
    c = t * top_k + j is token t's j-th choice. Returns int32 tensors:

    * ``order`` (T * top_k,): the copies sorted by expert, stably (copies of one expert in copy order);
    * ``token_of`` (T * top_k,): the token of each sorted copy (``order // top_k``), the dispatch's gather index;
    * ``pos`` (T * top_k,): where each copy lands in the sorted order (the inverse of ``order``);
    * ``counts`` (num_experts,): copies per expert.
    """
    top_k = experts.shape[1]
    flat = experts.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), device=order.device)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    return {"order": order.to(INDEX_DTYPE), "token_of": (order // top_k).to(INDEX_DTYPE), "pos": pos.to(INDEX_DTYPE),
            "counts": counts.to(INDEX_DTYPE)}  # fmt: skip


def chunk_transpose_index(counts: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, group ends) that reorder rows stored as chunks [a][b] (chunk (a, b) holds counts[a, b] rows,
    chunks back to back in row-major order of ``counts``) into chunks [b][a], keeping each chunk's row order.

    counts: int32 (A, B) on the device; ``rows`` its total, known on the host (so no sync: ``repeat_interleave``
    is told its output size). Returns int32 ``index`` (rows,) for ``gather_rows`` and int32 ``ends`` (B,), the
    cumulative row count of each b, i.e. the group ends of the [b][a] layout. With (A, B) = (source ranks, local
    experts) this is the permute after a dispatch; ``counts.t()`` gives its inverse.
    """
    A, B = counts.shape
    c = counts.long()
    flat = c.reshape(-1)
    src_start = (flat.cumsum(0) - flat).view(A, B).t().reshape(-1)  # start of chunk (a, b), listed in [b][a] order
    dst_counts = c.t().reshape(-1)
    dst_start = dst_counts.cumsum(0) - dst_counts
    chunk = torch.repeat_interleave(torch.arange(A * B, device=c.device), dst_counts, output_size=rows)
    index = src_start[chunk] + torch.arange(rows, device=c.device) - dst_start[chunk]
    return index.to(INDEX_DTYPE), c.sum(0).cumsum(0).to(INDEX_DTYPE)


def chunk_transpose_reference(x: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reorder of ``x``'s [a][b] chunks into [b][a] (counts read on the host), and the group ends."""
    table = counts.tolist()
    starts, at = {}, 0
    for a, row in enumerate(table):
        for b, n in enumerate(row):
            starts[a, b], at = at, at + n
    pieces = [x[starts[a, b] : starts[a, b] + table[a][b]] for b in range(len(table[0])) for a in range(len(table))]
    ends = torch.tensor(table, dtype=torch.int64).sum(0).cumsum(0).to(INDEX_DTYPE).to(x.device)
    return torch.cat(pieces) if pieces else x[:0], ends


def chunk_transpose_cost(rows: int, D: int, elt: int, chunks: int) -> Cost:
    """The gather of every row plus building its index: read the (A, B) counts, write and read back an int32
    index per row (torch's small index ops are not fused: counted once each way)."""
    move = gather_rows_cost(rows, D, elt)
    return Cost(move.bytes_read + chunks * _INDEX_BYTES, move.bytes_written + rows * _INDEX_BYTES)
