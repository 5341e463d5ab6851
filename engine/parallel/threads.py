"""Per-worker CPU thread budget: workers x BLAS/OpenMP threads <= cores.

OpenBLAS (numpy's bundled one) offers a thread-local thread count
(``openblas_set_num_threads_local``) and OpenMP's ``omp_set_num_threads``
sets the calling thread's own ICV, so each worker thread limits itself
without touching the others. Libraries are found among those already loaded
(``/proc/self/maps``); missing ones are skipped and reported.
"""
from __future__ import annotations

import ctypes
import os

_BLAS_SYMBOLS = ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads64_",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")


def _loaded_libs(fragment: str):
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if fragment in line and ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask; os.cpu_count where
    that cannot be read): the one count of the profile's fingerprint, its
    fit and sprint train's --threads warning."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Each worker's share of ``cores`` (default the cores this process may
    run on, ``usable_cores``: os.cpu_count counted the host's, so workers
    under taskset or a container's CPU set each took more than their share)."""
    cores = cores or usable_cores()
    return max(1, cores // max(1, workers))


def limit_this_thread(n: int) -> list[str]:
    """Limit BLAS and OpenMP parallelism of the calling thread to ``n``;
    returns what was set (for the log)."""
    import numpy as np  # noqa: F401  (makes sure numpy's OpenBLAS is loaded)
    done = []
    for path in _loaded_libs("openblas"):
        lib = ctypes.CDLL(path)
        for sym in _BLAS_SYMBOLS:
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                fn(int(n))
                done.append(f"{os.path.basename(path)}:{sym}={n}")
                break
    for path in _loaded_libs("gomp") + _loaded_libs("libomp"):
        fn = getattr(ctypes.CDLL(path), "omp_set_num_threads", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int]
            fn(int(n))
            done.append(f"{os.path.basename(path)}:omp_set_num_threads={n}")
    return done
