"""A network of the SPRINT family: layers over one flat parameter vector.

``params`` and ``grads`` are single contiguous vectors in the order of
``engine.spec.param_layout``; ``views`` maps (layer, "W"|"b") to reshaped
views of ``params`` and ``grad_views`` the same for ``grads``.
"""
from __future__ import annotations

import numpy as np

from . import spec as _spec
from . import layers as _layers


def _default_ops():
    from engine import ops
    return ops


def _xp():
    from engine import backend
    return backend.get_backend().xp


def init_params(spec, seed=0) -> np.ndarray:
    """Host float64 vector: He normal for ReLU layers, Glorot uniform for the
    output layer (no ReLU after it), zero biases; seeded, layout-ordered."""
    rng = np.random.default_rng(seed)
    geoms = {g.name: g for g in _spec.layers(spec)}
    flat = np.zeros(_spec.n_params(spec), np.float64)
    for name, part, shape, off in _spec.param_layout(spec):
        if part != "W":
            continue
        g = geoms[name]
        size = int(np.prod(shape))
        fan_in = size // shape[0]
        if g.relu:
            w = rng.normal(0.0, np.sqrt(2.0 / fan_in), size)
        else:
            lim = np.sqrt(6.0 / (fan_in + shape[0]))
            w = rng.uniform(-lim, lim, size)
        flat[off:off + size] = w
    return flat


def as_spec(model) -> _spec.NetSpec:
    """A NetSpec from a preset name, a JSON/YAML file path, a spec dict
    (``{"x0": 8, "m0": 1, "c": 3, "convs": [[16, 2]], "fcs": [64, 10]}``) or a NetSpec."""
    if isinstance(model, dict):
        return _spec.NetSpec.from_dict(dict(model))
    return _spec.get_spec(model)


class Net:
    """A CNN of the SPRINT family with its parameters in one flat vector.

    ``Net(model, seed=0, dtype=np.float32)``: ``model`` is a preset name
    (``"digits"``, ``"cifar"``, ...; ``sprint info`` lists them), a JSON/YAML
    spec file, a spec dict or a ``NetSpec``. Weights are seeded (He / Glorot)
    and live on the current backend (``engine.backend``): numpy arrays on the
    CPU, CuPy arrays on a GPU.

    Inputs are ``(N, m0, x0, x0)`` float batches, normalised as the training
    loader does (``DeformConfig.with_stats``); labels are ints in
    ``[0, n_classes)``.
    """

    def __init__(self, model, seed=0, dtype=np.float32, ops=None):
        self.spec = as_spec(model)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype}")
        self.ops = ops if ops is not None else _default_ops()
        self.xp = _xp()
        self.geoms = _spec.layers(self.spec)
        self.layers = _layers.build(self.geoms, self.ops)
        self.n_params = _spec.n_params(self.spec)
        self.params = self.xp.asarray(init_params(self.spec, seed).astype(self.dtype))
        self.grads = self.xp.zeros(self.n_params, self.dtype)
        self.views = self._views(self.params)
        self.grad_views = self._views(self.grads)

    def _views(self, flat):
        out = {}
        for name, part, shape, off in _spec.param_layout(self.spec):
            size = int(np.prod(shape))
            out[(name, part)] = flat[off:off + size].reshape(shape)
        return out

    # ---- flat vector ---------------------------------------------------
    def get_flat(self):
        """A copy of the parameter vector (device array)."""
        return self.params.copy()

    def set_flat(self, v):
        """Copy ``v`` (host or device, any float dtype) into the parameters in place,
        so the layer views stay valid."""
        if tuple(getattr(v, "shape", ())) != (self.n_params,):
            raise ValueError(f"set_flat: v must have shape ({self.n_params},), got {getattr(v, 'shape', None)}")
        self.params[...] = self.xp.asarray(v, dtype=self.dtype)

    # ---- passes ----------------------------------------------------------
    def _input(self, x):
        x = self.xp.ascontiguousarray(self.xp.asarray(x, dtype=self.dtype))
        want = self.spec.input_shape
        if x.ndim != 4 or tuple(x.shape[1:]) != want:
            raise ValueError(f"x must have shape (N, {', '.join(map(str, want))}), got {tuple(x.shape)}")
        return x

    def forward(self, x, train=False):
        """Logits ``(N, n_classes)`` of the batch ``x`` ``(N, m0, x0, x0)``.
        ``train=True`` keeps what ``backward`` needs (pooling switches, ReLU masks)."""
        h = self._input(x)
        for layer in self.layers:
            h = layer.forward(h, self.views[(layer.name, "W")], self.views[(layer.name, "b")], train)
        return h

    def backward(self, dlogits):
        """Back-propagate d(loss)/d(logits); fills ``grads``."""
        d = dlogits
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            d = layer.backward(d, self.grad_views[(layer.name, "W")],
                               self.grad_views[(layer.name, "b")], need_dx=i > 0)

    def loss_and_grad(self, x, y):
        """(mean cross-entropy over the batch, number classified right);
        ``grads`` receives the gradient of that mean (one training step is this
        plus ``SGD.step()``)."""
        y = self.xp.asarray(y)
        logits = self.forward(x, train=True)
        if y.shape != (logits.shape[0],):
            raise ValueError(f"y must have shape ({logits.shape[0]},), got {tuple(y.shape)}")
        loss, dlogits, _ = self.ops.softmax_xent(logits, y)
        n_correct = int((logits.argmax(axis=1) == y).sum())
        self.backward(dlogits)
        return float(loss), n_correct

    def predict(self, x, batch=256):
        """Predicted class of every sample of ``x`` ``(N, m0, x0, x0)``, in
        chunks of ``batch``; an int array on the backend's device."""
        out = []
        for i in range(0, len(x), batch):
            out.append(self.forward(x[i:i + batch]).argmax(axis=1))
        return self.xp.concatenate(out) if out else self.xp.zeros(0, np.int64)

    def table(self, n=1) -> str:
        """The layer table of ``sprint info``: shapes, N_Param and FLOPs for a batch of ``n``."""
        return _spec.summary_table(self.spec, n)

    def __repr__(self):
        shape = "x".join(map(str, self.spec.input_shape))
        return (f"Net({self.spec.name!r}, input {shape}, {self.spec.n_classes} classes, "
                f"n_params={self.n_params:,}, dtype={self.dtype.name})")
