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


# ---- the engine's own SGEMM (csrc/gemm.h): every micro-kernel this CPU runs ----

def _ext():
    from engine import backend
    return backend.set_backend("cpu").ext


ISAS = ["avx512", "avx2", "generic"]


def _bound(A, B, alpha, beta, c0, k):
    """Rigorous float32 error bound of any summation order: gamma_(k+2) times
    the absolute products (Higham), as float64."""
    absdot = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    return (k + 2) * 1.2e-7 * (abs(alpha) * absdot + abs(beta) * np.abs(c0)) + 1e-30


# m, n, k: 1, primes, around the micro-tiles (8x48, 4x24, 4x16), past the
# cache blocks (KC 64..512, MC, NC 4096), k = 0, and sizes that take the
# threaded and the k-split plans.
EDGE = [(1, 1, 1), (1, 1, 0), (5, 3, 0), (2, 3, 5), (7, 13, 17), (8, 32, 1), (9, 33, 2), (4, 24, 3), (3, 23, 31),
        (8, 48, 1), (9, 49, 2), (17, 95, 300),
        (31, 97, 64), (33, 95, 513), (3, 4100, 3), (1031, 5, 3), (64, 100, 600), (5, 7, 20011), (1, 257, 1000),
        (97, 1, 1001)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("mnk", EDGE, ids=lambda s: "x".join(map(str, s)))
def test_engine_sgemm_edges(isa, mnk):
    ext = _ext()
    if isa not in ext.gemm_info("")["supported"]:
        pytest.skip(f"this CPU cannot run {isa}")
    m, n, k = mnk
    rng = np.random.default_rng(m * 1000003 + n * 1009 + k)
    for ta, tb, alpha, beta in ((False, False, 1.0, 0.0), (True, False, -0.5, 1.0), (False, True, 2.0, 0.25),
                                (True, True, 0.75, -1.5)):
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        c0 = rng.standard_normal((m, n)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32) if beta == 0.0 else c0.copy()
        ext.sgemm(a, b, out, ta, tb, alpha, beta, isa)
        A, B = (a.T if ta else a), (b.T if tb else b)
        ref = alpha * (A.astype(np.float64) @ B.astype(np.float64)) + beta * c0.astype(np.float64)
        assert not np.isnan(out).any(), (ta, tb)
        assert np.all(np.abs(out - ref) <= _bound(A, B, alpha, beta, c0, k)), (ta, tb, np.abs(out - ref).max())


@pytest.mark.parametrize("isa", ISAS)
def test_engine_sgemm_env_selects_isa(isa, monkeypatch):
    """$SPRINT_CPU_ISA picks the kernel per call (gemm_info reports it); an
    ISA the CPU lacks or an unknown name is a ValueError, never a crash."""
    ext = _ext()
    monkeypatch.setenv("SPRINT_GEMM", "engine")
    monkeypatch.setenv("SPRINT_CPU_ISA", isa)
    if isa not in ext.gemm_info("generic")["supported"]:
        with pytest.raises(ValueError, match="SPRINT_CPU_ISA"):
            ext.gemm_info("")
        return
    info = ext.gemm_info("")
    assert info["isa"] == isa
    assert info["kc"] % 8 == 0 and info["mc"] % info["mr"] == 0 and info["nc"] % info["nr"] == 0
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((45, 70)).astype(np.float32), rng.standard_normal((70, 37)).astype(np.float32)
    got = ops.gemm(a, b)
    assert np.all(np.abs(got - a.astype(np.float64) @ b) <= _bound(a, b, 1.0, 0.0, 0.0, 70))


def test_engine_sgemm_bad_isa(monkeypatch):
    ext = _ext()
    a = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="expected avx512, avx2, generic"):
        ext.sgemm(a, a, np.empty((2, 2), np.float32), isa="sse9")
    monkeypatch.setenv("SPRINT_GEMM", "engine")
    monkeypatch.setenv("SPRINT_CPU_ISA", "nope")
    with pytest.raises(ValueError, match="SPRINT_CPU_ISA=nope"):
        ops.gemm(a, a)


