"""Other projects' kernels with recipes of their own, each beside its plain-torch reference: DeepGEMM's SM90 grouped
FP8 GEMM (``deepgemm``; the library is built by ``scripts/peers/``)."""
