"""What reads stored runs of any workload, looping over the workloads and naming none: ``tables`` (``mxbench
table``: a table kind found among the workloads'), ``plots`` (``mxbench plot``: a run's figures from its
workload), ``history`` and ``history_figure`` (the runs of one card over commits)."""
