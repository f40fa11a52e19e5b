"""The grouped GEMMs of an MoE layer behind one front door, by recipe and backend.

Two cases, with ``torch._grouped_mm`` semantics (``offs`` int32 (G,) cumulative group ends, groups may be empty):

* 2D x 3D (forward, backward input): a (M, K), b (G, K, N) -> out (M, N); group g is rows [offs[g-1], offs[g]) of
  a and out and uses b[g]. Output rows past offs[-1] are unspecified.
* 2D x 2D (backward weight): a (N, M), b (M, K) -> out (G, N, K); offs splits the contraction dim M and
  out[g] = a[:, group g] @ b[group g, :]. An empty group's output is zero.

``grouped_mm(a, b, offs, recipe)`` takes high-precision operands, quantizes them for the recipe and runs the
operand-level call. The operand-level calls -- what the pipeline times -- take quantized operands with the contraction
dim contiguous for both ("TN", as every FP8/MX tensor-core GEMM wants them):

* 2D x 3D: a_q (M, K), b_q (G, N, K) -> out (M, N);
* 2D x 2D: a_q (N, M), b_q (K, M) -> out (G, N, K).

``mxfp8_scaled_grouped_mm`` takes e4m3 data and the *blocked* e8m0 scales exactly as ``layouts`` produces them, the
same inputs for every backend: 2D x 3D: a_sb = ``rearrange_m_groups`` buffer (128 * (ceil(M/128) + G), ceil_4(K/32)),
b_sb = ``rearrange_3d`` (G, ceil_128(N), ceil_4(K/32)); 2D x 2D: ``rearrange_k_groups`` buffers
(ceil_128(N), M/32 + 4G) and (ceil_128(K), M/32 + 4G), whose group sizes must be multiples of 32 (an MX block must
not straddle two experts). Offs are checked on the host only where that needs no sync (CPU tensors); on the GPU the
Triton kernels trust them, and "native" checks them on the device on SM100 (``gemm_native``: malformed offs give an
all-NaN output, never a dead CUDA context).
``fp8_rowwise_scaled_grouped_mm`` is its FP8 rowwise sibling (fp32 scales from ``fp8_rowwise``). The dispatchers here
check every operand, then hand them to one backend module:

* "native" (``gemm_native``): ``torch._scaled_grouped_mm`` (MXFP8 on SM100 only, refused elsewhere before any
  launch, and there only once a probe at first use passed; FP8 rowwise on SM90 / SM100) and ``torch._grouped_mm``
  for bf16, all three behind guards on SM100 for what the SM100 kernels get wrong (empty 2D x 2D groups, fewer rows
  than experts, malformed offs);
* "triton", "triton_fp8" (``gemm_triton``): Triton grouped GEMMs on ``tl.dot_scaled`` and on fp8 ``tl.dot`` with
  an fp32 rescale per 32-wide chunk;
* "triton_dequant" (``gemm_dequant``): exact MXFP8 -> bf16 dequantization from the blocked scales, then
  ``torch._grouped_mm``;
* "triton_fused" (``gemm_fused``): persistent Triton grouped GEMMs that dequantize the token operand to bf16 in
  registers, in the GEMM's load path, and multiply on bf16 tensor cores (no full-size bf16 copy);
* "emulated" (``gemm_emulated``): dequantize and multiply in fp32, a host loop over groups: the reference.

Default backend (``available_backends``, best first): SM100 native > triton > triton_dequant > triton_fused >
triton_fp8; SM90 triton_dequant > triton_fused > triton_fp8 > triton; SM89 triton_fp8 > triton_dequant >
triton_fused > triton; CPU emulated (the Triton backends run there only under the interpreter, for tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import dequant, emulated as gemm_emulated, fp8_triton, fp8_ws, fused, native as gemm_native, mx_triton
from ..core.cost import Cost
from ..core.format import BLOCK_SIZE, DATA_DTYPE, ScaleMode
from ..quant.fp8_rowwise import quantize_fp8_rowwise, quantize_fp8_rowwise_3d, quantize_fp8_rowwise_k_groups
from .fp8_triton import Fp8Config
from .fp8_ws import WsConfig
from .fused import FusedConfig
from .mx_triton import TileConfig
from ..layouts.scale_layout import (
    SCALE_DTYPES,
    blocked_3d_shape,
    k_groups_shape,
    m_groups_shape,
    rearrange_3d,
    rearrange_k_groups,
    rearrange_m_groups,
)
from ..quant.quantize import quantize_3d, quantize_dim0, quantize_dim1
from ..core.runtime import (
    INTERPRET,
    InputError,
    check_config,
    check_host_offsets,
    check_offsets,
    check_same_device,
    check_shape,
    check_tensor,
)

RECIPES = ("mxfp8", "fp8_rowwise", "bf16")
BACKENDS = {
    "bf16": ("native", "emulated"),
    "fp8_rowwise": ("native", "triton", "triton_fast", "triton_ws", "emulated"),
    "mxfp8": ("native", "triton", "triton_dequant", "triton_fused", "triton_fp8", "emulated"),
}
# The launch configuration type of each backend that takes ``config=``, by recipe (a backend's name means one kernel
# family within a recipe: "triton" is ``gemm_triton`` for MXFP8 and ``gemm_fp8_rowwise`` for FP8 rowwise).
CONFIG_TYPES = {"mxfp8": {"triton": TileConfig, "triton_fp8": TileConfig, "triton_fused": FusedConfig},
                "fp8_rowwise": {"triton": Fp8Config, "triton_fast": Fp8Config, "triton_ws": WsConfig}}  # fmt: skip
OUT_DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class GroupedMMResult:
    """What ``grouped_mm`` returns: the output and the backend that computed it."""

    out: torch.Tensor
    backend: str


# ---------------------------------------------------------------------------------------------------------------
# Which backend runs where
# ---------------------------------------------------------------------------------------------------------------


def _capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, None for any other device."""
    return gemm_native.capability(device)


