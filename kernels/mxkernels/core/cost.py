"""What a kernel call must move and compute: the numerator of every efficiency figure.

Each kernel module declares the cost of its own calls (``*_cost`` functions beside the kernels); the pipeline
attaches them to its stages and the harness only reads them. Counts are the fewest bytes the call must move
through device memory (DRAM): every input byte read once, every output written once, padding and zero fill included.

Where a call reads the same bytes more than once (a gather of a token's row once per expert it is routed to), the
repeats are not in ``bytes_read`` but in ``bytes_reread``: whether L2 serves them depends on the access order and the
card, not on the call, so the DRAM count is the floor (what any implementation must move) and efficiency against it
can never pass the bandwidth peak. The repeats are kept beside it so that a reader can see how much a gather leans on
L2 (at Qwen3-30B-A3B's top-8 permute, 7 of every 8 row reads).
"""

from __future__ import annotations

from dataclasses import dataclass


# Compute precisions, slower roof first: every card's peak of a later one is at least an earlier one's (the FP8 rates
# are twice bf16's; MXFP8 runs at the FP8 rate, or is priced at it where a card emulates it).
FASTER = ("bf16", "fp8", "mxfp8")


@dataclass(frozen=True)
class Cost:
    """Bytes read and written through device memory and floating-point operations of one kernel call.

    ``precision`` names the compute roof the FLOPs run against ("bf16", "fp8", "mxfp8"); None for data movement.
    ``bytes_reread``: reads of bytes the call has already read (not in ``bytes_read``; module doc): L2 reuse is
    counted here and only here.
    """

    bytes_read: int
    bytes_written: int
    flops: int = 0
    precision: str | None = None
    bytes_reread: int = 0

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOPs per byte of device-memory traffic (the roofline's x axis)."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def __add__(self, other: Cost) -> Cost:
        """The two calls' traffic and FLOPs together. Where both do FLOPs at different precisions, the sum's run
        against the faster roof of the two (``FASTER``): its floor (all FLOPs at that peak) stays a lower bound on
        the time of both, and an efficiency of the sum never passes 100% of its denominator. Labelled with the
        slower one, an FP8 layer's graph (bf16 router GEMMs + FP8 expert GEMMs) read as impossibly fast."""
        mine, theirs = (c.precision if c.flops else None for c in (self, other))
        if mine and theirs:
            precision = max(mine, theirs, key=FASTER.index)
        else:
            precision = mine or theirs or self.precision or other.precision
        return Cost(
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.flops + other.flops,
            precision,
            self.bytes_reread + other.bytes_reread,
        )


def ceil_to(x: int, a: int) -> int:
    """The smallest multiple of ``a`` that is >= ``x``."""
    return -(-x // a) * a
