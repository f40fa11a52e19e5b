"""Grouped GEMMs: one front door by recipe (``grouped_gemm``), the ``Backend`` record (``backend``), and one file per
backend that declares itself."""
