"""Timing: the pure helpers on hand-worked numbers (CPU), then the timer against known kernels (GPU)."""

import statistics
import time
import warnings
from contextlib import contextmanager

import pytest
import torch

from mxbench.instruments import hardware
from mxbench.instruments import timing
from mxbench.instruments.timing import NodeCount, Timing, TimingError, TimingWarning, time_fn

HAS_CUDA = torch.cuda.is_available()


class TestSummaries:
    def test_odd_count_quartiles_are_the_middle_of_each_half(self):
        assert timing.summarize([5.0, 1.0, 3.0, 2.0, 4.0]) == (3.0, 2.0, 4.0)

    def test_even_count_quartiles_interpolate(self):
        # inclusive method on 1,2,3,4: positions 0.75, 1.5, 2.25 of the sorted samples
        assert timing.summarize([4.0, 1.0, 3.0, 2.0]) == (2.5, 1.75, 3.25)

    def test_one_sample_is_its_own_spread(self):
        assert timing.summarize([7.5]) == (7.5, 7.5, 7.5)

    def test_no_samples_is_an_error(self):
        with pytest.raises(ValueError, match="samples"):
            timing.summarize([])

    def test_timing_median_and_iqr(self):
        t = Timing([10.0, 14.0, 12.0, 11.0, 13.0], "graph-cold", 100, 2.0, 1)
        assert t.median_us == 12.0
        assert t.iqr_us == 2.0

    def test_unknown_method_is_refused(self):
        with pytest.raises(ValueError, match="method"):
            Timing([1.0], "graph-lukewarm", 1)


class TestCallsPerReplay:
    @pytest.mark.parametrize(
        "est_us, target_ms, max_calls, expected",
        [
            (100.0, 10.0, 1000, 100),  # 10 ms / 100 us
            (30.0, 10.0, 1000, 333),  # floor(10000 / 30): a replay never overshoots the target
            (3.0, 10.0, 1000, 1000),  # capped
            (20_000.0, 10.0, 1000, 1),  # a call longer than the target still gets one call
            (10.0, 10.0, 1, 1),
        ],
    )
    def test_fills_the_target(self, est_us, target_ms, max_calls, expected):
        assert timing.choose_calls_per_replay(est_us, target_ms, max_calls) == expected

    @pytest.mark.parametrize("kwargs, name", [
        ({"est_us": 0.0, "target_ms": 10.0}, "est_us"),
        ({"est_us": 5.0, "target_ms": 0.0}, "target_ms"),
        ({"est_us": 5.0, "target_ms": 10.0, "max_calls": 0}, "max_calls"),
    ])  # fmt: skip
    def test_bad_arguments_are_named(self, kwargs, name):
        with pytest.raises(ValueError, match=name):
            timing.choose_calls_per_replay(**kwargs)


class TestFlushSubtraction:
    def test_subtracts_the_median_flush_replay_per_call(self):
        # flush median 11 us over 10 calls: (110 - 11) / 10 = 9.9, ...
        got = timing.subtract_flush([110.0, 120.0, 130.0], [10.0, 12.0, 11.0], calls=10)
        assert got == pytest.approx([9.9, 10.9, 11.9])

    def test_an_outlier_flush_replay_does_not_move_the_samples(self):
        steady = timing.subtract_flush([110.0, 120.0, 130.0], [10.0, 12.0, 11.0], calls=10)
        spiky = timing.subtract_flush([110.0, 120.0, 130.0], [10.0, 90.0, 11.0], calls=10)
        assert spiky == pytest.approx(steady)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="calls"):
            timing.subtract_flush([1.0], [1.0], calls=0)
        with pytest.raises(ValueError, match="empty"):
            timing.subtract_flush([], [1.0], calls=1)


class TestFlushSize:
    def test_default_is_twice_the_l2(self):
        assert timing.flush_size(50 * 2**20) == 100 * 2**20

    def test_larger_request_is_kept(self):
        assert timing.flush_size(50 * 2**20, 2**30) == 2**30

    def test_smaller_than_twice_l2_is_refused(self):
        with pytest.raises(ValueError, match="flush_bytes"):
            timing.flush_size(50 * 2**20, 60 * 2**20)

    def test_unknown_l2_falls_back_to_twice_256_mib(self):
        assert timing.flush_size(0) == 512 * 2**20


