"""mxkernels: every kernel of an MXFP8 mixture-of-experts grouped-GEMM training step, with plain-torch references.

Depends on torch and triton only; knows nothing of the mxbench harness. Modules, one job each:

* ``format``: the MX format, scale modes, and the quantize / dequantize references (the oracle of every test);
* ``quantize``: Triton MXFP8 quantizers (dim0, dim1 transposed, 3D expert weights along K or N);
* ``quantize_blocked``: the same quantizers writing the grouped GEMMs' blocked scales themselves (fused scales);
* ``fp8_rowwise``: the FP8 rowwise recipe's quantizers, and ``fp8_colwise`` their column-direction kernels;
* ``layouts``: the blocked scale layout and its per-group rearrangements;
* ``padding``: token-group padding and unpadding;
* ``grouped_gemm``: the grouped GEMMs behind one front door, by recipe and backend, which run in ``gemm_native``
  (torch's grouped GEMMs), ``gemm_triton`` (Triton MX GEMMs), ``gemm_dequant`` (exact dequantization to bf16, then
  torch), ``gemm_fused`` (Triton GEMMs dequantizing the token operand in registers) and ``gemm_emulated`` (the fp32
  reference);
* ``names``: the vocabulary (recipes, passes, categories);
* ``stages``: what each stage of a step computes (specs: contract, oracle, comparison rule);
* ``pipeline``: the passes of a training step as stages bound to shapes, costs and tensors;
* ``autograd``: the drop-ins for ``torch._grouped_mm`` built from those stages;
* expert parallelism: ``token_permute`` (row gathers and routing indices), ``ep_comm`` (the all-to-alls),
  ``ep_stages`` (the EP stage specs and the bf16 / mxfp8 / mxfp8_a2a strategies), ``ep`` (the autograd EP layer)
  and ``ep_reference`` (its single-process reference).
"""

import importlib

# The public names, imported on first use: ``from mxkernels.runtime import InputError`` (what the harness's option
# checks need) must not compile every Triton kernel first.
_EXPORTS = {
    "bf16_grouped_mm": "autograd",
    "fp8_rowwise_grouped_mm": "autograd",
    "mxfp8_grouped_mm": "autograd",
    "Cost": "cost",
    "BLOCK_SIZE": "format",
    "E4M3_MAX": "format",
    "ScaleMode": "format",
    "dequantize_reference": "format",
    "quantize_reference": "format",
    "quantize_fp8_rowwise": "fp8_rowwise",
    "quantize_fp8_rowwise_3d": "fp8_rowwise",
    "quantize_fp8_rowwise_k_groups": "fp8_rowwise",
    "available_backends": "grouped_gemm",
    "grouped_mm": "grouped_gemm",
    "from_blocked": "layouts",
    "rearrange_3d": "layouts",
    "rearrange_k_groups": "layouts",
    "rearrange_m_groups": "layouts",
    "to_blocked": "layouts",
    "pad_token_groups": "padding",
    "unpad_token_groups": "padding",
    "build_step": "pipeline",
    "plan_step": "pipeline",
    "quantize_3d": "quantize",
    "quantize_dim0": "quantize",
    "quantize_dim1": "quantize",
    "quantize_3d_blocked": "quantize_blocked",
    "quantize_dim0_blocked": "quantize_blocked",
    "quantize_dim1_blocked": "quantize_blocked",
    "InputError": "runtime",
    "Category": "names",
    "Pass": "names",
    "Recipe": "names",
    "StageSpec": "stages",
    "all_specs": "stages",
    "get_spec": "stages",
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
