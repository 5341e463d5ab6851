"""ReLU forward/backward and the fused bias + ReLU against float64 NumPy,
finite differences away from the kink, bad input, CUDA vs CPU on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ops
from k2_support import (assert_close, check_cuda_binding, compiled_backend_without_device, cpu,
                        cuda_module_without_device, emulated_gpu_backend, gpu_backends, poison, using)

SHAPES = st.lists(st.integers(0, 9), min_size=1, max_size=4).map(tuple)


@pytest.fixture(autouse=True)
def _cpu():
    cpu()


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@settings(max_examples=30, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2**31))
def test_relu_forward_backward(shape, seed):
    x, dy = _rand(shape, seed), _rand(shape, seed + 1)
    y = ops.relu_forward(x, out=poison(shape))
    assert np.array_equal(y, np.maximum(x.astype(np.float64), 0))
    dx = ops.relu_backward(y, dy, out=poison(shape))
    assert np.array_equal(dx, np.where(x > 0, dy, 0))


def test_large_buffers_use_threads_and_in_place():
    x = _rand((3, 64, 33, 17), 3)
    ref = np.maximum(x, 0)
    assert ops.relu_forward(x, out=x) is x
    assert np.array_equal(x, ref)


def test_nan_propagates_and_negative_zero():
    x = np.array([np.nan, -1.0, 0.0, -0.0, 2.0], np.float32)
    y = ops.relu_forward(x)
    assert np.isnan(y[0]) and np.array_equal(y[1:], [0, 0, 0, 2])
    dx = ops.relu_backward(y, np.ones(5, np.float32))
    assert np.array_equal(dx, [0, 0, 0, 0, 1])  # mask y > 0 is false for NaN


def test_relu_gradient_by_central_differences():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(200).astype(np.float32)
    x[np.abs(x) < 0.05] = 0.5  # away from the kink
    dy = rng.standard_normal(200).astype(np.float32)
    dx = ops.relu_backward(ops.relu_forward(x), dy)
    h = 1e-3
    loss = lambda v: float(np.dot(ops.relu_forward(v).astype(np.float64), dy))  # noqa: E731
    for i in range(0, 200, 7):
        e = np.zeros(200, np.float32)
        e[i] = h
        num = (loss(x + e) - loss(x - e)) / (2 * h)
        assert abs(num - dx[i]) <= 1e-3 + 1e-3 * abs(num), i


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(0, 7), min_size=2, max_size=4).map(tuple),
       relu=st.booleans(), seed=st.integers(0, 2**31))
def test_bias_act(shape, relu, seed):
    x, b = _rand(shape, seed), _rand(shape[1], seed + 1)
    ref = x.astype(np.float64) + b.reshape((1, -1) + (1,) * (len(shape) - 2))
    if relu:
        ref = np.maximum(ref, 0)
    assert_close(ops.bias_act(x, b, relu=relu, out=poison(shape)), ref, what="bias_act")
    ops.bias_act(x, b, relu=relu, out=x)  # in place
    assert_close(x, ref, what="bias_act in place")


def _f(*shape):
    return np.zeros(shape, np.float32)


BAD = [
    (lambda: ops.relu_forward(np.zeros(4)), TypeError, "x"),
    (lambda: ops.relu_forward([1.0]), TypeError, "x"),
    (lambda: ops.relu_forward(_f(4, 4)[:, ::2]), ValueError, "x"),
    (lambda: ops.relu_forward(_f(4), out=_f(5)), ValueError, "out"),
    (lambda: ops.relu_forward(_f(4), out=np.zeros(4)), TypeError, "out"),
    (lambda: ops.relu_backward(_f(4), _f(5)), ValueError, "dy"),
    (lambda: ops.relu_backward(_f(4), np.zeros(4, np.int32)), TypeError, "dy"),
    (lambda: ops.bias_act(_f(4), _f(4)), ValueError, "x"),
    (lambda: ops.bias_act(_f(2, 3, 4), _f(4)), ValueError, "b"),
    (lambda: ops.bias_act(_f(2, 3), _f(3), relu=1), TypeError, "relu"),
]


@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_names_the_argument(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_partial_overlap_is_refused_in_place_is_fine():
    a = _f(16)
    with pytest.raises(ValueError, match="overlap"):
        ops.relu_forward(a[:8], out=a[4:12])
    from engine import _sprint_cpu as ext
    with pytest.raises(ValueError, match="overlap"):
        ext.relu_forward(a[:8], a[4:12])
    with pytest.raises(ValueError, match="out"):
        ext.relu_backward(_f(3), _f(3), _f(4))
    with pytest.raises(TypeError, match="b"):
        ext.bias_act(_f(2, 3), np.zeros(3), _f(2, 3), True)


def test_cuda_sources_on_the_cpu_match_the_cpu_twin(tmp_path):
    """kernels/elementwise.cu run through the ops' RawModule path."""
    emulated = emulated_gpu_backend(tmp_path, ("elementwise",))
    x, dy, b = _rand((3, 5, 7, 2), 1), _rand((3, 5, 7, 2), 2), _rand(5, 3)
    x[0, 0, 0, 0] = np.nan
    want = [ops.relu_forward(x), ops.relu_backward(ops.relu_forward(x), dy), ops.bias_act(x, b),
            ops.bias_act(x, b, relu=False)]
    with using(emulated):
        got = [ops.relu_forward(x, out=poison(x.shape)), ops.relu_backward(want[0], dy, out=poison(x.shape)),
               ops.bias_act(x, b, out=poison(x.shape)), ops.bias_act(x, b, relu=False, out=poison(x.shape))]
        inplace = x.copy()
        ops.relu_forward(inplace, out=inplace)
        with pytest.raises(ValueError, match="b"):
            ops.bias_act(x, _rand(4, 0))
    for g, w in zip(got, want):
        assert np.array_equal(g, w, equal_nan=True)
    assert np.array_equal(inplace, want[0], equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1,), (7, 5), (4, 64, 17, 13), (3, 1 << 18)])
