"""The clock and timing loop every sweep shares, and the thread limit they run under."""
from __future__ import annotations

import math
import time

import numpy as np

# -- timing ---------------------------------------------------------------------

def _sync():
    from engine import backend
    be = backend.get_backend()
    if be.name == "gpu":
        be.xp.cuda.Device().synchronize()


# The clock of the kernel sweeps. With one BLAS/OpenMP thread a CPU kernel
# runs on the calling thread, so its thread CPU time is its cost without the
# preemption a shared machine adds (wall-clock samples there scatter by
# 100 %+); the host-sharing factors come from the contention sweep instead.
CLOCK = {"name": "wall", "fn": time.perf_counter}


def use_clock(name):
    if name not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {name!r}")
    CLOCK.update(name=name, fn=time.thread_time if name == "cpu" else time.perf_counter)


def time_call(fn, repeats=5, min_time=2e-3):
    """(median, std) seconds per call of ``fn()``, batching calls so each
    sample lasts at least ``min_time`` (timer resolution, launch jitter)."""
    clock = CLOCK["fn"]
    fn()
    _sync()
    t0 = clock()
    fn()
    _sync()
    one = max(clock() - t0, 1e-7)
    inner = max(1, int(math.ceil(min_time / one)))
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(inner):
            fn()
        _sync()
        samples.append((clock() - t0) / inner)
    return float(np.median(samples)), float(np.std(samples))


def _rec(kind, fn, cfg, **fields):
    t, s = time_call(fn, cfg["repeats"], cfg["min_time"])
    return dict(kind=kind, t=t, std=s, clock=CLOCK["name"], **fields)


def _xp():
    from engine import backend
    return backend.get_backend().xp


def _rand(shape, seed=0):
    xp = _xp()
    return xp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))



def set_threads(threads):
    """Limit BLAS/OpenMP threads of this thread (after the kernels' libraries
    are loaded: a library loaded later would keep its default)."""
    if not threads:
        return []
    from engine import backend, ops  # noqa: F401  (loads the extension and its OpenMP)
    backend.get_backend()
    from engine.parallel.threads import limit_this_thread
    return limit_this_thread(int(threads))

