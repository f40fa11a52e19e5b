"""mxbench: benchmarking and roofline suite for MXFP8 MoE grouped-GEMM training kernels."""

__version__ = "0.1.0"
