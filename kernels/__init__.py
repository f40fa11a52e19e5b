"""mxkernels: every kernel of an MXFP8 mixture-of-experts grouped-GEMM training step, with plain-torch references.

Depends on torch and triton only; knows nothing of the mxbench harness.
"""

from .cost import Cost
from .format import (
    BLOCK_SIZE,
    E4M3_MAX,
    ScaleMode,
    dequantize_reference,
    quantize_reference,
)
from .layouts import from_blocked, to_blocked

__version__ = "0.1.0"
