"""The emulated GPU's kernels (tests/gpu_emu.py): kernels/*.cu compiled as
sequential C++ on the CPU (tests/k2_support.py's shim, extended to the
shared-memory and warp-shuffle kernels), loaded as CuPy's ``RawModule``
would load them, every launch checked against the kernel's C signature
(count; pointer, i64 or float; the pointed-to dtype; C-contiguity) and
recorded in the ledger. Compiled once per cache folder
(``$SPRINT_EMU_CACHE``), shared by all ranks."""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from gpu_emu_device import LEDGER, CUDARuntimeError, _ledger_lock, _use, current_device

# ---- the kernel sources as sequential C++ ------------------------------------------
# One block of one thread: every grid-stride loop visits all indices in order,
# a "block reduction" reduces one value, and a warp shuffle has no other lane
# to read from (sprint_shfl_none: adds nothing, maxes nothing).
SHIM = r"""
#include <math.h>
#include <string.h>
struct sprint_dim3 { unsigned x, y, z; };
static const sprint_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static const sprint_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __syncthreads() ((void)0)
struct sprint_shfl_none {};
static inline sprint_shfl_none __shfl_xor_sync(unsigned, float, int) { return {}; }
static inline sprint_shfl_none __shfl_down_sync(unsigned, float, int) { return {}; }
static inline float& operator+=(float& a, sprint_shfl_none) { return a; }
static inline float fmaxf(float a, sprint_shfl_none) { return a; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
"""

_SIG_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)
_DTYPES = {"float": np.float32, "double": np.float64, "i64": np.int64, "long long": np.int64,
           "int64_t": np.int64, "int": np.int32, "unsigned char": np.uint8, "uint8_t": np.uint8}


def _param_kinds(params: str):
    """[(kind, pointee dtype or None, read-only)] of a kernel's parameter list."""
    out = []
    for p in params.split(","):
        const = "const" in p.split("*")[0]
        p = " ".join(p.replace("__restrict__", " ").replace("const", " ").split())
        if not p:
            continue
        if "*" in p:
            base = p.split("*")[0].strip()
            out.append(("ptr", _DTYPES.get(base), const))
        else:
            base = p.rsplit(" ", 1)[0].strip()
            out.append(("f32" if base == "float" else "i64" if _DTYPES.get(base) is np.int64 else base, None, True))
    return out


def cache_dir() -> Path:
    d = os.environ.get("SPRINT_EMU_CACHE") or os.path.join(tempfile.gettempdir(), f"sprint-gpu-emu-{os.getuid()}")
    Path(d).mkdir(parents=True, exist_ok=True)
    return Path(d)


def compile_source(code: str) -> Path:
    """The shared library of ``code`` (NVRTC's input), built once per cache
    folder (the name is the hash of shim and code; written atomically, so
    concurrent ranks never load half a file)."""
    key = hashlib.sha256((SHIM + code).encode()).hexdigest()[:20]
    lib = cache_dir() / f"k{key}.so"
    if lib.exists():
        return lib
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("emulated GPU: no C++ compiler to run the CUDA sources on the CPU")
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".tmp")
    os.close(fd)
    try:
        src = Path(tmp + ".cpp")
        src.write_text(SHIM + "\n" + code)
        subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-w", str(src), "-o", tmp],
                       check=True, capture_output=True, text=True)
        os.replace(tmp, lib)
    finally:
        for p in (tmp, tmp + ".cpp"):
            if os.path.exists(p):
                os.unlink(p)
    return lib


def precompile_all() -> list[Path]:
    """Build every kernels/*.cu file as RawKernels would submit it."""
    from engine.backend import kernel_files, prepared_source
    return [compile_source(prepared_source(f)) for f in kernel_files()]


class RawModule:
    """kernels/*.cu as NVRTC would compile them, run as C++ on the CPU."""

    def __init__(self, code=None, options=(), **kw):
        self._lib = ctypes.CDLL(str(compile_source(code)))
        self._sigs = {name: _param_kinds(params) for name, params in _SIG_RE.findall(code)}

    def get_function(self, name):
        if name not in self._sigs:
            raise CUDARuntimeError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name})")
        return RawKernel(getattr(self._lib, name), name, self._sigs[name])


class RawKernel:
    def __init__(self, fn, name, sig):
        self.fn, self.name, self.sig = fn, name, sig

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        if len(args) != len(self.sig):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.sig)} parameters")
        conv = []
        from gpu_emu_array import _unsupported, ndarray
        for i, (a, (kind, pointee, const)) in enumerate(zip(args, self.sig)):
            what = f"{self.name} argument {i}"
            if kind == "ptr":
                if not isinstance(a, ndarray):
                    raise _unsupported(a) if isinstance(a, np.ndarray) else TypeError(
                        f"{what}: a device array expected, got {type(a).__name__}")
                _use(a, write=not const)
                if not a._a.flags.c_contiguous:
                    raise ValueError(f"{what}: a non-contiguous array passed as a pointer")
                if pointee is not None and a.dtype != pointee:
                    raise TypeError(f"{what}: {a.dtype} array for a {np.dtype(pointee)} pointer")
                conv.append(ctypes.c_void_p(a._a.ctypes.data))
            elif kind == "i64":
                if not isinstance(a, np.int64):
                    raise TypeError(f"{what}: long long parameter given {type(a).__name__}")
                conv.append(ctypes.c_longlong(int(a)))
            elif kind == "f32":
                if not isinstance(a, np.float32):
                    raise TypeError(f"{what}: float parameter given {type(a).__name__}")
                conv.append(ctypes.c_float(float(a)))
            else:
                raise TypeError(f"{what}: parameter type {kind!r} is not emulated")
        with _ledger_lock:
            LEDGER["launches"][self.name] = LEDGER["launches"].get(self.name, 0) + 1
            LEDGER["threads_devices"].add(f"{threading.current_thread().name}:{current_device()}")
        self.fn(*conv)
