"""Conv and FC layers: engine ops composed as SPEC orders them, checked against
the float64 reference; gradients land in (poisoned) views of a flat vector."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import engine_ref
from engine import layers as L
from engine import ops
from engine.spec import NetSpec, layers as geoms

R = engine_ref.ops


def _relu_then_pool_reference(x, w, b, pad, pool):
    """SPEC's order: conv, bias, ReLU, then max-pool."""
    y = np.maximum(R.conv2d_forward(x, w, b, 1, pad), 0)
    if pool > 1:
        y, _ = R.maxpool_forward(y, pool)
    return y


def _flat_views(shapes, dtype=np.float32):
    flat = np.full(sum(int(np.prod(s)) for s in shapes), np.nan, dtype)
    out, off = [], 0
    for s in shapes:
        k = int(np.prod(s))
        out.append(flat[off:off + k].reshape(s))
        off += k
    return flat, out


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 3), cin=st.integers(1, 4), m=st.integers(1, 5), side=st.sampled_from([2, 4, 6]),
       c=st.sampled_from([1, 3, 5]), pool=st.sampled_from([1, 2]), seed=st.integers(0, 10**6))
def test_conv_layer_forward_backward(n, cin, m, side, c, pool, seed):
    spec = NetSpec("t", side, cin, c, ((m, pool),), (2,))
    g = geoms(spec)[0]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin, side, side)).astype(np.float32)
    w = rng.standard_normal(g.w_shape).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    layer = L.Conv(g, ops)
    y = layer.forward(x, w, b, train=True)
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    ref = _relu_then_pool_reference(x64, w64, b64, (c - 1) // 2, pool)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)

    dy = rng.standard_normal(y.shape).astype(np.float32)
    flat, (dw, db) = _flat_views([g.w_shape, g.b_shape])
    dx = layer.backward(dy.copy(), dw, db, need_dx=True)   # backward may overwrite dy
    assert np.isfinite(flat).all(), "dW/db views not fully written"
    # reference backward through SPEC's order (ReLU before pool)
    conv = R.conv2d_forward(x64, w64, b64, 1, (c - 1) // 2)
    r = np.maximum(conv, 0)
    d = dy.astype(np.float64)
    if pool > 1:
        _, arg = R.maxpool_forward(r, pool)
        d = R.maxpool_backward(d, arg, r.shape, pool)
    d = np.where(conv > 0, d, 0)
    rdx, rdw, rdb = R.conv2d_backward(x64, w64, d, 1, (c - 1) // 2)
    tol = dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, rdw, **tol)
    np.testing.assert_allclose(db, rdb, **tol)
    np.testing.assert_allclose(dx, rdx, **tol)


@pytest.mark.parametrize("relu", [True, False])
def test_fc_layer_flattens_nchw_and_writes_views(relu):
    spec = NetSpec("t", 2, 3, 1, ((4, 1),), (5, 3) if relu else (3,))
    g = geoms(spec)[1]
    assert g.relu is relu
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4, 2, 2)).astype(np.float32)
    w = rng.standard_normal(g.w_shape).astype(np.float32)
    b = rng.standard_normal(g.b_shape).astype(np.float32)
    layer = L.FC(g, ops)
    y = layer.forward(x, w, b, train=True)
    pre = x.reshape(6, -1).astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(y, np.maximum(pre, 0) if relu else pre, rtol=1e-5, atol=1e-5)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    flat, (dw, db) = _flat_views([g.w_shape, g.b_shape])
    dx = layer.backward(dy.copy(), dw, db)
    d = np.where(pre > 0, dy, 0) if relu else dy.astype(np.float64)
    assert np.isfinite(flat).all()
    np.testing.assert_allclose(dw, d.T @ x.reshape(6, -1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, d.sum(0), rtol=1e-4, atol=1e-4)
    assert dx.shape == x.shape
    np.testing.assert_allclose(dx, (d @ w).reshape(x.shape), rtol=1e-4, atol=1e-4)


def test_first_layer_skips_dx_and_backward_needs_forward():
    g = geoms(NetSpec("t", 4, 1, 3, ((2, 2),), (2,)))[0]
    layer = L.Conv(g, ops)
    x = np.random.default_rng(0).standard_normal((2, 1, 4, 4)).astype(np.float32)
    w = np.ones(g.w_shape, np.float32)
    b = np.zeros(2, np.float32)
    y = layer.forward(x, w, b, train=True)
    _, (dw, db) = _flat_views([g.w_shape, g.b_shape])
    assert layer.backward(np.ones_like(y), dw, db, need_dx=False) is None
    with pytest.raises(RuntimeError, match="forward"):
        layer.backward(np.ones_like(y), dw, db)   # cache is consumed
    layer.forward(x, w, b, train=False)
    with pytest.raises(RuntimeError, match="forward"):
        layer.backward(np.ones_like(y), dw, db)   # inference keeps no cache


def test_build_maps_geometry_to_layers():
    built = L.build(geoms(NetSpec("t", 4, 1, 3, ((2, 2), (3, 1)), (4, 2))), ops)
    assert [type(l).__name__ for l in built] == ["Conv", "Conv", "FC", "FC"]
    assert [l.name for l in built] == ["conv1", "conv2", "fc1", "fc2"]
