"""Fully connected layers, forward and backward (SPEC §2), on the engine's
SGEMM (engine/ops/gemm.py); db by the convolution's channel-sum kernel, so
micro-batches chain exactly as the convolution's do."""
from __future__ import annotations

from engine.backend import get_backend
from engine.ops._check import check_array, check_bool, check_no_alias, out_array
from engine.ops.conv import _k_channel_sum
from engine.ops.gemm import gemm


def _check_linear(x, w):
    check_array("x", x, ndim=2, nonempty=True)
    check_array("w", w, ndim=2, nonempty=True)
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w must have shape (out, {x.shape[1]}) to match x's {x.shape[1]} features, "
                         f"got {tuple(w.shape)}")


def linear_forward(x, w, b=None, out=None):
    """y (N,out) = x (N,in) @ w (out,in)^T + b (out,)."""
    _check_linear(x, w)
    if b is not None:
        check_array("b", b, shape=(w.shape[0],))
    y = out_array("out", out, (x.shape[0], w.shape[0]))
    gemm(x, w, trans_b=True, out=y)
    if b is not None:
        y += b
    return y


def linear_backward(x, w, dy, dw_out=None, db_out=None, need_dx=True, dx_out=None, accumulate=False):
    """Gradients of linear_forward: (dx or None, dw, db); outputs overwritten,
    or with accumulate dw and db added to dw_out/db_out (both required) by
    continuing their sums row by row, as conv2d_backward does."""
    be = get_backend()
    xp = be.xp
    _check_linear(x, w)
    need_dx = check_bool("need_dx", need_dx)
    accumulate = check_bool("accumulate", accumulate)
    if accumulate and (dw_out is None or db_out is None):
        raise ValueError("accumulate needs dw_out and db_out (the sums to add to)")
    check_array("dy", dy, shape=(x.shape[0], w.shape[0]))
    dw = out_array("dw_out", dw_out, w.shape)
    db = out_array("db_out", db_out, (w.shape[0],))
    for name, o in (("dw_out", dw), ("db_out", db)):
        for iname, i in (("x", x), ("w", w), ("dy", dy)):
            check_no_alias(name, o, iname, i)
    gemm(dy, x, trans_a=True, out=dw, beta=1.0 if accumulate else 0.0)
    if be.kernels == "cpp":  # row by row onto db, so micro-batches chain exactly
        _k_channel_sum(be, dy.reshape(dy.shape[0], dy.shape[1], 1), db, accumulate)
    elif accumulate:
        db += xp.sum(dy, axis=0)
    else:
        xp.sum(dy, axis=0, out=db)
    dx = None
    if need_dx:
        dx = out_array("dx_out", dx_out, x.shape)
        gemm(dy, w, out=dx)
    return dx, dw, db
