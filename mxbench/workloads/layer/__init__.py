"""``mxbench layer``: the whole MoE layer (router, permute, gate/up and down projections, SwiGLU, combine, shared
experts), forward and backward, per stage and as one graph, with each recipe's accuracy beside its speed.

Modules: ``measure`` (the records of a run: every stage timed alone, the layer as one graph, the SQNR of every
output against an fp32 run; the analytic model without a GPU), ``tables`` (``table --kind layer`` in the seed's
form with its rows beside ours, ``--kind layer-stages``), ``figure`` (the layer's time by category), ``command``.
The layer and its stages live in the kernel package (``mxkernels.stages.layer``, ``mxkernels.stages.layer_specs``).
"""

TABLE_KINDS = ("layer", "layer-stages")
"""The ``table --kind`` values of layer runs: one row per recipe (the seed's form), and per stage."""

SEED_SOURCE = "torchao MXFP8 MoE training README, 'Single MoE layer forward + backward pass' (B200)"
SEED_ROWS = (
    # (model, total_M, N, K, bf16 ms, mxfp8 ms, speedup) as the seed prints them
    ("Llama4 16e", 131072, 8192, 5120, 275.270, 192.420, 1.431),
    ("DeepSeekV3", 131072, 2048, 7168, 92.032, 80.182, 1.148),
)
"""The seed's published B200 layer rows, shown beside ours and labelled as the seed's (never as our measurement)."""
