"""``mxbench ep --nproc N``: start N workers on this host through torch.distributed.run (torchrun).

The workers are exactly what ``torchrun --nproc-per-node N -m mxbench ep ...`` starts: the same command line minus
``--nproc``, and the rendezvous options given on it passed to the launcher (``--standalone``, a free local port,
when none are). The workers' environment is this process's, with two rules:

* NVLink multicast stays off: ``NCCL_NVLS_ENABLE`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST`` keep any value they
  have, and are set to 0 / 1 only where absent (never overridden, never cleared);
* without a GPU the Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` where absent.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
# torchrun options that place and connect the workers (the rendezvous); everything else belongs to mxbench
LAUNCHER_OPTIONS = ("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--rdzv_backend",
                    "--rdzv_endpoint", "--rdzv_id", "--rdzv_conf", "--master-addr", "--master-port", "--master_addr",
                    "--master_port", "--nnodes", "--node-rank", "--node_rank", "--standalone", "--max-restarts",
                    "--max_restarts", "--local-addr", "--local_addr")  # fmt: skip
# Seconds the launcher gets to stop its workers after Ctrl-C before it is killed.
STOP_GRACE_S = 30


def is_launcher_option(word: str) -> bool:
    return word.split("=", 1)[0] in LAUNCHER_OPTIONS


def worker_env(environ: Mapping[str, str], has_gpu: bool) -> dict[str, str]:
    """The workers' environment (module doc)."""
    env = dict(environ)
    for name, value in MULTICAST_OFF.items():
        env.setdefault(name, value)
    if not has_gpu:
        env.setdefault("TRITON_INTERPRET", "1")
    return env


def launcher_command(nproc: int, launcher_args: Sequence[str], worker_args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node N <rendezvous> -m mxbench <worker args>``."""
    rendezvous = list(launcher_args) or ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *rendezvous,
            "-m", "mxbench", *worker_args]  # fmt: skip


def launch(nproc: int, launcher_args: Sequence[str], worker_args: Sequence[str], has_gpu: bool,
           environ: Mapping[str, str]) -> int:  # fmt: skip
    """Run the workers and return the launcher's exit code (0 when every worker exited 0)."""
    proc = subprocess.Popen(launcher_command(nproc, launcher_args, worker_args), env=worker_env(environ, has_gpu))
    try:
        return proc.wait()
    except KeyboardInterrupt:  # torchrun forwards the signal to its workers; give them time to tear down
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
