"""Measured ceilings: the bandwidth and GEMM throughput this card actually reaches, stored per power limit.

Achievable HBM bandwidth is measured for three kinds of streaming, each over a bf16 source and timed cold
(``timing.time_fn``): ``copy`` (bf16 -> bf16: read + write), ``read2write1`` (bf16 -> fp8 cast: 2 B read, 1 B
written, the traffic of a quantizer) and ``read`` (a sum per tile: read only, a tiny output). A ceiling must be as
good as the card allows, so each kind is the best of several candidates: the Triton kernels below at a few tile
sizes and torch's own op as a cross-check (``meta`` records every candidate and which won). torch's same-dtype
``copy_`` is a memcpy, which a CUDA graph hands to the slower copy engines (see ``timing``), hence the kernels.
``bandwidth_tbps`` is the best kind.

GEMM ceilings are likewise the best of a set of shapes (``gemm_points``), so that no GEMM the pipeline times can beat
its own ceiling: an N x N x N matmul (``torch.mm`` in bf16, ``torch._scaled_mm`` e4m3 with tensorwise scales and fast
accumulation in fp8) and the grouped GEMMs of the training step itself, built by ``mxkernels.stages.pipeline.build_step`` at
the model presets' shapes (DeepSeek-V3, Llama 4 Scout), the roofline sweep's token counts and both group kinds:
forward and dgrad 2D x 3D, wgrad 2D x 2D, as ``torch._grouped_mm`` in bf16 and FP8 rowwise
``torch._scaled_grouped_mm`` in fp8. ``bf16_shape`` / ``fp8_shape`` name the shape that gave each ceiling and
``meta["gemm_candidates_tflops"]`` keeps every candidate. HBM bandwidth need not fall in proportion to a power cap, so
ceilings are measured at each cap rather than scaled; ``results/<card-slug>/ceilings.json`` keeps one entry per power
limit (entries written before the shape fields existed load with them None).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial

import torch
import triton
import triton.language as tl
from mxkernels.core.errors import InputError
from mxkernels.core.runtime import check_tensor

from .ceiling_store import _BANDWIDTH_KERNELS, Ceilings
from .hardware import device_properties

# Elements per program. At 8 warps (256 threads) a 16384-element bf16 tile is 8 16-byte loads per thread in flight:
# enough bytes per SM to cover HBM latency without a persistent loop.
TILES = (8192, 16384, 32768)
NUM_WARPS = 8
_GEMM_KINDS = {"bf16": "bf16_tflops", "fp8": "fp8_tflops"}
# The grouped GEMM shapes of the ceilings: the model presets the committed runs use, the roofline sweep's default
# token counts (`mxbench roofline --M`) and both of its group kinds.
GEMM_PRESETS = ("deepseek-v3", "llama4-scout")
GEMM_TOKENS = (16384, 32768, 65536, 131072)
GEMM_GROUPS = ("balanced", "skewed")


# ----------------------------------------------------------------------------------------- streaming kernels


@triton.jit
def _convert_kernel(src_ptr, dst_ptr, n, TILE: tl.constexpr):
    """dst[i] = src[i] in dst's dtype over one TILE per program: a copy when the dtypes match, else a cast."""
    offs = tl.program_id(0).to(tl.int64) * TILE + tl.arange(0, TILE)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask)
    tl.store(dst_ptr + offs, x.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile_sum_kernel(src_ptr, sums_ptr, n, TILE: tl.constexpr):
    """sums[p] = sum of tile p of src in fp32: every byte read, one 4-byte result per TILE elements written."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * TILE + tl.arange(0, TILE)
    x = tl.load(src_ptr + offs, mask=offs < n, other=0.0)
    tl.store(sums_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


def _check_tile(tile: int) -> None:
    if tile < 16 or tile & (tile - 1):
        raise InputError(f"tile must be a power of two of at least 16, got {tile}")


def stream_convert(src: torch.Tensor, dst: torch.Tensor, tile: int = 16384) -> torch.Tensor:
    """``dst`` (contiguous, as many elements as ``src``, bf16 or float8_e4m3fn) = ``src`` (contiguous bf16) in dst's
    dtype (round to nearest even), ``tile`` elements per program. Returns ``dst``."""
    check_tensor("src", src, dtypes=(torch.bfloat16,))
    check_tensor("dst", dst, dtypes=(torch.bfloat16, torch.float8_e4m3fn))
    if dst.numel() != src.numel():
        raise InputError(f"dst must hold {src.numel()} elements like src, got {dst.numel()}")
    _check_tile(tile)
    _convert_kernel[(triton.cdiv(src.numel(), tile),)](src, dst, src.numel(), TILE=tile, num_warps=NUM_WARPS)
    return dst


def stream_tile_sums(src: torch.Tensor, sums: torch.Tensor, tile: int = 16384) -> torch.Tensor:
    """``sums`` (fp32, ceil(src.numel() / tile) elements) = the fp32 sum of each ``tile`` consecutive elements of
    ``src`` (contiguous bf16; the last tile may be short). Returns ``sums``."""
    check_tensor("src", src, dtypes=(torch.bfloat16,))
    check_tensor("sums", sums, dtypes=(torch.float32,))
    _check_tile(tile)
    tiles = triton.cdiv(src.numel(), tile)
    if sums.numel() != tiles:
        raise InputError(f"sums must hold ceil({src.numel()} / {tile}) = {tiles} elements, got {sums.numel()}")
    _tile_sum_kernel[(tiles,)](src, sums, src.numel(), TILE=tile, num_warps=NUM_WARPS)
    return sums


Candidates = dict[str, dict[str, tuple[Callable[[], object], int]]]


def bandwidth_candidates(src: torch.Tensor, tiles: tuple[int, ...] = TILES) -> Candidates:
    """Every streaming candidate over ``src`` (contiguous bf16): kind ("copy", "read2write1", "read") -> candidate
    name -> (zero-argument call, bytes it moves). The Triton kernels at each of ``tiles``, then torch's op."""
    n, nbytes = src.numel(), src.nbytes
    same = torch.empty_like(src)
    fp8 = torch.empty(src.shape, dtype=torch.float8_e4m3fn, device=src.device)
    kinds: Candidates = {"copy": {}, "read2write1": {}, "read": {}}
    for tile in tiles:
        sums = torch.empty(triton.cdiv(n, tile), dtype=torch.float32, device=src.device)
        kinds["copy"][f"triton tile={tile}"] = (partial(stream_convert, src, same, tile), 2 * nbytes)
        kinds["read2write1"][f"triton tile={tile}"] = (partial(stream_convert, src, fp8, tile), nbytes + n)
        kinds["read"][f"triton tile={tile}"] = (partial(stream_tile_sums, src, sums, tile), nbytes + sums.nbytes)
    kinds["copy"]["torch copy_"] = (partial(same.copy_, src), 2 * nbytes)
    kinds["read2write1"]["torch copy_ (cast)"] = (partial(fp8.copy_, src), nbytes + n)
    kinds["read"]["torch sum"] = (src.sum, nbytes)
    return kinds


def best_bandwidths(measured: dict[str, dict[str, float]]) -> tuple[dict[str, float], dict[str, str]]:
    """From TB/s per kind and candidate: (each kind's best as ``Ceilings`` fields, with ``bandwidth_tbps`` the best
    of all; the winning candidate of each kind)."""
    if set(measured) != set(_BANDWIDTH_KERNELS) or not all(measured.values()):
        raise ValueError(f"measured must hold candidates of each of {', '.join(_BANDWIDTH_KERNELS)}")
    winners = {kind: max(candidates, key=candidates.get) for kind, candidates in measured.items()}
    best = {_BANDWIDTH_KERNELS[kind]: measured[kind][name] for kind, name in winners.items()}
    return {**best, "bandwidth_tbps": max(best.values())}, winners


# ------------------------------------------------------------------------------------------------ measurement


def measure_ceilings(
    device: int = 0,
    *,
    size_bytes: int = 2**31,
    gemm_n: int = 8192,
    tiles: tuple[int, ...] = TILES,
    points: Sequence[GemmPoint] | None = None,
) -> Ceilings:
    """Measure the ceilings of CUDA device ``device`` at its current power limit.

    ``size_bytes``: bytes of the bf16 source each streaming kernel reads, a whole number of MiB (needs about 2.5x
    that in free memory).
    ``gemm_n``: the square GEMM candidate is ``gemm_n``^3. ``tiles``: tile sizes tried for each Triton streaming
    kernel. ``points``: the steps whose grouped GEMMs are candidates too (None: ``gemm_points()``). Raises
    ``timing.TimingError`` without a CUDA device.
    """
    from .timing import TimingError

    if size_bytes < 2**20 or size_bytes % 2**20:
        # whole MiB: every tile is full, and an element count divisible by 16 lets Triton issue 16-byte accesses
        raise InputError(f"size_bytes must be a whole number of MiB (at least 1), got {size_bytes}")
    if gemm_n < 16 or gemm_n % 16:
        raise InputError(f"gemm_n must be a positive multiple of 16, got {gemm_n}")
    if not tiles:
        raise InputError("tiles must name at least one tile size")
    for tile in tiles:
        _check_tile(tile)
    if not torch.cuda.is_available():
        raise TimingError("no CUDA device: ceilings are measured on a GPU")
    points = gemm_points() if points is None else list(points)
    with torch.cuda.device(device):
        measured, copy_engine = _bandwidth_tbps(size_bytes, tiles)
        gemms, gemm_errors = _gemm_ceilings(gemm_n, points)
    bandwidth, winners = best_bandwidths(measured)
    gemm_best, gemm_shapes = best_gemms(gemms)
    props = device_properties(device)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "method": "graph-cold",
        "size_bytes": size_bytes,
        "bandwidth_best": winners,
        "bandwidth_candidates_tbps": measured,
        "copy_engine_candidates": copy_engine,
        "triton_num_warps": NUM_WARPS,
        "gemm_n": gemm_n,
        "gemm_points": [asdict(p) for p in points],
        "gemm_candidates_tflops": gemms,
        "bf16_gemm": "torch.mm (square), torch._grouped_mm (the step's grouped GEMMs)",
        "fp8_gemm": "torch._scaled_mm e4m3 tensorwise, use_fast_accum=True (square); FP8 rowwise "
        "torch._scaled_grouped_mm (the step's grouped GEMMs)",
        "device_properties": props,
    }
    for kind, error in gemm_errors.items():
        meta[f"{kind}_error"] = error
    return Ceilings(
        card=str(props["name"]),
        power_limit_w=_enforced_limit_w(device),
        **bandwidth,
        **gemm_best,
        meta=meta,
        **gemm_shapes,
    )


