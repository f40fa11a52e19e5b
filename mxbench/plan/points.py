"""Sweep points and their token-group sizes.

A sweep is a list of ``Point``s: the cross product of M, recipe and power limit for one N, K, G. Each point's
token groups are split evenly or like a router (seeded), and every recipe is measured beside its bf16 baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from mxkernels.core.errors import InputError
from mxkernels.quant.fp8_amax import MAX_COLS as FP8_FUSED_MAX_COLS
from mxkernels.core.names import BASELINE, Recipe
from mxkernels.stages.pipeline import RECIPES
from mxkernels.core.runtime import MAX_GROUPS

from ..storage.results import Point
from .skew import SKEW_ALPHA, skewed_shares

BLOCK = 32  # K and N must hold whole MX blocks
GROUP_KINDS = ("balanced", "skewed")
MODES = ("rceil", "floor")
# The recipes with a fused-scales step (``pipeline.step_stages(fuse_scales=True)``).
FUSED_RECIPES = (Recipe.MXFP8, Recipe.FP8_ROWWISE)
SKEW_METHOD = f"dirichlet(alpha={SKEW_ALPHA}) from numpy.random.default_rng(seed), largest-remainder rounding"


MAX_DIM = 2**20
"""The widest N or K taken: wider than any model's, and far inside the int64 offsets of every kernel."""
MAX_TOKENS = 2**31 - 1
"""The most token rows (M): group ends travel as int32 (``offs``)."""
MAX_DEVICE_BYTES = 288 * 10**9
"""The most memory of any card we know of (B300 / GB300: 288 GB of HBM3e): tensors past it cannot be allocated on any
device, so such a size is refused before any work rather than failing at its first allocation (or, on a CPU, asking
the host for a petabyte)."""


def check_fits(nbytes: int, what: str) -> None:
    """``nbytes`` (a lower bound of what a run allocates: its bf16 inputs and outputs) within ``MAX_DEVICE_BYTES``."""
    if nbytes > MAX_DEVICE_BYTES:
        raise InputError(f"{what} take at least {nbytes / 1e9:.4g} GB, past the {MAX_DEVICE_BYTES / 1e9:g} GB of the "
                         "largest card known; choose smaller sizes")  # fmt: skip


def check_tokens(M: int, name: str = "M") -> None:
    if not 1 <= M <= MAX_TOKENS:
        raise InputError(f"{name} must be between 1 and {MAX_TOKENS} (group ends are int32), got {M}")


def check_step_fits(M: int, N: int, K: int, G: int) -> None:
    """One training step's bf16 tensors at (M, N, K, G): a (M, K), w (G, N, K), grad_out (M, N), and as many again
    for y, grad_a and grad_w (two bytes each)."""
    check_fits(2 * 2 * (M * K + G * N * K + M * N), f"the tensors of M={M} N={N} K={K} G={G}")


def check_shape(N: int, K: int, G: int) -> None:
    for name, value in (("N", N), ("K", K)):
        if value <= 0 or value % BLOCK:
            raise InputError(f"{name} must be a positive multiple of {BLOCK}, got {value}")
        if value > MAX_DIM:
            raise InputError(f"{name} must be at most {MAX_DIM} (2**20), got {value}")
    _check_groups(G)


def _check_groups(G: int) -> None:
    if not 1 <= G <= MAX_GROUPS:
        raise InputError(f"G must be between 1 and {MAX_GROUPS}, got {G}")


