"""Kernel timing: CUDA-graph replays of many calls, cold L2 by default.

``time_fn(fn)`` returns per-call samples in microseconds. Each sample is one replay of a CUDA graph holding ``n``
calls of ``fn`` (``n`` chosen so a replay lasts about ``target_replay_ms``), divided by ``n``: launch overhead is
gone and the clocks stay up between calls.

Methods (``Timing.method``):
- ``graph-cold`` (default): the graph holds ``[flush, fn] x n``, where the flush writes a buffer of at least twice
  the L2 size so every call starts with a cold cache. A second graph of ``n`` flushes alone is replayed interleaved
  with the first, and its median is subtracted (the tritonbench/helion design): per call = (replay - flush) / n.
- ``graph-warm``: the graph holds ``fn x n``; inputs that fit in L2 stay there (hot-cache throughput).
- ``events-cold``: eager calls, each after a flush, timed by a CUDA event pair (the ``triton.testing.do_bench``
  design); includes launch gaps. For callables that cannot be captured.

Sanity: a graph that captured no GPU work (``fn`` launched on another stream, through an API graphs do not
capture, or returned a cached result) would time as nearly free, so the captured nodes are counted (through the
driver, when torch exposes the graph) and ``TimingError`` is raised when ``fn`` added none. Without a count the
replay time is compared with an empty graph's and the eager time. All synchronisation happens outside the timed
region; every event is recorded on the replay stream.
"""

from __future__ import annotations

import ctypes
import functools
import math
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

METHODS = ("graph-cold", "graph-warm", "events-cold")
MAX_CALLS_PER_REPLAY = 1000
ESTIMATE_CALLS = 5
# Where the driver cannot count the graph's nodes: a replay of n real calls costs at least ~1 us per call more
# than an empty graph; far below that, and far below the eager time, nothing was captured.
EMPTY_CALL_US = 0.25
EMPTY_FRACTION = 0.1
# Flush size when the device reports no L2 size (twice Triton's fixed 256 MiB buffer).
FALLBACK_FLUSH_BYTES = 2 * 256 * 2**20


class TimingError(RuntimeError):
    """Timing cannot produce a trustworthy number: no CUDA device, or a graph that captured no work."""


@dataclass
class Timing:
    """Per-call samples of one callable and how they were taken.

    ``samples_us``: one per replay (per eager call for "events-cold"), in microseconds per call.
    ``calls_per_replay``: calls of ``fn`` in each graph replay (1 for "events-cold").
    ``flush_us``: the flush cost per call that was subtracted ("graph-cold" only).
    ``kernels_per_call``: GPU work nodes (kernels, memcpys, memsets) each call added to the graph; None when not
    counted.
    """

    samples_us: list[float]
    method: str
    calls_per_replay: int
    flush_us: float | None = None
    kernels_per_call: int | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")

    @property
    def median_us(self) -> float:
        return summarize(self.samples_us)[0]

    @property
    def iqr_us(self) -> float:
        _, q1, q3 = summarize(self.samples_us)
        return q3 - q1


