"""``mxbench ep``: the expert-parallel pipeline on several processes (torch.distributed, launched by torchrun).

Modules, one job each: ``launch`` (the ``--nproc`` shortcut and the workers' environment), ``dist`` (process groups,
gathering to rank 0, bounded teardown), ``inputs`` (seeded routing and layer inputs), ``check`` (correctness against
the single-process reference), ``timing`` (stages timed in step across ranks), ``measure`` (the records of a run),
``metadata``, ``tables``, ``figure``, ``scaling`` (runs at several EP degrees side by side), ``ceiling`` (the
measured all-to-all ceiling) and ``command`` (the click command), ``topology`` (which ranks share a node; the all-
to-alls' bytes per link class) and the projection to other EP degrees: ``project`` (the link model),
``project_output`` (its tables, assumptions and figure) and ``project_command`` (``mxbench ep-project``). The layer
itself and its stages live in the kernel package (``mxkernels.autograd.ep_projection``).
"""

TABLE_KINDS = ("ep", "ep-summary", "ep-scaling")
"""The ``table --kind`` values of EP runs: per stage, per strategy (``tables``), and per EP degree of several runs of
one layer (``scaling``)."""
