"""What a run is on disk, the bottom layer: ``results`` (Point, Record, Run; JSON, the source of truth, and the CSV
beside it), ``schema`` and ``validation`` (the published schemas, checked on every read), ``writing`` (the one write
path of every output: atomic, never overwriting what this process did not write), ``replacing`` (whether a new run
may replace a stored one), ``marks`` (how a figure or table mxbench wrote is recognized), ``reading`` (the one reader
of inputs: regular files only, capped) and ``outputs`` (output paths checked before any work)."""