def backend_unavailable(recipe: str, backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run ``recipe`` on ``device``, or None if it can. Native MXFP8 on SM100 is probed at
    its first use on a device (``gemm_native.probe_mxfp8``: a launch and a sync, so not inside CUDA-graph
    capture)."""
    cap = _capability(device)
    if backend == "emulated":
        return None
    if backend == "native":
        return gemm_native.unavailable(recipe, cap, device)
    if backend == "triton_ws":
        # Gluon has no interpreter, and the kernel is built of SM90's wgmma (SM100 has none).
        return None if cap == (9, 0) else f"triton_ws is an SM90 (Hopper) kernel, this device is {cap or device}"
    if cap is None:
        return None if INTERPRET else f"the Triton backends need a CUDA device (or TRITON_INTERPRET=1), got {device}"
    if cap < (8, 9):
        return f"the Triton MXFP8 backends need fp8 tensor cores (compute capability >= 8.9), this GPU is {cap}"
    if backend == "triton_fused":
        return FUSED_WITHHELD
    if recipe == "fp8_rowwise" and cap < (9, 0):
        return f"the Triton FP8 rowwise grouped GEMM reads its operands through TMA (compute capability >= 9.0), this GPU is {cap}"
    return None


FUSED_WITHHELD = (
    "triton_fused is withheld on GPUs: four pipeline stages of its 2D x 3D kernel gave wrong bf16 outputs on an H100 "
    "(a race in the build, docs/perf-log.md), and the configurations measured right are no faster than triton_dequant; "
    "it runs under the interpreter for its tests, and on GPUs in its own GPU tests and tuning script"
)


def _preference(recipe: str, device: torch.device) -> tuple[str, ...]:
    cap = _capability(device)
    if recipe == "fp8_rowwise":
        # On CPU the Triton kernel runs in the interpreter, for tests; the emulation is the fast one there. On SM90
        # the warp-specialized kernel sums as torch's does and is faster in every pass (docs/perf-log.md).
        if cap is None:
            return ("emulated", "native", "triton", "triton_fast")
        return ("triton_ws", "native", "triton", "triton_fast", "emulated") if cap == (9, 0) else BACKENDS[recipe]
    if recipe != "mxfp8":
        return BACKENDS[recipe]
    if cap is None:
        # On CPU the Triton backends run in the interpreter, for tests; the emulation is the fast one there.
        return ("emulated", "triton_dequant", "triton_fused", "triton_fp8", "triton")
    if cap[0] == 10:
        return ("native", "triton", "triton_dequant", "triton_fused", "triton_fp8", "emulated")
    if cap == (9, 0):
        # triton_fused stays behind triton_dequant until it is measured faster at the DeepSeek-V3 shapes
        # (scripts/tune_fused_gemm.py, docs/perf-log.md).
        return ("triton_dequant", "triton_fused", "triton_fp8", "triton", "emulated")
    # Below SM90 torch._grouped_mm is a host loop over offs (a sync, not graph-capturable): not the default there.
    return ("triton_fp8", "triton_dequant", "triton_fused", "triton", "emulated")


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def check_recipe(recipe: object) -> str:
    if recipe not in RECIPES:
        raise InputError(f"recipe must be one of {', '.join(RECIPES)}; got {recipe!r}")
    return recipe


def available_backends(recipe: str, device: torch.device | str | None = None) -> list[str]:
    """Backends that can run ``recipe`` on ``device`` (default: the current GPU, else CPU), best first."""
    recipe = check_recipe(recipe)
    device = _default_device() if device is None else torch.device(device)
    return [b for b in _preference(recipe, device) if backend_unavailable(recipe, b, device) is None]


def default_backend(recipe: str, device: torch.device | str | None = None) -> str:
    """The backend a call with ``backend=None`` uses: the best available for ``recipe`` on ``device``."""
    return available_backends(recipe, device)[0]


def _resolve_backend(recipe: str, backend: str | None, device: torch.device) -> str:
    if backend is None:
        return default_backend(recipe, device)
    if backend not in BACKENDS[recipe]:
        raise InputError(f"backend for recipe {recipe!r} must be one of {', '.join(BACKENDS[recipe])}; got {backend!r}")
    reason = backend_unavailable(recipe, backend, device)
    if reason:
        raise RuntimeError(reason)
    return backend


# ---------------------------------------------------------------------------------------------------------------
# Operand checks
# ---------------------------------------------------------------------------------------------------------------


def _check_quantized(a_q, b_q, offs, group_multiple: int = 1) -> tuple[str, int, int, int, int]:
    """(case, M, N, K, G) of TN operands a_q, b_q (e4m3, contiguous): 2D x 3D or 2D x 2D, see the module doc.

    Where offs can be read without a sync (CPU), its values are checked too; in 2D x 2D every group size must be a
    multiple of ``group_multiple``.
    """
    check_tensor("a_q", a_q, dtypes=(DATA_DTYPE,), ndim=2)
    check_tensor("b_q", b_q, dtypes=(DATA_DTYPE,), ndim=(2, 3))
    check_offsets(offs)
    G = offs.numel()
    _check_same_device(a_q, b_q=b_q, offs=offs)
    if b_q.dim() == 3:
        (M, K), (Gb, N, Kb) = a_q.shape, b_q.shape
        if Kb != K:
            raise InputError(f"b_q (G, N, K) must share K with a_q (M, K); got {tuple(b_q.shape)}, {tuple(a_q.shape)}")
        if Gb != G:
            raise InputError(f"offs must hold one group end per expert of b_q ({Gb}), got {G}")
        check_host_offsets(offs, M)
        return "2d3d", M, N, K, G
    (N, M), (K, Mb) = a_q.shape, b_q.shape
    if Mb != M:
        raise InputError(f"a_q (N, M) and b_q (K, M) must share M; got {tuple(a_q.shape)}, {tuple(b_q.shape)}")
    check_host_offsets(offs, M, group_multiple)
    return "2d2d", M, N, K, G


def _check_same_device(a_q: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        check_same_device(name, x, a_q, "a_q")


def _check_launch_config(config: object, recipe: str, backend: str) -> None:
    """``config`` must be None or the backend's launch configuration type; backends without one ignore any."""
    types = CONFIG_TYPES[recipe]
    if backend in types:
        check_config("config", config, types[backend], f" for backend {backend!r} of recipe {recipe!r}")
    elif config is not None and not isinstance(config, (TileConfig, FusedConfig, Fp8Config, WsConfig)):
        raise InputError(f"config must be a launch configuration ({TileConfig.__name__}, {FusedConfig.__name__}, "
                         f"{Fp8Config.__name__} or {WsConfig.__name__}) or None, got {config!r}")  # fmt: skip


def _check_out_dtype(out_dtype: object, backend: str) -> torch.dtype:
    # torch._grouped_mm and the native MX kernel write bf16 only.
    allowed = (torch.bfloat16,) if backend in ("native", "triton_dequant") else OUT_DTYPES
    if out_dtype not in allowed:
        raise InputError(f"out_dtype must be one of {allowed} for backend {backend!r}; got {out_dtype}")
    return out_dtype


# ---------------------------------------------------------------------------------------------------------------
# Operand-level calls
# ---------------------------------------------------------------------------------------------------------------


def mxfp8_scaled_grouped_mm(
    a_q: torch.Tensor,
    a_sb: torch.Tensor,
    b_q: torch.Tensor,
    b_sb: torch.Tensor,
    offs: torch.Tensor,
    *,
    backend: str | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    config: TileConfig | FusedConfig | None = None,
) -> torch.Tensor:
    """MXFP8 grouped GEMM on quantized TN operands with blocked scales (shapes in the module doc).

    2D x 3D: a_q (M, K), a_sb ``rearrange_m_groups`` buffer, b_q (G, N, K), b_sb (G, ceil_128(N), ceil_4(K/32))
    -> (M, N). 2D x 2D: a_q (N, M), b_q (K, M), a_sb / b_sb ``rearrange_k_groups`` buffers -> (G, N, K).
    e4m3 data and e8m0 (or uint8) scales, all contiguous; K (2D x 3D) or M (2D x 2D) a multiple of 32.
    ``backend``: None picks ``default_backend("mxfp8", device)``. ``out_dtype``: bf16, or fp32 (not "native" nor
    "triton_dequant").
    ``config``: the Triton backends' launch, a ``CONFIG_TYPES[backend]`` (None: ``mx_triton.default_config`` /
    ``fused.default_config``); other backends ignore it.
    """
    case, M, N, K, G = _check_quantized(a_q, b_q, offs, BLOCK_SIZE)
    contraction = K if case == "2d3d" else M
    if contraction % BLOCK_SIZE:
        raise InputError(f"the contraction dim ({contraction}) must be a multiple of {BLOCK_SIZE}")
    check_tensor("a_sb", a_sb, dtypes=SCALE_DTYPES, ndim=2)
    check_tensor("b_sb", b_sb, dtypes=SCALE_DTYPES, ndim=3 if case == "2d3d" else 2)
    _check_same_device(a_q, a_sb=a_sb, b_sb=b_sb)
    if case == "2d3d":
        check_shape("a_sb", a_sb, m_groups_shape(M, K // BLOCK_SIZE, G))
        check_shape("b_sb", b_sb, blocked_3d_shape(G, N, K // BLOCK_SIZE))
    else:
        check_shape("a_sb", a_sb, k_groups_shape(N, M // BLOCK_SIZE, G))
        check_shape("b_sb", b_sb, k_groups_shape(K, M // BLOCK_SIZE, G))
    backend = _resolve_backend("mxfp8", backend, a_q.device)
    out_dtype = _check_out_dtype(out_dtype, backend)
    _check_launch_config(config, "mxfp8", backend)

    if backend == "native":
        return gemm_native.run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype)
    if backend == "emulated":
        return gemm_emulated.run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype)
    if backend == "triton_dequant":
        return dequant.run_mxfp8(a_q, a_sb, b_q, b_sb, offs)
    if backend == "triton_fused":
        return fused.run_mxfp8(a_q, a_sb, b_q, b_sb, offs, out_dtype=out_dtype, config=config)
    return mx_triton.run_mxfp8(a_q, a_sb, b_q, b_sb, offs, backend=backend, out_dtype=out_dtype, config=config)


def fp8_rowwise_scaled_grouped_mm(
    a_q: torch.Tensor,
    a_scale: torch.Tensor,
    b_q: torch.Tensor,
    b_scale: torch.Tensor,
    offs: torch.Tensor,
    *,
    backend: str | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
    config: Fp8Config | None = None,
) -> torch.Tensor:
    """FP8 rowwise grouped GEMM on quantized TN operands with fp32 scales (``fp8_rowwise`` produces them).

    2D x 3D: a_q (M, K), a_scale (M,), b_q (G, N, K), b_scale (G, N) -> (M, N).
    2D x 2D: a_q (N, M), a_scale (G, N), b_q (K, M), b_scale (G, K) -> (G, N, K) (per-group scales). "native"
    (``torch._scaled_grouped_mm``, SM90/SM100) has shape rules of its own (``gemm_native``) and writes bf16 only;
    "triton" (``gemm_fp8_rowwise``, SM90+: TMA; torch's sums) and "triton_fast" (the same kernels summing in the
    tensor core's accumulator throughout, as ``use_fast_accum``: faster, a lower SQNR) need the contraction's row
    stride a multiple of 16 bytes.
    ``use_fast_accum``: the native kernel's fast (less precise) accumulation. ``config``: "triton"'s launch (None:
    ``fp8_triton.default_config``).
    """
    case, M, N, K, G = _check_quantized(a_q, b_q, offs)
    if case == "2d3d":
        scale_shapes = (M,), (G, N)
    else:
        scale_shapes = (G, N), (G, K)
    for name, scale, shape in zip(("a_scale", "b_scale"), (a_scale, b_scale), scale_shapes, strict=True):
        check_tensor(name, scale, dtypes=(torch.float32,))
        check_shape(name, scale, shape)
    _check_same_device(a_q, a_scale=a_scale, b_scale=b_scale)
    backend = _resolve_backend("fp8_rowwise", backend, a_q.device)
    out_dtype = _check_out_dtype(out_dtype, backend)
    _check_launch_config(config, "fp8_rowwise", backend)

    if backend == "emulated":
        return gemm_emulated.run_fp8_rowwise(a_q, a_scale, b_q, b_scale, offs, out_dtype)
    if backend in ("triton", "triton_fast"):
        return fp8_triton.run_fp8_rowwise(a_q, a_scale, b_q, b_scale, offs, out_dtype, config,
                                                fast=backend == "triton_fast")  # fmt: skip
    if backend == "triton_ws":
        return fp8_ws.run_fp8_rowwise(a_q, a_scale, b_q, b_scale, offs, out_dtype, config)
    return gemm_native.run_fp8_rowwise(a_q, a_scale, b_q, b_scale, offs, out_dtype, use_fast_accum)


# ---------------------------------------------------------------------------------------------------------------
# The front door
# ---------------------------------------------------------------------------------------------------------------


def _mx_along_last(x: torch.Tensor, mode) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 blocks along the last dim of a 2D x (row- or column-major): q row-major, scales (R, C/32)."""
    if x.is_contiguous():
        return quantize_dim0(x, mode)
    return quantize_dim1(x.t().contiguous(), mode)


def quantize_mxfp8_operands(a, b, offs, mode: ScaleMode | str = "rceil"):
    """The operands of ``mxfp8_scaled_grouped_mm`` (a_q, a_sb, b_q, b_sb) of ``torch._grouped_mm`` operands a, b
    (2D x 3D: a (M, K), b (G, K, N); 2D x 2D: a (N, M), b (M, K); bf16 or fp32, any strides), quantized with
    ``mode``."""
    mode = ScaleMode.parse(mode)
    if b.dim() == 3:
        a_q, a_s = quantize_dim0(a.contiguous(), mode)
        b_q, b_s = quantize_3d(b.transpose(-2, -1).contiguous(), along="K", mode=mode)
        return a_q, rearrange_m_groups(a_s, offs), b_q, rearrange_3d(b_s)
    a_q, a_s = _mx_along_last(a, mode)
    b_q, b_s = _mx_along_last(b.t(), mode)
    return a_q, rearrange_k_groups(a_s, offs), b_q, rearrange_k_groups(b_s, offs)


def _quantize_fp8_rowwise(a, b, offs):
    if b.dim() == 3:
        a_q, a_scale = quantize_fp8_rowwise(a.contiguous())
        b_q, b_scale = quantize_fp8_rowwise_3d(b.transpose(-2, -1).contiguous(), along="K")
        return a_q, a_scale, b_q, b_scale
    return (*quantize_fp8_rowwise_k_groups(a.t(), offs), *quantize_fp8_rowwise_k_groups(b, offs))


def grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    recipe: str = "bf16",
    backend: str | None = None,
    mode: ScaleMode | str = "rceil",
) -> GroupedMMResult:
    """``torch._grouped_mm(a, b, offs=offs)`` in ``recipe``, on high-precision operands; bf16 output.

    2D x 3D: a (M, K), b (G, K, N) -> (M, N); 2D x 2D: a (N, M), b (M, K) -> (G, N, K) (module doc). Any strides
    (b is usually a transposed view of (G, N, K) weights). bf16 needs bf16 operands; fp8_rowwise and mxfp8 take
    bf16 or fp32, quantize them with this package's Triton quantizers (mxfp8: ``mode`` scales, blocked by the
    ``layouts`` kernels) and run ``fp8_rowwise_scaled_grouped_mm`` / ``mxfp8_scaled_grouped_mm``. ``backend``: None
    picks the
    best available on the device (``available_backends``). mxfp8 2D x 2D needs group sizes that are multiples of 32.
    """
    recipe = check_recipe(recipe)
    dtypes = (torch.bfloat16,) if recipe == "bf16" else (torch.bfloat16, torch.float32)
    check_tensor("a", a, dtypes=dtypes, ndim=2, contiguous=False)
    check_tensor("b", b, dtypes=dtypes, ndim=(2, 3), contiguous=False)
    check_offsets(offs)
    if b.dim() == 3:
        if a.shape[1] != b.shape[1]:
            raise InputError(f"a (M, K) and b (G, K, N) must agree on K; got {tuple(a.shape)}, {tuple(b.shape)}")
        if b.shape[0] != offs.numel():
            raise InputError(f"offs must hold one group end per expert of b ({b.shape[0]}), got {offs.numel()}")
    elif a.shape[1] != b.shape[0]:
        raise InputError(f"a (N, M) and b (M, K) must agree on M; got {tuple(a.shape)}, {tuple(b.shape)}")
    backend = _resolve_backend(recipe, backend, a.device)

    if recipe == "mxfp8":
        out = mxfp8_scaled_grouped_mm(*quantize_mxfp8_operands(a, b, offs, mode), offs, backend=backend)
    elif recipe == "fp8_rowwise":
        out = fp8_rowwise_scaled_grouped_mm(*_quantize_fp8_rowwise(a, b, offs), offs, backend=backend)
    elif backend == "native":
        out = gemm_native.run_bf16(a, b, offs)
    else:
        out = gemm_emulated.grouped_matmul_fp32(a, b, offs, torch.bfloat16)
    return GroupedMMResult(out, backend)


# ---------------------------------------------------------------------------------------------------------------
# Cost
# ---------------------------------------------------------------------------------------------------------------

_PRECISION = {"bf16": "bf16", "fp8_rowwise": "fp8", "mxfp8": "mxfp8"}


def grouped_mm_cost(M: int, N: int, K: int, G: int, recipe: str, case: str = "2d3d") -> Cost:
    """Cost of one grouped GEMM with bf16 output: 2*M*N*K FLOPs; bytes = operands + scales + output.

    2d3d: (M, K) x (G, K, N) -> (M, N); 2d2d: (N, M) x (M, K) -> (G, N, K) (M is the contraction dim). Operands
    are bf16 (2 bytes) or e4m3 (1 byte); fp8_rowwise scales are fp32, one per row (per group and row in 2d2d);
    mxfp8 scales are the blocked buffers as handed over (``layouts`` shapes, their padding included).
    """
    recipe = check_recipe(recipe)
    if case not in ("2d3d", "2d2d"):
        raise InputError(f"case must be '2d3d' or '2d2d', got {case!r}")
    if min(M, N, K) < 0 or G < 1:
        raise InputError(f"M, N, K must be >= 0 and G >= 1; got {M}, {N}, {K}, {G}")
    elt = 2 if recipe == "bf16" else 1
    if case == "2d3d":
        operands, out = (M * K + G * N * K) * elt, M * N * 2
    else:
        operands, out = (N * M + M * K) * elt, G * N * K * 2
    scales = 0
    if recipe == "fp8_rowwise":
        scales = 4 * (M + G * N if case == "2d3d" else G * (N + K))
    elif recipe == "mxfp8":
        contraction = K if case == "2d3d" else M
        if contraction % BLOCK_SIZE:
            raise InputError(f"mxfp8: the contraction dim ({contraction}) must be a multiple of {BLOCK_SIZE}")
        if case == "2d3d":
            scales = math.prod(m_groups_shape(M, K // BLOCK_SIZE, G)) + math.prod(
                blocked_3d_shape(G, N, K // BLOCK_SIZE)
            )
        else:
            scales = sum(r * c for r, c in (k_groups_shape(R, M // BLOCK_SIZE, G) for R in (N, K)))
    return Cost(bytes_read=operands + scales, bytes_written=out, flops=2 * M * N * K, precision=_PRECISION[recipe])

