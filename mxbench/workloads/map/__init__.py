"""``mxbench map``: where each recipe stops paying. A model's K and N at every cell of a grid of experts on the GPU
(G) x tokens (per expert, or in all), at the MoE layer or the expert projection: each recipe's forward + backward
speedup over bf16, measured by the layer's or the step's own measurement, or modelled without a GPU.

Modules: ``axes`` (the scope and token axis, Enums the command line imports), ``grid`` (the typed grid, its cells and
points, checked before any work), ``measure`` (each cell handed to its scope's timer in the loop every workload runs;
the model), ``speedups`` (a stored map run read back as its grid of speedups), ``tables`` (``table --kind map``),
``figure`` (a heatmap per recipe), ``command``.
"""

TABLE_KINDS = ("map",)
