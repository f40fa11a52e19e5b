"""The built-in implementations, registered exactly as a third party's are: mxkernels (this project's kernels),
torchao's Triton kernels (optional: ``pip install mxbench[peers]``) and ``torch.compile`` of the plain-torch
references.

Each adapter gives the stage's calling contract (``mxkernels.stages.step_specs``): torchao's functions take other argument
conventions and return other layouts, and the adapters say how they map. torchao is imported on use only.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import warnings
import importlib.util
from collections.abc import Callable

import torch
from mxkernels.gemm import backends, grouped_gemm
from mxkernels.gemm.backend import Backend
from mxkernels.layouts.scale_layout import blocked_3d_shape
from mxkernels.core.names import MEMORY_CATEGORIES, Category, Recipe
from mxkernels.core.runtime import INTERPRET
from mxkernels.stages.step_specs import all_specs

from .registry import OURS, Deviation, Implementation, Registry, always

TORCHAO = "torchao"
COMPILED = "torch.compile"
_MX = "torchao.prototype.mx_formats.kernels"
_MOE = "torchao.prototype.moe_training.kernels.mxfp8"
_PLAIN_TORCH_KERNELS = ("torch._grouped_mm",)
# ---------------------------------------------------------------------------------------------------------------
# mxkernels
# ---------------------------------------------------------------------------------------------------------------


def _triton_available(device: torch.device) -> str | None:
    if device.type == "cuda" or INTERPRET:
        return None
    return "needs a CUDA GPU or the Triton interpreter (TRITON_INTERPRET=1 set before mxkernels is imported)"


def _gemm_available(recipe: str, backend: Backend | None) -> Callable[[torch.device], str | None]:
    def available(device: torch.device) -> str | None:
        if backend is None:
            return None  # the default backend is chosen per device, and one always exists (emulated)
        if not backend.interpreter_exact and device.type != "cuda":
            return "Triton's interpreter computes its dots / fp32 registers at bf16 precision: checked on a GPU only"
        return grouped_gemm.backend_unavailable(recipe, backend.name, device)

    return available


def register_mxkernels(registry: Registry) -> None:
    """mxkernels' implementation of every stage; for the GEMMs also one per declared backend of the recipe
    (``mxkernels.gemm.backends``, those registered at run time too), named ``mxkernels:<backend>`` (``mxkernels``
    alone runs the best backend of the device)."""
    for spec in all_specs().values():
        if spec.category == Category.GEMM:
            available = _gemm_available(spec.recipe, None)
        elif spec.kernel in _PLAIN_TORCH_KERNELS:
            available = None
        else:
            available = _triton_available
        registry.add(Implementation(spec.recipe, spec.name, OURS, spec.impl, spec.kernel, available or always,
                                    origin="builtin"))  # fmt: skip
        if spec.category == Category.GEMM:
            for backend in backends.declared(spec.recipe):
                name = backend.name
                registry.add(Implementation(
                    spec.recipe, spec.name, f"{OURS}:{name}", functools.partial(spec.impl, backend=name),
                    f"{spec.kernel}(backend={name})", _gemm_available(spec.recipe, backend), origin="builtin",
                ))  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# torchao
# ---------------------------------------------------------------------------------------------------------------


def torchao_version() -> str | None:
    """torchao's version, None when it is not installed, or the import error of a broken install."""
    if importlib.util.find_spec("torchao") is None:
        return None
    try:
        with _quiet():
            return str(importlib.import_module("torchao").__version__)
    except Exception as e:  # noqa: BLE001 -- an installed but broken torchao still gets its rows, each with the reason
        return f"import failed: {e}"


@contextlib.contextmanager
def _quiet():
    """torchao's import warns and logs about optional kernels it cannot load (noise on every command's stderr):
    its warnings and log records below ERROR are dropped while it imports."""
    logger = logging.getLogger("torchao")
    level = logger.level
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logger.setLevel(level)


def _ao(module: str, name: str):
    with _quiet():
        return getattr(importlib.import_module(module), name)


def _torchao_available(quantizer: bool) -> Callable[[torch.device], str | None]:
    def available(device: torch.device) -> str | None:
        version = torchao_version()
        if version is None:
            return "torchao is not installed (pip install mxbench[peers])"
        if version.startswith("import failed"):
            return f"torchao {version}"
        if device.type != "cuda":
            return "torchao's Triton kernels need a CUDA GPU"
        if quantizer and torch.cuda.get_device_capability(device) < (10, 0):
            return "torchao's Triton MXFP8 quantizers run only on SM100+ (gated by is_sm_at_least_100)"
        return None

    return available


def _ao_dim0(x, *, mode):
    q, s = _ao(_MX, "triton_to_mxfp8_dim0")(x, inner_block_size=32, scaling_mode=mode)
    return q, s


def _ao_dim1(x, *, mode):
    """torchao returns the (M, K) data column-major; its transpose is the contract's (K, M)."""
    q, s = _ao(_MX, "triton_to_mxfp8_dim1")(x, inner_block_size=32, scaling_mode=mode)
    return q.t(), s