class TestEmptyGraphHeuristic:
    def test_replay_as_cheap_as_the_baseline_captured_nothing(self):
        assert timing.captured_nothing(replay_us=3.0, baseline_replay_us=2.9, calls=100, eager_us=5.0)

    def test_real_kernels_cost_microseconds_per_call(self):
        assert not timing.captured_nothing(replay_us=300.0, baseline_replay_us=3.0, calls=100, eager_us=5.0)

    def test_no_gpu_work_even_eagerly(self):
        # eager events around a callable that launches nothing (or launches elsewhere) measure ~0, noise either way
        assert timing.captured_nothing(replay_us=900.0, baseline_replay_us=900.1, calls=100, eager_us=-0.02)

    def test_a_tiny_op_as_fast_in_the_graph_as_eagerly_is_not_flagged(self):
        assert not timing.captured_nothing(replay_us=23.0, baseline_replay_us=3.0, calls=100, eager_us=1.0)

    def test_launch_bound_eager_call_with_a_fast_kernel_is_not_flagged(self):
        # 50 us of Python per eager call, 2 us of GPU work per call in the graph
        assert not timing.captured_nothing(replay_us=203.0, baseline_replay_us=3.0, calls=100, eager_us=50.0)


class TestNodeCounts:
    def test_work_and_copy_nodes_by_driver_type(self):
        # CUgraphNodeType: 0 kernel, 1 memcpy, 2 memset, 3 host, 4 child graph, 5 empty, 6/7 event wait/record
        assert timing.count_nodes([0, 0, 1, 2, 2, 3, 4, 5, 6, 7]) == NodeCount(work=6, memcpy=1, memset=2)
        assert timing.count_nodes([]) == NodeCount(0, 0, 0)

    def test_per_call_nodes_subtract_the_graph_without_fn(self):
        # 40 calls of [flush kernel, memcpy] against 40 flush kernels: one work node per call, a memcpy
        assert timing.nodes_per_call(NodeCount(80, 40, 0), NodeCount(40, 0, 0), calls=40) == NodeCount(1, 1, 0)
        # a reduction: a semaphore memset and a kernel per call, no flush
        assert timing.nodes_per_call(NodeCount(80, 0, 40), NodeCount(0, 0, 0), calls=40) == NodeCount(2, 0, 1)

    def test_bad_call_count(self):
        with pytest.raises(ValueError, match="calls"):
            timing.nodes_per_call(NodeCount(1, 0, 0), NodeCount(0, 0, 0), calls=0)


class TestOptions:
    @pytest.mark.parametrize("kwargs, name", [
        ({"samples": 0}, "samples"),
        ({"target_replay_ms": 0.0}, "target_replay_ms"),
        ({"warmup": -1}, "warmup"),
        ({"use_graph": False, "cold_l2": False}, "cold_l2"),
    ])  # fmt: skip
    def test_bad_options_are_named(self, kwargs, name):
        with pytest.raises(ValueError, match=name):
            time_fn(lambda: None, **kwargs)

    @pytest.mark.skipif(HAS_CUDA, reason="checks the no-GPU path")
    def test_no_cuda_device_is_a_timing_error(self):
        with pytest.raises(TimingError, match="no CUDA device"):
            time_fn(lambda: None)


# ------------------------------------------------------------------------------------------------ GPU


def _bandwidth_peak_tbps() -> float:
    props = hardware.device_properties()
    if props.get("bandwidth_tbps"):
        return props["bandwidth_tbps"]
    spec = hardware.detect()
    if spec is None:
        pytest.skip("unknown card and no bus bandwidth from torch")
    return spec.hbm_tbps