def _bandwidth_tbps(size_bytes: int, tiles: tuple[int, ...]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """(TB/s of every candidate by kind, the candidates timed as copy-engine memcpy nodes) over a bf16 source of
    ``size_bytes``; 1 TB/s = 1e6 bytes per us."""
    from .timing import TimingWarning, time_fn

    src = torch.randn(size_bytes // 2, dtype=torch.bfloat16, device="cuda")
    measured: dict[str, dict[str, float]] = {}
    copy_engine = []
    for kind, candidates in bandwidth_candidates(src, tiles).items():
        measured[kind] = {}
        for name, (fn, nbytes) in candidates.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TimingWarning)  # expected of torch copy_; recorded instead
                t = time_fn(fn)
            measured[kind][name] = nbytes / t.median_us / 1e6
            if t.memcpy_nodes:
                copy_engine.append(f"{kind}: {name}")
    return measured, copy_engine


@dataclass(frozen=True)
class GemmPoint:
    """A training step whose grouped GEMMs are ceiling candidates: a model preset's K, N, G at M tokens in G groups of
    the ``groups`` kind (``points.group_sizes``)."""

    preset: str
    K: int
    N: int
    G: int
    M: int
    groups: str = "balanced"

    @property
    def label(self) -> str:
        return f"{self.preset} M={self.M} {self.groups}"


def gemm_points(
    presets: Sequence[str] = GEMM_PRESETS, tokens: Sequence[int] = GEMM_TOKENS, groups: Sequence[str] = GEMM_GROUPS
) -> list[GemmPoint]:
    """The steps whose GEMMs the ceilings time: every preset (by name, ``shapes/``) x token count x group kind."""
    from ..plan.presets import get_preset

    points = []
    for name in presets:
        p = get_preset(name)
        points += [GemmPoint(p.name, p.K, p.N, p.G, M, kind) for M in tokens for kind in groups]
    return points


@dataclass(frozen=True)
class GemmCandidate:
    """One GEMM the ceilings time: ``kind`` "bf16" or "fp8", a ``name`` saying the shape, a zero-argument ``call`` on
    tensors already built, and its FLOPs."""

    kind: str
    name: str
    call: Callable[[], object]
    flops: int


def square_candidates(n: int, device="cuda") -> tuple[list[GemmCandidate], str | None]:
    """The n^3 matmuls: ``torch.mm`` bf16 and ``torch._scaled_mm`` e4m3 (tensorwise, fast accumulation), with why
    the fp8 one cannot run here (None when it can)."""
    flops, name = 2 * n**3, f"matmul {n}x{n}x{n}"
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    out = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    candidates = [GemmCandidate("bf16", name, partial(torch.mm, a, b, out=out), flops)]
    # _scaled_mm wants the second operand column-major: the transpose of a row-major (N, K) tensor
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), dtype=torch.float32, device=device)
    fp8_mm = partial(torch._scaled_mm, a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)
    try:
        fp8_mm()
    except RuntimeError as e:  # no fp8 tensor cores (e.g. A100) or no fp8 GEMM in this torch
        return candidates, " ".join(str(e).split())[:300]
    return [*candidates, GemmCandidate("fp8", name, fp8_mm, flops)], None


