"""What a kernel call must move and compute: the numerator of every efficiency figure.

Each kernel module declares the cost of its own calls (``*_cost`` functions beside the kernels); the pipeline
attaches them to its stages and the harness only reads them. Counts are the fewest bytes the call must move
through device memory: every input read once, every output written once, padding and zero fill included.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """Bytes read and written through device memory and floating-point operations of one kernel call.

    ``precision`` names the compute roof the FLOPs run against ("bf16", "fp8", "mxfp8"); None for data movement.
    """

    bytes_read: int
    bytes_written: int
    flops: int = 0
    precision: str | None = None

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOPs per byte of device-memory traffic (the roofline's x axis)."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def __add__(self, other: Cost) -> Cost:
        precision = self.precision if self.precision == other.precision else (self.precision or other.precision)
        return Cost(
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.flops + other.flops,
            precision,
        )


def ceil_to(x: int, a: int) -> int:
    """The smallest multiple of ``a`` that is >= ``x``."""
    return -(-x // a) * a
