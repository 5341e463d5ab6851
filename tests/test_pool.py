"""Max pooling forward (values + argmax) and backward against a float64
reference, finite differences away from ties, determinism, bad geometry and
arrays, CUDA vs CPU on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ops
from engine.selfcheck import ref_pool, ref_pool_backward  # float64 references, shared with sprint selfcheck
from k2_support import (assert_close, check_cuda_binding, compiled_backend_without_device, cpu,
                        cuda_module_without_device, emulated_gpu_backend, gpu_backends, poison, using)


@pytest.fixture(autouse=True)
def _cpu():
    cpu()


@st.composite
def geoms(draw):
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    ph, pw = draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))
    H = draw(st.integers(max(1, kh - 2 * ph), 12))
    W = draw(st.integers(max(1, kw - 2 * pw), 12))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), H, W)
    return shape, kh, kw, draw(st.integers(1, 4)), draw(st.integers(1, 4)), ph, pw


def _distinct(shape, seed):
    """Random values without ties (a permutation), so argmax is unambiguous."""
    rng = np.random.default_rng(seed)
    return (rng.permutation(int(np.prod(shape))).reshape(shape) * 0.01 - 3).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(g=geoms(), seed=st.integers(0, 2**31))
def test_forward_and_backward_match_reference(g, seed):
    shape, kh, kw, sh, sw, ph, pw = g
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    y_ref, am_ref = ref_pool(x, kh, kw, sh, sw, ph, pw)
    y, am = ops.maxpool_forward(x, (kh, kw), (sh, sw), (ph, pw),
                                out=poison(y_ref.shape), argmax_out=poison(y_ref.shape, np.int32))
    assert np.array_equal(y, y_ref)
    assert np.array_equal(am, am_ref)
    dy = np.random.default_rng(seed + 1).standard_normal(y.shape).astype(np.float32)
    dx = ops.maxpool_backward(dy, am, shape, (kh, kw), (sh, sw), (ph, pw), out=poison(shape))
    assert_close(dx, ref_pool_backward(dy, am_ref, shape), tol=1e-6, what="dx")


def test_backward_sums_in_ascending_output_order_bit_for_bit():
    """The CPU scatter and the CUDA gather both add each pixel's dy in
    ascending output order from 0: float32 np.add.at (sequential) does too."""
    x = np.random.default_rng(2).integers(0, 3, (2, 3, 9, 10)).astype(np.float32)  # many ties
    y, am = ops.maxpool_forward(x, 3, 1, 1)
    dy = (np.random.default_rng(3).standard_normal(y.shape) * 10 ** np.arange(y.shape[-1])).astype(np.float32)
    want = np.zeros((6, 90), np.float32)
    for p in range(6):
        np.add.at(want[p], am.reshape(6, -1)[p], dy.reshape(6, -1)[p])
    assert np.array_equal(ops.maxpool_backward(dy, am, x.shape, 3, 1, 1), want.reshape(x.shape))


def test_ties_pick_the_first_maximum_and_nan_propagates():
    x = np.zeros((1, 1, 2, 4), np.float32)
    x[0, 0, 1, 2] = np.nan
    y, am = ops.maxpool_forward(x, 2)
    assert y[0, 0, 0, 0] == 0 and am[0, 0, 0, 0] == 0
    assert np.isnan(y[0, 0, 0, 1]) and am[0, 0, 0, 1] == 6


def test_backward_by_central_differences():
    shape = (2, 3, 7, 8)
    x = _distinct(shape, 3)  # gaps of 0.01 >> h: no tie changes under the probe
    for k, s, p in [(2, None, 0), (3, 2, 1), ((3, 2), (1, 2), (1, 0))]:
        y, am = ops.maxpool_forward(x, k, s, p)
        dy = np.random.default_rng(4).standard_normal(y.shape).astype(np.float32)
        dx = ops.maxpool_backward(dy, am, shape, k, s, p)
        h = 1e-3
        flat = x.reshape(-1)
        for i in range(0, flat.size, 5):
            xp, xm = flat.copy(), flat.copy()
            xp[i] += h
            xm[i] -= h
            lp = np.dot(ops.maxpool_forward(xp.reshape(shape), k, s, p)[0].ravel().astype(np.float64), dy.ravel())
            lm = np.dot(ops.maxpool_forward(xm.reshape(shape), k, s, p)[0].ravel().astype(np.float64), dy.ravel())
            num = (lp - lm) / (2 * h)
            assert abs(num - dx.reshape(-1)[i]) <= 2e-3 + 1e-3 * abs(num), (k, s, p, i)


def test_reference_net_pooling_and_threads_are_deterministic():
    """2x2/2 on a conv-sized batch (parallel path) and overlapping 3x3/2, twice."""
    from engine import _sprint_cpu as ext
    x = np.random.default_rng(9).standard_normal((32, 64, 32, 32)).astype(np.float32)
    y, am = ops.maxpool_forward(x, 2)
    assert np.array_equal(y, x.reshape(32, 64, 16, 2, 16, 2).max(axis=(3, 5)))
    x = x[:4]
    y, am = ops.maxpool_forward(x, 3, 2, 1)
    dy = np.random.default_rng(10).standard_normal(y.shape).astype(np.float32)
    a = ops.maxpool_backward(dy, am, x.shape, 3, 2, 1)
    n = ext.get_num_threads()
    try:
        ext.set_num_threads(1)
        b = ops.maxpool_backward(dy, am, x.shape, 3, 2, 1)
    finally:
        ext.set_num_threads(n)
    assert np.array_equal(a, b)


def test_out_of_window_argmax_is_ignored_not_a_crash():
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    y, am = ops.maxpool_forward(x, 2)
    am[0, 0, 0, 0] = 10**9
    am[0, 1, 1, 1] = -5
    dx = ops.maxpool_backward(np.ones_like(y), am, x.shape, 2)
    assert dx[0, 0].sum() == 3 and dx[0, 1].sum() == 3


def test_empty_batch():
    y, am = ops.maxpool_forward(np.zeros((0, 3, 6, 6), np.float32), 2)
    assert y.shape == am.shape == (0, 3, 3, 3)
    assert ops.maxpool_backward(y, am, (0, 3, 6, 6), 2).shape == (0, 3, 6, 6)


def test_pool_out_shape():
    assert ops.pool_out_shape((2, 3, 32, 32), 2) == (2, 3, 16, 16)
    assert ops.pool_out_shape((1, 1, 7, 5), 3, 2, 1) == (1, 1, 4, 3)


def _x(*shape):
    return np.zeros(shape, np.float32)


BAD = [
    (lambda: ops.maxpool_forward(np.zeros((1, 1, 4, 4)), 2), TypeError, "x"),
    (lambda: ops.maxpool_forward(_x(1, 4, 4), 2), ValueError, "x"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 8)[..., ::2], 2), ValueError, "x"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 0), ValueError, "k"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 2.0), TypeError, "k"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), (2, 2, 2)), ValueError, "k"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 2, 0), ValueError, "stride"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 2, 2, -1), ValueError, "pad"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 2, 2, 2), ValueError, "pad"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 3, 1, (0, 3)), ValueError, "pad"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 7, 1, 1), ValueError, "k"),
    (lambda: ops.maxpool_forward(_x(1, 1, 0, 4), 1), ValueError, "x"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 2, out=_x(1, 1, 3, 2)), ValueError, "out"),
    (lambda: ops.maxpool_forward(_x(1, 1, 4, 4), 2, argmax_out=_x(1, 1, 2, 2)), TypeError, "argmax_out"),
    (lambda: ops.maxpool_backward(_x(1, 1, 2, 2), np.zeros((1, 1, 2, 2), np.int64), (1, 1, 4, 4), 2),
     TypeError, "argmax"),
    (lambda: ops.maxpool_backward(_x(1, 1, 3, 2), np.zeros((1, 1, 2, 2), np.int32), (1, 1, 4, 4), 2),
     ValueError, "dy"),
    (lambda: ops.maxpool_backward(_x(1, 1, 2, 2), np.zeros((1, 1, 2, 2), np.int32), (1, 4, 4), 2),
     ValueError, "x_shape"),
]


@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_names_the_argument(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_bindings_check_arguments_themselves():
    from engine import _sprint_cpu as ext
    x, y, am = _x(1, 1, 4, 4), _x(1, 1, 2, 2), np.zeros((1, 1, 2, 2), np.int32)
    ext.maxpool_forward(x, y, am, 2, 2, 2, 2, 0, 0)
    for args, name in [((2, 2, 2, 2, 2, 0), "pad"), ((5, 5, 1, 1, 0, 0), "k"), ((2, 2, 0, 2, 0, 0), "stride"),
                       ((2, 2, 2, 2, -1, 0), "pad"), ((2**40, 2, 2, 2, 0, 0), "k"),
                       ((3, 3, 1, 1, 1, 1), "y")]:
        with pytest.raises(ValueError, match=name):
            ext.maxpool_forward(x, y, am, *args)
    with pytest.raises(TypeError, match="argmax"):
        ext.maxpool_forward(x, y, y, 2, 2, 2, 2, 0, 0)
    with pytest.raises(ValueError, match="dy"):
        ext.maxpool_backward(_x(1, 1, 3, 3), am, x, 2, 2, 2, 2, 0, 0)
    with pytest.raises(ValueError, match="overlap"):
        buf = _x(1, 1, 4, 4)
        ext.maxpool_forward(buf, buf.reshape(-1)[:4].reshape(1, 1, 2, 2), am, 2, 2, 2, 2, 0, 0)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return emulated_gpu_backend(tmp_path_factory.mktemp("emulated"), ("pool",))


@settings(max_examples=30, deadline=None)
@given(g=geoms(), seed=st.integers(0, 2**31))
def test_cuda_sources_on_the_cpu_match_the_cpu_twin(emulated, g, seed):
    """kernels/pool.cu (forward, and the gather backward) run through the ops'
    RawModule path: the CPU twin's values, argmax and dx bits."""
    shape, kh, kw, sh, sw, ph, pw = g
    x = np.random.default_rng(seed).integers(-3, 3, shape).astype(np.float32)  # ties
    y, am = ops.maxpool_forward(x, (kh, kw), (sh, sw), (ph, pw))
    dy = np.random.default_rng(seed + 1).standard_normal(y.shape).astype(np.float32)
    dx = ops.maxpool_backward(dy, am, shape, (kh, kw), (sh, sw), (ph, pw))
    with using(emulated):
        ey, eam = ops.maxpool_forward(x, (kh, kw), (sh, sw), (ph, pw), out=poison(y.shape),
                                      argmax_out=poison(y.shape, np.int32))
        edx = ops.maxpool_backward(dy, eam, shape, (kh, kw), (sh, sw), (ph, pw), out=poison(shape))
    assert np.array_equal(ey, y) and np.array_equal(eam, am) and np.array_equal(edx, dx)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,k,s,p", [((2, 3, 13, 11), 2, None, 0), ((2, 4, 9, 17), 3, 2, 1),
                                         ((1, 1, 7, 7), (3, 1), (1, 2), (1, 0)), ((8, 64, 32, 32), 2, 2, 0)])
