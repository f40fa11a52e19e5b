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
check every operand, then hand them to the backend's run function.

The backends declare themselves: each module's ``Backend`` record (``backend``) says which recipes it runs, where it
can run and why not, its launch configuration, what it writes and where it ranks; ``backends.DECLARED`` lists them
(native, triton, triton_fast, triton_ws, triton_dequant, triton_fused, triton_fp8, emulated: each module's doc says
what it is). ``BACKENDS``, ``CONFIG_TYPES``, ``available_backends`` (the default order per device) and the checks
below are read from the declarations, so a backend added with ``backends.register_backend`` is one like the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from . import backends as declarations, native as gemm_native, shape_classes
from .backend import Backend, GemmCase, arch_of
from .shape_classes import Choice, GemmShape
from ..core.cost import Cost
from ..core.format import BLOCK_SIZE, DATA_DTYPE, ScaleMode
from ..core.names import Recipe
from ..quant.fp8_rowwise import quantize_fp8_rowwise, quantize_fp8_rowwise_3d, quantize_fp8_rowwise_k_groups
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
    InputError,
    check_config,
    check_host_offsets,
    check_offsets,
    check_same_device,
    check_shape,
    check_tensor,
)

RECIPES = tuple(r.value for r in Recipe)


class _ByRecipe(Mapping):
    """A read-only table by recipe, computed from the declarations at each lookup (a backend registered at run time
    is in it at once)."""

    def __init__(self, of: Callable[[str], object]):
        self._of = of

    def __getitem__(self, recipe: str):
        if recipe not in RECIPES:
            raise KeyError(recipe)
        return self._of(recipe)

    def __iter__(self):
        return iter(RECIPES)

    def __len__(self) -> int:
        return len(RECIPES)


BACKENDS = _ByRecipe(lambda recipe: tuple(b.name for b in declarations.declared(recipe)))
"""The backend names of each recipe, in declaration order."""
# The launch configuration type of each backend that takes ``config=``, by recipe (a backend's name means one kernel
# family within a recipe: "triton" is ``mx_triton`` for MXFP8 and ``fp8_triton`` for FP8 rowwise).
CONFIG_TYPES = _ByRecipe(lambda recipe: {b.name: b.config_type for b in declarations.declared(recipe) if b.config_type})


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


def _declared(recipe: str, backend: str) -> Backend:
    found = declarations.find(recipe, backend)
    if found is None:
        raise InputError(f"backend for recipe {recipe!r} must be one of {', '.join(BACKENDS[recipe])}; got {backend!r}")
    return found


