"""``mxbench peers``: our quantize / rearrange / pad kernels beside torchao's and torch.compile's: ``command``,
``measure`` (the run), ``sharded`` (over every GPU of a host), ``tables`` and ``figure``."""
