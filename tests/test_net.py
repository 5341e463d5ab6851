"""engine.Net: flat vectors and views, initialisation, and the whole-network
gradient against central finite differences in float64."""
import numpy as np
import pytest

import engine_ref
from engine.net import Net, init_params
from engine.spec import NetSpec, get_spec, n_params_formula, param_layout

TINY = get_spec("tiny")


def _batch(spec, n, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n,) + spec.input_shape)
    y = rng.integers(0, spec.n_classes, n)
    return x, y


@pytest.mark.parametrize("name", ["tiny", "digits", "cifar"])
def test_flat_vectors_and_views(name):
    net = Net(name)
    assert net.n_params == n_params_formula(net.spec) == net.params.size == net.grads.size
    assert net.params.dtype == np.float32 and net.params.flags.c_contiguous
    for lname, part, shape, off in param_layout(net.spec):
        v, g = net.views[(lname, part)], net.grad_views[(lname, part)]
        assert v.shape == g.shape == shape
        assert np.shares_memory(v, net.params) and np.shares_memory(g, net.grads)
        assert v.ctypes.data == net.params.ctypes.data + 4 * off


def test_init_is_seeded_he_and_glorot():
    spec = get_spec("cifar")
    a, b, c = init_params(spec, 0), init_params(spec, 0), init_params(spec, 1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    for lname, part, shape, off in param_layout(spec):
        v = a[off:off + int(np.prod(shape))]
        if part == "b":
            assert not v.any()
            continue
        fan_in = int(np.prod(shape[1:]))
        if lname == "fc2":  # output layer: Glorot uniform
            lim = np.sqrt(6 / (fan_in + shape[0]))
            assert np.abs(v).max() <= lim and v.std() == pytest.approx(lim / np.sqrt(3), rel=0.1)
        else:               # ReLU layers: He normal
            assert v.std() == pytest.approx(np.sqrt(2 / fan_in), rel=0.1)


def test_get_set_flat_copy_semantics():
    net = Net("tiny", seed=3)
    v = net.get_flat()
    assert not np.shares_memory(v, net.params)
    w = np.random.default_rng(0).standard_normal(net.n_params)
    net.set_flat(w)
    assert np.array_equal(net.params, w.astype(np.float32))
    assert np.array_equal(net.views[("fc2", "b")], w[-3:].astype(np.float32))  # views follow
    with pytest.raises(ValueError, match="shape"):
        net.set_flat(w[:-1])


def test_forward_shapes_and_input_errors():
    net = Net("digits")
    x, _ = _batch(net.spec, 5)
    assert net.forward(x).shape == (5, 10)
    assert net.predict(x, batch=2).shape == (5,)
    with pytest.raises(ValueError, match="x must have shape"):
        net.forward(np.zeros((5, 1, 9, 9), np.float32))
    with pytest.raises(ValueError, match="y must have shape"):
        net.loss_and_grad(x, np.zeros(4, np.int64))
    with pytest.raises(TypeError, match="dtype"):
        Net("tiny", dtype=np.int32)


def _loss(net, x, y):
    return net.ops.softmax_xent(net.forward(x), y)[0]


def _finite_difference_check(net, x, y, eps=1e-6):
    rng = np.random.default_rng(7)
    net.set_flat(init_params(net.spec, 0) + 0.01 * rng.standard_normal(net.n_params))
    net.grads[...] = np.nan
    loss, _ = net.loss_and_grad(x, y)
    assert loss == pytest.approx(_loss(net, x, y), rel=1e-12)
    analytic = net.grads.copy()
    numeric = np.empty(net.n_params)
    base = net.get_flat()
    for i in range(net.n_params):
        f = []
        for sign in (1, -1):
            p = base.copy()
            p[i] += sign * eps
            net.set_flat(p)
            f.append(_loss(net, x, y))
        numeric[i] = (f[0] - f[1]) / (2 * eps)
    net.set_flat(base)
    err = np.abs(analytic - numeric).max() / max(np.abs(numeric).max(), 1e-12)
    assert np.isfinite(analytic).all()
    assert err < 1e-6, f"relative gradient error {err:.2e}"
    return analytic


def test_whole_network_gradient_vs_finite_differences_reference_ops():
    """Every parameter of `tiny`, float64, layers composed over plain float64 ops."""
    net = Net(TINY, dtype=np.float64, ops=engine_ref.ops)
    x, y = _batch(TINY, 4)
    _finite_difference_check(net, x, y)


def test_whole_network_gradient_vs_finite_differences_engine_ops():
    """The same check through the engine's own ops in float64."""
    if not engine_ref.ops_accept_float64():
        pytest.skip("engine.ops are float32-only; float64 check runs on the reference ops above")
    net = Net(TINY, dtype=np.float64)
    x, y = _batch(TINY, 4)
    _finite_difference_check(net, x, y)


@pytest.mark.parametrize("name,n", [("tiny", 7), ("digits", 5)])
def test_engine_ops_gradient_matches_float64_reference(name, n):
    """float32 engine ops vs the float64 reference network at the same weights."""
    spec = get_spec(name)
    fast = Net(spec, seed=2)
    ref = Net(spec, seed=2, dtype=np.float64, ops=engine_ref.ops)
    x, y = _batch(spec, n, seed=4)
    fast.grads[...] = np.nan
    loss32, c32 = fast.loss_and_grad(x.astype(np.float32), y)
    loss64, c64 = ref.loss_and_grad(x, y)
    assert loss32 == pytest.approx(loss64, rel=1e-4)
    assert c32 == c64 == int((ref.forward(x).argmax(1) == y).sum())
    scale = np.abs(ref.grads).max()
    assert np.abs(fast.grads - ref.grads).max() < 1e-4 * scale


def test_custom_spec_from_call():
    spec = NetSpec("mini", x0=4, m0=1, c=3, convs=((2, 2),), fcs=(3,))
    net = Net(spec)
    assert net.n_params == 2 * (9 + 1) + 3 * (2 * 2 * 2 + 1)
    assert "mini" in net.table() and "conv1/p2" in net.table()
