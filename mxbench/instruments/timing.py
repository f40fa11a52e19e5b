"""Kernel timing: CUDA-graph replays of many calls, cold L2 by default.

``time_fn(fn)`` returns per-call samples in microseconds. Each sample is one replay of a CUDA graph holding ``n``
calls of ``fn`` (``n`` chosen so a replay lasts about ``target_replay_ms``), divided by ``n``: launch overhead is
gone and the clocks stay up between calls.

Methods (``Timing.method``):
- ``graph-cold`` (default): the graph holds ``[flush, fn] x n``, where the flush writes a buffer of at least twice
  the L2 size so every call starts with a cold cache. A second graph of ``n`` flushes alone is replayed around the
  first, and its median is subtracted (the tritonbench/helion design): per call = (replay - flush) / n.
- ``graph-warm``: the graph holds ``fn x n``; inputs that fit in L2 stay there (hot-cache throughput).
- ``events-cold``: eager calls, each after a flush, timed by a CUDA event pair (the ``triton.testing.do_bench``
  design); includes launch gaps. For callables that cannot be captured.

Replay order: the baseline graph's replays (the flush graph when cold) are split into halves before and after
``fn``'s replays (A-B-A), so drift over the run moves the subtracted median as it moves ``fn``'s, and ``fn``'s timed
replays run back to back. ``window`` (e.g. a telemetry sampler) is entered around exactly those replays (the eager
calls for "events-cold"), with the device synchronised at both ends, so energy over the window / (replays x calls per
replay) is the energy of one call (with its flush when cold: ``Timing.window_includes_flush``).

Fresh inputs (``time_fn(fresh=...)``): a timed call must compute its outputs from the values in its input buffers,
not remember them. Before each timed replay (each eager call for "events-cold") ``fresh.refill(remaining)`` writes
another set of valid input values into the same buffers, alternating so that the last timed replay
(``remaining == 0``) runs on values the callable never saw when it was called eagerly or captured; after the timed
replays ``fresh.verify(outputs)`` checks the outputs of that last replay (those ``fn`` returned during capture,
which every replay writes again) against the oracle on those values, and a mismatch is a ``StaleOutput`` error, not
a time. The refill is ordinary copies on the replay stream between one replay's end event and the next replay's
start event: outside every timed interval (the next replay begins with its flush anyway when cold), never captured;
its cost is one read and one write of the stage's input bytes per replay, inside the telemetry ``window``.

Sanity: a graph that captured no GPU work (``fn`` launched on another stream, through an API graphs do not
capture, or returned a cached result) would time as nearly free, so the captured nodes are counted (through the
driver, when torch exposes the graph) and ``TimingError`` is raised when ``fn`` added none. Without a count the
replay time is compared with an empty graph's and the eager time. All synchronisation happens outside the timed
region; every event is recorded on the replay stream.

Memcpy and memset nodes: a same-dtype contiguous ``copy_`` is a ``cudaMemcpyAsync`` (torch
``copy_device_to_device``). Captured, it becomes a memcpy node served by the copy engines, which stream more slowly
than the eager call (on an H200, a 1 GiB fp32 ``copy_`` took 509 us eager but 792 us in a graph), so the graph times
a different engine. Such nodes are counted (``Timing.memcpy_nodes``) and raise a ``TimingWarning``. Memset nodes are
counted too (``Timing.memset_nodes``) but do not warn: torch's multi-block reductions memset a few bytes of
semaphores before their kernel, which costs nothing next to it.
"""

from __future__ import annotations

import ctypes
import functools
import math
import statistics
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import astuple, dataclass
from typing import Protocol

import torch
from mxkernels.core.errors import InputError

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


class StaleOutput(TimingError):
    """The outputs of the last timed call are not those of its inputs: the callable returned a cached result,
    skipped work on a repeated call or detected the graph capture. Its time is not reported."""


class Fresh(Protocol):
    """New input values between timed calls and the check of the last call's outputs (see the module)."""

    def refill(self, remaining: int) -> None:
        """Write the values for the next timed call into the input buffers; ``remaining`` timed calls follow it
        (0: this is the last, whose outputs ``verify`` checks)."""

    def verify(self, outputs: object) -> str | None:
        """Why ``outputs`` (of the last timed call) are wrong for the values ``refill(0)`` wrote, or None."""


class TimingWarning(UserWarning):
    """The number is measured, but maybe not what was meant (a graph whose copies the copy engines serve)."""


