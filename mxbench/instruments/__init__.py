"""What measures, and what a measurement is held against: ``timing`` (CUDA-graph replays), ``power`` (NVML limits
and telemetry), ``hardware`` (the cards' spec table), ``ceilings`` (the bandwidth and GEMM throughput a card reaches),
``roofline`` (efficiency against those roofs, and the analytic model), ``provenance`` (which code ran), ``guarded``
(calling code that may hang or raise) and ``kit`` (the injectable bundle a sweep measures with)."""
