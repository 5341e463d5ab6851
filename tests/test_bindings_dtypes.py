"""Bindings accept equivalent dtype objects, not only NumPy's canonical ones:
an unpickled dtype (a dataset cached to disk) is equal to float32 but is a
different object."""
import pickle

import numpy as np
import pytest

from engine import ops


def _twin(dt):
    t = pickle.loads(pickle.dumps(np.dtype(dt)))
    assert t == np.dtype(dt) and t is not np.dtype(dt)
    return t


def test_float32_twin_reaches_kernels():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    y_ref, _ = ops.maxpool_forward(x, 2)
    y, _ = ops.maxpool_forward(x.view(_twin(np.float32)), 2)
    np.testing.assert_array_equal(y, y_ref)


@pytest.mark.parametrize("ldt", [np.int32, np.int64])
def test_label_twin_reaches_softmax(ldt):
    logits = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    labels = np.array([0, 4, 2], dtype=ldt)
    ref = ops.softmax_xent(logits, labels)[0]
    assert ops.softmax_xent(logits, labels.view(_twin(ldt)))[0] == ref


def test_uint8_twin_reaches_deform():
    x = np.arange(2 * 1 * 4 * 4, dtype=np.uint8).reshape(2, 1, 4, 4)
    params = ops.identity_params(2)
    mean, std = np.zeros(1, np.float32), np.ones(1, np.float32)
    ref = ops.deform(x, params, (4, 4), mean, std)
    got = ops.deform(x.view(_twin(np.uint8)), params, (4, 4), mean, std)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(ref, x / np.float32(255), rtol=1e-6)
