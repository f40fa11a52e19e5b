"""Which FP8 rowwise grouped-GEMM kernel and launch a call runs on SM90, by shape class: the one declaration.

A call with ``backend=None`` (``grouped_gemm``) and every GEMM stage of a step or layer built without a backend
(``stages.pipeline``) run what ``choose`` says for their shape. The class is computed from host-known values only --
the case (2D x 3D or 2D x 2D), the contraction's 128-wide steps, the output width, the experts G and the mean rows
per expert M / G -- never from ``offs`` (no device-to-host sync, so a call is still captured in a CUDA graph).

Why classes, from counting (docs/perf-log.md, 2026-11-29, the H200 measurements they rest on):

* The warp-specialized kernel (``fp8_ws``, 128 x 256 tiles) finds each 2D x 3D tile's expert by walking all G
  groups (two loads of ``offs`` a group, ~110 clocks) in each of its partitions: a per-tile cost linear in G, which
  at G = 8 is nothing and at G = 128 is ~7 us a tile, more than a 6-step tile's main loop. The single-warpgroup
  kernel (``fp8_triton``, 256 x 128) locates a tile with vector ops over the groups loaded once (no walk), but
  runs each step ~30% slower (its promotion adds serialize behind its wgmma) and has a longer fixed tile cost.
  Fitted to the seven 2D x 3D times measured (every one within 6%): ws a tile = 0.784 us a step + 3.0 us + 0.055 us a
  group; triton = 1.016 us a step + 4.24 us. So ws wins while G < 4.2 x steps + 22: DeepSeek-V3 and Scout (G = 8;
  56 and 40 steps) by far, gpt-oss-120b (G = 128, 23 steps: bound 119) and Qwen3-30B-A3B (G = 128, 6 or 16 steps:
  48 or 90) not.
* 2D x 2D (wgrad) tiles find their expert by division (every expert has the same tiles): no walk, ws measured
  fastest in all four models.
* Rows per expert: a tile of BM rows wastes the rows past its expert's end (about BM / 2 an expert when sizes are
  ragged, up to BM - 1 when balanced at a size that is not a multiple of BM). Under 384 rows per expert, 256-row
  tiles waste more than the ~4% the 64-row tile loses in its main loop (measured at 512 rows: 256 / 345 us against
  246 / 331).
* Output width: 2880 = 11.25 x 256 computes 12 column tiles for 11.25 (6.7% waste); a 128-column ws tile moves
  160 B/clk of shared memory at the tensor core's rate against 142 (12.7% more, ``fp8_ws.WsConfig.block_n``). So
  128-column ws tiles pay only where the 256-column tail wastes more than that (no preset model's width does);
  measured at 2880: 3332 against 2657 us.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from ..core.errors import InputError
from ..core.names import Recipe
from .backend import Arch
from .fp8_triton import Fp8Config
from .fp8_ws import WsConfig

STEP = 128  # the contraction per step (and per promotion into fp32) of every precise config below
CASES = ("2d3d", "2d2d")


class ShapeClass(StrEnum):
    """The shape classes of an FP8 rowwise grouped GEMM on SM90 (module doc: why each)."""

    WGRAD = "wgrad"  # 2D x 2D: tiles located by division
    FEW_GROUPS = "few_groups"  # 2D x 3D, ws's per-tile group walk cheaper than the main loop it saves
    FEW_GROUPS_NARROW_TAIL = "few_groups_narrow_tail"  # ... and 256-column tiles wasting > 12.7% of the width
    MANY_GROUPS = "many_groups"  # 2D x 3D, the walk costs more than ws saves: the single-warpgroup kernel
    MANY_SMALL_GROUPS = "many_small_groups"  # ... with under 384 rows an expert: its 64-row tiles


@dataclass(frozen=True)
class GemmShape:
    """One call in the front door's terms (``grouped_gemm._check_quantized``): 2D x 3D a (M, K), b (G, N, K) ->
    (M, N); 2D x 2D a (N, M), b (K, M) -> (G, N, K), the contraction M split by the groups."""

    case: str
    M: int
    N: int
    K: int
    G: int

    def __post_init__(self):
        if self.case not in CASES:
            raise InputError(f"case must be '2d3d' or '2d2d', got {self.case!r}")
        if min(self.M, self.N, self.K) < 0 or self.G < 1:
            raise InputError(f"M, N, K must be >= 0 and G >= 1; got {self.M}, {self.N}, {self.K}, {self.G}")

    @property
    def steps(self) -> int:
        """128-wide contraction steps of a tile (2D x 2D: of a mean-sized expert)."""
        contraction = self.K if self.case == "2d3d" else self.M / self.G
        return max(math.ceil(contraction / STEP), 1)

    @property
    def rows_per_group(self) -> float:
        return self.M / self.G

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

    # The fit of the seven 2D x 3D times of 2026-11-29 (H200; module doc): ws's and the single-warpgroup kernel's
    # microseconds per 128-wide step of a 32768-output tile, their fixed cost per tile, and ws's group walk per group.
    ws_step_us: float
    ws_tile_us: float
    ws_walk_us_per_group: float
    triton_step_us: float
    triton_tile_us: float
    # Under this many rows an expert, 256-row tiles waste more rows than the 64-row tile loses in its main loop.
    small_group_rows: int
    # A 128-column ws tile moves this much more shared memory per product than a 256-column one (160 / 142 B/clk).
    narrow_tile_cost: float
    choices: Mapping[ShapeClass, Choice] = field(default_factory=dict)

    def __post_init__(self):
        missing = set(ShapeClass) - set(self.choices)
        if missing:
            raise InputError(f"ClassTable: no choice for {sorted(missing)}")
        object.__setattr__(self, "choices", MappingProxyType(dict(self.choices)))

    def walk_bound(self, steps: int) -> float:
        """The most experts at which ws's tile (with its group walk) is still faster than the single-warpgroup one."""
        saved = (self.triton_step_us - self.ws_step_us) * steps + self.triton_tile_us - self.ws_tile_us
        return saved / self.ws_walk_us_per_group

    def classify(self, shape: GemmShape) -> ShapeClass:
        if shape.case == "2d2d":
            return ShapeClass.WGRAD
        if shape.G > self.walk_bound(shape.steps):
            if shape.rows_per_group < self.small_group_rows:
                return ShapeClass.MANY_SMALL_GROUPS
            return ShapeClass.MANY_GROUPS
        if shape.tail_waste(256) - shape.tail_waste(128) > self.narrow_tile_cost:
            return ShapeClass.FEW_GROUPS_NARROW_TAIL
        return ShapeClass.FEW_GROUPS


