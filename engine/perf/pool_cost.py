"""Max-pooling's cost as its CPU kernels spend it (csrc/pool.cpp), swept and fitted.

The forward runs, per plane and output row (``rows``), one SIMD loop over
the OW outputs for each of the p*p window elements: ``loops`` = planes * OH
* p^2 loop starts, each of OW // 8 eight-float vectors, a four-float one
for the next 4 and the last OW % 4 one by one (the vectorised loop and the
epilogues GCC leaves it; a strided read, the stride being p). The backward
zeroes the plane (E stores) and then scatters each output (``outputs`` =
E / p^2) with an integer division.

Priced on elements and input rows alone (the terms fitted until session 12)
pooling by 4 was off both ways: heldout-shallow's 28x28 map pooled by 4
(OW 7: a 4-float vector and 3 floats one by one, 16 times per row) ran its forward 2.2x and its backward 0.3x the
price (test set 9, bench/RESULTS.md section 4): every swept pool was by 2.
The sweep (``sweep_pooling``) now covers pools of 2-5 over maps of 4-64.

Records: ``{"kind": "pool_fwd"|"pool_bwd", "x": E, "planes", "h", "p",
"t", "std", "holdout"}``; held out: every fourth shape.
"""
from __future__ import annotations

import numpy as np

from .nnls_fit import error_summary, nnls_relative, sweep_cv
from .timing import _rand, _rec

POOL_KINDS = ("pool_fwd", "pool_bwd")
FEATURES = {"pool_fwd": ("loops", "vec8", "vec4", "scalar", "rows", "1"), "pool_bwd": ("elements", "outputs", "1")}
# The largest map swept (16 MiB): past the L2 and the seen nets' maps at batch 16.
MAX_ELEMENTS = 1 << 22


def pool_features(kind, planes, h, p) -> tuple:
    """The ``FEATURES[kind]`` of a p x p, stride-p pool over ``planes`` maps of h x h."""
    planes, h, p = int(planes), int(h), int(p)
    ow = max((h - p) // p + 1, 0)       # = OH: square maps
    if kind == "pool_fwd":
        loops = float(planes * ow * p * p)
        return (loops, loops * (ow // 8), loops * (ow % 8 // 4), loops * (ow % 4), float(planes * ow), 1.0)
    if kind == "pool_bwd":
        return (float(planes * h * h), float(planes * ow * ow), 1.0)
    raise ValueError(f"no pooling kernel {kind!r}")


def pool_size(g, n) -> tuple:
    """(elements, input rows, planes, side, pool) of a spec layer's pool over
    its conv output at batch ``n``: the first two are what profiles fitted
    before priced it on (``Profile.term``)."""
    m, side, _ = g.extra["conv_out"]
    return (m * side * side * n, m * side * n, m * n, side, g.pool)


def fit_pool(kind, fit_r, hold) -> dict:
    """{"coef", "features", "error", ...} of ``kind`` by NNLS on relative residuals."""
    X = lambda rs: np.array([pool_features(kind, r["planes"], r["h"], r["p"]) for r in rs])
    coef = nnls_relative(X(fit_r), [r["t"] for r in fit_r])
    ev = lambda rs: error_summary(X(rs) @ coef, [r["t"] for r in rs]) if rs else {"n": 0}
    return {"coef": [float(c) for c in coef], "features": list(FEATURES[kind]), "unit": "pool shape",
            "cv": sweep_cv(fit_r + hold), "error": {"fit": ev(fit_r), "holdout": ev(hold)}}


def pool_time(term, kind, size, scale=1.0, call_scale=1.0) -> float:
    """A ``fit_pool`` term's price of ``pool_size`` ``size``: the per-unit
    parts times ``scale``, the fixed one times ``call_scale``."""
    f = pool_features(kind, *size[2:5])
    c = term["coef"]
    return scale * sum(a * x for a, x in zip(c[:-1], f[:-1])) + call_scale * c[-1] * f[-1]


def pool_shapes(cfg, rng=None):
    """[(n, M, H, p)]: the conv outputs of the layer nets, each pooled by 2-4
    where its side allows, at the sweep's batch sizes; then random ones
    (planes 4-2048, side 4-64, pool 2-5). The seen nets' maps are not swept:
    the kernel sees planes, side and pool only, and a seen net's map at one
    batch size is a held-out net's at another (test set 8's were)."""
    from .sweep_kernels import layer_net_convs
    rng = rng or np.random.default_rng(13)
    out = []
    for _, g, n in layer_net_convs(cfg["batches"]):
        pools = {g.pool, 2, 3, 4}
        m, side, _ = g.extra["conv_out"]
        for p in sorted(pools):
            s = (n, m, side, p)
            if p > 1 and side >= p and n * m * side * side <= MAX_ELEMENTS and s not in out:
                out.append(s)
    n_net = len(out)
    while len(out) < n_net + cfg["op_shapes"]:
        p = int(rng.integers(2, 6))
        side = int(rng.integers(max(p, 4), 65))
        planes = max(1, int(round(2 ** rng.uniform(2, 11))))
        s = (1, planes, side, p)
        if planes * side * side <= MAX_ELEMENTS:
            out.append(s)
    return out


def sweep_pooling(cfg, skipped=None):
    """maxpool_forward and maxpool_backward over ``pool_shapes``."""
    from engine import ops
    if not hasattr(ops, "maxpool_forward"):
        if skipped is not None:
            skipped.append("maxpool")
        return []
    recs = []
    for i, (n, m, side, p) in enumerate(pool_shapes(cfg)):
        y = _rand((n, m, side, side), 4)
        yp, am = ops.maxpool_forward(y, p)
        f = dict(x=y.size, planes=n * m, h=side, p=p, holdout=i % 4 == 3)
        recs.append(_rec("pool_fwd", lambda: ops.maxpool_forward(y, p), cfg, **f))
        recs.append(_rec("pool_bwd", lambda: ops.maxpool_backward(yp, am, y.shape, p), cfg, **f))
    return recs

