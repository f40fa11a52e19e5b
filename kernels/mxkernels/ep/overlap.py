"""Running part of a stage list on a second stream: the shared experts beside the all-to-alls (``--overlap``).

``run_overlapped(stages, env, side_names, side)`` runs ``stages`` in order like ``pipeline.run_stages``, except that
the stages named in ``side_names`` are issued on ``side``, a second stream that first waits for the work issued so
far. A stage of the main stream that reads a tensor a side stage made joins the side stream first (the main stream
waits for it), and so does the end of the list: what the side computes is never read before it is complete. The
stage functions themselves stay plain (timed alone, each is the same call on the main stream).

On a CPU there are no streams and everything runs in order; to keep the join testable there (gloo CI), the side's
results are held back until the join: until then the environment holds NaN-filled stand-ins, so a stage that read a
side tensor without the join computes garbage and the layer's check fails, as a race would on a GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence

import torch


class SideStream:
    """The second stream of a device (a CUDA stream), or its CPU stand-in (module doc)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    @staticmethod
    @functools.cache
    def of(device: torch.device) -> SideStream:
        """The one side stream of ``device`` (every step reuses it: a CUDA-graph capture sees the same stream)."""
        return SideStream(device)

    def run(self, stage, env: dict) -> tuple:
        """``stage`` issued on the side stream after the work issued so far on the current one."""
        if self.stream is None:
            return stage.call(env)
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            values = stage.call(env)
        self._keep([env[n] for n in stage.inputs], self.stream)
        return values

    def stand_in(self, value):
        """What the main stream's environment holds for a side result until the join (module doc)."""
        if self.stream is None and isinstance(value, torch.Tensor) and value.is_floating_point():
            return torch.full_like(value, float("nan"))
        return value

    def join(self, values: Sequence) -> None:
        """The current stream waits for everything issued on the side; ``values`` are read on it from now on."""
        if self.stream is None:
            return
        main = torch.cuda.current_stream(self.device)
        main.wait_stream(self.stream)
        self._keep(values, main)

    @staticmethod
    def _keep(tensors, stream) -> None:
        """Tell the caching allocator that ``stream`` uses these blocks too (not inside a graph capture, whose
        private pool frees nothing before the graph goes)."""
        if torch.cuda.is_current_stream_capturing():
            return
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(stream)


def reads_side(stage, pending) -> bool:
    """Whether a main-stream stage reads a side result not yet joined (it must join first)."""
    return any(n in pending for n in stage.inputs)


def run_overlapped(stages: Sequence, env: dict, side_names: Collection[str], side: SideStream) -> dict:
    """``pipeline.run_stages`` with the stages named in ``side_names`` on ``side`` (module doc)."""
    pending: dict[str, object] = {}  # side results not yet joined: the side stages read them, the main one may not

    def join():
        side.join(list(pending.values()))
        env.update(pending)
        pending.clear()

    for stage in stages:
        if stage.name in side_names:
            values = side.run(stage, {**env, **pending})
            for name, value in zip(stage.outputs, values, strict=True):
                if name is not None:
                    pending[name] = value
                    env[name] = side.stand_in(value)
            continue
        if pending and reads_side(stage, pending):
            join()
        values = stage.call(env)
        for name, value in zip(stage.outputs, values, strict=True):
            if name is not None:
                env[name] = value
    if pending:
        join()
    return env
