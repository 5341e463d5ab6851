"""Pipeline stages: a contiguous range of a network's layers with its own
slice of the flat parameter and gradient vectors.

The flat layout of :func:`engine.spec.param_layout` is layer-ordered, so the
parameters of layers ``[lo, hi)`` are one contiguous slice ``[p_lo, p_hi)``
of the whole network's vector: a stage's optimizer, checkpoint part and
gradient allreduce among replicas see one flat vector, as everywhere else in
the engine, and the concatenation of all stages' vectors *is* the network's.

A stage runs several micro-batches at once (a pipeline keeps up to K of them
in flight), while a layer object keeps the cache of one forward only. Layers
own no parameters and cost nothing to build, so each forward builds fresh
layer objects and returns them in its context; the backward of that
micro-batch uses them. The forward reads its weights as views of the flat
vector it is given: the live parameters (the backward then sees whatever is
current when it runs) or a buffer of the micro-batch's own (a stashed or
predicted version, which the backward may refill in place before it runs).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine import layers as _layers
from engine import spec as _spec


def parse_partition(text: str, n_layers: int) -> list:
    """'0:2,2:3,3:4' -> [(0, 2), (2, 3), (3, 4)], checked to cover the
    layers in order without gaps; each stage holds at least one layer."""
    try:
        parts = [tuple(int(v) for v in p.split(":")) for p in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--partition must look like 0:2,2:4 (got {text!r})") from None
    if any(len(p) != 2 for p in parts):
        raise ValueError(f"--partition must look like 0:2,2:4 (got {text!r})")
    check_partition(parts, n_layers)
    return parts


def check_partition(parts, n_layers: int) -> None:
    expect = 0
    for lo, hi in parts:
        if lo != expect or hi <= lo:
            raise ValueError(f"--partition {format_partition(parts)} must be contiguous, non-empty "
                             f"layer ranges from 0 to {n_layers}")
        expect = hi
    if expect != n_layers:
        raise ValueError(f"--partition {format_partition(parts)} must end at layer {n_layers} "
                         f"(the network has {n_layers} layers)")


def stage_ranges(text, stages: int, n_layers: int, net: str):
    """The one check of --stages and --partition (sprint train, predict,
    simulate and info): K = ``stages`` no more than the net's ``n_layers``,
    and the ranges of --partition ``text`` (None when not given) K of them."""
    from engine.errors import RunError
    # each error names its option at the end, as every other option's does
    if not 1 <= stages <= n_layers:
        raise RunError(f"--stages must be between 1 and the {n_layers} layers of {net}, got {stages}", "--stages")
    if not text:
        return None
    parts = parse_partition(text, n_layers)
    if len(parts) != stages:
        raise RunError(f"--partition {text} has {len(parts)} stages, --stages says {stages}", "--partition")
    return parts


def format_partition(parts) -> str:
    return ",".join(f"{lo}:{hi}" for lo, hi in parts)


def even_partition(n_layers: int, k: int) -> list:
    """K contiguous ranges of near-equal layer counts (the fallback when no
    cost is known)."""
    if not 1 <= k <= n_layers:
        raise ValueError(f"--stages must be between 1 and the number of layers ({n_layers}), got {k}")
    bounds = [round(i * n_layers / k) for i in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def param_bounds(spec, lo: int, hi: int):
    """[p_lo, p_hi) of layers [lo, hi) in the flat vector."""
    geoms = _spec.layers(spec)
    start = sum(g.n_params for g in geoms[:lo])
    return start, start + sum(g.n_params for g in geoms[lo:hi])


@dataclass
class Context:
    """What a forward leaves for its backward."""
    layers: list
    weights: object      # the flat vector the forward's layer views point into
    n: int


class Stage:
    """Layers ``[lo, hi)`` of ``spec`` on this process."""

    def __init__(self, spec, lo: int, hi: int, seed: int = 0, dtype=np.float32, ops=None):
        from engine import backend
        from engine.net import init_params
        self.spec = _spec.get_spec(spec)
        all_geoms = _spec.layers(self.spec)
        if not 0 <= lo < hi <= len(all_geoms):
            raise ValueError(f"stage layers {lo}:{hi} out of range 0:{len(all_geoms)}")
        self.lo, self.hi = lo, hi
        self.geoms = all_geoms[lo:hi]
        self.first, self.last = lo == 0, hi == len(all_geoms)
        if ops is None:
            from engine import ops
        self.ops = ops
        self.xp = backend.get_backend().xp
        self.dtype = np.dtype(dtype)
        self.p_lo, self.p_hi = param_bounds(self.spec, lo, hi)
        self.n_params = self.p_hi - self.p_lo
        # the whole net's init, sliced: stage k of any partition starts from
        # exactly the weights the single-process Net(seed) has there
        full = init_params(self.spec, seed)
        self.params = self.xp.asarray(full[self.p_lo:self.p_hi].astype(self.dtype))
        self.grads = self.xp.zeros(self.n_params, self.dtype)
        self.grad_views = self.views(self.grads)
        self.in_shape = tuple(self.geoms[0].in_shape)
        self.out_shape = tuple(self.geoms[-1].out_shape)

    def views(self, flat) -> dict:
        out, off = {}, 0
        for g in self.geoms:
            for part, shape in (("W", g.w_shape), ("b", g.b_shape)):
                size = int(np.prod(shape))
                out[(g.name, part)] = flat[off:off + size].reshape(shape)
                off += size
        return out

    def names(self) -> list:
        return [g.name for g in self.geoms]

    def forward(self, x, weights=None, train=True):
        """(output, Context) of the stage on ``x`` with ``weights`` (a flat
        vector of this stage's size; default the live parameters)."""
        w = self.params if weights is None else weights
        views = self.views(w)
        h = self.xp.ascontiguousarray(self.xp.asarray(x, dtype=self.dtype))
        if tuple(h.shape[1:]) != self.in_shape:
            raise ValueError(f"stage {self.lo}:{self.hi}: input must have shape (N, "
                             f"{', '.join(map(str, self.in_shape))}), got {tuple(h.shape)}")
        layers = _layers.build(self.geoms, self.ops)
        for layer in layers:
            h = layer.forward(h, views[(layer.name, "W")], views[(layer.name, "b")], train)
        return h, Context(layers, w, int(x.shape[0]))

    def backward(self, ctx: Context, dy, accumulate=False):
        """Fill ``grads`` with this stage's gradient (accumulate: add it,
        continuing the sums, so consecutive micro-batches give the whole
        batch's gradient bit for bit); return d(loss)/d(input) (None on the
        first stage)."""
        d = self.xp.ascontiguousarray(self.xp.asarray(dy, dtype=self.dtype))
        acc = {"accumulate": True} if accumulate else {}
        for i in range(len(ctx.layers) - 1, -1, -1):
            layer = ctx.layers[i]
            d = layer.backward(d, self.grad_views[(layer.name, "W")], self.grad_views[(layer.name, "b")],
                               need_dx=i > 0 or not self.first, **acc)
        return d

    def loss_grad(self, logits, y, batch=None):
        """(mean loss, n correct, dlogits) on the last stage: dlogits of the
        mean loss over ``batch`` samples (default: these), i.e. (probs -
        onehot) / batch, rounded as one process's whole batch rounds it."""
        y = self.xp.asarray(y)
        kw = {} if batch is None else {"grad_scale": 1.0 / batch}
        loss, dlogits, _ = self.ops.softmax_xent(logits, y, **kw)
        return float(loss), int((logits.argmax(axis=1) == y).sum()), dlogits

    def describe(self) -> str:
        return f"layers {self.lo}:{self.hi} ({', '.join(self.names())}), {self.n_params:,} params"
