"""The vocabulary every kernel shares: the MX format and its references (``format``), recipes, passes and categories
(``names``), costs (``cost``), comparison rules (``comparison``), argument checks and the launch target (``runtime``,
``errors``), the Triton block arithmetic of the quantizers (``block_math``) and vector-Jacobian products for the
oracles (``vjp``)."""
