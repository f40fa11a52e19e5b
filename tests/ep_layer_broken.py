"""Deliberately broken stages of the EP layer (for tests/test_ep_layer.py), each keeping its stage's contract:

* ``dispatch_dropping_rank_one``: the dispatch all-to-all, with the rows received from rank 1 zeroed;
* ``permute_off_by_one``: the expert-major permutation reading every row one place later (wrapping round);
* ``combine_without_scores``: the weighted sum of each token's copies, with the scores forgotten.

``mxbench ep --layer --check`` must fail on each.
"""

from mxkernels.ep.comm import all_to_all_rows
from mxkernels.moe.moe_rows import combine_rows
from mxkernels.moe.token_permute import chunk_transpose_index, gather_rows


def dispatch_dropping_rank_one(xs, *, send_splits, recv_splits, group=None):
    (xr,) = all_to_all_rows(xs, send_splits=send_splits, recv_splits=recv_splits, group=group)
    xr = xr.clone()
    xr[recv_splits[0] : recv_splits[0] + recv_splits[1]] = 0
    return (xr,)


def permute_off_by_one(xr, counts):
    index, ends = chunk_transpose_index(counts, xr.shape[0])
    return gather_rows(xr, (index + 1) % xr.shape[0]), ends


def combine_without_scores(ys, pos, top, *, weighted):
    return (combine_rows(ys, pos, None, top.shape[1]),)
