"""The MoE layer's kernels and front doors: the router (``router``), row gathers and scatters (``moe_rows``,
``token_permute``), SwiGLU (``swiglu``), the fused layer stages (``moe_fused``), the expert projection with autograd
(``projection``) and the whole layer with autograd, its inputs and its plain-torch oracle (``layer``)."""
