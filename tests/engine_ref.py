"""Plain float64 NumPy reference ops with the engine.ops signatures, for the
engine tests (layer composition, whole-network finite differences).  Written
for clarity, not speed: direct loops over the kernel window."""
from __future__ import annotations

import types

import numpy as np


def _pad(x, p):
    return np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))


def conv2d_forward(x, w, b, stride=1, pad=0, workspace_bytes=None, relu=False):
    assert stride == 1
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = _pad(x, pad)
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    y = np.zeros((n, m, oh, ow), np.float64)
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    if b is not None:
        y += b[None, :, None, None]
    return np.maximum(y, 0) if relu else y


def conv2d_backward(x, w, dy, stride=1, pad=0, dw_out=None, db_out=None, need_dx=True,
                    workspace_bytes=None):
    m, c, kh, kw = w.shape
    xp = _pad(x, pad)
    oh, ow = dy.shape[2:]
    dw = np.zeros(w.shape)
    dxp = np.zeros(xp.shape)
    for i in range(kh):
        for j in range(kw):
            dw[:, :, i, j] = np.einsum("nmhw,nchw->mc", dy, xp[:, :, i:i + oh, j:j + ow])
            dxp[:, :, i:i + oh, j:j + ow] += np.einsum("nmhw,mc->nchw", dy, w[:, :, i, j])
    db = dy.sum(axis=(0, 2, 3))
    dw, db = _into(dw_out, dw), _into(db_out, db)
    h, wd = x.shape[2:]
    return (dxp[:, :, pad:pad + h, pad:pad + wd].copy() if need_dx else None), dw, db


def linear_forward(x, w, b):
    return x @ w.T + (0 if b is None else b)


def linear_backward(x, w, dy, dw_out=None, db_out=None, need_dx=True):
    return (dy @ w if need_dx else None), _into(dw_out, dy.T @ x), _into(db_out, dy.sum(0))


def _into(out, v):
    if out is None:
        return v
    out[...] = v
    return out


def relu_forward(x, out=None):
    return _into(out, np.maximum(x, 0))


def relu_backward(y, dy, out=None):
    return _into(out, np.where(y > 0, dy, 0))


def maxpool_forward(x, k, stride=None, pad=0):
    n, c, h, w = x.shape
    oh, ow = h // k, w // k
    y = np.full((n, c, oh, ow), -np.inf)
    arg = np.zeros((n, c, oh, ow), np.int64)
    for i in range(k):
        for j in range(k):
            v = x[:, :, i::k, j::k][:, :, :oh, :ow]
            better = v > y
            y = np.where(better, v, y)
            flat = (np.arange(oh)[:, None] * k + i) * w + (np.arange(ow)[None, :] * k + j)
            arg = np.where(better, flat, arg)
    return y, arg


def maxpool_backward(dy, argmax, x_shape, k, stride=None, pad=0):
    n, c, h, w = x_shape
    dx = np.zeros((n, c, h * w))
    for a in range(n):
        for b in range(c):
            np.add.at(dx[a, b], argmax[a, b].ravel(), dy[a, b].ravel())
    return dx.reshape(x_shape)


def softmax_xent(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    n = len(labels)
    loss = -np.log(p[np.arange(n), labels]).mean()
    d = p.copy()
    d[np.arange(n), labels] -= 1
    return float(loss), d / n, p


def sgd_update(w, v, g, lr, momentum, weight_decay):
    v *= momentum
    v -= lr * (g + weight_decay * w)
    w += v


ops = types.SimpleNamespace(**{k: v for k, v in globals().items()
                               if callable(v) and not k.startswith("_") and k != "types"})


def ops_accept_float64() -> bool:
    """Whether the engine's own ops run in float64 (they may be float32-only)."""
    from engine import ops as real
    try:
        x = np.zeros((1, 1, 3, 3))
        real.conv2d_forward(x, np.zeros((1, 1, 3, 3)), np.zeros(1), 1, 1)
        real.softmax_xent(np.zeros((1, 2)), np.zeros(1, np.int64))
        return True
    except (TypeError, ValueError):
        return False
