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


# ---- the CUDA kernel sources, run sequentially on the CPU --------------------
# kernels/<name>.cu compiled as C++ with a shim (one block of one thread, so
# every grid-stride loop visits all indices in order): checks the kernels'
# index arithmetic and semantics against the CPU twins without a GPU. Kernels
# that need real threads (warp shuffles, __syncthreads) are not covered.

_SHIM = r"""
#include <math.h>
struct sprint_dim3 { unsigned x, y, z; };
static const sprint_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static const sprint_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __syncthreads() ((void)0)  /* only compiled: unused by the emulated kernels */
"""


def emulated_kernels(name, tmp_dir):
    """ctypes library of kernels/<name>.cu built for sequential CPU execution
    (pytest.skip when no C++ compiler is found)."""
    import ctypes
    import shutil
    import subprocess
    from pathlib import Path

    import pytest

    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to run the CUDA sources on the CPU")
    tmp_dir = Path(tmp_dir)
    shim = tmp_dir / "cuda_shim.h"
    shim.write_text(_SHIM)
    lib = tmp_dir / f"lib{name}_emulated.so"
    src = backend.kernel_dir() / f"{name}.cu"
    subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-include", str(shim), "-x", "c++",
                    str(src), "-I", str(src.parent), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def kernel_call(lib, kernel, *args):
    """Call an emulated kernel: numpy arrays as pointers, Python ints as
    long long (i64), Python floats as float -- the convention of common.cuh."""
    import ctypes
    conv = []
    for a in args:
        if isinstance(a, np.ndarray):
            conv.append(ctypes.c_void_p(a.ctypes.data))
        elif isinstance(a, (bool, int, np.integer)):
            conv.append(ctypes.c_longlong(int(a)))
        else:
            conv.append(ctypes.c_float(float(a)))
    getattr(lib, kernel)(*conv)


def emulated_gpu_backend(tmp_dir, families=("pool", "elementwise", "vector", "deform")):
    """A backend that takes the ops' GPU RawModule path with NumPy arrays and
    runs the launched kernels from the real kernels/*.cu sources on the CPU:
    checks the Python-side validation, the launch arguments (order, types) and
    the kernel code against the CPU twins."""
    libs = [emulated_kernels(f, tmp_dir) for f in families]

    def raw_launch(kernel, args, n=None, grid=None, block=256):
        for lib in libs:
            if hasattr(lib, kernel):
                return kernel_call(lib, kernel, *args)
        raise AssertionError(f"kernel {kernel} is not emulated")

    be = backend.Backend("gpu", np, None, "rawmodule")
    be.raw_launch = raw_launch
    return be


def cuda_module_without_device():
    """engine._sprint_cuda on a machine with no CUDA device (else skip: the
    binding tests pass fake device pointers, which a real launch would use).
    There a valid call gets through every argument check and its launch fails
    with a RuntimeError naming the CUDA error; nothing touches memory."""
    import pytest
    try:
        from engine import _sprint_cuda
    except ImportError:
        pytest.skip("engine._sprint_cuda is not built")
    if _sprint_cuda.device_count() > 0:
        pytest.skip("a CUDA device is present: fake pointers would be dereferenced")
    return _sprint_cuda


def check_cuda_binding(call, exc=RuntimeError, match="CUDA error"):
    import pytest
    with pytest.raises(exc, match=match):
        call()


def compiled_backend_without_device():
    """The ops' compiled-module GPU path with NumPy arrays whose host
    addresses stand in for device pointers, on a machine with no device: each
    op must get through its checks and call its engine._sprint_cuda binding
    with arguments the binding accepts -- the launch then fails with a
    RuntimeError naming the CUDA error (no memory is touched)."""
    c = cuda_module_without_device()
    be = backend.Backend("gpu", np, c, "compiled")
    be.ptr = lambda a: 0 if a is None else int(a.ctypes.data)
    be.stream_ptr = lambda: 0
    return be
