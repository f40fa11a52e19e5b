"""Quantizers: MXFP8 along dim0, dim1 and 3D expert weights (``quantize``, ``quantize_cols``), the same writing the
GEMMs' blocked scales (``quantize_blocked``), and the FP8 rowwise recipe's (``fp8_rowwise``, its column kernels
``fp8_colwise``, and ``fp8_amax``: one amax pass shared by a tensor's two copies)."""
