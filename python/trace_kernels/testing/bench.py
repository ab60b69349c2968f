"""Timing helpers: CUDA events around CUDA-graph replays, median of many, fresh inputs.

Host launch overhead (Python dispatch, validation, ctypes) is kept out of kernel numbers by
capturing `iters` calls into one graph and timing its replays; callers rotate input sets so that
repeated calls do not hit L2.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from trace_kernels.runtime.graphs import capture_graph


def time_graph(fn: Callable[[int], None], variants: int, *, replays: int = 20, warmup: int = 3) -> float:
    """Median milliseconds per call of fn(i) for i in range(variants), measured over graph replays.

    fn(i) must launch on the current stream and touch only preallocated or graph-pool memory.
    Falls back to timing eager calls with events when capture fails.
    """
    for i in range(variants):
        fn(i)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    try:
        with capture_graph(graph, stream=stream):
            for i in range(variants):
                fn(i)
    except Exception:  # capture unsupported (e.g. a cooperative launch on an old driver)
        return time_eager(fn, variants, replays=replays, warmup=warmup)
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / variants)
    return statistics.median(times)


def time_eager(fn: Callable[[int], None], variants: int, *, replays: int = 20, warmup: int = 3) -> float:
    for i in range(warmup):
        fn(i % variants)
    torch.cuda.synchronize()
    times = []
    for r in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(r % variants)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_overhead_us(fn: Callable[[], None], calls: int = 200) -> float:
    """Median host time per call in microseconds (what a Python caller pays to launch)."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def variants_for(bytes_per_set: int, l2_bytes: int, max_sets: int = 8) -> int:
    """Input sets to rotate so the working set is several times the L2."""
    return max(2, min(max_sets, -(-4 * l2_bytes // max(1, bytes_per_set))))
