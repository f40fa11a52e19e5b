"""What a model calls: the autograd front doors built from the declared stage lists, so a model runs exactly what
the harness times. The expert projection (``projection``: drop-ins for ``torch._grouped_mm``), the MoE layer
(``layer``, with its inputs and its plain-torch oracle), the expert-parallel projection (``ep_projection``) and the
expert-parallel layer (``ep_layer``)."""
