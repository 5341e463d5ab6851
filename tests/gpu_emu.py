"""An emulated GPU for whole training runs: a stand-in ``cupy`` module whose
arrays live in host memory but behave like device arrays, and whose
``RawModule`` runs the real kernels/*.cu sources compiled as sequential C++
(tests/k2_support.py's shim, extended to the shared-memory and warp
kernels). :func:`install` puts it in ``sys.modules["cupy"]``; then the
engine's own ``--device gpu`` path (engine.backend._make_gpu, RawKernels,
Backend.raw_launch, xp = cupy) runs unchanged, inside mpiexec children too
(tests/gpu_boot.py).

It is strict where real CuPy is, so that a GPU branch that forgets a host
copy fails here as it would on a GPU:

* ``numpy.asarray(device_array)`` raises TypeError (CuPy's "Implicit
  conversion to a NumPy array is not allowed");
* a numpy array mixed into a device operation, ufunc or kernel argument
  raises TypeError; ``device[...] = numpy_array`` raises ValueError (CuPy
  routes it through ``fill``);
* a device array handed to MPI (Send, Isend, Allreduce, ...) raises
  BufferError: the MPI here is not CUDA-aware, so device buffers must be
  staged through the host (``.get()`` / ``cupy.asnumpy``) first;
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
import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import weakref
from pathlib import Path

import numpy as np

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


# ---- what a process did (tests read it) --------------------------------------------
LEDGER = {"launches": {}, "h2d": 0, "d2h": 0, "devices_used": set(), "selected": None,
          "threads_devices": set(), "races": {}}
_ledger_lock = threading.Lock()


def _note(key, n=1):
    with _ledger_lock:
        LEDGER[key] += n


def _write_ledger():
    d = os.environ.get("SPRINT_EMU_LOG")
    if not d:
        return
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    out = dict(LEDGER, devices_used=sorted(LEDGER["devices_used"]),
               threads_devices=sorted(LEDGER["threads_devices"]), pid=os.getpid())
    Path(d).mkdir(parents=True, exist_ok=True)
    p = Path(d) / f"rank{rank}.json"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, p)


# ---- devices and streams ---------------------------------------------------------------
class CUDARuntimeError(RuntimeError):
    pass


_tls = threading.local()


def device_count() -> int:
    return int(os.environ.get("SPRINT_EMU_GPUS", "4"))


def current_device() -> int:
    return getattr(_tls, "device", 0)


class Device:
    def __init__(self, device=None):
        self.id = current_device() if device is None else int(device)
        if not 0 <= self.id < device_count():
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id}")

    def use(self):
        _tls.device = self.id
        _tls.stream = None
        if threading.current_thread() is threading.main_thread():
            LEDGER["selected"] = self.id

    def synchronize(self):
        _synchronized(lambda w: w.device_id == self.id)

    def __enter__(self):
        self._prev = current_device()
        self.use()
        return self

    def __exit__(self, *exc):
        Device(self._prev).use()
        return False


class Stream:
    """A CUDA stream. The emulation runs work at once, but remembers which
    stream wrote each buffer until that stream is synchronised (see _use)."""
    _next = [1]

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.device_id = current_device()
        self.null, self.non_blocking = bool(null), bool(non_blocking)
        if null:
            self.ptr = 0
        else:
            self.ptr = Stream._next[0]
            Stream._next[0] += 1
        self.thread = threading.current_thread().name

    def __repr__(self):
        if self.null:
            return f"the null stream of device {self.device_id}"
        kind = "non-blocking" if self.non_blocking else "blocking"
        return f"{kind} stream {self.ptr} of device {self.device_id} (made by thread {self.thread})"

    def use(self):
        if self.device_id != current_device():
            raise ValueError(f"stream of device {self.device_id} made current on device {current_device()}")
        _tls.stream = self
        return self

    def synchronize(self):
        if self.null:       # the legacy default stream also waits for the blocking streams
            _synchronized(lambda w: w.device_id == self.device_id and not w.non_blocking)
        else:
            _synchronized(lambda w: w is self)

    def __enter__(self):
        self._prev = getattr(_tls, "stream", None)
        return self.use()

    def __exit__(self, *exc):
        _tls.stream = self._prev
        return False


_NULL = {}


def get_current_stream():
    s = getattr(_tls, "stream", None)
    if s is None:
        s = _NULL.get(current_device())
        if s is None:
            s = _NULL[current_device()] = Stream(null=True)
    return s


# id(buffer) -> (weak reference to the buffer, the stream that last wrote it)
# until that stream is synchronised (buffer: the root numpy array of a view)
_WRITER: dict = {}
_writer_lock = threading.RLock()


def _synchronized(which):
    with _writer_lock:
        for k, (_, w, _t) in list(_WRITER.items()):
            if which(w):
                _WRITER.pop(k, None)


def _writer(root):
    e = _WRITER.get(id(root))
    return e[1:] if e is not None and e[0]() is root else (None, None)


def _wrote(root, stream):
    k = id(root)
    _WRITER[k] = (weakref.ref(root, lambda _, k=k: _WRITER.pop(k, None)), stream,
                  threading.current_thread().name)


def _ordered(w, r) -> bool:
    """Whether work queued on stream r runs after what stream w has queued:
    the same stream, or the legacy null stream and a blocking stream (each
    waits for the other); never a non_blocking stream and another."""
    if w is r:
        return True
    if w.device_id != r.device_id or w.non_blocking or r.non_blocking:
        return False
    return w.null or r.null


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


# ---- device arrays ----------------------------------------------------------------------
_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy "
             "array explicitly.")
_NOT_FOR_MPI = ("emulated GPU: a device array was handed to MPI, which is not CUDA-aware here; stage it "
                "through host memory (.get() / cupy.asnumpy) first")


class _Mem:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr, device_id):
        self.ptr, self.device_id = ptr, device_id


def _unsupported(x):
    return TypeError(f"Unsupported type {type(x)}")


def _use(a, write=False, view=False):
    """Device work on ``a`` from this thread: on its own device, and after
    the stream that last wrote it (else a race on a GPU: the writer's stream
    must be synchronised before another stream touches the buffer)."""
    if a._dev != current_device():
        raise ValueError(f"emulated GPU: an array of device {a._dev} used on device {current_device()} "
                         f"(thread {threading.current_thread().name})")
    if view:            # no device work (a view, a shape, a pointer)
        return
    cur = get_current_stream()
    root = _root(a._a)
    with _writer_lock:
        w, by = _writer(root)
        if w is not None and not _ordered(w, cur):
            if os.environ.get("SPRINT_EMU_RACES") != "log":
                raise RuntimeError(f"emulated GPU: stream race: a buffer written by thread {by} on {w} was used "
                                   f"by thread {threading.current_thread().name} on {cur} before that stream was "
                                   f"synchronised")
            _log_race(w, cur)
        if write:
            _wrote(root, cur)


def _log_race(w, cur):
    """$SPRINT_EMU_RACES=log: count each race site in the ledger and go on
    (to survey a strategy's hand-overs at once)."""
    import traceback
    where = [f"{f.filename.split('/engine/')[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()
             if "/engine/" in f.filename]
    key = f"{w!r} -> {cur!r}: " + " < ".join(where[-4:])
    with _ledger_lock:
        LEDGER["races"][key] = LEDGER["races"].get(key, 0) + 1


def _unwrap(x, allow_host=False):
    """numpy view of a device array; host arrays refused (CuPy does)."""
    if isinstance(x, ndarray):
        _use(x)
        return x._a
    if isinstance(x, np.ndarray):
        if x.ndim == 0 or allow_host:
            return x
        raise _unsupported(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, allow_host) for v in x)
    return x


