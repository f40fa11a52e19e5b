"""What mxbench measures, one folder each: ``step`` (the expert projection's training step: ``roofline``),
``peers`` (our data-movement kernels beside others'), ``layer`` (the whole MoE layer) and ``ep`` (expert
parallelism on several GPUs). Each declares itself in its ``declared.py`` (a ``Workload``: its commands, table
kinds, figures and check); ``registered`` lists them; ``declaration`` says what a declaration holds."""
