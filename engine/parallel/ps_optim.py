"""The update rules a parameter server applies to its shard (engine.parallel.ps):
momentum SGD, and Adagrad's per-parameter learning rates as in DistBelief
(--server-opt)."""
from __future__ import annotations

import numpy as np


class ShardSGD:
    """v = mu v - lr (g + k wd w); w += v, where g is the sum of k replica
    gradients (a push of k accumulated steps decays the weights k times): with
    k = 1 exactly the engine's single-process SGD step."""
    kind = "sgd"

    def __init__(self, n, momentum=0.9, weight_decay=0.0):
        self.momentum, self.weight_decay = float(momentum), float(weight_decay)
        self.v = np.zeros(n, np.float32)

    def apply(self, w, g, lr, k=1):
        g = g + (k * self.weight_decay) * w if self.weight_decay else g
        self.v *= np.float32(self.momentum)
        self.v -= np.float32(lr) * g
        w += self.v

    def state(self):
        return {"velocity": self.v}

    def load(self, st):
        self.v[...] = st["velocity"]


class ShardAdagrad:
    """DistBelief's per-parameter learning rates: h += g^2; w -= lr g / sqrt(h)
    (g with k * wd * w folded in), h starting at ``init`` so that the first
    steps are not lr-sized in every coordinate."""
    kind = "adagrad"

    def __init__(self, n, weight_decay=0.0, init=0.1, eps=1e-10):
        self.weight_decay, self.eps = float(weight_decay), float(eps)
        self.h = np.full(n, init, np.float32)

    def apply(self, w, g, lr, k=1):
        g = g + (k * self.weight_decay) * w if self.weight_decay else g
        self.h += g * g
        w -= np.float32(lr) * g / (np.sqrt(self.h) + np.float32(self.eps))

    def state(self):
        return {"accumulator": self.h}

    def load(self, st):
        self.h[...] = st["accumulator"]


SERVER_OPTS = {"sgd": ShardSGD, "adagrad": ShardAdagrad}


def make_server_opt(kind, n, momentum=0.9, weight_decay=0.0):
    if kind == "sgd":
        return ShardSGD(n, momentum, weight_decay)
    if kind == "adagrad":
        return ShardAdagrad(n, weight_decay)
    raise ValueError(f"server optimizer must be one of {sorted(SERVER_OPTS)}, got {kind!r} (--server-opt)")
