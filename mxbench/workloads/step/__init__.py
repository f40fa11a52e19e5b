"""``mxbench roofline``: the expert projection's training step (quantize, rearrange, pad, grouped GEMMs, forward and
backward) per stage over a sweep of M: ``command``, ``sweep`` (the run, or the analytic model without a GPU),
``sharded`` (the sweep over every GPU of a host), ``tables``, ``projection`` (onto another card), ``plots`` and
``figures/`` (its panels)."""
