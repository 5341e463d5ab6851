"""Vector ops on flat float32 buffers, in place: the optimizer's update and
SPRINT's updater (SumGradient, AddMomentum, UpdateWeights) on the flat
parameter vector (kernels/vector.cu, CPU twin csrc/vector.cpp). Every buffer
is 1-D float32 C-contiguous, all of the same length; scalars must be finite.
Each op returns the buffer it updated.

On the CPU the arrays are validated by the C++ binding itself (same rules,
errors naming the argument): these ops run on every update of SPRINT's
updater, and the Python checks would cost 4x the kernel on small vectors."""
from __future__ import annotations

import numpy as np

from engine.backend import get_backend
from engine.ops._check import check_array, check_float, check_no_alias

__all__ = ["axpy", "scale", "sum_into", "momentum_step", "sgd_update"]

# The CUDA kernel sums up to this many buffers per pass (kernels/vector.cu).
_SUM_PER_PASS = 8
_F32_MAX = float(np.finfo(np.float32).max)


def _scalar(name, v):
    v = check_float(name, v)
    if abs(v) > _F32_MAX:
        raise ValueError(f"{name} must fit in float32, got {v}")
    return v


def _flat(name, a, n=None, writable=False):
    check_array(name, a, ndim=1, writable=writable)
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} must have length {n} (like the first buffer), got {a.shape[0]}")
    return a


def _disjoint(*named):
    for i, (na, a) in enumerate(named):
        for nb, b in named[i + 1:]:
            check_no_alias(na, a, nb, b)


def axpy(alpha, x, y):
    """y += alpha * x."""
    be = get_backend()
    alpha = _scalar("alpha", alpha)
    if be.kernels == "cpp":
        be.ext.axpy(alpha, x, y)
        return y
    n = _flat("x", x).shape[0]
    _flat("y", y, n, writable=True)
    _disjoint(("x", x), ("y", y))
    if be.kernels == "compiled":
        be.ext.axpy(alpha, be.ptr(x), be.ptr(y), n, stream=be.stream_ptr())
    elif n:
        be.raw_launch("sprint_axpy_f32", (y, x, alpha, n), n=n)
    return y


def scale(alpha, x):
    """x *= alpha."""
    be = get_backend()
    alpha = _scalar("alpha", alpha)
    if be.kernels == "cpp":
        be.ext.scale(alpha, x)
        return x
    n = _flat("x", x, writable=True).shape[0]
    if be.kernels == "compiled":
        be.ext.scale(alpha, be.ptr(x), n, stream=be.stream_ptr())
    elif n:
        be.raw_launch("sprint_scale_f32", (x, alpha, n), n=n)
    return x


def sum_into(out, bufs):
    """out = bufs[0] + bufs[1] + ..., summed left to right (deterministic).
    out may be bufs[0] itself (accumulate in place); no other overlap."""
    be = get_backend()
    if not isinstance(bufs, (list, tuple)):
        raise TypeError(f"bufs must be a list or tuple of arrays, got {type(bufs).__name__}")
    if be.kernels == "cpp":
        be.ext.sum_into(out, bufs)
        return out
    n = _flat("out", out, writable=True).shape[0]
    if not bufs:
        raise ValueError("bufs must hold at least one buffer")
    for i, b in enumerate(bufs):
        _flat(f"bufs[{i}]", b, n)
        if i > 0 or b is not out:
            check_no_alias("out", out, f"bufs[{i}]", b)
    if be.kernels == "compiled":
        be.ext.sum_into(be.ptr(out), [be.ptr(b) for b in bufs], n, stream=be.stream_ptr())
    elif n:
        _sum_into_raw(be, out, bufs, n)
    return out


def _sum_into_raw(be, out, bufs, n):
    # Same passes as csrc/launch_vector.cu: 8 buffers per pass, the running
    # sum carried into later passes as b0; unused slots repeat b0 (never read).
    first = 0
    while first < len(bufs):
        chunk = [out] if first else []
        take = _SUM_PER_PASS - len(chunk)
        chunk += bufs[first:first + take]
        first += take
        k = len(chunk)
        chunk += [chunk[0]] * (_SUM_PER_PASS - k)
        be.raw_launch("sprint_sum_into_f32", (out, *chunk, k, n), n=n)


def momentum_step(w, delta, upd, nu):
    """delta = nu * delta + upd; w += delta   (SPRINT's AddMomentum + UpdateWeights)."""
    be = get_backend()
    nu = _scalar("nu", nu)
    if be.kernels == "cpp":
        be.ext.momentum_step(w, delta, upd, nu)
        return w
    n = _flat("w", w, writable=True).shape[0]
    _flat("delta", delta, n, writable=True)
    _flat("upd", upd, n)
    _disjoint(("w", w), ("delta", delta), ("upd", upd))
    if be.kernels == "compiled":
        be.ext.momentum_step(be.ptr(w), be.ptr(delta), be.ptr(upd), nu, n, stream=be.stream_ptr())
    elif n:
        be.raw_launch("sprint_momentum_step_f32", (w, delta, upd, nu, n), n=n)
    return w


def sgd_update(w, v, g, lr, momentum, weight_decay):
    """v = momentum * v - lr * (g + weight_decay * w); w += v."""
    be = get_backend()
    lr = _scalar("lr", lr)
    momentum = _scalar("momentum", momentum)
    weight_decay = _scalar("weight_decay", weight_decay)
    if be.kernels == "cpp":
        be.ext.sgd_update(w, v, g, lr, momentum, weight_decay)
        return w
    n = _flat("w", w, writable=True).shape[0]
    _flat("v", v, n, writable=True)
    _flat("g", g, n)
    _disjoint(("w", w), ("v", v), ("g", g))
    if be.kernels == "compiled":
        be.ext.sgd_update(be.ptr(w), be.ptr(v), be.ptr(g), lr, momentum, weight_decay, n,
                          stream=be.stream_ptr())
    elif n:
        be.raw_launch("sprint_sgd_update_f32", (w, v, g, lr, momentum, weight_decay, n), n=n)
    return w
