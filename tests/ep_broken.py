"""A deliberately broken EP permutation (for tests/test_ep.py): the first two expert-major rows swapped.

It keeps the permute stage's contract (``permute(xr, counts) -> (a, offs)``) and changes only the order of two
rows, the smallest mistake a permutation can make; ``mxbench ep --check`` must fail on it.
"""

from mxkernels.moe.token_permute import chunk_transpose_index, gather_rows


def swapped_permute(xr, counts):
    index, ends = chunk_transpose_index(counts, xr.shape[0])
    index = index.clone()
    index[[0, 1]] = index[[1, 0]]
    return gather_rows(xr, index), ends


def raising_permute(xr, counts):
    """An implementation that raises on every rank (``mxbench ep`` must say so in one line, not a traceback each)."""
    raise RuntimeError("kernel launch failed")