def backend_unavailable(recipe: str, backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot run ``recipe`` on ``device``, or None if it can (its declaration's ``unavailable``).
    Native MXFP8 on SM100 is probed at its first use on a device (``gemm_native.probe_mxfp8``: a launch and a sync,
    so not inside CUDA-graph capture)."""
    return _declared(recipe, backend).unavailable(Recipe(recipe), _capability(device), device)


def _preference(recipe: str, device: torch.device) -> list[Backend]:
    """The recipe's backends by their rank on the device's architecture, ties in declaration order."""
    arch = arch_of(_capability(device))
    return sorted(declarations.declared(recipe), key=lambda b: b.rank(arch))


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
    return [b.name for b in _preference(recipe, device) if backend_unavailable(recipe, b.name, device) is None]


def default_backend(recipe: str, device: torch.device | str | None = None) -> str:
    """The backend a call with ``backend=None`` uses: the best available for ``recipe`` on ``device``."""
    return available_backends(recipe, device)[0]


def choose(recipe: str, case: GemmCase | str, M: int, N: int, K: int, G: int,
           device: torch.device | str | None = None) -> Choice:  # fmt: skip
    """The backend and launch configuration a call with ``backend=None`` runs, from its shape (``_check_quantized``'s
    terms: 2d3d a (M, K), b (G, N, K); 2d2d a (N, M), b (K, M)) and host-known values only (``shape_classes``).
    Where the recipe has no class table on the device's architecture, or the class's backend cannot run there, the
    default backend with its own default launch (config None)."""
    recipe = check_recipe(recipe)
    device = _default_device() if device is None else torch.device(device)
    shape = GemmShape(case, M, N, K, G)
    table = shape_classes.table_for(recipe, arch_of(_capability(device)))
    if table is not None:
        picked = table.choices[table.classify(shape)]
        if backend_unavailable(recipe, picked.backend, device) is None:
            return picked
    return Choice(default_backend(recipe, device), None, "the device's default order (no shape class applies)")


def _resolve_backend(recipe: str, backend: str | None, device: torch.device) -> Backend:
    """The declaration of ``backend`` (None: the device's default), refused here if it cannot run on ``device``."""
    if backend is None:
        backend = default_backend(recipe, device)
    reason = backend_unavailable(recipe, backend, device)
    if reason:
        raise RuntimeError(reason)
    return declarations.find(recipe, backend)


# ---------------------------------------------------------------------------------------------------------------
# Operand checks
# ---------------------------------------------------------------------------------------------------------------


def _check_quantized(a_q, b_q, offs, group_multiple: int = 1) -> tuple[GemmCase, int, int, int, int]:
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
        return GemmCase.A2D_B3D, M, N, K, G
    (N, M), (K, Mb) = a_q.shape, b_q.shape
    if Mb != M:
        raise InputError(f"a_q (N, M) and b_q (K, M) must share M; got {tuple(a_q.shape)}, {tuple(b_q.shape)}")
    check_host_offsets(offs, M, group_multiple)
    return GemmCase.A2D_B2D, M, N, K, G


def _check_same_device(a_q: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        check_same_device(name, x, a_q, "a_q")


def _launch_options(config: object, recipe: str, backend: Backend) -> dict:
    """The ``config=`` keyword of the backend's run function: None or its declared type. A backend without one gets
    none, and ignores a launch configuration of another backend (so one ``config`` can go with ``backend=None``)."""
    if backend.config_type is not None:
        check_config("config", config, backend.config_type, f" for backend {backend.name!r} of recipe {recipe!r}")
        return {"config": config}
    types = tuple(dict.fromkeys(t for b in declarations.DECLARED if (t := b.config_type)))
    if config is not None and not isinstance(config, types):
        raise InputError(f"config must be a launch configuration ({', '.join(t.__name__ for t in types)}) or None, "
                         f"got {config!r}")  # fmt: skip
    return {}


def _check_out_dtype(out_dtype: object, backend: Backend) -> torch.dtype:
    if out_dtype not in backend.out_dtypes:
        raise InputError(f"out_dtype must be one of {backend.out_dtypes} for backend {backend.name!r}; got {out_dtype}")
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
    config: object = None,
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
    contraction = K if case is GemmCase.A2D_B3D else M
    if contraction % BLOCK_SIZE:
        raise InputError(f"the contraction dim ({contraction}) must be a multiple of {BLOCK_SIZE}")
    check_tensor("a_sb", a_sb, dtypes=SCALE_DTYPES, ndim=2)
    check_tensor("b_sb", b_sb, dtypes=SCALE_DTYPES, ndim=3 if case is GemmCase.A2D_B3D else 2)
    _check_same_device(a_q, a_sb=a_sb, b_sb=b_sb)
    if case is GemmCase.A2D_B3D:
        check_shape("a_sb", a_sb, m_groups_shape(M, K // BLOCK_SIZE, G))
        check_shape("b_sb", b_sb, blocked_3d_shape(G, N, K // BLOCK_SIZE))
    else:
        check_shape("a_sb", a_sb, k_groups_shape(N, M // BLOCK_SIZE, G))
        check_shape("b_sb", b_sb, k_groups_shape(K, M // BLOCK_SIZE, G))
    return _run("mxfp8", backend, (a_q, a_sb, b_q, b_sb, offs), out_dtype, config)


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
    config: object = None,
) -> torch.Tensor:
    """FP8 rowwise grouped GEMM on quantized TN operands with fp32 scales (``fp8_rowwise`` produces them).

    2D x 3D: a_q (M, K), a_scale (M,), b_q (G, N, K), b_scale (G, N) -> (M, N).
    2D x 2D: a_q (N, M), a_scale (G, N), b_q (K, M), b_scale (G, K) -> (G, N, K) (per-group scales). "native"
    (``torch._scaled_grouped_mm``, SM90/SM100) has shape rules of its own (``gemm_native``) and writes bf16 only;
    "triton" (``gemm_fp8_rowwise``, SM90+: TMA; torch's sums) and "triton_fast" (the same kernels summing in the
    tensor core's accumulator throughout, as ``use_fast_accum``: faster, a lower SQNR) need the contraction's row
    stride a multiple of 16 bytes.
    ``use_fast_accum``: the native kernel's fast (less precise) accumulation. ``config``: the backend's launch (None:
    its default). ``backend=None``: the backend and launch of the shape's class (``choose``; a ``config`` given is
    kept, and must then be the chosen backend's type).
    """
    case, M, N, K, G = _check_quantized(a_q, b_q, offs)
    if case is GemmCase.A2D_B3D:
        scale_shapes = (M,), (G, N)
    else:
        scale_shapes = (G, N), (G, K)
    for name, scale, shape in zip(("a_scale", "b_scale"), (a_scale, b_scale), scale_shapes, strict=True):
        check_tensor(name, scale, dtypes=(torch.float32,))
        check_shape(name, scale, shape)
    _check_same_device(a_q, a_scale=a_scale, b_scale=b_scale)
    operands = (a_q, a_scale, b_q, b_scale, offs)
    if backend is None:  # the shape's class decides (``choose``): never a read of offs
        picked = choose("fp8_rowwise", case, M, N, K, G, a_q.device)
        backend, config = picked.backend, picked.config if config is None else config
    return _run("fp8_rowwise", backend, operands, out_dtype, config, use_fast_accum=use_fast_accum)


def _run(recipe: str, backend: str | None, operands: tuple, out_dtype: object, config: object, **options):
    """The backend's run function for ``recipe`` on checked operands, once it has accepted the output dtype and
    launch configuration (``backend`` module doc: the calling convention)."""
    found = _resolve_backend(recipe, backend, operands[0].device)
    out_dtype = _check_out_dtype(out_dtype, found)
    options |= _launch_options(config, recipe, found)
    return found.run[Recipe(recipe)](*operands, out_dtype, **options)


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
    config = None
    if recipe == "fp8_rowwise" and backend is None:  # the shape's class (``choose``), in the kernel's terms
        G = offs.numel()
        case = GemmCase.of_b(b)
        if case is GemmCase.A2D_B3D:  # a (M, K), b (G, K, N)
            dims = a.shape[0], b.shape[2], a.shape[1]
        else:  # a (N, M), b (M, K)
            dims = a.shape[1], a.shape[0], b.shape[1]
        picked = choose(recipe, case, *dims, G, a.device)
        backend, config = picked.backend, picked.config
    backend = _resolve_backend(recipe, backend, a.device).name

    if recipe == "mxfp8":
        out = mxfp8_scaled_grouped_mm(*quantize_mxfp8_operands(a, b, offs, mode), offs, backend=backend)
    elif recipe == "fp8_rowwise":
        out = fp8_rowwise_scaled_grouped_mm(*_quantize_fp8_rowwise(a, b, offs), offs, backend=backend, config=config)
    else:
        out = declarations.find(recipe, backend).run[Recipe.BF16](a, b, offs)
    return GroupedMMResult(out, backend)


# ---------------------------------------------------------------------------------------------------------------
# Cost
# ---------------------------------------------------------------------------------------------------------------

_PRECISION = {"bf16": "bf16", "fp8_rowwise": "fp8", "mxfp8": "mxfp8"}


def grouped_mm_cost(M: int, N: int, K: int, G: int, recipe: str, case: GemmCase | str = GemmCase.A2D_B3D) -> Cost:
    """Cost of one grouped GEMM with bf16 output: 2*M*N*K FLOPs; bytes = operands + scales + output.

    2d3d: (M, K) x (G, K, N) -> (M, N); 2d2d: (N, M) x (M, K) -> (G, N, K) (M is the contraction dim). Operands
    are bf16 (2 bytes) or e4m3 (1 byte); fp8_rowwise scales are fp32, one per row (per group and row in 2d2d);
    mxfp8 scales are the blocked buffers as handed over (``layouts`` shapes, their padding included).
    """
    recipe = check_recipe(recipe)
    case = GemmCase.parse(case)
    if min(M, N, K) < 0 or G < 1:
        raise InputError(f"M, N, K must be >= 0 and G >= 1; got {M}, {N}, {K}, {G}")
    elt = 2 if recipe == "bf16" else 1
    if case is GemmCase.A2D_B3D:
        operands, out = (M * K + G * N * K) * elt, M * N * 2
    else:
        operands, out = (N * M + M * K) * elt, G * N * K * 2
    scales = 0
    if recipe == "fp8_rowwise":
        scales = 4 * (M + G * N if case is GemmCase.A2D_B3D else G * (N + K))
    elif recipe == "mxfp8":
        contraction = K if case is GemmCase.A2D_B3D else M
        if contraction % BLOCK_SIZE:
            raise InputError(f"mxfp8: the contraction dim ({contraction}) must be a multiple of {BLOCK_SIZE}")
        if case is GemmCase.A2D_B3D:
            scales = math.prod(m_groups_shape(M, K // BLOCK_SIZE, G)) + math.prod(
                blocked_3d_shape(G, N, K // BLOCK_SIZE)
            )
        else:
            scales = sum(r * c for r, c in (k_groups_shape(R, M // BLOCK_SIZE, G) for R in (N, K)))
    return Cost(bytes_read=operands + scales, bytes_written=out, flops=2 * M * N * K, precision=_PRECISION[recipe])