def plan_points(
    Ms: Sequence[int],
    N: int,
    K: int,
    G: int,
    recipes: Sequence[str] = ("mxfp8",),
    mode: str = "rceil",
    groups: str = "balanced",
    seed: int = 0,
    power_limits: Sequence[float | None] = (None,),
    fuse_scales: bool = False,
) -> list[Point]:
    """The cross product power limit x M x recipe (in that nesting, so each limit is applied once).

    ``power_limits`` in watts; None means the card's limit as found. ``fuse_scales``: each MXFP8 and FP8 rowwise
    point is followed by its fused-scales twin (see ``pipeline.step_stages``), measured side by side in the same
    run. Duplicates are dropped, order kept.
    """
    check_shape(N, K, G)
    if not Ms or any(not isinstance(M, int) or M <= 0 for M in Ms):
        raise InputError(f"M must be one or more positive integers, got {list(Ms)}")
    if max(Ms) > MAX_TOKENS:
        raise InputError(f"M must be at most {MAX_TOKENS} (group ends are int32), got {max(Ms)}")
    check_step_fits(max(Ms), N, K, G)
    if not recipes or any(r not in RECIPES for r in recipes):
        raise InputError(f"recipe must be one or more of {', '.join(RECIPES)}; got {list(recipes)}")
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    if groups not in GROUP_KINDS:
        raise InputError(f"groups must be one of {', '.join(GROUP_KINDS)}; got {groups!r}")
    if fuse_scales and Recipe.FP8_ROWWISE in recipes and max(K, N) > FP8_FUSED_MAX_COLS:
        raise InputError(f"--fuse-scales with fp8_rowwise holds rows of up to {FP8_FUSED_MAX_COLS} elements; "
                         f"K={K}, N={N}: drop fp8_rowwise or --fuse-scales")  # fmt: skip
    if not power_limits or any(w is not None and w <= 0 for w in power_limits):
        raise InputError(f"power limits must be positive watts or None, got {list(power_limits)}")
    points = [
        Point(M, N, K, G, recipe, mode, groups, seed, None if w is None else float(w), fused)
        for w in power_limits
        for M in Ms
        for recipe in recipes
        for fused in ((False, True) if fuse_scales and recipe in FUSED_RECIPES else (False,))
    ]
    return list(dict.fromkeys(points))


def group_sizes(M: int, G: int, kind: str = "balanced", seed: int = 0, alignment: int | None = None) -> list[int]:
    """Rows of each of the G token groups; they sum to exactly M.

    balanced: M split evenly, the remainder spread one row (or one ``alignment`` unit) over the first groups.
    skewed: router-like, Dirichlet(``SKEW_ALPHA``) shares drawn from ``seed``; some groups may be small or empty.
    ``alignment``: every size a multiple of it (M must be one).
    """
    if M < 0:
        raise InputError(f"M must be non-negative, got {M}")
    _check_groups(G)
    unit = alignment or 1
    if unit < 1 or M % unit:
        raise InputError(f"alignment {alignment} must be a positive divisor of M={M}")
    units = M // unit
    if kind == "balanced":
        base, extra = divmod(units, G)
        sizes = [base + (g < extra) for g in range(G)]
    elif kind == "skewed":
        shares = skewed_shares(G, seed)
        sizes = _largest_remainder([float(s) * units for s in shares], units)
    else:
        raise InputError(f"groups must be one of {', '.join(GROUP_KINDS)}; got {kind!r}")
    return [s * unit for s in sizes]


def _largest_remainder(quotas: Sequence[float], total: int) -> list[int]:
    """Integers summing to ``total``, each the floor of its quota, the leftover units to the largest fractions."""
    sizes = [int(q) for q in quotas]
    by_fraction = sorted(range(len(quotas)), key=lambda g: (sizes[g] - quotas[g], g))
    for g in by_fraction[: total - sum(sizes)]:
        sizes[g] += 1
    return sizes


def point_group_sizes(point: Point) -> list[int]:
    return group_sizes(point.M, point.G, point.groups, point.seed)


def with_baselines(points: Iterable[Point]) -> list[Point]:
    """``points`` with the bf16 point at the same shape after each other recipe's point, each point once."""
    out: dict[Point, None] = {}
    for p in points:
        out[p] = None
        out[dataclasses.replace(p, recipe=BASELINE, fuse_scales=False)] = None
    return list(out)
