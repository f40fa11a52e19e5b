"""The launch configuration of the warp-specialized FP8 rowwise grouped GEMM (``fp8_ws``): one frozen dataclass, each
field with its why, and the defaults per case. Apart from the kernel so that the shape classes (``shape_classes``) and
the scripts name launches without importing Gluon."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.runtime import InputError, check_int
from .backend import GemmCase

# Shared memory for the ring and the staging buffers: the SM90 block's 227 KiB less 2 KiB for the barriers and the
# scales' layout conversions (the 2D x 2D default's four slots and one staging buffer a consumer built to 230480 bytes).
_SHARED_BUDGET = 227 * 1024 - 2048


@dataclass(frozen=True)
class WsConfig:
    """One launch of the warp-specialized kernel."""

    # Tile rows: two consumer warpgroups of block_m / 2 = 64 rows each (one m64 wgmma row slab apiece).
    block_m: int = 128
    # Tile columns: 128, or 256 summed as two 128-column partials in turn (``_contract``): a thread then holds the
    # partial and two sums (64 + 2 x 64 registers); one 256-column partial and its sum would need 256, more than a
    # thread has. Wider tiles read less shared memory per product: each m64 wgmma reads its whole B block, so a
    # 128 x 128 tile moves ~160 B/clk/SM through shared memory at the tensor core's rate (TMA fills included), over
    # the SM's 128, and a 128 x 256 one ~142 (docs/perf-log.md).
    block_n: int = 256
    # Contraction per step and per promotion: 128 is torch's promotion interval and a whole 128-byte swizzle row of
    # e4m3 per operand row (TMA's widest).
    block_k: int = 128
    # Ring slots: (block_m + block_n) * block_k bytes each (32 KiB at 128 x 128 x 128, 48 at 128 x 256), within the
    # 227 KiB an SM has with the staging buffers.
    num_stages: int = 3
    # Row tiles per band of the tile order: the SMs running at once share a few A and B panels in L2.
    group_m: int = 8
    # Whole blocks of a bf16 output leave through a staging buffer and TMA (64 x 128 x 2 bytes a consumer) rather
    # than as scattered 4-byte stores from the accumulator's layout; blocks that end a group take masked stores.
    tma_store: bool = True
    # setmaxnreg per partition: the producer warp needs few (40 spill in the 2D x 2D edge steps' column masks); each
    # consumer warpgroup takes what is left (registers are split by warpgroup: the producer's and the two consumers'
    # share 64 K registers, 512 a thread).
    producer_regs: int = 48
    consumer_regs: int = 232
    # Cap on the grid (None: one program per SM). Tests use a small one so a program walks several tiles and groups.
    max_programs: int | None = None
    # Each consumer loads its tile's scales before the main loop (blocked layout, converted after it) instead of
    # after: their load latency then hides behind the main loop. Faster at 64-128 experts, slower at 8 (H200 A/B,
    # docs/perf-log.md): the shape classes choose.
    early_scales: bool = False
    # Staging buffers a consumer takes in turn for its TMA stores (1 or 2): with two, a 256-column tile's second half
    # does not wait for its first half's store. Two need the ring to leave 2 x 16 KiB more shared memory.
    staging: int = 1

    def __post_init__(self):
        if self.block_m != 128 or self.block_n not in (128, 256) or self.block_k not in (64, 128):
            raise InputError(f"WsConfig: tiles of 128 rows, 128 or 256 columns and 64 or 128 contraction elements, got "
                             f"{self.block_m} x {self.block_n} x {self.block_k}")  # fmt: skip
        for name in ("num_stages", "group_m"):
            check_int(f"WsConfig.{name}", getattr(self, name), 1)
        for name in ("producer_regs", "consumer_regs"):
            value = getattr(self, name)
            check_int(f"WsConfig.{name}", value, 24, 256)
            if value % 8:
                raise InputError(f"WsConfig.{name} must be a multiple of 8 (setmaxnreg), got {value}")
        if self.max_programs is not None:
            check_int("WsConfig.max_programs", self.max_programs, 1)
        if not isinstance(self.early_scales, bool):
            raise InputError(f"WsConfig.early_scales must be a bool, got {self.early_scales!r}")
        check_int("WsConfig.staging", self.staging, 1, 2)
        ring = self.num_stages * (self.block_m + self.block_n) * self.block_k
        if ring + 2 * self.staging * (self.block_m // 2) * min(self.block_n, 128) * 2 > _SHARED_BUDGET:
            raise InputError(f"WsConfig: a ring of {self.num_stages} slots and {self.staging} staging buffers a "
                             f"consumer take more than the {_SHARED_BUDGET} bytes of shared memory they may")  # fmt: skip


DEFAULT_CONFIG = WsConfig()


# The defaults per case: scripts/tune_fp8_gemm.py's candidates at DeepSeek-V3 and Llama 4 Scout shapes on an H100, two
# runs (docs/perf-log.md). 2D x 3D: three or four slots and either band height are within 1% over fwd and dgrad; 2D x
# 2D: four slots and bands of 16 were 2-3% ahead in wgrad (its (N, K) outputs share B panels across more rows).
_DEFAULT_CONFIGS = {GemmCase.A2D_B3D: DEFAULT_CONFIG, GemmCase.A2D_B2D: WsConfig(num_stages=4, group_m=16)}


def default_config(case: GemmCase | str) -> WsConfig:
    """The ``WsConfig`` a call uses when none is given."""
    return _DEFAULT_CONFIGS[GemmCase.parse(case)]
