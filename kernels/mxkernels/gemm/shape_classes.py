"""Which FP8 rowwise grouped-GEMM kernel and launch a call runs on SM90, by shape class: the one declaration.

A call with ``backend=None`` (``grouped_gemm``) and every GEMM stage of a step or layer built without a backend
(``stages.pipeline``) run what ``choose`` says for their shape. The class is computed from host-known values only --
the case (2D x 3D or 2D x 2D) and the output width -- never from ``offs`` (no device-to-host sync, so a call is still captured in a CUDA graph).

Why these classes (docs/perf-log.md, 2026-11-29: the H200 measurements they rest on):

* 2D x 3D, every expert count measured: the warp-specialized kernel (``fp8_ws``, 128 x 256 tiles). Before its tile
  walk kept a cursor it walked all G groups for every tile (~7 us a tile at G = 128) and lost to the
  single-warpgroup kernel at 128 experts; with the cursor (each program visits each group once over all its tiles)
  it wins everywhere measured on an H200: Qwen3-30B-A3B fwd / dgrad 193 / 255 us against the single-warpgroup
  256 x 128's 246 / 333, gpt-oss-120b 2075 / 2088 against 2524 / 2535 (torch 2492 / 2534), DeepSeek-V3 and Scout
  as before. At 128 rows an expert (Qwen3's widths, 16384 rows) the 64-row single-warpgroup tile won fwd (82.6
  against 87.7 us) and lost dgrad (106.5 against 95.4): ws is 3% ahead over the pair, so one launch serves and no
  rows-per-expert class is kept.
* 2D x 2D (wgrad): tiles find their expert by division, ws measured fastest in all four models (its own launch).
* Output width: 2880 = 11.25 x 256 computes 12 column tiles for 11.25 (6.7% waste); a 128-column ws tile moves
  160 B/clk of shared memory at the tensor core's rate against 142 (12.7% more, ``ws_config.WsConfig.block_n``). So
  128-column ws tiles pay only where the 256-column tail wastes more than that (no preset model's width does;
  predicted from counting only); measured at 2880: 3332 against 2657 us.
* Expert count: from 64 experts up (short runs of tiles an expert), the same launch with its scales loaded before the
  main loop and two staging buffers a consumer (``WsConfig.early_scales``, ``staging``): an interleaved A/B on one
  H200 gave 0.91-1.01x the plain launch at Qwen3-30B-A3B's and DeepSeek-V2-Lite's layer projections (64 and 128
  experts) and 1.00-1.13x at DeepSeek-V3's and Scout's (8), which keep the plain launch; 9-63 not measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from ..core.errors import InputError
from ..core.names import Recipe
from .backend import Arch, GemmCase
from .ws_config import WsConfig

class ShapeClass(StrEnum):
    """The shape classes of an FP8 rowwise grouped GEMM on SM90 (module doc: why each)."""

    WGRAD = "wgrad"  # 2D x 2D: tiles located by division
    GROUPED = "grouped"  # 2D x 3D: the warp-specialized kernel, 256-column tiles
    GROUPED_NARROW_TAIL = "grouped_narrow_tail"  # ... where 256-column tiles waste > 12.7% more of the width
    GROUPED_MANY = "grouped_many"  # ... at many experts (short tiles an expert): the scales loaded early


@dataclass(frozen=True)
class GemmShape:
    """One call in the front door's terms (``grouped_gemm._check_quantized``): 2D x 3D a (M, K), b (G, N, K) ->
    (M, N); 2D x 2D a (N, M), b (K, M) -> (G, N, K), the contraction M split by the groups."""

    case: GemmCase  # a string ("2d3d") is taken and made a member
    M: int
    N: int
    K: int
    G: int

    def __post_init__(self):
        object.__setattr__(self, "case", GemmCase.parse(self.case))
        if min(self.M, self.N, self.K) < 0 or self.G < 1:
            raise InputError(f"M, N, K must be >= 0 and G >= 1; got {self.M}, {self.N}, {self.K}, {self.G}")

    def tail_waste(self, block_n: int) -> float:
        """The share of computed output columns past N with block_n-column tiles (2880 at 256: 0.067)."""
        return math.ceil(self.N / block_n) * block_n / self.N - 1 if self.N else 0.0


@dataclass(frozen=True)
class Choice:
    """What a call of a class runs: the backend's name, its launch configuration, and why."""

    backend: str
    config: object
    why: str


@dataclass(frozen=True)
class ClassTable:
    """The class boundaries and each class's kernel, one frozen declaration (``SM90_FP8_ROWWISE``)."""

    # A 128-column ws tile moves this much more shared memory per product than a 256-column one (160 / 142 B/clk).
    narrow_tile_cost: float
    # From this many experts up, 2D x 3D calls are GROUPED_MANY.
    many_groups: int
    choices: Mapping[ShapeClass, Choice] = field(default_factory=dict)

    def __post_init__(self):
        missing = set(ShapeClass) - set(self.choices)
        if missing:
            raise InputError(f"ClassTable: no choice for {sorted(missing)}")
        object.__setattr__(self, "choices", MappingProxyType(dict(self.choices)))

    def classify(self, shape: GemmShape) -> ShapeClass:
        if shape.case is GemmCase.A2D_B2D:
            return ShapeClass.WGRAD
        if shape.tail_waste(256) - shape.tail_waste(128) > self.narrow_tile_cost:
            return ShapeClass.GROUPED_NARROW_TAIL
        if shape.G >= self.many_groups:
            return ShapeClass.GROUPED_MANY
        return ShapeClass.GROUPED


SM90_FP8_ROWWISE = ClassTable(
    narrow_tile_cost=160 / 142 - 1,
    many_groups=64,
    choices={
        ShapeClass.WGRAD: Choice("triton_ws", WsConfig(num_stages=4, group_m=16),
                                 "fastest in every model measured (H200: Qwen3 300 us, gpt-oss 2497; DeepSeek-V3 and "
                                 "Scout's default, chosen on an H100)"),
        ShapeClass.GROUPED: Choice("triton_ws", WsConfig(),
                                   "fastest at 8 and 128 experts on an H200 (DeepSeek-V3 3094 / 3446 us, Scout, "
                                   "Qwen3 193 / 255, gpt-oss 2075 / 2088); 3% ahead of 64-row tiles at 128 rows "
                                   "an expert"),
        ShapeClass.GROUPED_MANY: Choice("triton_ws", WsConfig(early_scales=True, staging=2),
                                        "the scales loaded before the main loop and two staging buffers: 0.91-1.01x "
                                        "the plain launch at 64 and 128 experts (H200 A/B, Qwen3 and V2-Lite layer "
                                        "projections), 1.00-1.13x at 8 (DeepSeek-V3, Scout), so not there"),
        ShapeClass.GROUPED_NARROW_TAIL: Choice("triton_ws", WsConfig(block_n=128, num_stages=4),
                                               "predicted from counting only: 256 columns waste more than the "
                                               "narrow tile's extra shared-memory traffic"),
    },
)  # fmt: skip

_TABLES: Mapping[tuple[Recipe, Arch], ClassTable] = MappingProxyType({(Recipe.FP8_ROWWISE, Arch.SM90): SM90_FP8_ROWWISE})


def table_for(recipe: Recipe | str, arch: Arch) -> ClassTable | None:
    """The class table of a recipe on an architecture; None where its backends' default order decides alone."""
    return _TABLES.get((Recipe(recipe), arch))


def classify(shape: GemmShape, table: ClassTable = SM90_FP8_ROWWISE) -> ShapeClass:
    return table.classify(shape)
