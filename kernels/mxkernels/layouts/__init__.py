"""Where the bytes go between quantizer and GEMM: the blocked scale layout and its per-group rearrangements
(``scale_layout``) and token-group padding and unpadding (``padding``)."""
