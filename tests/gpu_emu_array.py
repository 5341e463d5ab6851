"""The emulated GPU's device array (tests/gpu_emu.py): ``ndarray``, a host
buffer that refuses to be used as one (implicit conversion to numpy, host
operands, MPI without CUDA-awareness), and the module functions that move
data between host and device (``asarray``, ``array``, ``asnumpy``). Every
use goes through gpu_emu_device's ledger, stream and device checks."""
from __future__ import annotations

import sys

import numpy as np

from gpu_emu_device import (LEDGER, Device, _note, _root, _settled, _use, cuda_aware_mpi, current_device,
                            get_current_stream)

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
        # engine.checkpoint recognises device arrays by this attribute and
        # mpi4py takes it for a CUDA buffer: refused by the mask unless MPI is
        # CUDA-aware ($SPRINT_EMU_CUDA_MPI=1), and then only once the stream
        # that wrote the buffer is synchronised (MPI waits for no stream)
        aware = cuda_aware_mpi()
        if aware:
            _settled(self)
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self._a.ctypes.data, False),
                "version": 3, "strides": None, "mask": None if aware else _NOT_FOR_MPI}

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


# ---- host <-> device ------------------------------------------------------------------
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
