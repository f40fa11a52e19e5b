"""A sharded sweep under torchrun that is cut short (for tests/test_shard.py).

``python -m torch.distributed.run --nproc-per-node 2 tests/shard_crash.py OUT [crash|wait]``: every rank measures
with the fake instruments of ``test_sweep``, each timing taking a little while. ``crash``: rank 1's process ends
abruptly in its third point, as a crashed worker does; torchrun then stops rank 0 with SIGTERM, and rank 0 must still
write what it has. ``wait``: nobody crashes, the test stops torchrun with Ctrl-C (SIGINT).
"""

import os
import sys
import time
from pathlib import Path

from shard_fakes import POINTS, fakes_for, sweep_options

from mxbench.workloads.step.sharded import sharded_sweep

rank = int(os.environ["RANK"])
f, ins = fakes_for(rank)


out, how = Path(sys.argv[1]), sys.argv[2]


def slow():
    time.sleep(0.2 if how == "crash" else 0.5)  # rank 0 is still measuring when rank 1 dies, or Ctrl-C comes
    if len(f.timed) == 6:  # a point and its baseline measured (3 + 2 timings): the test's cue for Ctrl-C
        out.with_suffix(f".rank{rank}").touch()
    if how == "crash" and rank == 1 and len(f.timed) > 5:
        os._exit(3)


f.on_time = slow
run = sharded_sweep(POINTS, options=sweep_options(out, rank), instruments=ins, progress=False)
sys.exit(130 if run is not None and run.meta.get("interrupted") else 0)
