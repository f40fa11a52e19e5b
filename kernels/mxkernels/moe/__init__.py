"""The MoE layer's kernels: the router (``router``), row gathers and scatters (``moe_rows``, ``token_permute``),
SwiGLU (``swiglu``) and the fused layer stages (``moe_fused``). Their autograd front doors are in ``autograd``."""
