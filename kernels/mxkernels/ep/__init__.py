"""Expert parallelism: the all-to-alls (``comm``) and the expert-parallel projection with autograd (``projection``)."""
