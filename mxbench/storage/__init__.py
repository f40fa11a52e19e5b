"""What a run is on disk, the bottom layer: ``results`` (Point, Record, Run; JSON, the source of truth, and the CSV
beside it), ``schema`` and ``validation`` (the published schemas, checked on every read), ``writing`` (the one write
path: atomic, never overwriting what this process did not write), ``replacing`` (whether a new run may replace a
stored one) and ``outputs`` (output paths checked before any work)."""
