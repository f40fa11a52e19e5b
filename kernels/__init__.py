"""mxkernels: every kernel of an MXFP8 mixture-of-experts grouped-GEMM training step, with plain-torch references.

Depends on torch and triton only; knows nothing of the mxbench harness. Modules, one job each:

* ``format``: the MX format, scale modes, and the quantize / dequantize references (the oracle of every test);
* ``quantize``: Triton MXFP8 quantizers (dim0, dim1 transposed, 3D expert weights along K or N);
* ``fp8_rowwise``: the FP8 rowwise recipe's quantizers;
* ``layouts``: the blocked scale layout and its per-group rearrangements;
* ``padding``: token-group padding and unpadding;
* ``grouped_gemm``: the grouped GEMMs behind one front door, by recipe and backend, which run in ``gemm_native``
  (torch's grouped GEMMs), ``gemm_triton`` (Triton MX GEMMs), ``gemm_dequant`` (exact dequantization to bf16, then
  torch), ``gemm_fused`` (Triton GEMMs dequantizing the token operand in registers) and ``gemm_emulated`` (the fp32
  reference);
* ``stages``: what each stage of a step computes (specs: contract, oracle, comparison rule);
* ``pipeline``: the passes of a training step as stages bound to shapes, costs and tensors;
* ``autograd``: the drop-ins for ``torch._grouped_mm`` built from those stages.
"""

from .autograd import bf16_grouped_mm, fp8_rowwise_grouped_mm, mxfp8_grouped_mm
from .cost import Cost
from .format import BLOCK_SIZE, E4M3_MAX, ScaleMode, dequantize_reference, quantize_reference
from .fp8_rowwise import quantize_fp8_rowwise, quantize_fp8_rowwise_3d, quantize_fp8_rowwise_k_groups
from .grouped_gemm import available_backends, grouped_mm
from .layouts import from_blocked, rearrange_3d, rearrange_k_groups, rearrange_m_groups, to_blocked
from .padding import pad_token_groups, unpad_token_groups
from .pipeline import build_step, plan_step
from .quantize import quantize_3d, quantize_dim0, quantize_dim1
from .runtime import InputError
from .stages import Category, Pass, Recipe, StageSpec, all_specs, get_spec

__version__ = "0.1.0"