def summarize(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of ``samples`` (inclusive quartiles, as ``Record.iqr_us``)."""
    if not samples:
        raise ValueError("samples must not be empty")
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return median, q1, q3


def choose_calls_per_replay(est_us: float, target_ms: float, max_calls: int = MAX_CALLS_PER_REPLAY) -> int:
    """Calls per graph replay so that a replay lasts about ``target_ms``: floor(target / est), in [1, max_calls].

    ``est_us`` is the eager time of one graph body (flush + call when cold).
    """
    if not est_us > 0:
        raise ValueError(f"est_us must be positive, got {est_us}")
    if not target_ms > 0:
        raise ValueError(f"target_ms must be positive, got {target_ms}")
    if max_calls < 1:
        raise ValueError(f"max_calls must be at least 1, got {max_calls}")
    return max(1, min(max_calls, math.floor(target_ms * 1000.0 / est_us)))


def subtract_flush(replay_us: Sequence[float], flush_replay_us: Sequence[float], calls: int) -> list[float]:
    """Per-call times of cold replays: (replay - median flush replay) / calls, one per replay.

    The flush graph's median (not its paired sample) is subtracted, so the spread of the result is the spread of
    the measured replays alone rather than the sum of both graphs' noise.
    """
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    if not replay_us or not flush_replay_us:
        raise ValueError("replay_us and flush_replay_us must not be empty")
    flush = statistics.median(flush_replay_us)
    return [(r - flush) / calls for r in replay_us]


def flush_size(l2_bytes: int, flush_bytes: int | None = None) -> int:
    """Bytes the cold-L2 flush writes: ``flush_bytes`` if given, else twice the L2 size.

    A flush smaller than twice the L2 would leave part of the inputs resident and silently time a warm cache
    (flashinfer#4468), so a smaller ``flush_bytes`` is refused.
    """
    minimum = 2 * l2_bytes if l2_bytes > 0 else FALLBACK_FLUSH_BYTES
    if flush_bytes is None:
        return minimum
    if flush_bytes < minimum:
        raise ValueError(f"flush_bytes must be at least twice the L2 size ({minimum} bytes), got {flush_bytes}")
    return flush_bytes


def captured_nothing(replay_us: float, baseline_replay_us: float, calls: int, eager_us: float) -> bool:
    """Whether a replay of ``calls`` calls looks like a graph without ``fn``'s work (when nodes cannot be counted).

    ``baseline_replay_us`` is the same graph without ``fn`` (the flush graph, or an empty graph); ``eager_us`` the
    eager GPU time of one call. Flagged when the extra time per call is tiny in absolute terms (a real kernel node
    costs about a microsecond) and far below the eager time, or when the eager call did no GPU work either.
    """
    per_call = (replay_us - baseline_replay_us) / calls
    return per_call < EMPTY_CALL_US and (per_call < EMPTY_FRACTION * eager_us or eager_us < EMPTY_CALL_US)


def time_fn(
    fn: Callable[[], object],
    *,
    cold_l2: bool = True,
    use_graph: bool = True,
    samples: int = 25,
    target_replay_ms: float = 10.0,
    warmup: int = 3,
    flush_bytes: int | None = None,
) -> Timing:
    """Time ``fn`` (a zero-argument callable launching GPU work on the current device); see the module docstring.

    ``fn`` is first called eagerly ``warmup`` times (so Triton JIT and autotuning happen before capture). Raises
    ``TimingError`` without a CUDA device, when ``fn`` cannot be captured, or when the graph holds none of its work.
    """
    _check_options(cold_l2, use_graph, samples, target_replay_ms, warmup)
    if not torch.cuda.is_available():
        raise TimingError("no CUDA device: timing needs a GPU (use the analytic model without one)")
    device = torch.cuda.current_device()
    flush = _Flush(device, flush_bytes) if cold_l2 else None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
            if not use_graph:
                return _time_events(fn, flush, samples, stream)
            return _time_graph(fn, flush, samples, target_replay_ms, stream)
    finally:
        torch.cuda.current_stream().wait_stream(stream)


def _check_options(cold_l2: bool, use_graph: bool, samples: int, target_replay_ms: float, warmup: int) -> None:
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if not target_replay_ms > 0:
        raise ValueError(f"target_replay_ms must be positive, got {target_replay_ms}")
    if warmup < 0:
        raise ValueError(f"warmup must be non-negative, got {warmup}")
    if not use_graph and not cold_l2:
        raise ValueError("use_graph=False times cold calls only ('events-cold'); pass cold_l2=True")


class _Flush:
    """A buffer of at least 2x L2 whose zeroing evicts everything else from the cache."""

    def __init__(self, device: int, flush_bytes: int | None):
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        self.buffer = torch.empty(flush_size(l2, flush_bytes), dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def _time_events(fn, flush: _Flush, samples: int, stream: torch.cuda.Stream) -> Timing:
    pairs = [_event_pair() for _ in range(samples)]
    for start, end in pairs:
        flush()
        start.record(stream)
        fn()
        end.record(stream)
    stream.synchronize()
    return Timing([s.elapsed_time(e) * 1000.0 for s, e in pairs], "events-cold", 1)


def _time_graph(fn, flush: _Flush | None, samples: int, target_replay_ms: float, stream) -> Timing:
    if flush is None:
        body = fn
    else:

        def body():
            flush()
            fn()

    eager_body_us = _eager_us(body, stream)
    n = choose_calls_per_replay(eager_body_us, target_replay_ms)
    main, main_nodes = _capture(body, n, stream)
    if flush is not None:  # the flush graph: what is subtracted, and the same graph without fn
        base, base_nodes = _capture(flush, n, stream)
        main_us, base_us = _time_replays([main, base], samples, stream)
    else:
        (main_us,) = _time_replays([main], samples, stream)
        base_nodes = 0

    if main_nodes is not None and base_nodes is not None:
        kernels = round((main_nodes - base_nodes) / n)
        empty = kernels == 0
    else:  # no node counts: compare with the graph without fn (an empty one when warm) and the eager time
        kernels = None
        if flush is None:
            (base_us,) = _time_replays([_capture(None, n, stream)[0]], samples, stream)
        eager_fn_us = eager_body_us - (_eager_us(flush, stream) if flush is not None else 0.0)
        empty = captured_nothing(statistics.median(main_us), statistics.median(base_us), n, eager_fn_us)
    if empty:
        raise TimingError(
            "the CUDA graph captured none of fn's GPU work: fn may launch on another stream, use an API that graph "
            "capture skips, or return a cached result; time it with use_graph=False or fix the callable"
        )
    if flush is None:
        return Timing([r / n for r in main_us], "graph-warm", n, None, kernels)
    per_call = subtract_flush(main_us, base_us, n)
    if statistics.median(per_call) <= 0:
        raise TimingError(
            f"fn's time is below the noise of the {statistics.median(base_us) / n:.2f} us flush it follows; "
            "time it warm (cold_l2=False) or with more work per call"
        )
    return Timing(per_call, "graph-cold", n, statistics.median(base_us) / n, kernels)


def _event_pair() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _eager_us(body: Callable[[], object], stream: torch.cuda.Stream) -> float:
    """Mean eager time of one ``body()`` over a few back-to-back calls."""
    start, end = _event_pair()
    start.record(stream)
    for _ in range(ESTIMATE_CALLS):
        body()
    end.record(stream)
    stream.synchronize()
    return start.elapsed_time(end) * 1000.0 / ESTIMATE_CALLS


def _capture(body: Callable[[], object] | None, n: int, stream) -> tuple[torch.cuda.CUDAGraph, int | None]:
    """A graph of ``n`` calls of ``body`` (an empty graph for None) and its count of work nodes (None if unknown)."""
    graph, keeps_template = _new_graph()
    calls = n if body is not None else 0
    try:
        with warnings.catch_warnings():
            # an empty graph is intended for the warm baseline; torch warns about it
            warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(calls):
                    body()
    except Exception as e:
        raise TimingError(f"fn could not be captured in a CUDA graph ({e}); time it with use_graph=False") from e
    nodes = _count_work_nodes(graph) if keeps_template else None
    if keeps_template:
        graph.instantiate()
    return graph, nodes


def _new_graph() -> tuple[torch.cuda.CUDAGraph, bool]:
    """A graph that keeps its cudaGraph_t after capture (so its nodes can be counted) where torch allows it."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True), True
    except TypeError:  # torch before keep_graph
        return torch.cuda.CUDAGraph(), False


# CUgraphNodeType values of nodes that do GPU work: kernel, memcpy, memset, child graph.
_WORK_NODE_TYPES = frozenset({0, 1, 2, 4})


@functools.cache
def _libcuda() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:  # no NVIDIA driver library (e.g. ROCm)
        return None


def _count_work_nodes(graph: torch.cuda.CUDAGraph) -> int | None:
    """Kernel, memcpy, memset and child-graph nodes of ``graph``'s template, through the driver API."""
    cuda = _libcuda()
    if cuda is None:
        return None
    try:
        raw = ctypes.c_void_p(graph.raw_cuda_graph())
    except (AttributeError, RuntimeError):
        return None
    count = ctypes.c_size_t(0)
    if cuda.cuGraphGetNodes(raw, None, ctypes.byref(count)) != 0:
        return None
    nodes = (ctypes.c_void_p * count.value)()
    if count.value and cuda.cuGraphGetNodes(raw, nodes, ctypes.byref(count)) != 0:
        return None
    kinds = []
    for node in nodes[: count.value]:
        kind = ctypes.c_int(-1)
        if cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) != 0:
            return None
        kinds.append(kind.value)
    return sum(k in _WORK_NODE_TYPES for k in kinds)


def _time_replays(graphs: list[torch.cuda.CUDAGraph], samples: int, stream) -> list[list[float]]:
    """Replay times (us) of each graph, ``samples`` each, interleaved so drift hits all graphs alike."""
    for g in graphs:  # the first replay uploads the graph; keep it out of the samples
        g.replay()
    pairs = [[_event_pair() for _ in range(samples)] for _ in graphs]
    for i in range(samples):
        for g, p in zip(graphs, pairs):
            p[i][0].record(stream)
            g.replay()
            p[i][1].record(stream)
    stream.synchronize()
    return [[s.elapsed_time(e) * 1000.0 for s, e in p] for p in pairs]
