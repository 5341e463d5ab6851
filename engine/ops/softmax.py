"""Softmax fused with cross-entropy and its gradient, row-wise
(kernels/softmax.cu, CPU twin csrc/softmax.cpp). The row max is subtracted
before exp, so logits of +-1e4 give finite results."""
from __future__ import annotations

import numpy as np

from engine.backend import get_backend
from engine.ops._check import check_array, check_float, check_no_alias, out_array

__all__ = ["softmax_xent"]


def _block(K: int) -> int:
    """Threads per row block; the rule of softmax_block() in csrc/softmax.h."""
    return 32 if K <= 32 else 64 if K <= 64 else 128 if K <= 128 else 256


def softmax_xent(logits, labels, dlogits_out=None, probs_out=None, grad_scale=None):
    """(loss, dlogits, probs) for logits (N, K) float32 and labels (N,) ints in 0..K-1:
    probs = softmax(logits), loss = mean over rows of -log probs[label] (a float),
    dlogits = (probs - onehot(labels)) * grad_scale, grad_scale = 1/N by default
    (the gradient of that mean); a micro-batch passes 1/(its mini-batch size)."""
    be = get_backend()
    xp = be.xp
    check_array("logits", logits, ndim=2, nonempty=True)
    N, K = logits.shape
    if not isinstance(labels, xp.ndarray):
        raise TypeError(f"labels must be a {xp.__name__}.ndarray, got {type(labels).__name__}")
    if labels.dtype.kind not in "iu":
        raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
    check_array("labels", labels, shape=(N,), dtype=None, contiguous=False)
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= K:
        bad = lo if lo < 0 else hi
        raise ValueError(f"labels must lie in 0..{K - 1} (the logits' classes), found {bad}")
    dlogits = out_array("dlogits_out", dlogits_out, (N, K))
    probs = out_array("probs_out", probs_out, (N, K))
    for name, a in (("dlogits_out", dlogits), ("probs_out", probs)):
        check_no_alias("logits", logits, name, a)
        check_no_alias("labels", labels, name, a)
    check_no_alias("dlogits_out", dlogits, "probs_out", probs)
    scale = np.float32(1.0 / N if grad_scale is None else check_float("grad_scale", grad_scale, minimum=0.0))
    if be.kernels == "cpp":
        if labels.dtype not in (np.int32, np.int64) or not labels.flags.c_contiguous:
            labels = np.ascontiguousarray(labels, dtype=np.int64)
        row_loss = be.workspace("softmax_row_loss", N)
        loss = be.ext.softmax_xent(logits, labels, probs, dlogits, row_loss, float(scale))
        return float(loss), dlogits, probs
    labels = xp.ascontiguousarray(labels, dtype=xp.int64)
    row_loss = xp.empty(N, dtype=xp.float32)
    if be.kernels == "compiled":
        be.ext.softmax_xent(be.ptr(logits), be.ptr(labels), be.ptr(probs), be.ptr(dlogits),
                            be.ptr(row_loss), N, K, stream=be.stream_ptr())
        if grad_scale is not None:  # the compiled kernel scales by 1/N itself
            dlogits *= np.float32(scale * N)
    else:
        be.raw_launch("sprint_softmax_xent_f32",
                      (logits, labels, probs, dlogits, row_loss, N, K, scale),
                      grid=min(N, 1 << 20), block=_block(K))
    return float(row_loss.sum(dtype=xp.float64)) / N, dlogits, probs
