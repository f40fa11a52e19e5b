"""How stored runs are shown, below the workloads that use it: ``render`` (rows as markdown, CSV or plain text,
under a run's header block), ``frame`` (runs as pandas frames, and the one record filter ``select``) and ``panels``
(what every figure panel shares: the run's context, colours, axes, and writing a figure)."""
