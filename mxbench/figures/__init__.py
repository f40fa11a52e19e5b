"""Panels of stored runs, one module per family (the step against M, the roofline, power limits, peers, the
B200 projection, history); ``mxbench.plots`` turns them into figures and files."""