@pytest.mark.gpu
class TestOnGPU:
    def test_large_elementwise_copy_runs_near_the_memory_bandwidth(self):
        src = torch.randn(2**28, device="cuda")  # 1 GiB
        dst = torch.empty_like(src)
        t = time_fn(lambda: torch.neg(src, out=dst))  # an SM kernel: 1 GiB read, 1 GiB written
        tbps = 2 * src.nbytes / t.median_us / 1e6
        peak = _bandwidth_peak_tbps()
        assert 0.5 * peak < tbps < 1.02 * peak
        assert t.method == "graph-cold" and t.kernels_per_call == 1 and t.memcpy_nodes == 0 and t.flush_us > 0
        assert len(t.samples_us) == 25 and t.calls_per_replay >= 1 and t.window_includes_flush is None

    def test_cold_l2_is_slower_than_warm_for_an_l2_resident_input(self):
        x = torch.randn(4 * 2**20, device="cuda")  # 16 MiB: fits in the L2 of every supported card
        cold = time_fn(lambda: x.sum())
        warm = time_fn(lambda: x.sum(), cold_l2=False)
        assert warm.method == "graph-warm" and warm.flush_us is None
        assert cold.median_us > 1.2 * warm.median_us

    def test_graph_time_matches_profiler_kernel_time(self):
        src = torch.randn(2**26, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty(src.shape, device="cuda", dtype=torch.float32)  # a conversion: one elementwise kernel

        def fn():
            dst.copy_(src)

        graph = time_fn(fn)
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        buf = torch.empty(timing.flush_size(l2), dtype=torch.uint8, device="cuda")
        flush_names = {e.name for e in _kernel_events(lambda: buf.zero_(), 3)}
        reps = 10

        def flushed_fn():
            buf.zero_()
            fn()

        fn_kernels = [e for e in _kernel_events(flushed_fn, reps) if e.name not in flush_names]
        profiled_us = sum(e.time_range.elapsed_us() for e in fn_kernels) / reps
        assert graph.median_us == pytest.approx(profiled_us, rel=0.15)

    def test_events_cold_agrees_with_graph_cold_on_a_long_kernel(self):
        # an elementwise kernel, not a same-dtype copy_: a graph would run that memcpy on the copy engines
        src = torch.randn(2**28, device="cuda")
        dst = torch.empty_like(src)
        graph = time_fn(lambda: torch.neg(src, out=dst))
        events = time_fn(lambda: torch.neg(src, out=dst), use_graph=False)
        assert graph.memcpy_nodes == 0
        assert events.method == "events-cold" and events.calls_per_replay == 1 and events.kernels_per_call is None
        assert events.median_us == pytest.approx(graph.median_us, rel=0.15)

    def test_a_same_dtype_copy_is_a_memcpy_node_and_warns(self):
        src = torch.randn(2**24, device="cuda")  # 64 MiB
        same = torch.empty_like(src)
        with pytest.warns(TimingWarning, match="memcpy"):
            t = time_fn(lambda: same.copy_(src))  # contiguous, same dtype: cudaMemcpyAsync
        assert (t.kernels_per_call, t.memcpy_nodes, t.memset_nodes) == (1, 1, 0)
        half = torch.empty(src.shape, dtype=torch.bfloat16, device="cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("error", TimingWarning)
            t = time_fn(lambda: half.copy_(src))  # a conversion: an elementwise kernel
        assert (t.kernels_per_call, t.memcpy_nodes, t.memset_nodes) == (1, 0, 0)

    @pytest.mark.parametrize("cold_l2, use_graph", [(True, True), (False, True), (True, False)])
    def test_the_window_holds_only_fns_timed_calls(self, cold_l2, use_graph):
        # fn is short next to its flush, so a window that also held the flush-only replays would last ~1.8x longer
        x = torch.randn(4 * 2**20, device="cuda")
        spans = []

        @contextmanager
        def window():
            start = time.perf_counter()
            yield
            spans.append(time.perf_counter() - start)

        t = time_fn(lambda: x.sum(), cold_l2=cold_l2, use_graph=use_graph, window=window)
        assert len(spans) == 1 and t.window_includes_flush is cold_l2
        if use_graph:  # the GPU time of fn's replays: per call plus the flush subtracted from it, n calls each
            gpu_s = sum(s + (t.flush_us or 0.0) for s in t.samples_us) * t.calls_per_replay / 1e6
            assert 0.95 * gpu_s < spans[0] < 1.3 * gpu_s + 0.005

    @pytest.mark.parametrize("cold_l2", [True, False])
    def test_a_callable_without_gpu_work_is_refused(self, cold_l2):
        with pytest.raises(TimingError, match="captured none"):
            time_fn(lambda: None, cold_l2=cold_l2)

    def test_work_on_another_stream_is_refused(self):
        x = torch.randn(2**20, device="cuda")
        y = torch.empty_like(x)
        other = torch.cuda.Stream()

        def fn():
            with torch.cuda.stream(other):
                y.copy_(x)

        with pytest.raises(TimingError):
            time_fn(fn)
        torch.cuda.synchronize()

    @pytest.mark.parametrize("cold_l2", [True, False])
    def test_without_node_counts_the_time_heuristic_still_refuses_an_empty_graph(self, monkeypatch, cold_l2):
        monkeypatch.setattr(timing, "_count_nodes", lambda graph: None)
        with pytest.raises(TimingError, match="captured none"):
            time_fn(lambda: None, cold_l2=cold_l2)
        x = torch.randn(2**24, device="cuda")
        t = time_fn(lambda: x.sum(), cold_l2=cold_l2)
        assert t.kernels_per_call is None and t.memcpy_nodes is None and statistics.median(t.samples_us) > 0


def _kernel_events(fn, reps):
    """The CUDA kernel events of ``reps`` eager calls of ``fn``, from torch.profiler."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
