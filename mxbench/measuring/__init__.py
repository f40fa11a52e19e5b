"""What every workload measures with: ``stages`` (the sweep's options and the timer that turns stages into
records), ``metadata`` (what every run records besides its records), ``progress`` (the progress line),
``dist`` (process groups: joining, gathering to rank 0, bounded teardown) and ``shard`` (one run's work split over
the GPUs of a host)."""
