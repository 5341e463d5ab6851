"""Shared test configuration: the `gpu` and `mpi` markers; gpu tests skip
with the reason when CuPy or a CUDA device is missing.

The suite runs on the CPU backend on every machine: its references are NumPy
arrays, and on a GPU machine the default device ('auto') would otherwise be
the GPU for every test (and for the `sprint` processes the tests start). GPU
tests select the GPU themselves, and each test gets back the backend it
started with, so one that fails half-way cannot move the next onto the GPU."""
from __future__ import annotations

import functools
import os

import pytest

os.environ.setdefault("SPRINT_DEVICE", "cpu")
# MPICH's launcher (hydra's proxy) writes the host's topology for the ranks
# of a job to /tmp/hydra_hwloc_xmlfile_XXXXXX (a fixed folder: TMPDIR is not
# read) and removes it only when the job ends normally; the suite's MPI_Abort
# and kill tests left about 25 a run. The proxy writes none when
# HWLOC_XMLFILE is set; set empty, each rank's hwloc fails to open it and
# discovers the topology itself, as a one-rank job does.
os.environ.setdefault("HWLOC_XMLFILE", "")
# predict, tune, simulate and plan read ./profile.json without --profile
# (engine.perf.cli_profile.profile_option): a `sprint profile` run in the
# checkout would otherwise change what the suite's commands predict from.
os.environ["SPRINT_PROFILE"] = ""


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


@pytest.fixture(autouse=True)
def _restore_backend():
    from engine import backend
    before = backend._current
    yield
    backend._current = before