def grouped_candidates(point: GemmPoint, device="cuda", fp8_backend: str | None = "native") -> Iterator[GemmCandidate]:
    """The GEMM stages of ``point``'s bf16 step (``torch._grouped_mm``) and, unless ``fp8_backend`` is None, of its
    FP8 rowwise step on that backend, bound to real tensors by ``pipeline.build_step``: exactly the calls the
    pipeline times. Lazy, one recipe's tensors alive at a time."""
    from mxkernels.stages import pipeline

    from ..plan.points import group_sizes

    recipes = {"bf16": ("bf16", None), "fp8": ("fp8_rowwise", fp8_backend)}
    for kind, (recipe, backend) in recipes.items():
        if kind == "fp8" and fp8_backend is None:
            continue
        sizes = group_sizes(point.M, point.G, point.groups)
        stages = pipeline.build_step(recipe, point.M, point.N, point.K, point.G, sizes, backend=backend,
                                     device=device)  # fmt: skip
        for stage in stages:
            if stage.category == "gemm":
                case = "2D x 2D" if stage.name == "gemm_wgrad" else "2D x 3D"
                yield GemmCandidate(kind, f"{point.label} {stage.name} {case}", stage.run, stage.cost.flops)
        del stages
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def measure_gemms(
    candidates: Iterator[GemmCandidate] | Sequence[GemmCandidate],
) -> dict[str, dict[str, float]]:
    """TFLOP/s (1 TFLOP/s = 1e6 FLOP per us) of each candidate by kind and name, timed with ``timing.time_fn``."""
    from .timing import time_fn

    measured: dict[str, dict[str, float]] = {kind: {} for kind in _GEMM_KINDS}
    for c in candidates:
        measured[c.kind][c.name] = c.flops / time_fn(c.call).median_us / 1e6
    return measured


