"""Deliberately broken stages of the FP8 rowwise EP strategies and the shared experts (for tests/test_ep_fp8.py),
each keeping its stage's contract:

* ``dispatch_without_scales``: the FP8 dispatch sends the e4m3 rows but not their scales (the receiver takes 1);
* ``add_shared_left_out``: the layer's output without the shared experts' (the routed output alone).

``mxbench ep --layer --check`` must fail on each.
"""

import torch
from mxkernels.ep.comm import all_to_all_rows


def dispatch_without_scales(q, s, *, send_splits, recv_splits, group=None):
    (qr,) = all_to_all_rows(q, send_splits=send_splits, recv_splits=recv_splits, group=group)
    return qr, torch.ones(qr.shape[0], dtype=s.dtype, device=s.device)


def add_shared_left_out(y_routed, ys):
    return (y_routed.clone(),)