def _wrap(r, outs=(), written=True):
    if isinstance(r, np.ndarray):
        for o in outs:
            if isinstance(o, ndarray) and r is o._a:
                return o
        out = ndarray._of(r)
        if written:
            _use(out, write=True)
        return out
    if isinstance(r, np.generic):     # CuPy reductions give 0-d device arrays, not scalars
        out = ndarray._of(np.asarray(r))
        _use(out, write=True)
        return out
    if isinstance(r, tuple):
        return tuple(_wrap(v, outs) for v in r)
    return r


def _call(fn, args, kwargs, this=None):
    """``fn`` on the numpy views; a result that is a view of an input is no
    device work (a new array or an ``out`` is written on the current stream)."""
    out = kwargs.get("out")
    outs = out if isinstance(out, tuple) else (out,)
    a = _unwrap(args)
    kw = {k: _unwrap(v) for k, v in kwargs.items()}
    r = fn(*a, **kw)
    for o in outs:
        if isinstance(o, ndarray):
            _use(o, write=True)
    if this is not None and isinstance(r, np.ndarray) and _root(r) is _root(this._a):
        return ndarray._of(r, this._dev)           # a view (reshape, ravel, T, ...)
    return _wrap(r, outs)


class ndarray:
    """A device array: a host buffer that refuses to be used as one."""
    __array_priority__ = 1000

    def __init__(self, shape, dtype=float):
        self._a = np.empty(shape, dtype)
        self._dev = current_device()
        LEDGER["devices_used"].add(self._dev)

    @classmethod
    def _of(cls, a, dev=None):
        self = object.__new__(cls)
        self._a = a
        self._dev = current_device() if dev is None else dev
        LEDGER["devices_used"].add(self._dev)
        return self

    # -- what numpy may not do with it --
    def __array__(self, *a, **k):
        raise TypeError(_IMPLICIT)

    @property
    def __cuda_array_interface__(self):
        # engine.checkpoint recognises device arrays by this attribute. mpi4py
        # reads it too: the mask makes it refuse the buffer (not CUDA-aware).
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self._a.ctypes.data, False),
                "version": 3, "strides": None, "mask": _NOT_FOR_MPI}

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _call(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        return _call(func, args, kwargs)

    def __reduce__(self):
        return (_rebuild, (self._a.copy(), self._dev))

    # -- host <-> device --
    def get(self, stream=None, order="C", out=None):
        """A host copy, after the current stream's work (CuPy synchronises it)."""
        _note("d2h")
        _use(self)
        get_current_stream().synchronize()
        return np.array(self._a, order=order)

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr)}")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError("Shape mismatch")
        if not self._a.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        _note("h2d")
        _use(self, write=True)
        self._a[...] = arr

    @property
    def data(self):
        return _Mem(self._a.ctypes.data, self._dev)

    @property
    def device(self):
        return Device(self._dev)

    # -- the numpy-like surface --
    shape = property(lambda s: s._a.shape)
    dtype = property(lambda s: s._a.dtype)
    ndim = property(lambda s: s._a.ndim)
    size = property(lambda s: s._a.size)
    nbytes = property(lambda s: s._a.nbytes)
    itemsize = property(lambda s: s._a.itemsize)
    strides = property(lambda s: s._a.strides)
    flags = property(lambda s: s._a.flags)
    T = property(lambda s: ndarray._of(s._a.T, s._dev))

    _HOST_ONLY = frozenset({"ctypes", "tofile", "dump", "dumps", "tobytes", "__array_interface__",
                            "__array_struct__", "base"})

    def __getattr__(self, name):
        if name.startswith("__") or name in self._HOST_ONLY:
            raise AttributeError(name)
        v = getattr(self._a, name)
        if callable(v):
            def method(*args, **kwargs):
                r = _call(v, args, kwargs, this=self)
                _use(self, view=isinstance(r, ndarray) and _root(r._a) is _root(self._a))
                return r
            return method
        return _wrap(v)

    def fill(self, value):
        if isinstance(value, np.ndarray):
            if value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.item()
        _use(self, write=True)
        self._a.fill(_unwrap(value))

    def copy(self, order="C"):
        _use(self)
        return _wrap(self._a.copy(order=order))

    def __getitem__(self, key):
        key = _unwrap(key, allow_host=True)
        r = self._a[key]
        if isinstance(r, np.generic):       # CuPy: a 0-d view
            r = self._a[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]
        view = _root(r) is _root(self._a)
        _use(self, view=view)
        return ndarray._of(r, self._dev) if view else _wrap(r)

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and value.shape != ():
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        _use(self, write=True)
        self._a[_unwrap(key, allow_host=True)] = _unwrap(value)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _scalar(self):
        if self.size != 1:
            raise TypeError("only size-1 arrays can be converted to Python scalars")
        return self.get().reshape(()).item()

    def __float__(self):
        return float(self._scalar())

    def __int__(self):
        return int(self._scalar())

    def __bool__(self):
        return bool(self._scalar())

    def __index__(self):
        if self.dtype.kind not in "iu":
            raise TypeError("only integer arrays can be used as an index")
        return int(self._scalar())

    def __format__(self, spec):
        return format(self._scalar() if self.size == 1 else str(self), spec)

    def __repr__(self):
        return f"emulated_device_array({self._a!r}, device={self._dev})"

    __str__ = __repr__
    __hash__ = None


