"""mxkernels: every kernel of an MXFP8 mixture-of-experts grouped-GEMM training step, with plain-torch references.

Depends on torch and triton only; knows nothing of the mxbench harness. Subpackages by role, each saying what it
holds: ``core`` (format, names, costs, runtime), ``quant`` (quantizers), ``layouts`` (scale layouts, padding),
``gemm`` (grouped GEMMs, one file per backend), ``moe`` (the layer's kernels), ``ep`` (expert parallelism's
all-to-alls and options), ``stages`` (every workload's declared stage tables), ``autograd`` (what a model calls:
the front doors built from those tables), ``reference`` (oracles written apart) and ``peers`` (other projects'
kernels). ``docs/architecture.md`` in the repository holds the module map.
"""

import importlib

# The public names, imported on first use: ``from mxkernels.core.runtime import InputError`` (what the harness's option
# checks need) must not compile every Triton kernel first.
_EXPORTS = {
    "bf16_grouped_mm": "autograd.projection",
    "fp8_rowwise_grouped_mm": "autograd.projection",
    "mxfp8_grouped_mm": "autograd.projection",
    "Cost": "core.cost",
    "BLOCK_SIZE": "core.format",
    "E4M3_MAX": "core.format",
    "ScaleMode": "core.format",
    "dequantize_reference": "core.format",
    "quantize_reference": "core.format",
    "quantize_fp8_rowwise": "quant.fp8_rowwise",
    "quantize_fp8_rowwise_3d": "quant.fp8_rowwise",
    "quantize_fp8_rowwise_k_groups": "quant.fp8_rowwise",
    "available_backends": "gemm.grouped_gemm",
    "Backend": "gemm.backend",
    "GemmCase": "gemm.backend",
    "register_backend": "gemm.backends",
    "grouped_mm": "gemm.grouped_gemm",
    "from_blocked": "layouts.scale_layout",
    "rearrange_3d": "layouts.scale_layout",
    "rearrange_k_groups": "layouts.scale_layout",
    "rearrange_m_groups": "layouts.scale_layout",
    "to_blocked": "layouts.scale_layout",
    "pad_token_groups": "layouts.padding",
    "unpad_token_groups": "layouts.padding",
    "build_step": "stages.pipeline",
    "plan_step": "stages.pipeline",
    "quantize_3d": "quant.quantize",
    "quantize_dim0": "quant.quantize",
    "quantize_dim1": "quant.quantize",
    "quantize_3d_blocked": "quant.quantize_blocked",
    "quantize_dim0_blocked": "quant.quantize_blocked",
    "quantize_dim1_blocked": "quant.quantize_blocked",
    "InputError": "core.runtime",
    "Category": "core.names",
    "Pass": "core.names",
    "Recipe": "core.names",
    "StageSpec": "stages.step_specs",
    "all_specs": "stages.step_specs",
    "get_spec": "stages.step_specs",
}

__version__ = "0.1.0"
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
