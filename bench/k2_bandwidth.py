"""Shared by the K2 kernel benchmarks (pool, softmax, vector): effective
memory bandwidth of an op against a memcpy (numpy.copyto) of the same buffer
measured in the same run, so the ratio carries across machines."""
from __future__ import annotations

import statistics
import time

import numpy as np


def median_seconds(fn, repeats=7, min_time=0.05):
    """Median seconds per call, each repeat batching enough calls to last
    min_time (one warm-up call first: page faults, thread start)."""
    fn()
    t = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t, 1e-7)
    loops = max(1, int(min_time / one))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(loops):
            fn()
        times.append((time.perf_counter() - t) / loops)
    return statistics.median(times)


_memcpy_cache: dict[int, float] = {}


def memcpy_gbps(nbytes: int) -> float:
    """GB/s of numpy.copyto of an nbytes buffer (read + write = 2 * nbytes moved)."""
    if nbytes not in _memcpy_cache:
        src = np.ones(max(nbytes // 4, 1), np.float32)
        dst = np.empty_like(src)
        _memcpy_cache[nbytes] = 2 * src.nbytes / median_seconds(lambda: np.copyto(dst, src)) / 1e9
    return _memcpy_cache[nbytes]


def op_seconds(benchmark, fn):
    """Run fn under pytest-benchmark; its median (or our own timing when
    benchmarks are disabled, e.g. a plain `pytest` run)."""
    benchmark(fn)
    stats = getattr(benchmark, "stats", None)
    if stats is not None and getattr(stats, "stats", None) is not None and stats.stats.rounds > 1:
        return stats.stats.median
    return median_seconds(fn, repeats=3, min_time=0.01)


def record(benchmark, seconds, moved_bytes, base_bytes, **info):
    """Attach GB/s and the ratio to memcpy to the benchmark; return them."""
    gbps = moved_bytes / seconds / 1e9
    base = memcpy_gbps(base_bytes)
    out = {"seconds": seconds, "gbps": round(gbps, 3), "memcpy_gbps": round(base, 3),
           "ratio_vs_memcpy": round(gbps / base, 3), **info}
    benchmark.extra_info.update(out)
    print(f"\n  {info}: {seconds * 1e6:10.1f} us  {gbps:7.2f} GB/s  memcpy {base:7.2f} GB/s  "
          f"ratio {gbps / base:5.2f}")
    return out
