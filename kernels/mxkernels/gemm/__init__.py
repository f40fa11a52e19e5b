"""Grouped GEMMs: one front door by recipe (``grouped_gemm``), the ``Backend`` record (``backend``), one file per
backend that declares itself, and the list of those declarations (``backends``)."""