@dataclass
class Timing:
    """Per-call samples of one callable and how they were taken.

    ``samples_us``: one per replay (per eager call for "events-cold"), in microseconds per call.
    ``calls_per_replay``: calls of ``fn`` in each graph replay (1 for "events-cold").
    ``flush_us``: the flush cost per call that was subtracted ("graph-cold" only).
    ``kernels_per_call``: GPU work nodes (kernels, memcpys, memsets) each call added to the graph; None when not
    counted.
    ``memcpy_nodes`` / ``memset_nodes``: how many of those are memcpy / memset nodes (work the driver may hand to
    copy engines rather than SM kernels); None when not counted.
    ``window_includes_flush``: with a ``window``, whether the calls inside it each followed a flush (cold methods);
    None without a window.
    """

    samples_us: list[float]
    method: str
    calls_per_replay: int
    flush_us: float | None = None
    kernels_per_call: int | None = None
    memcpy_nodes: int | None = None
    memset_nodes: int | None = None
    window_includes_flush: bool | None = None

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
        raise InputError(f"flush_bytes must be at least twice the L2 size ({minimum} bytes), got {flush_bytes}")
    return flush_bytes


def captured_nothing(replay_us: float, baseline_replay_us: float, calls: int, eager_us: float) -> bool:
    """Whether a replay of ``calls`` calls looks like a graph without ``fn``'s work (when nodes cannot be counted).

    ``baseline_replay_us`` is the same graph without ``fn`` (the flush graph, or an empty graph); ``eager_us`` the
    eager GPU time of one call. Flagged when the extra time per call is tiny in absolute terms (a real kernel node
    costs about a microsecond) and far below the eager time, or when the eager call did no GPU work either.
    """
    per_call = (replay_us - baseline_replay_us) / calls
    return per_call < EMPTY_CALL_US and (per_call < EMPTY_FRACTION * eager_us or eager_us < EMPTY_CALL_US)


@dataclass(frozen=True)
class NodeCount:
    """Nodes of a captured graph: ``work`` (kernel, memcpy, memset and child-graph nodes), and among them
    ``memcpy`` and ``memset``."""

    work: int
    memcpy: int
    memset: int


# CUgraphNodeType values (cuda.h) of the nodes that do GPU work
_KERNEL, _MEMCPY, _MEMSET, _CHILD_GRAPH = 0, 1, 2, 4
_WORK_NODE_TYPES = frozenset({_KERNEL, _MEMCPY, _MEMSET, _CHILD_GRAPH})


def count_nodes(types: Iterable[int]) -> NodeCount:
    """``NodeCount`` of a graph whose nodes have the CUgraphNodeType values ``types``."""
    kinds = Counter(types)
    return NodeCount(sum(kinds[t] for t in _WORK_NODE_TYPES), kinds[_MEMCPY], kinds[_MEMSET])


def nodes_per_call(graph: NodeCount, baseline: NodeCount, calls: int) -> NodeCount:
    """Nodes each of ``calls`` calls of ``fn`` added: (graph - baseline) / calls, rounded (the baseline is the same
    graph without ``fn``: its flushes, or nothing)."""
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    return NodeCount(*(round((g - b) / calls) for g, b in zip(astuple(graph), astuple(baseline), strict=True)))


