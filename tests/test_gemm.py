"""gemm (row-major, transposes, alpha/beta) against float64 matmul."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ops


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(0, 40), st.booleans(), st.booleans(),
       st.sampled_from([1.0, -0.5, 2.0]), st.sampled_from([0.0, 1.0, 0.25]), st.integers(0, 999))
def test_gemm_matches_float64(m, n, k, ta, tb, alpha, beta, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32) if beta == 0.0 else c0.copy()
    got = ops.gemm(a, b, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta, out=out)
    assert got is out
    A = a.T if ta else a
    B = b.T if tb else b
    ref = alpha * (A.astype(np.float64) @ B.astype(np.float64)) + (beta * c0 if beta else 0.0)
    assert not np.isnan(got).any()
    tol = 1e-5 * (1 + k) * (1 + np.abs(ref))
    assert np.all(np.abs(got - ref) <= tol)


def test_gemm_allocates_out():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(ops.gemm(a, b), a @ b)


A = np.zeros((3, 4), np.float32)
B = np.zeros((4, 5), np.float32)


@pytest.mark.parametrize("call,exc,name", [
    (lambda: ops.gemm(A.astype(np.float64), B), TypeError, "a"),
    (lambda: ops.gemm(A, B[None]), ValueError, "b"),
    (lambda: ops.gemm(A, B.T), ValueError, "b"),
    (lambda: ops.gemm(A, B, trans_a=True), ValueError, "b"),
    (lambda: ops.gemm(A, B, trans_a="yes"), TypeError, "trans_a"),
    (lambda: ops.gemm(A, B, alpha=float("nan")), ValueError, "alpha"),
    (lambda: ops.gemm(A, B, beta=1.0), ValueError, "out"),
    (lambda: ops.gemm(A, B, out=np.zeros((3, 4), np.float32)), ValueError, "out"),
    (lambda: ops.gemm(A, B, out=np.zeros((5, 3), np.float32).T), ValueError, "out"),
    (lambda: ops.gemm(A[:, :3], B[:3]), ValueError, "a"),
])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_out_must_not_alias_inputs():
    sq = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="out"):
        ops.gemm(sq, np.ones((4, 4), np.float32), out=sq)


@pytest.mark.gpu
def test_gpu_gemm_matches_cpu():
    import cupy

    from engine import backend
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 29)).astype(np.float32)
    b = rng.standard_normal((41, 29)).astype(np.float32)
    c = rng.standard_normal((37, 41)).astype(np.float32)
    ref = 0.5 * a.astype(np.float64) @ b.T.astype(np.float64) + 2.0 * c
    try:
        backend.set_backend("gpu")
        out = cupy.asarray(c)
        ops.gemm(cupy.asarray(a), cupy.asarray(b), trans_b=True, alpha=0.5, beta=2.0, out=out)
        np.testing.assert_allclose(out.get(), ref, rtol=1e-4, atol=1e-4)
        out2 = ops.gemm(cupy.asarray(a), cupy.asarray(b), trans_b=True)
        np.testing.assert_allclose(out2.get(), a.astype(np.float64) @ b.T, rtol=1e-4, atol=1e-4)
    finally:
        backend.set_backend("cpu")
