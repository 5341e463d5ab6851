"""Shared by the K2 kernel benchmarks (pool, softmax, vector): effective
memory bandwidth of an op against a memcpy (numpy.copyto) of a reference
buffer, the two timed round-robin (conftest.interleaved) so that both see the
same machine load; the ratio carries across machines. Calls shorter than
~20 us are batched so that each timed sample is well above the clock's
resolution and the loop overhead. With one OpenMP thread the clock is the
thread's CPU time (time.thread_time): on a shared machine the wall clock
mostly measures the other processes."""
from __future__ import annotations

import os
import time

import numpy as np

from conftest import interleaved

_SAMPLE_S = 2e-5


def use_cpu():
    """CPU backend with $SPRINT_BENCH_THREADS OpenMP threads (default: all
    cores). On a loaded machine a 2-thread region can wait a whole scheduler
    slice for its second thread; SPRINT_BENCH_THREADS=1 measures the kernels
    themselves."""
    from engine import backend
    from engine.parallel.threads import usable_cores
    be = backend.set_backend("cpu")
    be.ext.set_num_threads(int(os.environ.get("SPRINT_BENCH_THREADS", usable_cores())))
    return be


def _batched(fn):
    fn()  # warm-up: page faults, thread start
    t = time.perf_counter()
    fn()
    loops = max(1, int(_SAMPLE_S / max(time.perf_counter() - t, 1e-8)))
    if loops == 1:
        return fn, 1

    def run():
        for _ in range(loops):
            fn()
    return run, loops


def measure(benchmark, fn, moved_bytes, base_bytes, summary=None, reps=15, **info):
    """pytest-benchmark's run of fn (its table), then fn and a memcpy of
    base_bytes timed round-robin: median seconds per call, GB/s of fn
    (moved_bytes per call) and of memcpy (2 * base_bytes) and their ratio,
    attached as extra_info (and a line for the terminal summary)."""
    benchmark(fn)
    src = np.ones(max(base_bytes // 4, 1), np.float32)
    dst = np.empty_like(src)
    op, n_op = _batched(fn)
    cp, n_cp = _batched(lambda: np.copyto(dst, src))
    from engine import backend
    single = backend.get_backend().ext.get_num_threads() == 1
    med = interleaved({"op": op, "copy": cp}, reps=reps, clock=time.thread_time if single else time.perf_counter)
    s_op, s_cp = med["op"] / n_op, med["copy"] / n_cp
    gbps, base = moved_bytes / s_op / 1e9, 2 * src.nbytes / s_cp / 1e9
    out = {"seconds": s_op, "gbps": round(gbps, 3), "memcpy_gbps": round(base, 3),
           "ratio_vs_memcpy": round(gbps / base, 3), "clock": "thread_cpu" if single else "wall"}
    benchmark.extra_info.update({**info, **out})
    line = (f"{' '.join(f'{k}={v}' for k, v in info.items())}: {s_op * 1e6:9.1f} us  "
            f"{gbps:7.2f} GB/s  memcpy {base:7.2f} GB/s  ratio {gbps / base:5.2f}")
    if summary is not None:
        summary(line)
    print("\n  " + line)
    return out
