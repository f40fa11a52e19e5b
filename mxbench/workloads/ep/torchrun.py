"""torch.distributed.run (torchrun) as ``mxbench ep --nproc`` runs it: the same launcher, minus its own traceback.

When a worker fails, torchrun raises ``ChildFailedError`` and the interpreter prints a traceback and a box per
rank; on a signal it raises ``SignalException`` the same way. The workers have said what went wrong (``worker``:
one line naming the rank, the stage and the exception), so here both end in an exit code alone: 1, or 130 for a
signal, and ``launch`` prints the one line.
"""

from __future__ import annotations

import sys


PARENT_ENV = "MXBENCH_EP_TORCHRUN_PID"
"""This process's pid, in the workers' environment: a worker that finds another parent was orphaned before it could
ask to die with this one (``launch.die_with_parent``), and exits."""


def main(argv: list[str]) -> int:
    import logging
    import os

    os.environ[PARENT_ENV] = str(os.getpid())  # torchrun hands its environment to the workers
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    # its log of a failed worker ("failed (exitcode: 1) local_rank: 0 ...") repeats what the worker said
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        torchrun(argv)
    except ChildFailedError:
        return 1
    except (SignalException, KeyboardInterrupt):
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