def time_fn(
    fn: Callable[[], object],
    *,
    cold_l2: bool = True,
    use_graph: bool = True,
    samples: int = 25,
    target_replay_ms: float = 10.0,
    warmup: int = 3,
    flush_bytes: int | None = None,
    window: Callable[[], AbstractContextManager] | None = None,
    agree: Callable[[float], float] | None = None,
    fresh: Fresh | None = None,
) -> Timing:
    """Time ``fn`` (a zero-argument callable launching GPU work on the current device); see the module docstring.

    ``fn`` is first called eagerly ``warmup`` times (so Triton JIT and autotuning happen before capture).
    ``window``: a factory of a context manager entered around ``fn``'s timed replays only (not warm-up, estimate,
    capture or the flush-only replays); the calls inside it are ``len(samples_us) * calls_per_replay``.
    ``agree``: maps this process's eager estimate of one graph body (us) to the estimate that sets the calls per
    replay. Processes timing a collective together pass one that returns the largest estimate of them all, so
    that every process captures and replays the same number of collective calls. ``fresh``: new input values before
    every timed call and the check of the last one's outputs (see the module). Raises
    ``TimingError`` without a CUDA device, when ``fn`` cannot be captured, or when the graph holds none of its work;
    ``StaleOutput`` when ``fresh`` finds the last timed outputs wrong; warns (``TimingWarning``) when ``fn``'s graph
    holds memcpy or memset nodes.
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
                return _time_events(fn, flush, samples, stream, window, fresh)
            return _time_graph(fn, flush, samples, target_replay_ms, stream, window, agree, fresh)
    finally:
        torch.cuda.current_stream().wait_stream(stream)


def _check_options(cold_l2: bool, use_graph: bool, samples: int, target_replay_ms: float, warmup: int) -> None:
    if samples < 1:
        raise InputError(f"samples must be at least 1, got {samples}")
    if not target_replay_ms > 0:
        raise InputError(f"target_replay_ms must be positive, got {target_replay_ms}")
    if warmup < 0:
        raise InputError(f"warmup must be non-negative, got {warmup}")
    if not use_graph and not cold_l2:
        raise InputError("use_graph=False times cold calls only ('events-cold'); pass cold_l2=True")


class _Flush:
    """A buffer of at least 2x L2 whose zeroing evicts everything else from the cache."""

    def __init__(self, device: int, flush_bytes: int | None):
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        self.buffer = torch.empty(flush_size(l2, flush_bytes), dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def _windowed(window: Callable[[], AbstractContextManager] | None) -> AbstractContextManager:
    """``window()`` entered on an idle device (so it holds only the work queued inside it), or nothing."""
    if window is None:
        return nullcontext()
    torch.cuda.synchronize()
    return window()


def _refill(fresh: Fresh | None, remaining: int) -> None:
    if fresh is not None:
        fresh.refill(remaining)


def _verify(fresh: Fresh | None, outputs: object) -> None:
    """``StaleOutput`` when ``fresh`` finds the last timed call's ``outputs`` wrong."""
    problem = None if fresh is None else fresh.verify(outputs)
    if problem is not None:
        raise StaleOutput(f"the outputs of the last timed call are not those of the inputs written before it "
                          f"({problem}): a cached result, work skipped on a repeated call or a detected graph "
                          f"capture; not timed")  # fmt: skip


def _time_events(fn, flush: _Flush, samples: int, stream: torch.cuda.Stream, window, fresh=None) -> Timing:
    pairs = [_event_pair() for _ in range(samples)]
    outputs = None
    with _windowed(window):
        for i, (start, end) in enumerate(pairs):
            _refill(fresh, samples - 1 - i)  # before the flush and the start event: not timed
            flush()
            start.record(stream)
            outputs = fn()
            end.record(stream)
        torch.cuda.synchronize()
    _verify(fresh, outputs)
    return Timing(
        [s.elapsed_time(e) * 1000.0 for s, e in pairs], "events-cold", 1,
        window_includes_flush=True if window is not None else None,
    )  # fmt: skip


def _time_graph(fn, flush: _Flush | None, samples: int, target_replay_ms: float, stream, window, agree=None,
                fresh=None) -> Timing:  # fmt: skip
    if flush is None:
        body = fn
    else:

        def body():
            flush()
            return fn()

    eager_body_us = _eager_us(body, stream)
    n = choose_calls_per_replay(eager_body_us if agree is None else agree(eager_body_us), target_replay_ms)
    main, main_nodes, outputs = _capture(body, n, stream)
    refill = None if fresh is None else fresh.refill
    if flush is not None:  # the flush graph: what is subtracted, and the same graph without fn
        base, base_nodes, _ = _capture(flush, n, stream)
        main_us, base_us = _time_replays(main, base, samples, stream, window, refill)
    else:
        main_us, _ = _time_replays(main, None, samples, stream, window, refill)
        base_nodes = NodeCount(0, 0, 0)
    _verify(fresh, outputs)  # every replay wrote the outputs the capture returned: these are the last replay's

    if main_nodes is not None and base_nodes is not None:
        per_call = nodes_per_call(main_nodes, base_nodes, n)
        kernels, memcpys, memsets = per_call.work, per_call.memcpy, per_call.memset
        empty = kernels == 0
    else:  # no node counts: compare with the graph without fn (an empty one when warm) and the eager time
        kernels = memcpys = memsets = None
        if flush is None:
            base_us, _ = _time_replays(_capture(None, n, stream)[0], None, samples, stream, None)
        eager_fn_us = eager_body_us - (_eager_us(flush, stream) if flush is not None else 0.0)
        empty = captured_nothing(statistics.median(main_us), statistics.median(base_us), n, eager_fn_us)
    if empty:
        raise TimingError(
            "the CUDA graph captured none of fn's GPU work: fn may launch on another stream, use an API that graph "
            "capture skips, or return a cached result; time it with use_graph=False or fix the callable"
        )
    if memcpys:
        warnings.warn(
            f"fn added {memcpys} memcpy node(s) per call to the CUDA graph: the copy engines serve them in a replay, "
            "more slowly than the eager call (a same-dtype contiguous copy_ is a cudaMemcpyAsync), so this graph "
            "time need not be the eager one; compare with use_graph=False or time a kernel",
            TimingWarning,
            stacklevel=3,
        )
    windowed = {"window_includes_flush": flush is not None} if window is not None else {}
    if flush is None:
        return Timing([r / n for r in main_us], "graph-warm", n, None, kernels, memcpys, memsets, **windowed)
    per_call_us = subtract_flush(main_us, base_us, n)
    flush_us = statistics.median(base_us) / n
    if statistics.median(per_call_us) <= 0:
        raise TimingError(
            f"fn's time is below the noise of the {flush_us:.2f} us flush it follows; "
            "time it warm (cold_l2=False) or with more work per call"
        )
    return Timing(per_call_us, "graph-cold", n, flush_us, kernels, memcpys, memsets, **windowed)


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