def best_gemms(measured: dict[str, dict[str, float]]) -> tuple[dict[str, float | None], dict[str, str | None]]:
    """From TFLOP/s per kind and candidate: (each kind's best as ``Ceilings`` fields, None for a kind with no
    candidate; the winning candidate of each kind as ``bf16_shape`` / ``fp8_shape``)."""
    if not measured.get("bf16"):
        raise InputError("measured must hold at least one bf16 GEMM candidate")
    best, shapes = {}, {}
    for kind, field_name in _GEMM_KINDS.items():
        candidates = measured.get(kind) or {}
        winner = max(candidates, key=candidates.get) if candidates else None
        best[field_name] = candidates[winner] if winner else None
        shapes[f"{kind}_shape"] = winner
    return best, shapes


def _gemm_ceilings(n: int, points: Sequence[GemmPoint]) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """(TFLOP/s of every GEMM candidate by kind, why a kind's candidates could not run), on the current device."""
    from mxkernels.gemm.grouped_gemm import available_backends

    square, fp8_error = square_candidates(n)
    fp8_backend = "native" if fp8_error is None and "native" in available_backends("fp8_rowwise") else None
    errors = {"fp8": fp8_error} if fp8_error else {}
    if fp8_error is None and fp8_backend is None:
        errors["fp8_grouped"] = "FP8 rowwise torch._scaled_grouped_mm does not run on this card"

    def candidates():
        yield from square
        for point in points:
            yield from grouped_candidates(point, fp8_backend=fp8_backend)

    return measure_gemms(candidates()), errors


def _enforced_limit_w(device: int) -> float | None:
    from .power import PowerController, PowerError

    try:
        return PowerController(device).read_limits().enforced_w
    except PowerError:
        return None


