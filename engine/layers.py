"""Layers of the SPRINT CNN family as forward/backward pairs over engine.ops.

A layer owns no parameters: it reads W and b as views of the network's flat
parameter vector and its backward writes dW and db straight into views of the
flat gradient vector (the ``dw_out``/``db_out`` arguments of the ops), so
the optimizer, the ASGD buffers and the allreduce only ever see two vectors.
No arithmetic happens here -- every number is computed by an op.  ReLU runs
in place on buffers the layer owns; ``backward`` may overwrite its ``dy``.
"""
from __future__ import annotations


class Conv:
    """c x c conv (stride 1, side-keeping pad) -> ReLU -> max-pool p x p.

    The ReLU is fused into the convolution's write-back (the implicit GEMM
    applies it to each output tile while it is in cache). Its backward uses the
    pooled output: max-pool and ReLU commute (both monotone), so the mask
    y > 0 after pooling is the mask of the pooled elements.
    """

    kind = "conv"

    def __init__(self, geom, ops):
        self.geom = geom
        self.ops = ops
        self.name = geom.name
        self.pad = (geom.w_shape[2] - 1) // 2
        self.pool = geom.pool
        self._cache = None

    def forward(self, x, w, b, train=False):
        ops = self.ops
        y = ops.conv2d_forward(x, w, b, stride=1, pad=self.pad, relu=True)
        argmax = None
        if self.pool > 1:
            conv_shape = y.shape
            y, argmax = ops.maxpool_forward(y, self.pool)
        else:
            conv_shape = None
        self._cache = (x, w, y, argmax, conv_shape) if train else None
        return y

    def backward(self, dy, dw_out, db_out, need_dx=True, accumulate=False):
        """dx (or None); dw_out/db_out receive the gradients (accumulate: added
        to, continuing their sums -- see ops.conv2d_backward)."""
        if self._cache is None:
            raise RuntimeError(f"{self.name}: backward() needs a forward(train=True) first")
        x, w, y, argmax, conv_shape = self._cache
        ops = self.ops
        d = ops.relu_backward(y, dy, out=dy)   # dy comes from the layer above: ours
        if self.pool > 1:
            d = ops.maxpool_backward(d, argmax, conv_shape, self.pool)
        dx, _, _ = ops.conv2d_backward(x, w, d, stride=1, pad=self.pad, dw_out=dw_out, db_out=db_out,
                                       need_dx=need_dx, **({"accumulate": True} if accumulate else {}))
        self._cache = None
        return dx


class FC:
    """Fully connected layer on the NCHW flatten of its input; ReLU unless last."""

    kind = "fc"

    def __init__(self, geom, ops):
        self.geom = geom
        self.ops = ops
        self.name = geom.name
        self.relu = geom.relu
        self._cache = None

    def forward(self, x, w, b, train=False):
        x2 = x.reshape(x.shape[0], -1)
        y = self.ops.linear_forward(x2, w, b)
        if self.relu:
            y = self.ops.relu_forward(y, out=y)
        self._cache = (x, x2, w, y) if train else None
        return y

    def backward(self, dy, dw_out, db_out, need_dx=True, accumulate=False):
        if self._cache is None:
            raise RuntimeError(f"{self.name}: backward() needs a forward(train=True) first")
        x, x2, w, y = self._cache
        if self.relu:
            dy = self.ops.relu_backward(y, dy, out=dy)
        dx, _, _ = self.ops.linear_backward(x2, w, dy, dw_out=dw_out, db_out=db_out, need_dx=need_dx,
                                            **({"accumulate": True} if accumulate else {}))
        self._cache = None
        return None if dx is None else dx.reshape(x.shape)


def build(geoms, ops):
    """One layer object per LayerGeom of engine.spec.layers()."""
    kinds = {"conv": Conv, "fc": FC}
    return [kinds[g.kind](g, ops) for g in geoms]
