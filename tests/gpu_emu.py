"""An emulated GPU for whole training runs: a stand-in ``cupy`` module whose
arrays live in host memory but behave like device arrays, and whose
``RawModule`` runs the real kernels/*.cu sources compiled as sequential C++
(tests/k2_support.py's shim, extended to the shared-memory and warp
kernels). :func:`install` puts it in ``sys.modules["cupy"]``; then the
engine's own ``--device gpu`` path (engine.backend._make_gpu, RawKernels,
Backend.raw_launch, xp = cupy) runs unchanged, inside mpiexec children too
(tests/gpu_boot.py). The device array lives in tests/gpu_emu_array.py,
devices, streams and the ledger in tests/gpu_emu_device.py, the kernels in
tests/gpu_emu_kernels.py; this file assembles them into the module.

It is strict where real CuPy is, so that a GPU branch that forgets a host
copy fails here as it would on a GPU:

* ``numpy.asarray(device_array)`` raises TypeError (CuPy's "Implicit
  conversion to a NumPy array is not allowed");
* a numpy array mixed into a device operation, ufunc or kernel argument
  raises TypeError; ``device[...] = numpy_array`` raises ValueError (CuPy
  routes it through ``fill``);
* a device array handed to MPI (Send, Isend, Allreduce, ...) raises
  BufferError: the MPI here is not CUDA-aware, so device buffers must be
  staged through the host (``.get()`` / ``cupy.asnumpy``) first. With
  ``$SPRINT_EMU_CUDA_MPI=1`` MPI says it is CUDA-aware and takes device
  buffers, once the stream that wrote them is synchronised;
* every kernel launch checks its arguments against the kernel's C signature
  (count; pointer, i64 or float; the pointed-to dtype; C-contiguity);
* the current device is per thread, as in the CUDA runtime (a new thread
  starts on device 0), and an array used on another device than the one it
  was allocated on raises ValueError: stricter than a GPU with peer access,
  where it would run slowly across the bus, but each rank's (and each
  thread's) work must stay on the rank's own GPU;
* streams: work runs at once, but each buffer remembers the stream that
  last wrote it (kernel outputs: the non-const pointer parameters; ``out=``,
  in-place operators, new arrays, host-to-device copies) until that stream
  is synchronised (``Stream.synchronize``, ``Device.synchronize``, a
  ``.get()`` on it). Using the buffer on a stream not ordered after the
  writer raises RuntimeError ("stream race"): the legacy null stream and
  blocking streams wait for each other, a ``non_blocking`` stream for
  nothing. Races are checked in the order the threads really ran, so a
  missing synchronisation at a hand-over between threads shows up.

GEMM goes through ``cupy.matmul`` (cuBLAS on a GPU): NumPy's matmul here,
so results may differ from the engine's CPU SGEMM in the last bits.
``$SPRINT_EMU_GPUS`` sets the device count (default 4), ``$SPRINT_EMU_CACHE``
where the compiled kernels are kept (shared by all ranks), and
``$SPRINT_EMU_LOG`` a folder where each process writes, at exit, what it did
(kernels launched, host<->device copies, the devices it used);
``$SPRINT_EMU_RACES=log`` counts stream races in that ledger instead of
raising (a survey of every hand-over of a strategy at once).
"""
from __future__ import annotations

import atexit
import importlib.machinery
import os
import sys
import types

import numpy as np

from gpu_emu_array import (_call, _unsupported, _unwrap, _use, _wrap, array, asarray, asnumpy,  # noqa: F401
                           get_array_module, ndarray)
from gpu_emu_device import (LEDGER, CUDARuntimeError, Device, Stream, _write_ledger, cuda_aware_mpi,  # noqa: F401
                            current_device, device_count, get_current_stream)
from gpu_emu_kernels import RawModule, compile_source, precompile_all  # noqa: F401