SM90_FP8_ROWWISE = ClassTable(
    ws_step_us=0.784,  # (270 / 12 - 469 / 32) / (16 - 6): Qwen3 fwd and dgrad, per tile round
    ws_tile_us=3.0,  # wgrad (no walk): 293 / 47 and 2471 / 268 us a round less their steps
    ws_walk_us_per_group=0.055,  # dgrad's 10.0 us a round less its steps and ws_tile_us, over G = 128
    triton_step_us=1.016,  # (246 / 12 - 331 / 32) / (16 - 6)
    triton_tile_us=4.24,  # 331 / 32 us less 6 steps (gpt-oss fwd: 4.16)
    small_group_rows=384,  # (s + 128) / (s + 32) > 1.04 for ragged experts; balanced, 256-row tiles waste 33% at 384
    narrow_tile_cost=160 / 142 - 1,
    choices={
        ShapeClass.WGRAD: Choice("triton_ws", WsConfig(num_stages=4, group_m=16),
                                 "fastest in every model measured (Qwen3 293 us, gpt-oss 2471; DeepSeek-V3 and "
                                 "Scout's default, chosen on an H100)"),
        ShapeClass.FEW_GROUPS: Choice("triton_ws", WsConfig(),
                                      "DeepSeek-V3 and Llama 4 Scout's default (1.24-1.42x torch on an H100), unchanged"),
        ShapeClass.FEW_GROUPS_NARROW_TAIL: Choice("triton_ws", WsConfig(block_n=128, num_stages=4),
                                                  "predicted from counting only: 256 columns waste more than the "
                                                  "narrow tile's extra shared-memory traffic"),
        ShapeClass.MANY_GROUPS: Choice("triton", Fp8Config(256, 128, 128, num_warps=8, num_stages=3),
                                       "measured best precise config at 128 experts of 512-1024 rows: Qwen3 fwd 246 / "
                                       "dgrad 331 us (ws 270 / 469), gpt-oss 2478 / 2573 (ws 2657 / 2685); torch's bits"),
        ShapeClass.MANY_SMALL_GROUPS: Choice("triton", Fp8Config(64, 128, 128, num_warps=4, num_stages=4,
                                                                 programs_per_sm=2),
                                             "64-row tiles waste the fewest rows; within 4% of 256 x 128 at 512 rows "
                                             "(256 / 345 us), predicted ahead under 384"),
    },
)  # fmt: skip

_TABLES: Mapping[tuple[Recipe, Arch], ClassTable] = MappingProxyType({(Recipe.FP8_ROWWISE, Arch.SM90): SM90_FP8_ROWWISE})


def table_for(recipe: Recipe | str, arch: Arch) -> ClassTable | None:
    """The class table of a recipe on an architecture; None where its backends' default order decides alone."""
    return _TABLES.get((Recipe(recipe), arch))


def classify(shape: GemmShape, table: ClassTable = SM90_FP8_ROWWISE) -> ShapeClass:
    return table.classify(shape)
