"""Argument validation shared by every op: each failure raises TypeError
(wrong type/dtype) or ValueError (wrong rank/shape/layout/value) whose message
starts with the argument's name."""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from engine.backend import get_backend


def _xp():
    return get_backend().xp


def _dtype_names(dtypes) -> str:
    return " or ".join(str(np.dtype(d)) for d in dtypes)


def check_array(name: str, a: Any, ndim: int | Sequence[int] | None = None,
                dtype: Any = np.float32, contiguous: bool = True,
                shape: Sequence[int | None] | None = None, writable: bool = False,
                nonempty: bool = False, xp=None):
    """Validate an array argument of the current backend and return it.

    dtype: a dtype, a tuple of allowed dtypes, or None (any). shape: expected
    shape, None entries are wildcards (implies ndim). nonempty: no zero dims.
    """
    xp = xp or _xp()
    if not isinstance(a, xp.ndarray):
        raise TypeError(f"{name} must be a {xp.__name__}.ndarray, got {type(a).__module__}.{type(a).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
        if a.dtype not in [np.dtype(d) for d in allowed]:
            raise TypeError(f"{name} must have dtype {_dtype_names(allowed)}, got {a.dtype}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None:
        dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if a.ndim not in dims:
            want = " or ".join(f"{d}-D" for d in dims)
            raise ValueError(f"{name} must be {want}, got shape {tuple(a.shape)}")
    if shape is not None and any(s is not None and s != d for s, d in zip(shape, a.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{name} must have shape {want}, got {tuple(a.shape)}")
    if nonempty and a.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(a.shape)}")
    if contiguous and not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use ascontiguousarray)")
    if writable and hasattr(a.flags, "writeable") and not a.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    return a


def out_array(name: str, out: Any, shape: Sequence[int], dtype: Any = np.float32, xp=None):
    """The output buffer: a new array if out is None, else out validated
    (exact shape and dtype, C-contiguous, writeable)."""
    xp = xp or _xp()
    shape = tuple(int(s) for s in shape)
    if out is None:
        return xp.empty(shape, dtype=dtype)
    return check_array(name, out, shape=shape, dtype=dtype, writable=True, xp=xp)


def check_int(name: str, v: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (Python or NumPy, not bool) within [minimum, maximum]."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
    v = int(v)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {v}")
    return v


def check_positive_int(name: str, v: Any, maximum: int | None = None) -> int:
    return check_int(name, v, 1, maximum)


def check_nonneg_int(name: str, v: Any, maximum: int | None = None) -> int:
    return check_int(name, v, 0, maximum)


def check_pair(name: str, v: Any, minimum: int = 0, maximum: int | None = None) -> tuple[int, int]:
    """An int or a pair of ints (e.g. stride, pad) as a 2-tuple."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
        return (check_int(name, v[0], minimum, maximum), check_int(name, v[1], minimum, maximum))
    x = check_int(name, v, minimum, maximum)
    return (x, x)


def check_float(name: str, v: Any, finite: bool = True, minimum: float | None = None) -> float:
    """A real scalar (Python or NumPy, not bool)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}")
    v = float(v)
    if finite and not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def check_bool(name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return bool(v)


def check_no_alias(name_a: str, a: Any, name_b: str, b: Any) -> None:
    """Refuse two arrays that share memory (an output aliasing an input)."""
    if a is None or b is None:
        return
    xp = _xp()
    may_share = getattr(xp, "may_share_memory", None) or np.may_share_memory
    if may_share(a, b):
        raise ValueError(f"{name_a} and {name_b} must not overlap")


def _data_ptr(a) -> int:
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)  # cupy
    return int(ptr) if ptr is not None else int(a.__array_interface__["data"][0])


def check_same_or_disjoint(name_a: str, a: Any, name_b: str, b: Any) -> None:
    """Allow b to be the very buffer of a (an in-place op), refuse any other
    overlap (a shifted view would read values already written)."""
    if a is b or (a.shape == b.shape and a.strides == b.strides and _data_ptr(a) == _data_ptr(b)):
        return
    check_no_alias(name_a, a, name_b, b)
