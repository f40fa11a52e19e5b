"""Timing on every rank at once: a call that may hold collectives, timed in step, summarised per rank.

Every rank times the same call with ``instruments.timing.time_fn`` (CUDA-graph replays, cold L2, flush subtracted),
and the ranks agree on the calls per replay (the largest eager estimate wins), so each captures and replays the
same number of collective calls in the same order. A collective can be captured only with host split sizes fixed
at capture time (NCCL); before timing one in a graph, a throw-away capture of a single call is tried on every
rank (never replayed: a replay whose peer never comes would block), and if any rank fails to capture, every rank
times the call with CUDA events instead (``events-cold``, labelled so in the record). A timing that fails on any
rank after capture sends every rank to the event timer too, so the ranks' sequences of collectives never diverge.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...instruments.timing import Timing, summarize, time_fn
from ...measuring.dist import Context, agree_max, any_rank
from ...measuring.stages import error_message

METHOD_GRAPH = "graph"
METHOD_EVENTS = "events"


@dataclass(frozen=True)
class RankTiming:
    """One rank's samples of one call and how they were taken (or the error that stopped them)."""

    rank: int
    samples_us: list[float]
    method: str
    details: dict[str, Any]
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        """Median, quartiles, min and max (us), the sample count and how they were taken."""
        if not self.samples_us:
            return {"rank": self.rank, "error": self.error}
        median, q1, q3 = summarize(self.samples_us)
        return {"rank": self.rank, "median_us": median, "q1_us": q1, "q3_us": q3, "min_us": min(self.samples_us),
                "max_us": max(self.samples_us), "samples": len(self.samples_us), "method": self.method,
                **self.details}  # fmt: skip


def _probe_capture(fn: Callable[[], object]) -> str | None:
    """Why one call of ``fn`` cannot be captured in a CUDA graph here (None: it can). Warmed up on a side
    stream first, as capture needs; the graph is dropped unreplayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        del graph
        return None
    except Exception as e:  # noqa: BLE001 -- any capture failure means: time with events
        return error_message(e)
    finally:
        torch.cuda.synchronize()
        gc.collect()


def _details(t: Timing) -> dict[str, Any]:
    return {"calls_per_replay": t.calls_per_replay, "flush_us": t.flush_us, "kernels_per_call": t.kernels_per_call,
            "memcpy_nodes": t.memcpy_nodes, "timing_method": t.method}  # fmt: skip


def time_on_ranks(ctx: Context, fn: Callable[[], object], *, graph: bool, samples: int) -> RankTiming:
    """This rank's timing of ``fn``, taken in step with the other ranks (module doc). Never raises for a call
    that fails: the error is the result's, and every rank has left the collective path the same way."""
    if ctx.device.type != "cuda":
        return RankTiming(ctx.rank, [], "", {}, "no CUDA device: timing needs GPUs (NCCL); run --check on a CPU")
    why_not = _probe_capture(fn) if graph else "graph timing not requested"
    use_graph = graph and not any_rank(ctx, why_not is not None)
    agree = lambda us: agree_max(ctx, us)
    error = None
    try:
        t = time_fn(fn, cold_l2=True, use_graph=use_graph, samples=samples, agree=agree if use_graph else None)
    except Exception as e:  # noqa: BLE001 -- a failed timing becomes this stage's error row
        error, t = error_message(e), None
    if use_graph and any_rank(ctx, error is not None):  # every rank retries with events, so none waits alone
        why_not, use_graph = error or "another rank failed graph timing", False
        try:
            t, error = time_fn(fn, cold_l2=True, use_graph=False, samples=samples), None
        except Exception as e:  # noqa: BLE001 -- the events timing failed too: the row says how
            error, t = error_message(e), None
    if t is None:
        return RankTiming(ctx.rank, [], "", {}, error)
    details = _details(t)
    if not use_graph and graph:
        details["graph_error"] = why_not
    return RankTiming(ctx.rank, list(t.samples_us), METHOD_GRAPH if use_graph else METHOD_EVENTS, details)


def across_ranks(timings: list[dict[str, Any]]) -> dict[str, Any]:
    """Min, median and max over ranks of the per-rank medians, and the slowest rank (the collective's critical
    path). Ranks that have no samples are left out."""
    ok = [t for t in timings if t.get("median_us") is not None]
    if not ok:
        return {}
    medians = [t["median_us"] for t in ok]
    slowest = max(ok, key=lambda t: t["median_us"])
    return {"min_us": min(medians), "median_us": statistics.median(medians), "max_us": max(medians),
            "slowest_rank": slowest["rank"]}  # fmt: skip