def test_engine_sgemm_isa_in_fresh_process():
    """The variable read by a process that never set it itself (what a user does)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, SPRINT_CPU_ISA="generic", SPRINT_GEMM="engine")
    code = ("import numpy as np; from engine import backend, ops; be = backend.set_backend('cpu'); "
            "a = np.arange(12, dtype=np.float32).reshape(3, 4); "
            "assert np.array_equal(ops.gemm(a, a, trans_b=True), (a.astype(np.float64) @ a.T).astype(np.float32)); "
            "print(be.ext.gemm_info('')['isa'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "generic"


@pytest.mark.parametrize("isa", ISAS)
def test_engine_sgemm_rows_do_not_depend_on_the_shape(isa):
    """Any block of rows (a micro-batch) or columns gives bitwise the same
    elements as the whole product: one summation order per element."""
    ext = _ext()
    if isa not in ext.gemm_info("")["supported"]:
        pytest.skip(f"this CPU cannot run {isa}")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((300, 700)).astype(np.float32)
    b = rng.standard_normal((700, 211)).astype(np.float32)
    full = np.empty((300, 211), np.float32)
    ext.sgemm(a, b, full, False, False, 1.0, 0.0, isa)
    for r0, r1, c0, c1 in ((0, 1, 0, 211), (1, 12, 0, 211), (12, 300, 0, 211), (5, 77, 3, 50), (0, 300, 100, 101)):
        part = np.empty((r1 - r0, c1 - c0), np.float32)
        ext.sgemm(np.ascontiguousarray(a[r0:r1]), np.ascontiguousarray(b[:, c0:c1]), part, False, False, 1.0, 0.0,
                  isa)
        assert np.array_equal(part, full[r0:r1, c0:c1]), (r0, r1, c0, c1)


@pytest.mark.parametrize("isa", ISAS)
def test_engine_sgemm_beta_one_continues_the_sums_exactly(isa):
    """C = A[:, :k1] @ B[:k1], then C += A[:, k1:] @ B[k1:] with beta = 1, is
    the whole product bit for bit (k = samples: gradients summed micro-batch
    by micro-batch equal the whole batch's), for k cut inside and across the
    cache blocks and for transposed operands."""
    ext = _ext()
    if isa not in ext.gemm_info("")["supported"]:
        pytest.skip(f"this CPU cannot run {isa}")
    rng = np.random.default_rng(6)
    m, n, k = 37, 101, 1000
    at = rng.standard_normal((k, m)).astype(np.float32)   # stored k x m (trans_a), as dW = dy^T @ x
    b = rng.standard_normal((k, n)).astype(np.float32)
    full = np.full((m, n), np.nan, np.float32)
    ext.sgemm(at, b, full, True, False, 1.0, 0.0, isa)
    for cuts in ((1,), (11, 500), (193, 194, 777)):
        got = np.full((m, n), np.nan, np.float32)
        lo = 0
        for hi in cuts + (k,):
            ext.sgemm(np.ascontiguousarray(at[lo:hi]), np.ascontiguousarray(b[lo:hi]), got, True, False, 1.0,
                      0.0 if lo == 0 else 1.0, isa)
            lo = hi
        assert np.array_equal(got, full), cuts


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 15, 16, 17, 47, 48, 49, 97])
def test_engine_sgemm_transposed_b_packs_the_same_panels(isa, n):
    """op(B) = B^T (an FC layer's x @ W^T, packed by register transposes of
    L columns x L k, the k tail element by element) gives bitwise the
    product of the same matrix stored untransposed: the same panels, the same
    chains. k crosses whole transposes, their tail and the cache block."""
    ext = _ext()
    if isa not in ext.gemm_info("")["supported"]:
        pytest.skip(f"this CPU cannot run {isa}")
    rng = np.random.default_rng(n)
    for m, k in ((1, 1), (7, 15), (9, 16), (13, 17), (33, 37), (8, 1000)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        want = np.full((m, n), np.nan, np.float32)
        got = np.full((m, n), np.nan, np.float32)
        ext.sgemm(a, b, want, False, False, 1.0, 0.0, isa)
        ext.sgemm(a, np.ascontiguousarray(b.T), got, False, True, 1.0, 0.0, isa)
        assert np.array_equal(got, want), (m, k)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert np.all(np.abs(got - ref) <= _bound(a, b, 1.0, 0.0, np.zeros_like(got), k)), (m, k)
