"""Helpers of the K2 kernel tests (pool, softmax, elementwise, vector, deform):
run the public ops on a chosen backend, poisoned output buffers, and the
tolerance rule |got - ref| <= tol + |ref| * eps."""
from __future__ import annotations

import contextlib

import numpy as np

from engine import backend


@contextlib.contextmanager
def using(be):
    """Run the ops on backend object ``be`` (restores the previous one)."""
    old = backend._current
    backend._current = be
    try:
        yield be
    finally:
        backend._current = old


def cpu():
    return backend.set_backend("cpu")


def gpu_backends():
    """The GPU kernel paths: CuPy RawModule always, the compiled module if built."""
    import cupy

    out = [backend.Backend("gpu", cupy, backend.RawKernels(cupy), "rawmodule")]
    try:
        from engine import _sprint_cuda
        if _sprint_cuda.device_count() > 0:
            out.append(backend.Backend("gpu", cupy, _sprint_cuda, "compiled"))
    except ImportError:
        pass
    return out


def poison(shape, dtype=np.float32, xp=np):
    """An output buffer full of NaN (or a sentinel for ints): every element
    the kernel fails to write shows up."""
    a = xp.empty(shape, dtype=dtype)
    a.fill(np.nan if np.dtype(dtype).kind == "f" else -7)
    return a


def assert_close(got, ref, tol=1e-6, eps=1e-5, what=""):
    got = backend.to_host(got).astype(np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.all(np.isfinite(got) | np.isnan(ref)), f"{what}: non-finite output"
    err = np.abs(got - ref)
    bound = tol + np.abs(ref) * eps
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} outside tol {tol} + |ref|*{eps}; "
                           f"max err {err.max():.3g}")
