"""``mxbench ep --nproc N``: start N workers on this host through torch.distributed.run (torchrun).

The workers are exactly what ``torchrun --nproc-per-node N -m mxbench ep ...`` starts: the same command line minus
``--nproc``, and the rendezvous options given on it passed to the launcher (``--standalone``, a free local port,
when none are). The workers' environment is this process's, with these rules:

* NVLink multicast stays off: ``NCCL_NVLS_ENABLE`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST`` keep any value they
  have, and are set to 0 / 1 only where absent (never overridden, never cleared);
* without a GPU the Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` where absent;
* ``OMP_NUM_THREADS=1`` where absent (torchrun's own default, which it otherwise announces in a banner);
* ``MXBENCH_EP_REPORTS``: a folder where a failing worker leaves its one line, printed here once.

No worker outlives the launcher: torchrun runs in a session of its own (Ctrl-C at a terminal reaches this process
only) and is killed when this process dies (``PR_SET_PDEATHSIG``), and each worker is killed when torchrun dies
(``die_with_parent``, called first thing by the worker). Ctrl-C kills torchrun, so every worker, and exits 130
with one line.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...measuring.dist import MULTICAST_OFF

# torchrun options that place and connect the workers (the rendezvous); everything else belongs to mxbench
LAUNCHER_OPTIONS = ("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--rdzv_backend",
                    "--rdzv_endpoint", "--rdzv_id", "--rdzv_conf", "--master-addr", "--master-port", "--master_addr",
                    "--master_port", "--nnodes", "--node-rank", "--node_rank", "--standalone", "--max-restarts",
                    "--max_restarts", "--local-addr", "--local_addr")  # fmt: skip
REPORTS_ENV = "MXBENCH_EP_REPORTS"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def is_launcher_option(word: str) -> bool:
    return word.split("=", 1)[0] in LAUNCHER_OPTIONS


def worker_env(environ: Mapping[str, str], has_gpu: bool) -> dict[str, str]:
    """The workers' environment (module doc)."""
    env = dict(environ)
    for name, value in MULTICAST_OFF.items():
        env.setdefault(name, value)
    if not has_gpu:
        env.setdefault("TRITON_INTERPRET", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launcher_command(nproc: int, launcher_args: Sequence[str], worker_args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N <rendezvous> -m mxbench <worker args>``."""
    rendezvous = list(launcher_args) or ["--standalone"]
    return [sys.executable, "-m", "mxbench.workloads.ep.torchrun", f"--nproc-per-node={nproc}", *rendezvous,
            "-m", "mxbench", *worker_args]  # fmt: skip


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; elsewhere nothing). A parent that
    died before the call (this process's parent is no longer the one that started it: ``torchrun`` names
    itself) leaves this process orphaned: it exits at once."""
    from .torchrun import PARENT_ENV

    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def launch(nproc: int, launcher_args: Sequence[str], worker_args: Sequence[str], has_gpu: bool,
           environ: Mapping[str, str], echo=print) -> int:  # fmt: skip
    """Run the workers and return the exit code: 0 when every worker exited 0, 1 when one failed (its line printed
    once), 130 after Ctrl-C (every worker stopped)."""
    with tempfile.TemporaryDirectory(prefix="mxbench-ep-") as reports:
        env = {**worker_env(environ, has_gpu), REPORTS_ENV: reports}
        proc = subprocess.Popen(launcher_command(nproc, launcher_args, worker_args), env=env, start_new_session=True,
                                preexec_fn=die_with_parent)  # fmt: skip
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun; each worker follows it (die_with_parent)
            proc.wait()
            echo(f"interrupted: the {nproc} workers were stopped", file=sys.stderr)
            return 130
        lines = [p.read_text().strip() for p in sorted(Path(reports).glob("rank*"), key=lambda p: p.stat().st_mtime)]
    if code and lines:
        more = f" (and {len(lines) - 1} more rank(s))" if len(lines) > 1 else ""
        echo(f"mxbench ep: {lines[0]}{more}", file=sys.stderr)
        return 1
    if code == 130:
        echo(f"interrupted: the {nproc} workers were stopped", file=sys.stderr)
    return code
