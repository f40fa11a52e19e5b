"""Running code the harness does not trust in a process of its own (``check`` of an outside implementation): whatever
it does to its process -- ``os._exit``, a signal (``os.kill(os.getpid(), 9)``), a segfault, a hang, a CUDA context it
breaks -- ends that process only, and comes back as one line naming it.

The child is started with ``multiprocessing``'s "spawn" (a forked child cannot use CUDA once the parent has), so it
imports what it runs afresh: the target and its arguments are pickled (functions by module and name). It reports
through a pipe, message by message:

* ``("calling",)`` just before it calls the untrusted code, ``("returned",)`` when that returns: between the two the
  parent waits ``timeout_s`` at most, then kills the child (a hang is its time-out, not the run's end);
* ``("result", value)`` for each result, in order; ``("done",)`` at the end;
* ``("failed", text)`` when the target itself raised.

Anything else -- starting up, preparing inputs, comparing -- is the harness's own work, given ``startup_s``.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..instruments.guarded import one_line

STARTUP_S = 900.0
"""The most a child may take between two messages outside the untrusted call: importing torch, mxkernels and the
implementation's module, setting up CUDA, building inputs and running the oracles (seconds each on a CPU under the
Triton interpreter)."""


@dataclass
class Apart:
    """What a child sent (``results``, in order) and, when it ended before saying ``done``, why (``failure``: one
    line naming the signal, the exit code, the time-out or the exception)."""

    results: list = field(default_factory=list)
    failure: str | None = None


def picklable(*values: Any) -> str | None:
    """Why ``values`` cannot be handed to a spawned child (a lambda, a closure, a local class), or None."""
    try:
        pickle.dumps(values)
    except Exception as e:  # noqa: BLE001 -- pickling may raise anything (TypeError, AttributeError, PicklingError)
        return one_line(e)
    return None


def ended(exitcode: int | None) -> str:
    """How a child process ended, in words."""
    if exitcode is None:
        return "its process stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "an unknown signal"
        return f"its process was killed by signal {-exitcode} ({name})"
    return f"its process exited with code {exitcode} (os._exit, a crash or an exit outside the call)"


def _child(conn, target: Callable[..., None], args: tuple) -> None:
    try:
        target(conn.send, *args)
        conn.send(("done",))
    except BaseException as e:  # noqa: BLE001 -- the target's own failure is reported, whatever it is
        try:
            conn.send(("failed", f"{one_line(e)}\n{traceback.format_exc()}"))
        except Exception:  # noqa: BLE001, S110 -- the pipe is gone: the exit code says the rest
            pass
    finally:
        conn.close()


def run_apart(target: Callable[..., None], args: tuple, *, timeout_s: float, startup_s: float = STARTUP_S) -> Apart:
    """``target(send, *args)`` in a spawned child process (see the module); what it sent, and why it ended early."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, target, args), name="mxbench-apart", daemon=True)
    process.start()
    send.close()  # the child holds the only sending end: its death is our end of file
    out, calling = Apart(), False
    try:
        while True:
            limit = timeout_s if calling else startup_s
            if not receive.poll(limit):
                process.kill()
                out.failure = (f"Timeout: did not return within {timeout_s:g} s (its process was killed; raise "
                               f"--timeout)" if calling else
                               f"Timeout: its process sent nothing for {startup_s:g} s (killed)")  # fmt: skip
                return out
            try:
                kind, *rest = receive.recv()
            except (EOFError, OSError):
                break
            if kind == "calling":
                calling = True
            elif kind == "returned":
                calling = False
            elif kind == "result":
                calling = False
                out.results.append(rest[0])
            elif kind == "failed":
                out.failure = rest[0]
                return out
            elif kind == "done":
                return out
        process.join(30)
        out.failure = ended(process.exitcode)
        return out
    finally:
        receive.close()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
