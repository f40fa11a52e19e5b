"""mxbench: benchmarking and roofline suite for MXFP8 MoE grouped-GEMM training kernels."""

from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The checkout mxbench runs from: shape presets are read from its ``shapes/`` and every run records its commit."""