def _cublas_gemm(transa, transb, a, b, out=None, alpha=1.0, beta=0.0):
    """cupy.cublas.gemm: out = alpha op(a) op(b) + beta out (NumPy's matmul here)."""
    ops = {"N": False, "n": False, 0: False, "T": True, "t": True, 1: True}
    if transa not in ops or transb not in ops:
        raise TypeError(f"invalid transpose option {transa!r}/{transb!r}")
    for x in (a, b) + (() if out is None else (out,)):
        if not isinstance(x, ndarray):
            raise _unsupported(x)
        _use(x, write=x is out)
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype:
        raise ValueError(f"cublas.gemm: 2-D arrays of one dtype expected, got {a.shape} {a.dtype} and "
                         f"{b.shape} {b.dtype}")
    A = a._a.T if ops[transa] else a._a
    B = b._a.T if ops[transb] else b._a
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"cublas.gemm: inner dimensions differ ({A.shape} x {B.shape})")
    prod = np.matmul(A, B)
    if out is None:
        if beta != 0:
            raise ValueError("cublas.gemm: beta != 0 needs out")
        return _wrap(prod * a.dtype.type(alpha))
    if out.shape != prod.shape or out.dtype != a.dtype:
        raise ValueError(f"cublas.gemm: out is {out.shape} {out.dtype}, the product {prod.shape} {a.dtype}")
    t = a.dtype.type
    out._a[...] = (prod * t(alpha) + out._a * t(beta)) if beta != 0 else prod * t(alpha)
    return out


# ---- the module object ---------------------------------------------------------------------
_PASS = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
         "uint64", "bool_", "dtype", "newaxis", "inf", "nan", "pi", "e", "finfo", "iinfo", "integer",
         "floating", "number", "generic", "result_type", "can_cast", "isscalar")


def _creator(fn):
    def f(*args, **kwargs):
        return _wrap(fn(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))
    return f


def make_module() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.__file__ = __file__
    cp.__doc__ = "emulated CuPy (tests/gpu_emu.py)"
    # importlib.util.find_spec("cupy") reads this once the module is installed
    cp.__spec__ = importlib.machinery.ModuleSpec("cupy", None, origin=__file__)
    cp.ndarray = ndarray
    for n in _PASS:
        setattr(cp, n, getattr(np, n))
    for n in ("zeros", "empty", "ones", "full", "arange", "linspace", "eye", "zeros_like", "empty_like",
              "ones_like", "full_like"):
        setattr(cp, n, _creator(getattr(np, n)))
    cp.asarray, cp.array, cp.asnumpy, cp.get_array_module = asarray, array, asnumpy, get_array_module
    cp.RawModule = RawModule
    cublas = types.ModuleType("cupy.cublas")
    cublas.gemm = _cublas_gemm
    cp.cublas = cublas

    def __getattr__(name):
        fn = getattr(np, name)
        if isinstance(fn, type) or not callable(fn):
            return fn

        def f(*args, **kwargs):
            return _call(fn, args, kwargs)
        f.__name__ = name
        return f
    cp.__getattr__ = __getattr__

    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    runtime.getDeviceCount = device_count
    runtime.getDevice = current_device
    runtime.memGetInfo = lambda: (8 << 30, 16 << 30)
    runtime.CUDARuntimeError = CUDARuntimeError
    cuda.runtime = runtime
    cuda.Device, cuda.Stream, cuda.get_current_stream = Device, Stream, get_current_stream
    cuda.CUDARuntimeError = CUDARuntimeError
    cp.cuda = cuda
    cp.cuda.Device = Device
    return cp


def install():
    """Make ``import cupy`` give the emulation (before the engine imports it)."""
    cp = make_module()
    sys.modules["cupy"] = cp
    sys.modules["cupy.cuda"] = cp.cuda
    sys.modules["cupy.cuda.runtime"] = cp.cuda.runtime
    sys.modules["cupy.cublas"] = cp.cublas
    os.environ.setdefault("SPRINT_KERNELS", "rawmodule")
    if cuda_aware_mpi():
        from mpi4py import MPI
        MPI.Query_cuda_support = lambda: True
    atexit.register(_write_ledger)
    return cp
