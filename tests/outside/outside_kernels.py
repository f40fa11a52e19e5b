"""An outside team's kernels, as mxbench's "Done when" test installs them: a package of its own (with a git repo)
that registers implementations through the ``mxbench.implementations`` entry point. Plain torch, written from the
MX spec (the quantizer is the README's ``plain_quantizer``); each ``FAULTS`` entry is one of the classes of wrong
kernel that ``mxbench check`` must catch, planted on top of a correct implementation, and ``ok_*`` are correct.
"""

import os
import time

import torch
from plain_quantizer import quantize_a as mx_rows  # along the last dim

E4M3_MIN_NORMAL = 2.0**-6
E4M3_SUBNORMAL_STEP = 2.0**-9


def mx_along_m(a, *, mode):
    """quantize_a_t / quantize_grad_out_t: blocks along M, output (K, M)."""
    return mx_rows(a.t().contiguous(), mode=mode)


def mx_along_n(w, *, mode):
    """quantize_w_t: blocks along N of (G, N, K), output (G, K, N)."""
    return mx_rows(w.transpose(1, 2).contiguous(), mode=mode)


def pad(x, offs, *, alignment, extra_slot_when_unaligned=False):
    """pad_a: each group at the start of a slot of ceil_a(size) rows, zeros elsewhere."""
    G, M = offs.numel(), x.shape[0]
    rows = -(-(M + alignment * G) // alignment) * alignment
    out = torch.zeros(rows, x.shape[1], dtype=x.dtype, device=x.device)
    ends, start, slot = [], 0, 0
    for end in offs.tolist():
        size = end - start
        n = min(size, rows - slot)
        out[slot : slot + n] = x[start : start + n]
        slot += -(-size // alignment) * alignment + (alignment if extra_slot_when_unaligned and size % alignment else 0)
        ends.append(slot)
        start = end
    return out, torch.tensor(ends, dtype=torch.int32, device=x.device)


# ---- the planted faults ---------------------------------------------------------------------------------------


def _bytes(t):
    return t.view(torch.uint8)


def flush_subnormal_scale_blocks(q, s):
    """Blocks of scale 2**-127 (byte 0: fp32-subnormal inputs) flushed to zero, as torchao's to_mx does."""
    tiny = (_bytes(s) == 0).repeat_interleave(32, -1)
    return torch.where(tiny, torch.zeros_like(_bytes(q)), _bytes(q)).view(q.dtype), s


def zero_blocks_scale_127(q, s):
    """All-zero blocks get scale byte 127 (2**0) instead of the spec's smallest scale."""
    zero = (_bytes(q).unflatten(-1, (-1, 32)) & 0x7F).amax(-1) == 0
    return q, torch.where(zero, torch.full_like(_bytes(s), 127), _bytes(s)).view(s.dtype)


def truncate_subnormal_outputs(x, q, s):
    """Values that land in e4m3's subnormal range truncated toward zero instead of rounded to nearest even."""
    scale = torch.ldexp(torch.ones_like(_bytes(s), dtype=torch.float32), _bytes(s).int() - 127)
    scaled = x.float() / scale.repeat_interleave(32, -1)
    small = scaled.abs() < E4M3_MIN_NORMAL
    cut = (torch.trunc(scaled / E4M3_SUBNORMAL_STEP) * E4M3_SUBNORMAL_STEP).to(q.dtype)
    return torch.where(small & (_bytes(s).repeat_interleave(32, -1) != 255), _bytes(cut), _bytes(q)).view(q.dtype), s


def floor_as_rceil(x, *, mode):
    """FLOOR mode computed as RCEIL: right in one mode only."""
    return mx_rows(x, mode="rceil")


FAULTS = {
    # class of fault: (stage, function)
    "along-M": ("quantize_a_t", lambda a, *, mode: flush_subnormal_scale_blocks(*mx_along_m(a, mode=mode))),
    "along-N": ("quantize_w_t", lambda w, *, mode: zero_blocks_scale_127(*mx_along_n(w, mode=mode))),
    "unaligned-group": ("pad_a", lambda a, offs, *, alignment: pad(a, offs, alignment=alignment,
                                                                    extra_slot_when_unaligned=True)),
    "e4m3-subnormal-output": ("quantize_a", lambda a, *, mode: truncate_subnormal_outputs(a, *mx_rows(a, mode=mode))),
    "zero-block-scale": ("quantize_grad_out_t", lambda x, *, mode: zero_blocks_scale_127(*mx_along_m(x, mode=mode))),
    "subnormal-flush": ("quantize_w", lambda w, *, mode: flush_subnormal_scale_blocks(*mx_rows(w, mode=mode))),
    "floor-mode": ("quantize_grad_out", floor_as_rceil),
}


def mutate_input(a, *, mode):
    out = mx_rows(a, mode=mode)
    a.zero_()  # the caller's activations, gone
    return out


def exit_quietly(a, *, mode):
    raise SystemExit(0)


def raise_error(a, *, mode):
    raise RuntimeError("kernel launch failed:\n  an error message\n  over several lines")


def hang(a, *, mode):
    time.sleep(3600)


HOSTILE = {"input-mutation": mutate_input, "system-exit": exit_quietly, "raises": raise_error, "hang": hang}

CORRECT = {
    "quantize_a": mx_rows,
    "quantize_a_t": mx_along_m,
    "quantize_w_t": mx_along_n,
    "pad_a": pad,
}


def quantize_a_timed(a, *, mode):
    """quantize_a at GPU speed (mxkernels' Triton kernel stands in for the team's own), for ``regress``: with
    ``OUTSIDE_SLOWDOWN=0.1`` in the environment it also quantizes another tenth of its rows and throws that away,
    the planted 10% slowdown of ``scripts/regress_outside_slowdown.py``."""
    from mxkernels.quant.quantize import quantize_dim0

    out = quantize_dim0(a, mode)
    extra = round(a.shape[0] * float(os.environ.get("OUTSIDE_SLOWDOWN", "0")))
    if extra:
        quantize_dim0(a[-extra:], mode)
    return out


def register(registry):
    registry.register("quantize_a", quantize_a_timed, name="outside-timed")
    for stage, fn in CORRECT.items():
        registry.register(stage, fn, name="outside")
    for fault, (stage, fn) in FAULTS.items():
        registry.register(stage, fn, name=f"outside-{fault}")
    for what, fn in HOSTILE.items():
        registry.register("quantize_a", fn, name=f"outside-{what}")
