"""Peers built from third-party sources kept out of git (.peers/): DeepGEMM's grouped FP8 GEMM."""