def _ao_3d_along_k(w, *, mode):
    """(G, N, K) weights as the (G*N, K) matrix torchao's 2D quantizers take (blocks never straddle experts)."""
    G, N, K = w.shape
    q, s = _ao_dim0(w.reshape(G * N, K), mode=mode)
    return q.view(G, N, K), s.view(G, N, K // 32)


def _ao_3d_along_n(w, *, mode):
    """dim1 of (G*N, K) gives (K, G*N) data and (K, G*N/32) scales: per expert, a (G, K, N) view."""
    G, N, K = w.shape
    q, s = _ao_dim1(w.reshape(G * N, K), mode=mode)
    return q.view(K, G, N).permute(1, 0, 2), s.view(K, G, N // 32).permute(1, 0, 2)


def _ao_m_groups(scales, offs):
    return (_ao(_MOE, "triton_mx_block_rearrange_2d_M_groups")(scales, offs),)


def _ao_k_groups(scales, offs):
    """torchao takes the group ends in scale columns (offs / 32)."""
    return (_ao(_MOE, "triton_mx_block_rearrange_2d_K_groups")(scales, offs // 32),)


def _ao_k_groups_prepared(inputs, params):
    scales, offs = inputs
    f, scale_offs = _ao(_MOE, "triton_mx_block_rearrange_2d_K_groups"), offs // 32  # converted once, untimed
    return lambda: (f(scales, scale_offs),)


def _ao_3d(scales):
    """torchao returns the experts' blocked images flattened, (G, ceil_128(R) * ceil_4(C)); the contract's shape is
    (G, ceil_128(R), ceil_4(C)), the same bytes."""
    out = _ao(_MOE, "triton_mx_block_rearrange_per_group_3d")(scales)
    return (out.view(blocked_3d_shape(*scales.shape)),)


_TORCHAO = {
    # stage: (fn, torchao function (for the tables), is a quantizer, prepare)
    "quantize_a": (_ao_dim0, "triton_to_mxfp8_dim0", True, None),
    "quantize_grad_out": (_ao_dim0, "triton_to_mxfp8_dim0", True, None),
    "quantize_w": (_ao_3d_along_k, "triton_to_mxfp8_dim0 of (G*N, K)", True, None),
    "quantize_w_t": (_ao_3d_along_n, "triton_to_mxfp8_dim1 of (G*N, K)", True, None),
    "quantize_a_t": (_ao_dim1, "triton_to_mxfp8_dim1", True, None),
    "quantize_grad_out_t": (_ao_dim1, "triton_to_mxfp8_dim1", True, None),
    "rearrange_a": (_ao_m_groups, "triton_mx_block_rearrange_2d_M_groups", False, None),
    "rearrange_grad_out": (_ao_m_groups, "triton_mx_block_rearrange_2d_M_groups", False, None),
    "rearrange_a_t": (_ao_k_groups, "triton_mx_block_rearrange_2d_K_groups", False, _ao_k_groups_prepared),
    "rearrange_grad_out_t": (_ao_k_groups, "triton_mx_block_rearrange_2d_K_groups", False, _ao_k_groups_prepared),
    "rearrange_w": (_ao_3d, "triton_mx_block_rearrange_per_group_3d", False, None),
    "rearrange_w_t": (_ao_3d, "triton_mx_block_rearrange_per_group_3d", False, None),
}


TORCHAO_MX_DEVIATION = Deviation(
    "torchao's to_mx departs from the MX spec in blocks of scale byte 0 (it clamps the scale to 2**-126 and "
    "flushes subnormal inputs) and in blocks holding Inf (a finite scale, the Inf dropped) or NaN (finite data "
    "zeroed under the NaN scale)",
    scale_bytes=(0, 255),
)


def register_torchao(registry: Registry) -> None:
    for stage, (fn, kernel, quantizer, prepare) in _TORCHAO.items():
        registry.add(Implementation(Recipe.MXFP8, stage, TORCHAO, fn, kernel, _torchao_available(quantizer),
                                    prepare=prepare, origin="builtin",
                                    deviation=TORCHAO_MX_DEVIATION if quantizer else None,
                                    code=TORCHAO))  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# torch.compile of the references
# ---------------------------------------------------------------------------------------------------------------


class _Compiled:
    """``torch.compile(oracle)``, compiled on first call (compiling is slow: only what runs pays for it)."""

    def __init__(self, oracle: Callable[..., tuple]):
        self.oracle, self.compiled = oracle, None
        functools.update_wrapper(self, oracle)

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            self.compiled = torch.compile(self.oracle)
        return self.compiled(*args, **kwargs)


def _compiled_available(device: torch.device) -> str | None:
    if device.type == "cuda":
        return None
    return "compiled for a GPU peer row only (on a CPU it would check the oracle against itself)"


def register_compiled(registry: Registry) -> None:
    """``torch.compile`` of the oracle of every MXFP8 data-movement stage. The references that read offsets on
    the host cannot be captured in a CUDA graph."""
    for spec in all_specs().values():
        if spec.recipe != Recipe.MXFP8 or spec.category not in MEMORY_CATEGORIES:
            continue
        host_offsets = spec.category == Category.PAD or spec.kernel in (
            "rearrange_m_groups", "rearrange_k_groups", "quantize_dim0_blocked", "quantize_dim1_blocked"
        )  # fmt: skip
        registry.add(Implementation(spec.recipe, spec.name, COMPILED, _Compiled(spec.oracle),
                                    f"torch.compile({spec.kernel} reference)", _compiled_available,
                                    graph_safe=not host_offsets, origin="builtin"))  # fmt: skip


def register_all(registry: Registry) -> None:
    register_mxkernels(registry)
    register_torchao(registry)
    register_compiled(registry)
