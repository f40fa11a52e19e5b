"""The all-to-alls of expert parallelism over ``torch.distributed``: token rows, their scales, and the split sizes.

``all_to_all_rows`` sends chunk r of its inputs' rows to rank r and returns the rows received, grouped by source
rank, through ``torch.distributed.all_to_all_single`` with host split sizes (what NCCL can capture in a CUDA graph).
Tensors travel as raw bytes (a uint8 view of each row), so bf16, e4m3 data and e8m0 scales all go through the same
call on NCCL and on gloo, which has no fp8 types. Several tensors (MXFP8 data and its scales) travel in one
all-to-all each, in order, with the same splits.

The split sizes come from ``exchange_counts``: each rank sends the number of rows it has for every (rank, local
expert) in one small all-to-all on the device, then copies the received counts to the host: the one device-to-host
sync of an EP step, which is why the step is captured with its routing fixed.

Costs count what crosses the interconnect, per rank: ``bytes_read`` the bytes this rank sends to *other* ranks,
``bytes_written`` the bytes it receives from them (its own chunk is a local copy and is not counted). Their sum
over the time is the bidirectional rate, the convention of NVIDIA's per-GPU NVLink figures (e.g. 900 GB/s for
H100 SXM = 450 GB/s each way).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..core.cost import Cost


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """(rows, row bytes) uint8 view of a row-major tensor of any dtype."""
    if not x.is_contiguous():
        raise ValueError("all-to-all inputs must be contiguous (row-major)")
    return x.view(torch.uint8).view(x.shape[0], -1) if x.numel() else x.new_empty((x.shape[0], 0), dtype=torch.uint8)


def _from_bytes(raw: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return raw.view(like.dtype).view(raw.shape[0], *like.shape[1:])


def _check_splits(x: torch.Tensor, send: Sequence[int], recv: Sequence[int], group) -> None:
    world = dist.get_world_size(group)
    if len(send) != world or len(recv) != world:
        raise ValueError(f"send and receive splits need one entry per rank ({world}); got {len(send)}, {len(recv)}")
    if sum(send) != x.shape[0]:
        raise ValueError(f"send splits sum to {sum(send)} but the input has {x.shape[0]} rows")


def all_to_all_rows(*xs: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], group=None):
    """Each input's rows [sum(send_splits[:r]), +send_splits[r]) go to rank r; returns, per input, the rows
    received: recv_splits[r] rows from rank r, in rank order. Same dtype and trailing shape as each input."""
    outs = []
    for x in xs:
        _check_splits(x, send_splits, recv_splits, group)
        raw = _as_bytes(x)
        out = torch.empty((sum(recv_splits), raw.shape[1]), dtype=torch.uint8, device=x.device)
        dist.all_to_all_single(out, raw, output_split_sizes=list(recv_splits), input_split_sizes=list(send_splits),
                               group=group)  # fmt: skip
        outs.append(_from_bytes(out, x))
    return tuple(outs)


def all_to_all_rows_reference(*xs: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], group=None):
    """``all_to_all_rows`` built from ``all_gather`` alone: every rank gathers every rank's whole input (padded to
    the longest) and its splits, and keeps the chunks addressed to it. Slow and obviously right: the oracle."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    every_send: list[list[int] | None] = [None] * world
    dist.all_gather_object(every_send, list(send_splits), group=group)
    outs = []
    for x in xs:
        raw = _as_bytes(x)
        longest = max(sum(s) for s in every_send)
        padded = torch.zeros((longest, raw.shape[1]), dtype=torch.uint8, device=x.device)
        padded[: raw.shape[0]] = raw
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded, group=group)
        chunks = []
        for src, splits in enumerate(every_send):
            start = sum(splits[:rank])
            chunks.append(gathered[src][start : start + splits[rank]])
        out = torch.cat(chunks)
        if out.shape[0] != sum(recv_splits):
            raise ValueError(f"rank {rank} expected {sum(recv_splits)} rows but the other ranks send {out.shape[0]}")
        outs.append(_from_bytes(out.contiguous(), x))
    return tuple(outs)


def exchange_counts(send_counts: torch.Tensor, group=None) -> torch.Tensor:
    """send_counts (W, E) int32 on the device: rows this rank has for local expert e of rank r. Returns (W, E):
    rows rank s will send this rank for each of its local experts, on the device (one all-to-all, no host sync)."""
    recv = torch.empty_like(send_counts)
    dist.all_to_all_single(recv.view(-1), send_counts.contiguous().view(-1), group=group)
    return recv


def exchange_counts_reference(send_counts: torch.Tensor, group=None) -> torch.Tensor:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    every = [torch.empty_like(send_counts) for _ in range(world)]
    dist.all_gather(every, send_counts.contiguous(), group=group)
    return torch.stack([every[src][rank] for src in range(world)])


def remote_rows(splits: Sequence[int], rank: int) -> int:
    """Rows of a split list that involve another rank (all but this rank's own chunk)."""
    return sum(splits) - splits[rank]


def all_to_all_cost(send_splits: Sequence[int], recv_splits: Sequence[int], rank: int, row_bytes: int) -> Cost:
    """Bytes this rank sends to other ranks (``bytes_read``) and receives from them (``bytes_written``) for rows
    of ``row_bytes`` bytes: bf16 tokens of width K are 2K bytes; MXFP8 ones K data bytes + K/32 scale bytes."""
    return Cost(remote_rows(send_splits, rank) * row_bytes, remote_rows(recv_splits, rank) * row_bytes)


def exchange_counts_cost(world: int, experts: int) -> Cost:
    per_rank = experts * 4  # int32 counts of one rank's local experts
    return Cost((world - 1) * per_rank, (world - 1) * per_rank)
