"""The processes of an EP run: the process group, a CPU control group, gathering to rank 0, bounded teardown.

Data moves over the default group: NCCL when every process has a GPU, else gloo (CPUs, the Triton kernels under
the interpreter). Control traffic (agreeing on a number, gathering statistics, barriers) goes over a separate gloo
group, so it never enqueues work on a GPU stream nor lands inside a CUDA graph capture.

Teardown is explicit and bounded (``teardown``): drop what holds graphs and buffers, synchronise, a monitored
barrier, then ``destroy_process_group`` in a thread that is given ``timeout_s``. Seen on 2 x H200 (NCCL 2.28.9): after
a CUDA-graph capture of NCCL all-to-alls the processes hung in ``destroy_process_group``; a worker whose teardown
does not finish leaves through ``os._exit`` once its results are written, instead of hanging until a time limit.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from mxkernels.core.errors import InputError

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
"""NVLink multicast off in every process that may open NCCL (issue 12): honoured where given, never overridden."""


@dataclass
class Context:
    """This process's place in the run. ``group`` None is the default (data) group; ``control`` the gloo group."""

    rank: int
    world: int
    local_rank: int
    backend: str
    device: torch.device
    control: Any
    group: Any = None

    @property
    def root(self) -> bool:
        return self.rank == 0


def under_torchrun() -> bool:
    """Whether this process is a torchrun worker (the launcher's environment variables are all set). Some of them
    without the others, or values torchrun never sets, are a stale or hand-made environment: ``InputError`` naming
    them, before anything waits on a rendezvous that no other process will join."""
    present = [v for v in TORCHRUN_VARS if v in os.environ]
    if not present:
        return False
    shown = " ".join(f"{v}={os.environ[v]}" for v in present)
    if len(present) < len(TORCHRUN_VARS):
        missing = ", ".join(v for v in TORCHRUN_VARS if v not in present)
        raise InputError(f"the environment sets {shown} but not {missing}: torchrun sets all of them, so these are "
                         "left over from elsewhere; unset them, or start the workers with torchrun (or mxbench ep "
                         "--nproc)")  # fmt: skip
    numbers = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        try:
            numbers[name] = int(os.environ[name])
        except ValueError:
            raise InputError(f"{name}={os.environ[name]!r} in the environment is not an integer (torchrun sets it); "
                             f"unset it, or start the workers with torchrun") from None  # fmt: skip
    if not 0 <= numbers["RANK"] < numbers["WORLD_SIZE"] or numbers["LOCAL_RANK"] < 0:
        raise InputError(f"{shown}: RANK must be in 0..WORLD_SIZE-1 and LOCAL_RANK non-negative; torchrun never sets "
                         "these, so they are left over from elsewhere: unset them")  # fmt: skip
    return True


def choose_backend(local_rank: int) -> str:
    """NCCL where this process has its own GPU, else gloo."""
    if dist.is_nccl_available() and torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return "nccl"
    return "gloo"


def init(timeout_s: float = 600.0) -> Context:
    """Join the run: torchrun's group when launched by it, else a group of one process (EP degree 1)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = choose_backend(local_rank)
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if under_torchrun():
            dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    return Context(dist.get_rank(), dist.get_world_size(), local_rank, backend, device, control)


def gather(ctx: Context, obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (a list in rank order); None on the other ranks."""
    out = [None] * ctx.world if ctx.root else None
    dist.gather_object(obj, out, dst=0, group=ctx.control)
    return out


def broadcast(ctx: Context, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ctx.control)
    return box[0]


def agree_max(ctx: Context, value: float) -> float:
    """The largest ``value`` of all ranks, on every rank."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.control)
    return float(t.item())


def any_rank(ctx: Context, flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any."""
    return agree_max(ctx, 1.0 if flag else 0.0) > 0


def barrier(ctx: Context, timeout_s: float = 600.0) -> None:
    dist.monitored_barrier(group=ctx.control, timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)


BARRIER_TIMEOUT_S = 30.0
"""How long the last barrier waits for the other ranks (they finish the same work at about the same time)."""
DESTROY_TIMEOUT_S = 10.0
"""How long ``destroy_process_group`` may take before the process exits without it (it returns in well under a
second when it returns at all)."""


def teardown(ctx: Context, barrier_s: float = BARRIER_TIMEOUT_S, destroy_s: float = DESTROY_TIMEOUT_S) -> bool:
    """Leave the run (module doc); True when ``destroy_process_group`` returned within ``destroy_s``."""
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    try:
        barrier(ctx, barrier_s)
    except RuntimeError as e:  # a rank that died already: say so, and still leave
        print(f"rank {ctx.rank}: teardown barrier failed: {' '.join(str(e).split())[:200]}", file=sys.stderr)
    finished = threading.Event()

    def destroy():
        dist.destroy_process_group()
        finished.set()

    threading.Thread(target=destroy, name="destroy_process_group", daemon=True).start()
    return finished.wait(destroy_s)


def leave(ctx: Context | None, code: int, barrier_s: float = BARRIER_TIMEOUT_S) -> int:
    """Tear down (if a group was joined) and return ``code``; exits the process at once when teardown hangs."""
    if ctx is not None and dist.is_initialized() and not teardown(ctx, barrier_s):
        print(f"rank {ctx.rank}: destroy_process_group did not return in {DESTROY_TIMEOUT_S:g} s; exiting",
              file=sys.stderr)  # fmt: skip
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
