"""Plain-torch oracles written apart from every kernel they judge: the GEMM stages in fp64 (``gemm``), the
expert-parallel projection (``ep``) and the expert-parallel layer (``ep_layer``) in one process."""
