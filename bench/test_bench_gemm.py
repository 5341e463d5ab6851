"""SGEMM sweep for the performance model, and NumPy matmul vs a direct cblas
call into the same OpenBLAS.

The sweep times C(m,n) = A(m,k) B(k,n) float32 row-major over a grid of
powers of two and in-between sizes plus the GEMM shapes of the cifar
reference net, and writes bench/results/sgemm_sweep.json:
{"machine": ..., "backend": "cpu"|"gpu", "records": [{m, n, k, seconds (median), gflops}, ...]}.

    pytest bench/test_bench_gemm.py --benchmark-only -s
"""
from __future__ import annotations

import ctypes
import glob
import itertools
import os

import numpy as np
import pytest
from conftest import adaptive_median, interleaved, machine_info, save_json

from engine import backend, ops

POW2 = [16, 64, 256, 1024]
BETWEEN = [48, 192, 768]
DIAG = [16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
# (m, n, k) of the cifar net at batch 32: fwd (M, N*P, K), dW (M, K, N*P), dX (K, N*P, M)
CIFAR = [(64, 32768, 27), (64, 27, 32768), (64, 32768, 576), (64, 576, 32768), (576, 32768, 64),
         (128, 8192, 576), (128, 576, 8192), (576, 8192, 128), (128, 8192, 1152), (128, 1152, 8192),
         (1152, 8192, 128), (256, 2048, 1152), (256, 1152, 2048), (1152, 2048, 256), (256, 2048, 2304),
         (256, 2304, 2048), (2304, 2048, 256), (32, 512, 4096), (32, 10, 512)]


def sweep_shapes() -> list[tuple[int, int, int]]:
    shapes = set(itertools.product(POW2, POW2, POW2)) | set(itertools.product(BETWEEN, BETWEEN, BETWEEN))
    shapes |= {(s, s, s) for s in DIAG} | set(CIFAR)
    return sorted(shapes, key=lambda s: s[0] * s[1] * s[2])


def run_sweep(xp, sync=None) -> list[dict]:
    rng = np.random.default_rng(0)
    recs = []
    for m, n, k in sweep_shapes():
        a = xp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        b = xp.asarray(rng.standard_normal((k, n), dtype=np.float32))
        c = xp.empty((m, n), np.float32)
        t = adaptive_median(lambda: ops.gemm(a, b, out=c), min_time=0.03, sync=sync)
        recs.append({"m": m, "n": n, "k": k, "seconds": t, "gflops": 2.0 * m * n * k / t / 1e9})
    return recs


@pytest.fixture(scope="module")
def cpu():
    return backend.set_backend("cpu")


def test_sgemm_sweep(benchmark, cpu, summary):
    recs = benchmark.pedantic(run_sweep, args=(np,), rounds=1, iterations=1)
    path = save_json("sgemm_sweep.json", {"machine": machine_info(), "backend": "cpu", "records": recs})
    best = max(recs, key=lambda r: r["gflops"])
    big = [r for r in recs if r["m"] == r["n"] == r["k"] == 1024][0]
    summary(f"sgemm sweep: {len(recs)} shapes -> {path.name}; 1024^3 {big['gflops']:.1f} GFLOP/s, "
            f"best {best['gflops']:.1f} at {best['m']}x{best['n']}x{best['k']}")


# ---- NumPy matmul vs cblas_sgemm called directly (what C++ would call) ----

def _openblas_sgemm():
    """cblas_sgemm of the OpenBLAS NumPy is linked with (ILP64, scipy_ prefix),
    via ctypes: the cost of calling BLAS from C++ without NumPy's dispatch."""
    libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(libdir, "*openblas*.so*")):
        lib = ctypes.CDLL(path)
        for sym, itype in (("scipy_cblas_sgemm64_", ctypes.c_int64), ("cblas_sgemm64_", ctypes.c_int64),
                           ("cblas_sgemm", ctypes.c_int)):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = None
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, itype, itype, itype, ctypes.c_float,
                               ctypes.c_void_p, itype, ctypes.c_void_p, itype, ctypes.c_float, ctypes.c_void_p,
                               itype]
                return fn
    return None


SGEMM = _openblas_sgemm()


@pytest.mark.skipif(SGEMM is None, reason="NumPy's OpenBLAS cblas_sgemm symbol not found")
@pytest.mark.parametrize("mnk", [(64, 64, 64), (128, 1024, 576), (256, 2048, 2304), (64, 32768, 576), (1024, 1024, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
def test_numpy_matmul_vs_cblas(benchmark, cpu, mnk, summary):
    m, n, k = mnk
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c1, c2 = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c2.ctypes.data
    cblas = lambda: SGEMM(101, 111, 111, m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)  # noqa: E731
    numpy = lambda: np.matmul(a, b, out=c1)  # noqa: E731
    t = interleaved({"numpy": numpy, "cblas": cblas}, reps=15)
    np.testing.assert_allclose(c1, c2, rtol=1e-4, atol=1e-3)
    benchmark.extra_info.update({"numpy_s": t["numpy"], "cblas_s": t["cblas"]})
    benchmark(numpy)
    fl = 2.0 * m * n * k
    summary(f"sgemm {m}x{n}x{k}: numpy.matmul {fl / t['numpy'] / 1e9:6.1f} GFLOP/s, direct cblas "
            f"{fl / t['cblas'] / 1e9:6.1f} GFLOP/s (numpy/cblas time {t['numpy'] / t['cblas']:.3f})")


@pytest.mark.gpu
def test_sgemm_sweep_gpu(benchmark, summary):
    import cupy
    sync = cupy.cuda.get_current_stream().synchronize
    try:
        backend.set_backend("gpu")
        recs = benchmark.pedantic(run_sweep, args=(cupy, sync), rounds=1, iterations=1)
        save_json("sgemm_sweep_gpu.json", {"machine": machine_info(), "backend": "gpu", "records": recs})
        big = [r for r in recs if r["m"] == r["n"] == r["k"] == 2048][0]
        summary(f"GPU sgemm sweep: {len(recs)} shapes; 2048^3 {big['gflops']:.0f} GFLOP/s")
    finally:
        backend.set_backend("cpu")
