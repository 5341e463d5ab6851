"""Softmax + cross-entropy + gradient against float64 NumPy, central finite
differences of the mean loss, stability at +-1e4, labels validation, CUDA vs
CPU on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ops
from k2_support import (assert_close, check_cuda_binding, compiled_backend_without_device, cpu,
                        cuda_module_without_device, gpu_backends, poison, using)


@pytest.fixture(autouse=True)
def _cpu():
    cpu()


def ref_softmax_xent(z, y):
    z = z.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(axis=1, keepdims=True)
    p = e / s
    n = len(y)
    loss = float(np.mean(np.log(s[:, 0]) - (z[np.arange(n), y] - m[:, 0])))
    d = p.copy()
    d[np.arange(n), y] -= 1
    return loss, d / n, p


def _case(n, k, seed, scale=3.0, label_dtype=np.int64):
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((n, k)) * scale).astype(np.float32)
    return z, rng.integers(0, k, n).astype(label_dtype)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), k=st.sampled_from([1, 2, 3, 10, 31, 33, 100, 257, 1000]),
       seed=st.integers(0, 2**31), label_dtype=st.sampled_from([np.int32, np.int64, np.uint8]))
def test_matches_reference(n, k, seed, label_dtype):
    if label_dtype == np.uint8 and k > 255:
        k = 255
    z, y = _case(n, k, seed, label_dtype=label_dtype)
    loss, d, p = ops.softmax_xent(z, y, dlogits_out=poison((n, k)), probs_out=poison((n, k)))
    rl, rd, rp = ref_softmax_xent(z, y.astype(np.int64))
    assert isinstance(loss, float)
    assert abs(loss - rl) <= 1e-5 + 1e-5 * abs(rl)
    assert_close(p, rp, tol=1e-6, eps=1e-5, what="probs")
    assert_close(d, rd, tol=1e-6 / n, eps=1e-5, what="dlogits")


def test_gradient_by_central_differences():
    z, y = _case(6, 7, 1, scale=1.0)
    _, d, _ = ops.softmax_xent(z, y)
    h = 1e-2  # float32 loss: larger h, but the loss is smooth (error O(h^2))
    for i in range(z.shape[0]):
        for j in range(z.shape[1]):
            zp, zm = z.copy(), z.copy()
            zp[i, j] += h
            zm[i, j] -= h
            num = (ops.softmax_xent(zp, y)[0] - ops.softmax_xent(zm, y)[0]) / (2 * h)
            assert abs(num - d[i, j]) <= 2e-4 + 1e-2 * abs(num), (i, j, num, d[i, j])


def test_stable_for_huge_logits():
    z = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1e4, 1e4, -1e4], [-1e4, 1e4, 1e4 - 5]], np.float32)
    y = np.array([1, 2, 0, 2])
    loss, d, p = ops.softmax_xent(z, y)
    assert np.isfinite(loss) and np.all(np.isfinite(d)) and np.all(np.isfinite(p))
    rl, rd, rp = ref_softmax_xent(z, y)
    assert abs(loss - rl) <= 1e-6 * abs(rl)
    assert_close(p, rp, tol=1e-6, what="probs")
    assert_close(d, rd, tol=1e-6, what="dlogits")
    np.testing.assert_allclose(p.sum(axis=1), 1, rtol=1e-6)


def test_large_batch_parallel_rows_deterministic():
    from engine import backend
    z, y = _case(4096, 10, 3)
    loss, d, p = ops.softmax_xent(z, y)
    rl, rd, rp = ref_softmax_xent(z, y)
    assert abs(loss - rl) <= 1e-5 * abs(rl)
    assert_close(d, rd, tol=1e-9, eps=1e-5, what="dlogits")
    ext = backend.get_backend().ext
    n = ext.get_num_threads()
    try:
        ext.set_num_threads(1)
        loss1, d1, _ = ops.softmax_xent(z, y)
    finally:
        ext.set_num_threads(n)
    assert loss1 == loss and np.array_equal(d1, d)


def _z(n=4, k=3):
    return np.zeros((n, k), np.float32)


BAD = [
    (lambda: ops.softmax_xent(_z(), np.array([0, 1, 2, 3])), ValueError, "labels"),
    (lambda: ops.softmax_xent(_z(), np.array([0, -1, 2, 0])), ValueError, "labels"),
    (lambda: ops.softmax_xent(_z(), np.array([0.0, 1, 2, 0])), TypeError, "labels"),
    (lambda: ops.softmax_xent(_z(), [0, 1, 2, 0]), TypeError, "labels"),
    (lambda: ops.softmax_xent(_z(), np.array([0, 1, 2])), ValueError, "labels"),
    (lambda: ops.softmax_xent(_z(), np.zeros((4, 1), np.int64)), ValueError, "labels"),
    (lambda: ops.softmax_xent(np.zeros((4, 3)), np.zeros(4, np.int64)), TypeError, "logits"),
    (lambda: ops.softmax_xent(np.zeros(4, np.float32), np.zeros(4, np.int64)), ValueError, "logits"),
    (lambda: ops.softmax_xent(_z(0, 3), np.zeros(0, np.int64)), ValueError, "logits"),
    (lambda: ops.softmax_xent(_z(4, 6)[:, ::2], np.zeros(4, np.int64)), ValueError, "logits"),
    (lambda: ops.softmax_xent(_z(), np.zeros(4, np.int64), dlogits_out=_z(4, 4)), ValueError, "dlogits_out"),
]


@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_names_the_argument(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_binding_checks_labels_and_buffers():
    from engine import _sprint_cpu as ext
    z, p, d, r = _z(), _z(), _z(), np.zeros(4, np.float32)
    assert ext.softmax_xent(z, np.zeros(4, np.int32), p, d, r) == pytest.approx(np.log(3))
    with pytest.raises(ValueError, match=r"labels\[2\]"):
        ext.softmax_xent(z, np.array([0, 1, 3, 0], np.int64), p, d, r)
    with pytest.raises(TypeError, match="labels"):
        ext.softmax_xent(z, np.zeros(4, np.uint8), p, d, r)
    with pytest.raises(ValueError, match="row_loss"):
        ext.softmax_xent(z, np.zeros(4, np.int64), p, d, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="overlap"):
        ext.softmax_xent(z, np.zeros(4, np.int64), p, p, r)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(1, 1), (7, 10), (33, 1000), (512, 64), (3, 4099)])
def test_gpu_softmax_matches_cpu(n, k):
    import cupy

    z, y = _case(n, k, 5)
    z[0, 0] = 1e4
    loss, d, p = ops.softmax_xent(z, y)
    for be in gpu_backends():
        with using(be):
            gl, gd, gp = ops.softmax_xent(cupy.asarray(z), cupy.asarray(y.astype(np.int32)),
                                          dlogits_out=poison((n, k), xp=cupy), probs_out=poison((n, k), xp=cupy))
            assert abs(gl - loss) <= 1e-5 * max(1.0, abs(loss)), be.kernels
            assert_close(gp, p, tol=1e-6, eps=1e-5, what=be.kernels)
            assert_close(gd, d, tol=1e-6 / n, eps=1e-5, what=be.kernels)
            with pytest.raises(ValueError, match="labels"):
                ops.softmax_xent(cupy.asarray(z), cupy.full(n, k, cupy.int64))


def test_cuda_binding_checks_arguments_without_a_gpu():
    c = cuda_module_without_device()
    check_cuda_binding(lambda: c.softmax_xent(8, 16, 24, 32, 40, 4, 10))
    for args, name in (((0, 16, 24, 32, 40, 4, 10), "logits"), ((8, 0, 24, 32, 40, 4, 10), "labels"),
                       ((8, 16, 24, 32, 0, 4, 10), "row_loss"), ((8, 16, 24, 32, 40, 0, 10), "N"),
                       ((8, 16, 24, 32, 40, 4, 0), "K")):
        check_cuda_binding(lambda: c.softmax_xent(*args), ValueError, name)


def test_ops_call_the_compiled_binding_correctly():
    with using(compiled_backend_without_device()):
        check_cuda_binding(lambda: ops.softmax_xent(_z(), np.array([0, 1, 2, 0], np.int32)))
