"""``t_c`` measured on this machine, as OptCNN does it: every (layer,
configuration) block is run forward and backward a few times at its
sub-shape and the median kept, instead of pricing its kernels from the
fitted profile.

Why: the profile's kernel fits age with the kernels and price a layer by
its kernels alone (on 30 Nov the shipped profiles priced the one-device
cifar step at 307 and 317 ms where it took 394-593 ms after the CPU
convolution became an implicit GEMM), while a block's own timing is what
the executor will spend on it. Transfers and allreduces keep
the profile's MPI fits. A block is timed the way engine.parallel.layerwise
runs it: a convolution on its rows and columns plus the kernel's halo with
no padding of its own, an FC layer on its output features, the softmax on
its samples. Blocks with the same sub-shape are timed once.

A block timed alone, again and again, runs on warm caches; inside a step
the same kernels run slower. As the profile's ``kernel_factor`` does for its
kernel sweeps, every block time is scaled by one factor per net and batch:
a whole one-device step (``Net.loss_and_grad`` + the SGD update) over the
sum of the one-device blocks. The one-device plan is then the calibration
point; every split plan is a prediction.

    prof = MeasuredCompute(Profile.load(), "cifar")     # then any cost function
    L.evaluate("cifar", plan.layers, 2, 32, prof)
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np


class MeasuredCompute:
    """A profile whose ``layer_time`` (read by engine.perf.layerwise.t_compute)
    is measured; every other attribute is the wrapped profile's."""

    def __init__(self, profile, spec, reps: int = 5, dtype=np.float32):
        from engine import spec as spec_mod
        self._profile = profile
        self.spec = spec_mod.get_spec(spec)
        self.reps, self.dtype = int(reps), np.dtype(dtype)
        self.source = f"{profile.source} + measured t_c"
        self.cache, self.factors = {}, {}

    def __getattr__(self, name):
        return getattr(self._profile, name)

    def layer_time(self, node, cfg, batch) -> float:
        return self.block_time(node, cfg, batch) * self.step_factor(batch)

    def block_time(self, node, cfg, batch) -> float:
        """Median seconds of one block's forward + backward, timed alone."""
        n, c, h, w = cfg
        key = (node.name, batch // n, c, h, w)
        if key not in self.cache:
            self.cache[key] = self._time(node, batch // n, c, h, w)
        return self.cache[key]

    def step_factor(self, batch) -> float:
        """A one-device step of ``batch`` over the sum of its blocks timed alone."""
        if batch not in self.factors:
            from engine.net import Net
            from engine.optim import SGD
            from .layerwise import graph_nodes
            net = Net(self.spec, seed=0, dtype=self.dtype)
            opt = SGD(net, lr=1e-9)
            rng = np.random.default_rng(1)
            x = rng.standard_normal((batch,) + tuple(self.spec.input_shape)).astype(self.dtype)
            y = rng.integers(0, self.spec.n_classes, batch)
            step = self._median(lambda: (net.loss_and_grad(x, y), opt.step()))
            blocks = sum(self.block_time(v, (1, 1, 1, 1), batch) for v in graph_nodes(self.spec))
            self.factors[batch] = step / blocks
        return self.factors[batch]

    def _time(self, node, b, c, h, w) -> float:
        from engine import layers as _layers
        from engine import ops
        rng = np.random.default_rng(0)
        rand = lambda *s: rng.standard_normal(s).astype(self.dtype)
        if node.kind == "softmax":
            logits, y = rand(b, node.out[0]), rng.integers(0, node.out[0], b)
            return self._median(lambda: ops.softmax_xent(logits, y))
        g = node.geom
        m = g.w_shape[0] // c
        wt, bias = rand(m, *g.w_shape[1:]), rand(m)
        gw, gb = np.empty_like(wt), np.empty_like(bias)
        sub = dataclasses.replace(g, w_shape=(m,) + tuple(g.w_shape[1:]), b_shape=(m,))
        lay = _layers.build([sub], ops)[0]
        if node.kind == "conv":
            halo = g.w_shape[2] - 1
            x = rand(b, g.w_shape[1], node.out[1] // h * g.pool + halo, node.out[2] // w * g.pool + halo)
            lay.pad = 0                              # the halo rows stand for the padding, as in the executor
        else:
            x = rand(b, g.w_shape[1])

        def fwd_bwd():
            y = lay.forward(x, wt, bias, True)
            lay.backward(np.ones_like(y), gw, gb, need_dx=not node.first)
        return self._median(fwd_bwd)

    def _median(self, f) -> float:
        f()                                          # warm caches and workspaces
        ts = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))
