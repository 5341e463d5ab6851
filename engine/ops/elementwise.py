"""ReLU forward/backward and the fused per-channel bias-add + ReLU
(kernels/elementwise.cu, CPU twin csrc/elementwise.cpp)."""
from __future__ import annotations

from engine.backend import get_backend
from engine.ops._check import (check_array, check_bool, check_no_alias, check_same_or_disjoint,
                               out_array)

__all__ = ["relu_forward", "relu_backward", "bias_act"]


def relu_forward(x, out=None):
    """out = max(x, 0) for a float32 array of any shape; out may be x (in place).
    NaN propagates (so a diverging run stays visible)."""
    be = get_backend()
    check_array("x", x)
    out = out_array("out", out, x.shape)
    check_same_or_disjoint("x", x, "out", out)
    if be.kernels == "cpp":
        be.ext.relu_forward(x, out)
    elif be.kernels == "compiled":
        be.ext.relu_forward(be.ptr(x), be.ptr(out), x.size, stream=be.stream_ptr())
    elif x.size:
        be.raw_launch("sprint_relu_fwd_f32", (x, out, x.size), n=x.size)
    return out


def relu_backward(y, dy, out=None):
    """dx = dy where y > 0 else 0; y is the forward output. out may be dy."""
    be = get_backend()
    check_array("y", y)
    check_array("dy", dy, shape=y.shape)
    out = out_array("out", out, y.shape)
    check_same_or_disjoint("dy", dy, "out", out)
    check_same_or_disjoint("y", y, "out", out)
    if be.kernels == "cpp":
        be.ext.relu_backward(y, dy, out)
    elif be.kernels == "compiled":
        be.ext.relu_backward(be.ptr(y), be.ptr(dy), be.ptr(out), y.size, stream=be.stream_ptr())
    elif y.size:
        be.raw_launch("sprint_relu_bwd_f32", (y, dy, out, y.size), n=y.size)
    return out


def bias_act(x, b, relu=True, out=None):
    """out = x + b[c] over channel axis 1 of x (N, C, ...), then ReLU if relu;
    out may be x. The bias + ReLU after an FC or convolution GEMM in one pass."""
    be = get_backend()
    check_array("x", x)
    if x.ndim < 2:
        raise ValueError(f"x must be at least 2-D (N, C, ...), got shape {tuple(x.shape)}")
    check_array("b", b, shape=(x.shape[1],))
    relu = check_bool("relu", relu)
    out = out_array("out", out, x.shape)
    check_same_or_disjoint("x", x, "out", out)
    check_no_alias("b", b, "out", out)
    if be.kernels == "cpp":
        be.ext.bias_act(x, b, out, relu)
        return out
    if x.size == 0:
        return out
    outer, channels = x.shape[0], x.shape[1]
    inner = x.size // (outer * channels)
    if be.kernels == "compiled":
        be.ext.bias_act(be.ptr(x), be.ptr(b), be.ptr(out), outer, channels, inner, relu,
                        stream=be.stream_ptr())
    else:
        be.raw_launch("sprint_bias_act_f32", (x, b, out, x.size, channels, inner, relu), n=x.size)
    return out
