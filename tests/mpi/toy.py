"""Softmax regression in numpy: a tiny worker source for the parallel tests."""
from __future__ import annotations

import numpy as np

from engine.parallel.source import Step


def make_data(n=512, d=6, k=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(k, d))
    y = rng.integers(0, k, size=n)
    x = (centers[y] + rng.normal(0, 1, size=(n, d))).astype(np.float32)
    return x, y.astype(np.int64), k


def n_params(d, k):
    return k * d + k


def init_weights(d, k, seed=1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 0.1, size=n_params(d, k))).astype(dtype)


def softmax_grad(w, x, y, k):
    """Mean cross-entropy gradient of softmax regression, in the dtype of w."""
    d = x.shape[1]
    x = x.astype(w.dtype, copy=False)
    W = w[:k * d].reshape(k, d)
    b = w[k * d:]
    z = x @ W.T + b
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
    correct = int((p.argmax(axis=1) == y).sum())
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    g = np.concatenate([(p.T @ x).ravel(), p.sum(axis=0)]).astype(w.dtype)
    return g, loss, correct


class SoftmaxSource:
    """Worker source: walks its shard of (x, y) in order, batch at a time.

    ``shard=(i, m)`` takes samples i, i+m, i+2m, ... ; ``record`` keeps, per
    gradient, the tag, the weights it was computed on and the gradient."""

    def __init__(self, x, y, k, batch, shard=(0, 1), tag_prefix=(), record=False, delay=0.0,
                 dtype=np.float32):
        self.x, self.y, self.k = x[shard[0]::shard[1]], y[shard[0]::shard[1]], k
        self.batch = batch
        self.pos = 0
        self.count = 0
        self.weights = np.zeros(n_params(x.shape[1], k), dtype)
        self.tag_prefix = tuple(tag_prefix)
        self.record = {} if record else None
        self.delay = delay

    def load(self):
        n = len(self.y)
        idx = (self.pos + np.arange(self.batch)) % n
        self.pos = (self.pos + self.batch) % n
        return self.x[idx], self.y[idx]

    def deform(self, batch):
        return batch

    def compute(self, batch):
        if self.delay:
            import time
            time.sleep(self.delay)
        g, loss, correct = softmax_grad(self.weights, batch[0], batch[1], self.k)
        tag = self.tag_prefix + (self.count,)
        self.count += 1
        if self.record is not None:
            self.record[tag] = (self.weights.copy(), g.copy())
        return Step(grad=g, n=len(batch[1]), loss=loss, correct=correct, tag=tag)
