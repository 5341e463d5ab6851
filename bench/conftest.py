"""Shared benchmark helpers. Ratios are measured in the same run: the
candidates are timed round-robin (interleaved), so a change in machine load
hits all of them alike, and medians are compared.

Run: pytest bench/ --benchmark-only  (results JSON in bench/results/)."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

RESULTS = Path(__file__).resolve().parent / "results"
_SUMMARY: list[str] = []


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy (skipped with the reason otherwise)")
    config.addinivalue_line("markers", "mpi: starts MPI processes (mpiexec)")


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if gpu_items:
        from engine.backend import _gpu_unavailable_reason
        reason = _gpu_unavailable_reason()
        if reason:
            for it in gpu_items:
                it.add_marker(pytest.mark.skip(reason=f"no GPU: {reason}"))


def interleaved(fns: dict[str, Callable[[], object]], reps: int = 7, warmup: int = 1,
                sync: Callable[[], object] | None = None,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds of each fn, timed round-robin. sync() (e.g. a device
    synchronize) is called before reading the clock; clock=time.thread_time
    times single-threaded code on a loaded machine by its CPU time."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    if sync:
        sync()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t0 = clock()
            f()
            if sync:
                sync()
            times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def adaptive_median(f: Callable[[], object], min_time: float = 0.05, min_reps: int = 3,
                    max_reps: int = 50, sync: Callable[[], object] | None = None) -> float:
    """Median of repeated timings: at least min_reps and about min_time in all."""
    f()
    if sync:
        sync()
    ts: list[float] = []
    while len(ts) < min_reps or (sum(ts) < min_time and len(ts) < max_reps):
        t0 = time.perf_counter()
        f()
        if sync:
            sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def save_json(name: str, payload) -> Path:
    from engine.checkpoint import write_json
    return write_json(RESULTS / name, payload, indent=1)


def machine_info() -> dict:
    import platform

    import numpy as np
    info = {"machine": platform.node(), "cpu_count": os.cpu_count(), "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    try:
        from engine import _sprint_cpu
        info["omp_threads"] = _sprint_cpu.get_num_threads()
    except ImportError:
        pass
    return info


@pytest.fixture
def summary():
    """summary(line): printed in the terminal summary at the end of the run."""
    return _SUMMARY.append


def pytest_terminal_summary(terminalreporter):
    if _SUMMARY:
        terminalreporter.section("SPRINT kernel benchmarks (ratios measured in the same run)")
        for line in _SUMMARY:
            terminalreporter.write_line(line)


# PyTorch brings its own OpenMP runtime: with it loaded, the engine's cifar
# step ran 1.8x slower (152.7 -> 83.7 img/s at batch 32 from the import
# alone), and PyTorch's own convolutions slowed too. So no benchmark process
# imports both: PyTorch baselines run in fresh processes of their own.
_FRESH = r"""
import importlib, json, sys
sys.path.insert(0, {bench!r}); sys.path.insert(0, {root!r})
if sys.argv[1] == "torch":
    import torch
mod = importlib.import_module(sys.argv[2])
print(json.dumps(getattr(mod, sys.argv[3])(*json.loads(sys.argv[4]))))
"""


def in_fresh_process(framework: str, module: str, fn: str, *args, threads: int | None = None,
                     timeout: float = 900):
    """bench module `module`'s fn(*args) in a new interpreter that imports
    PyTorch only when framework == "torch"; its JSON result."""
    bench = Path(__file__).resolve().parent
    code = _FRESH.format(bench=str(bench), root=str(bench.parent))
    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, "-c", code, framework, module, fn, json.dumps(args)],
                       capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode:
        raise RuntimeError(f"{module}.{fn} in a fresh process failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def torch_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("torch") is not None