def _binop(ufunc, reflected=False, inplace=False):
    def op(self, other):
        if inplace:
            return _call(ufunc, (self, other), {"out": self})
        return _call(ufunc, (other, self) if reflected else (self, other), {})
    return op


for _name, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power),
                   ("matmul", np.matmul), ("and", np.bitwise_and), ("or", np.bitwise_or),
                   ("xor", np.bitwise_xor)):
    setattr(ndarray, f"__{_name}__", _binop(_uf))
    setattr(ndarray, f"__r{_name}__", _binop(_uf, reflected=True))
    setattr(ndarray, f"__i{_name}__", _binop(_uf, inplace=True))
for _name, _uf in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)):
    setattr(ndarray, f"__{_name}__", _binop(_uf))
for _name, _uf in (("neg", np.negative), ("pos", np.positive), ("abs", np.absolute), ("invert", np.invert)):
    setattr(ndarray, f"__{_name}__", lambda self, _u=_uf: _call(_u, (self,), {}))
ndarray.__module__ = "cupy"


def _rebuild(a, dev):
    return ndarray._of(a, dev)


# ---- the module's functions ----------------------------------------------------------
def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray):
        _use(a, view=True)
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    if isinstance(a, np.ndarray):
        _note("h2d")
    return _wrap(np.array(a, dtype=dtype, order=order or "K", copy=True))


def array(a, dtype=None, copy=True, order="K"):
    if isinstance(a, ndarray) and not copy:
        return asarray(a, dtype)
    if isinstance(a, ndarray):
        _use(a)
        return _wrap(np.array(a._a, dtype=dtype, order=order))
    return asarray(a, dtype)


def asnumpy(a, stream=None, order="C", out=None):
    if isinstance(a, ndarray):
        return a.get(order=order)
    return np.asarray(a, order=order)


def get_array_module(*args):
    return sys.modules["cupy"] if any(isinstance(a, ndarray) for a in args) else np


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
    atexit.register(_write_ledger)
    return cp