def test_gpu_elementwise_matches_cpu(shape):
    import cupy

    x, dy = _rand(shape, 1), _rand(shape, 2)
    b = _rand(shape[1], 3) if len(shape) > 1 else None
    y = ops.relu_forward(x)
    dx = ops.relu_backward(y, dy)
    ba = ops.bias_act(x, b) if b is not None else None
    for be in gpu_backends():
        with using(be):
            gy = ops.relu_forward(cupy.asarray(x), out=poison(shape, xp=cupy))
            assert np.array_equal(gy.get(), y), be.kernels
            gdx = ops.relu_backward(gy, cupy.asarray(dy), out=poison(shape, xp=cupy))
            assert np.array_equal(gdx.get(), dx), be.kernels
            if b is not None:
                gba = ops.bias_act(cupy.asarray(x), cupy.asarray(b), out=poison(shape, xp=cupy))
                assert np.array_equal(gba.get(), ba), be.kernels


def test_cuda_bindings_check_arguments_without_a_gpu():
    c = cuda_module_without_device()
    for call in (lambda: c.relu_forward(8, 16, 10), lambda: c.relu_backward(8, 16, 24, 10),
                 lambda: c.bias_act(8, 16, 24, 2, 3, 5, True)):
        check_cuda_binding(call)
    for call, exc, name in ((lambda: c.relu_forward(8, 0, 10), ValueError, "out"),
                            (lambda: c.relu_backward(8, 16, 24, -1), ValueError, "n"),
                            (lambda: c.bias_act(8, 0, 24, 2, 3, 5, True), ValueError, "b"),
                            (lambda: c.bias_act(8, 16, 24, 2, 0, 5, True), ValueError, "channels"),
                            (lambda: c.bias_act(8, 16, 24, 2**31, 2**31, 2**31, True), ValueError, "large")):
        check_cuda_binding(call, exc, name)


def test_ops_call_the_compiled_bindings_correctly():
    with using(compiled_backend_without_device()):
        for call in (lambda: ops.relu_forward(_f(3, 4)), lambda: ops.relu_backward(_f(3, 4), _f(3, 4)),
                     lambda: ops.bias_act(_f(2, 3, 4), _f(3))):
            check_cuda_binding(call)