def _capture(body: Callable[[], object] | None, n: int,
             stream) -> tuple[torch.cuda.CUDAGraph, NodeCount | None, object]:  # fmt: skip
    """A graph of ``n`` calls of ``body`` (an empty graph for None), its node count (None if unknown) and what the
    last call returned (its outputs live in the graph's memory: every replay writes them again)."""
    graph, keeps_template = _new_graph()
    calls = n if body is not None else 0
    outputs = None
    try:
        with warnings.catch_warnings():
            # an empty graph is intended for the warm baseline; torch warns about it
            warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(calls):
                    outputs = body()
    except Exception as e:
        raise TimingError(f"fn could not be captured in a CUDA graph ({e}); time it with use_graph=False") from e
    nodes = _count_nodes(graph) if keeps_template else None
    if keeps_template:
        graph.instantiate()
    return graph, nodes, outputs


def _new_graph() -> tuple[torch.cuda.CUDAGraph, bool]:
    """A graph that keeps its cudaGraph_t after capture (so its nodes can be counted) where torch allows it."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True), True
    except TypeError:  # torch before keep_graph
        return torch.cuda.CUDAGraph(), False


@functools.cache
def _libcuda() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:  # no NVIDIA driver library (e.g. ROCm)
        return None


def _count_nodes(graph: torch.cuda.CUDAGraph) -> NodeCount | None:
    """The ``NodeCount`` of ``graph``'s template, through the driver API (None where it cannot be read)."""
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
    return count_nodes(kinds)


def _time_replays(
    graph: torch.cuda.CUDAGraph, baseline: torch.cuda.CUDAGraph | None, samples: int, stream, window,
    refill: Callable[[int], None] | None = None,
) -> tuple[list[float], list[float] | None]:
    """Replay times (us) of ``graph`` and ``baseline`` (None: no baseline), ``samples`` each: half the baseline's
    replays, ``graph``'s back to back (inside ``window``), the baseline's other half (A-B-A, see the module).
    ``refill(remaining)`` runs before each of ``graph``'s timed replays, between the events (never timed)."""
    graphs = [graph] if baseline is None else [graph, baseline]
    for g in graphs:  # the first replay uploads the graph; keep it out of the samples
        g.replay()

    def replays(g: torch.cuda.CUDAGraph, count: int, refill=None) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
        pairs = [_event_pair() for _ in range(count)]
        for i, (start, end) in enumerate(pairs):
            if refill is not None:
                refill(count - 1 - i)
            start.record(stream)
            g.replay()
            end.record(stream)
        return pairs

    before = replays(baseline, samples // 2) if baseline is not None else []
    with _windowed(window):
        timed = replays(graph, samples, refill)
        torch.cuda.synchronize()
    after = replays(baseline, samples - samples // 2) if baseline is not None else []
    stream.synchronize()

    def us(pairs):
        return [s.elapsed_time(e) * 1000.0 for s, e in pairs]

    return us(timed), (us(before + after) if baseline is not None else None)