def test_gpu_pool_matches_cpu(shape, k, s, p):
    import cupy

    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    y, am = ops.maxpool_forward(x, k, s, p)
    dy = np.random.default_rng(3).standard_normal(y.shape).astype(np.float32)
    dx = ops.maxpool_backward(dy, am, shape, k, s, p)
    for be in gpu_backends():
        with using(be):
            gy, gam = ops.maxpool_forward(cupy.asarray(x), k, s, p, out=poison(y.shape, xp=cupy),
                                          argmax_out=poison(y.shape, np.int32, xp=cupy))
            assert np.array_equal(gy.get(), y) and np.array_equal(gam.get(), am), be.kernels
            gdx = ops.maxpool_backward(cupy.asarray(dy), gam, shape, k, s, p, out=poison(shape, xp=cupy))
            assert np.array_equal(gdx.get(), dx), be.kernels  # same gather order: same bits


def test_cuda_bindings_check_arguments_without_a_gpu():
    c = cuda_module_without_device()
    check_cuda_binding(lambda: c.maxpool_forward(8, 16, 24, 2, 3, 8, 8, 2, 2, 2, 2, 0, 0))
    check_cuda_binding(lambda: c.maxpool_backward(8, 16, 24, 2, 3, 8, 8, 3, 3, 2, 2, 1, 1))
    for args, name in (((0, 16, 24, 2, 3, 8, 8, 2, 2, 2, 2, 0, 0), "x"),
                       ((8, 16, 0, 2, 3, 8, 8, 2, 2, 2, 2, 0, 0), "argmax"),
                       ((8, 16, 24, 2, 3, 8, 8, 2, 2, 2, 2, 2, 0), "pad"),
                       ((8, 16, 24, 2, 3, 8, 8, 9, 9, 1, 1, 0, 0), "k"),
                       ((8, 16, 24, 2, 3, 8, 8, 2, 2, 0, 2, 0, 0), "stride"),
                       ((8, 16, 24, -1, 3, 8, 8, 2, 2, 2, 2, 0, 0), "N"),
                       ((8, 16, 24, 2, 3, 2**40, 8, 2, 2, 2, 2, 0, 0), "x")):
        check_cuda_binding(lambda: c.maxpool_forward(*args), ValueError, name)


def test_ops_call_the_compiled_bindings_correctly():
    with using(compiled_backend_without_device()):
        check_cuda_binding(lambda: ops.maxpool_forward(_x(2, 3, 8, 8), 3, 2, 1))
        check_cuda_binding(lambda: ops.maxpool_backward(_x(2, 3, 4, 4), np.zeros((2, 3, 4, 4), np.int32),
                                                        (2, 3, 8, 8), 3, 2, 1))
