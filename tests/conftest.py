"""Shared test configuration: the `gpu` and `mpi` markers; gpu tests skip
with the reason when CuPy or a CUDA device is missing."""
from __future__ import annotations

import functools

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy (skipped with the reason otherwise)")
    config.addinivalue_line("markers", "mpi: starts MPI processes (mpiexec)")


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    from engine.backend import _gpu_unavailable_reason
    return _gpu_unavailable_reason()


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"no GPU: {reason}")
        for it in gpu_items:
            it.add_marker(skip)
