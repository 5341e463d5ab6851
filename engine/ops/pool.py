"""Max pooling, any window / stride / padding, with the argmax kept for the
backward pass (kernels/pool.cu, CPU twin csrc/pool.cpp).

argmax is int32: the flat index h*W + w of the chosen pixel inside its (n, c)
plane. The first maximum in row-major window order wins; NaN propagates.
Backward is a gather (each input pixel sums dy over the windows that chose it,
in a fixed order): deterministic, no atomics. Padding must be smaller than the
window, so every window holds at least one real pixel."""
from __future__ import annotations

import numpy as np

from engine.backend import get_backend
from engine.ops._check import check_array, check_int, check_no_alias, check_pair, out_array

__all__ = ["maxpool_forward", "maxpool_backward", "pool_out_shape"]

_MAX_PARAM = 1 << 24  # as csrc/pool.h


def _window(x_shape, k, stride, pad):
    """(kh, kw, sh, sw, ph, pw, OH, OW) for an (N, C, H, W) input, validated."""
    kh, kw = check_pair("k", k, 1, _MAX_PARAM)
    sh, sw = check_pair("stride", k if stride is None else stride, 1, _MAX_PARAM)
    ph, pw = check_pair("pad", pad, 0, _MAX_PARAM)
    H, W = x_shape[2], x_shape[3]
    if ph >= kh or pw >= kw:
        raise ValueError(f"pad must be smaller than the window k: pad=({ph}, {pw}), k=({kh}, {kw})")
    if H < 1 or W < 1:
        raise ValueError(f"x must have H, W >= 1, got shape {tuple(x_shape)}")
    if kh > H + 2 * ph or kw > W + 2 * pw:
        raise ValueError(f"k=({kh}, {kw}) is larger than the padded input "
                         f"({H}+2*{ph}, {W}+2*{pw})")
    if (H + ph) * (W + pw) > np.iinfo(np.int32).max:
        raise ValueError(f"x plane {H}x{W} is too large for int32 argmax indices")
    return kh, kw, sh, sw, ph, pw, (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1


def pool_out_shape(x_shape, k, stride=None, pad=0):
    """Output shape (N, C, OH, OW) of maxpool_forward on an input of x_shape."""
    x_shape = _shape4("x_shape", x_shape)
    g = _window(x_shape, k, stride, pad)
    return (x_shape[0], x_shape[1], g[6], g[7])


def _shape4(name, s):
    if not isinstance(s, (tuple, list)) or len(s) != 4:
        raise ValueError(f"{name} must be a 4-tuple (N, C, H, W), got {s!r}")
    return tuple(check_int(name, v, 0) for v in s)


def maxpool_forward(x, k, stride=None, pad=0, out=None, argmax_out=None):
    """y, argmax (N, C, OH, OW) <- max pooling of x (N, C, H, W) float32;
    stride defaults to k; k, stride, pad are ints or (h, w) pairs."""
    be = get_backend()
    check_array("x", x, ndim=4)
    kh, kw, sh, sw, ph, pw, OH, OW = _window(x.shape, k, stride, pad)
    N, C, H, W = x.shape
    y = out_array("out", out, (N, C, OH, OW))
    am = out_array("argmax_out", argmax_out, (N, C, OH, OW), dtype=np.int32)
    check_no_alias("x", x, "out", y)
    check_no_alias("x", x, "argmax_out", am)
    check_no_alias("out", y, "argmax_out", am)
    if be.kernels == "cpp":
        be.ext.maxpool_forward(x, y, am, kh, kw, sh, sw, ph, pw)
    elif be.kernels == "compiled":
        be.ext.maxpool_forward(be.ptr(x), be.ptr(y), be.ptr(am), N, C, H, W, kh, kw, sh, sw, ph, pw,
                               stream=be.stream_ptr())
    elif y.size:
        be.raw_launch("sprint_maxpool_fwd_f32",
                      (x, y, am, N * C, H, W, OH, OW, kh, kw, sh, sw, ph, pw), n=y.size)
    return y, am


def maxpool_backward(dy, argmax, x_shape, k, stride=None, pad=0, out=None):
    """dx (x_shape) <- dy routed to the argmax of each window (summed where
    windows overlap). argmax entries outside their window contribute nothing."""
    be = get_backend()
    x_shape = _shape4("x_shape", x_shape)
    kh, kw, sh, sw, ph, pw, OH, OW = _window(x_shape, k, stride, pad)
    N, C, H, W = x_shape
    check_array("dy", dy, shape=(N, C, OH, OW))
    check_array("argmax", argmax, shape=(N, C, OH, OW), dtype=np.int32)
    dx = out_array("out", out, x_shape)
    check_no_alias("dy", dy, "out", dx)
    check_no_alias("argmax", argmax, "out", dx)
    if be.kernels == "cpp":
        be.ext.maxpool_backward(dy, argmax, dx, kh, kw, sh, sw, ph, pw)
    elif be.kernels == "compiled":
        be.ext.maxpool_backward(be.ptr(dy), be.ptr(argmax), be.ptr(dx), N, C, H, W, kh, kw, sh, sw,
                                ph, pw, stream=be.stream_ptr())
    elif dx.size:
        be.raw_launch("sprint_maxpool_bwd_f32",
                      (dy, argmax, dx, N * C, H, W, OH, OW, kh, kw, sh, sw, ph, pw), n=dx.size)
    return dx
