"""Vector ops on flat float32 buffers (axpy, scale, sum_into, momentum_step,
sgd_update) against float64 NumPy, bad input, and CUDA vs CPU on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ops
from k2_support import (assert_close, check_cuda_binding, compiled_backend_without_device, cpu,
                        cuda_module_without_device, emulated_gpu_backend, gpu_backends, poison, using)

# Sizes below and above the OpenMP threshold (65536) and odd tails.
SIZES = st.one_of(st.integers(0, 300), st.sampled_from([65535, 65536, 100_003, 1 << 18]))
SCALARS = st.floats(-4, 4, allow_nan=False)


@pytest.fixture(autouse=True)
def _cpu():
    cpu()


def _vec(n, seed):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@settings(max_examples=25, deadline=None)
@given(n=SIZES, alpha=SCALARS, seed=st.integers(0, 2**31))
def test_axpy_and_scale(n, alpha, seed):
    x, y = _vec(n, seed), _vec(n, seed + 1)
    ref = y.astype(np.float64) + np.float64(np.float32(alpha)) * x
    assert ops.axpy(alpha, x, y) is y
    assert_close(y, ref, what="axpy")
    ref = x.astype(np.float64) * np.float64(np.float32(alpha))
    ops.scale(alpha, x)
    assert_close(x, ref, what="scale")


@settings(max_examples=25, deadline=None)
@given(n=SIZES, nbufs=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_sum_into(n, nbufs, seed):
    bufs = [_vec(n, seed + i) for i in range(nbufs)]
    ref = np.sum([b.astype(np.float64) for b in bufs], axis=0) if n else np.zeros(0)
    out = poison(n)
    ops.sum_into(out, bufs)
    assert_close(out, ref, tol=1e-5, what="sum_into")
    # accumulate into the first buffer in place
    ops.sum_into(bufs[0], bufs)
    assert_close(bufs[0], ref, tol=1e-5, what="sum_into in place")


def test_sum_into_is_left_to_right_float32():
    """Deterministic order: exactly ((b0 + b1) + b2) + ... in float32."""
    bufs = [_vec(70_001, s) * 10 ** (s % 3) for s in range(10)]
    want = bufs[0].copy()
    for b in bufs[1:]:
        want = want + b
    out = poison(70_001)
    ops.sum_into(out, bufs)
    assert np.array_equal(out, want)


@settings(max_examples=25, deadline=None)
@given(n=SIZES, nu=st.floats(0, 0.999), seed=st.integers(0, 2**31))
def test_momentum_step(n, nu, seed):
    w, d, u = _vec(n, seed), _vec(n, seed + 1), _vec(n, seed + 2)
    nu32 = np.float64(np.float32(nu))
    d_ref = nu32 * d.astype(np.float64) + u
    w_ref = w.astype(np.float64) + d_ref
    ops.momentum_step(w, d, u, nu)
    assert_close(d, d_ref, what="delta")
    assert_close(w, w_ref, tol=1e-5, what="w")


@settings(max_examples=25, deadline=None)
@given(n=SIZES, lr=st.floats(0, 1), mom=st.floats(0, 0.99), wd=st.floats(0, 0.1),
       seed=st.integers(0, 2**31))
def test_sgd_update(n, lr, mom, wd, seed):
    w, v, g = _vec(n, seed), _vec(n, seed + 1), _vec(n, seed + 2)
    f = lambda a: np.float64(np.float32(a))  # noqa: E731 - the kernel sees float32 scalars
    v_ref = f(mom) * v - f(lr) * (g.astype(np.float64) + f(wd) * w)
    w_ref = w.astype(np.float64) + v_ref
    ops.sgd_update(w, v, g, lr, mom, wd)
    assert_close(v, v_ref, tol=1e-5, what="v")
    assert_close(w, w_ref, tol=1e-5, what="w")


def test_sgd_two_steps_match_the_recurrence():
    w, g = _vec(1000, 1), _vec(1000, 2)
    v = np.zeros_like(w)
    w64, v64 = w.astype(np.float64), np.zeros(1000)
    for _ in range(2):
        v64 = 0.9 * v64 - 0.1 * (g + 0.01 * w64)
        w64 = w64 + v64
        ops.sgd_update(w, v, g, 0.1, 0.9, 0.01)
    assert_close(w, w64, tol=1e-5, what="w after 2 steps")


# ---- bad input ----------------------------------------------------------------

def _f(n=8):
    return np.zeros(n, np.float32)


BAD = [
    (lambda: ops.axpy(1.0, np.zeros(8), _f()), TypeError, "x"),
    (lambda: ops.axpy(1.0, _f(), np.zeros(8, np.float16)), TypeError, "y"),
    (lambda: ops.axpy(1.0, [0.0] * 8, _f()), TypeError, "x"),
    (lambda: ops.axpy(1.0, _f(), _f(9)), ValueError, "y"),
    (lambda: ops.axpy(1.0, _f(16)[::2], _f()), ValueError, "x"),
    (lambda: ops.axpy(1.0, np.zeros((2, 4), np.float32), _f()), ValueError, "x"),
    (lambda: ops.axpy(float("nan"), _f(), _f()), ValueError, "alpha"),
    (lambda: ops.axpy("1", _f(), _f()), TypeError, "alpha"),
    (lambda: ops.axpy(1e39, _f(), _f()), ValueError, "alpha"),
    (lambda: ops.scale(float("inf"), _f()), ValueError, "alpha"),
    (lambda: ops.sum_into(_f(), []), ValueError, "bufs"),
    (lambda: ops.sum_into(_f(), _f()), TypeError, "bufs"),
    (lambda: ops.sum_into(_f(), [_f(), _f(7)]), ValueError, r"bufs\[1\]"),
    (lambda: ops.sum_into(_f(), [_f(), np.zeros(8, np.int32)]), TypeError, r"bufs\[1\]"),
    (lambda: ops.momentum_step(_f(), _f(), _f(9), 0.9), ValueError, "upd"),
    (lambda: ops.momentum_step(_f(), _f(), _f(), None), TypeError, "nu"),
    (lambda: ops.sgd_update(_f(), _f(), _f(), 0.1, 0.9, float("nan")), ValueError, "weight_decay"),
    (lambda: ops.sgd_update(_f(), _f(5), _f(), 0.1, 0.9, 0.0), ValueError, "v"),
]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return emulated_gpu_backend(tmp_path_factory.mktemp("emulated"), ("vector",))


@pytest.mark.parametrize("path", ["cpp", "gpu-python-checks"])
@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_names_the_argument(call, exc, name, path, request):
    with using(cpu() if path == "cpp" else request.getfixturevalue("emulated")):
        with pytest.raises(exc, match=name):
            call()


def test_cuda_sources_on_the_cpu_match_the_cpu_twins(emulated):
    """kernels/vector.cu run through the ops' RawModule path (sum_into in
    passes of 8 with the running sum as b0) gives the CPU twins' bits."""
    n = 70_001
    bufs = [_vec(n, s) * 10 ** (s % 4) for s in range(19)]
    x, y, w, d, u = (_vec(n, 100 + s) for s in range(5))
    want = {"sum": ops.sum_into(poison(n), bufs), "axpy": ops.axpy(0.3, x, y.copy()),
            "scale": ops.scale(-2.5, x.copy())}
    w1, d1, w2, v2 = w.copy(), d.copy(), w.copy(), d.copy()
    ops.momentum_step(w1, d1, u, 0.9)
    ops.sgd_update(w2, v2, u, 0.05, 0.9, 1e-3)
    with using(emulated):
        assert np.array_equal(ops.sum_into(poison(n), bufs), want["sum"])
        acc = bufs[0].copy()
        assert np.array_equal(ops.sum_into(acc, [acc] + bufs[1:]), want["sum"])  # into bufs[0]
        assert np.array_equal(ops.axpy(0.3, x, y.copy()), want["axpy"])
        assert np.array_equal(ops.scale(-2.5, x.copy()), want["scale"])
        ew, ed = w.copy(), d.copy()
        ops.momentum_step(ew, ed, u, 0.9)
        assert np.array_equal(ew, w1) and np.array_equal(ed, d1)
        ew, ev = w.copy(), d.copy()
        ops.sgd_update(ew, ev, u, 0.05, 0.9, 1e-3)
        assert np.array_equal(ew, w2) and np.array_equal(ev, v2)
        a = np.zeros(16, np.float32)
        with pytest.raises(ValueError, match="overlap"):
            ops.axpy(1.0, a[:8], a[4:12])
        with pytest.raises(ValueError, match="overlap"):
            ops.sum_into(a[:8], [_f(), a[:8]])


def test_aliasing_is_refused_except_accumulating_into_bufs0():
    a = np.zeros(16, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        ops.axpy(1.0, a[:8], a[4:12])
    with pytest.raises(ValueError, match="overlap"):
        ops.momentum_step(a[:8], a[:8], _f(), 0.9)
    with pytest.raises(ValueError, match="overlap"):
        ops.sum_into(a[:8], [_f(), a[:8]])
    ro = _f()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="y"):
        ops.axpy(1.0, _f(), ro)


def test_bindings_check_arguments_themselves():
    """The C++ functions validate too (they are public in engine._sprint_cpu)."""
    from engine import _sprint_cpu as ext
    with pytest.raises(TypeError, match="x"):
        ext.axpy(1.0, np.zeros(8), _f())
    with pytest.raises(ValueError, match="y"):
        ext.axpy(1.0, _f(), _f(9))
    with pytest.raises(ValueError, match="alpha"):
        ext.axpy(float("inf"), _f(), _f())
    with pytest.raises(ValueError, match="C-contiguous"):
        ext.scale(1.0, _f(16)[::2])
    with pytest.raises(ValueError, match=r"bufs\[1\]"):
        ext.sum_into(_f(), [_f(), _f(3)])
    with pytest.raises(ValueError, match="bufs"):
        ext.sum_into(_f(), [])
    with pytest.raises(ValueError, match="overlap"):
        a = _f(16)
        ext.sum_into(a[:8], [_f(), a[:8]])
    with pytest.raises(ValueError, match="overlap"):
        a = _f(16)
        ext.sgd_update(a[:8], a[8:], a[4:12], 0.1, 0.9, 0.0)


# ---- GPU: compiled module and RawModule against the CPU kernels -------------

@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 1000, 65537, 1 << 20])
def test_gpu_vector_ops_match_cpu(n):
    import cupy

    x, y, w, d, u = (_vec(n, s) for s in range(5))
    bufs = [_vec(n, 10 + s) for s in range(11)]  # > 8: two passes on the GPU
    ref = {}
    ref["axpy"] = ops.axpy(0.5, x, y.copy())
    ref["scale"] = ops.scale(-1.5, x.copy())
    ref["sum"] = ops.sum_into(np.empty(n, np.float32), bufs)
    w1, d1 = w.copy(), d.copy()
    ops.momentum_step(w1, d1, u, 0.9)
    w2, v2 = w.copy(), d.copy()
    ops.sgd_update(w2, v2, u, 0.05, 0.9, 1e-3)
    for be in gpu_backends():
        with using(be):
            g = cupy.asarray
            assert_close(ops.axpy(0.5, g(x), g(y)), ref["axpy"], what=be.kernels)
            assert_close(ops.scale(-1.5, g(x)), ref["scale"], what=be.kernels)
            out = poison(n, xp=cupy)
            assert np.array_equal(ops.sum_into(out, [g(b) for b in bufs]).get(), ref["sum"]), be.kernels
            gw, gd = g(w), g(d)
            ops.momentum_step(gw, gd, g(u), 0.9)
            assert_close(gw, w1, what=be.kernels)
            assert_close(gd, d1, what=be.kernels)
            gw, gv = g(w), g(d)
            ops.sgd_update(gw, gv, g(u), 0.05, 0.9, 1e-3)
            assert_close(gw, w2, what=be.kernels)
            assert_close(gv, v2, what=be.kernels)


def test_cuda_bindings_check_arguments_without_a_gpu():
    c = cuda_module_without_device()
    for call in (lambda: c.axpy(0.5, 8, 16, 10), lambda: c.scale(2.0, 8, 10),
                 lambda: c.sum_into(8, [16, 24] + [32] * 9, 10),  # 11 buffers: two launches
                 lambda: c.momentum_step(8, 16, 24, 0.9, 10), lambda: c.sgd_update(8, 16, 24, 0.1, 0.9, 0.0, 10)):
        check_cuda_binding(call)
    for call, exc, name in ((lambda: c.axpy(0.5, 0, 16, 10), ValueError, "x"),
                            (lambda: c.axpy(float("inf"), 8, 16, 10), ValueError, "alpha"),
                            (lambda: c.scale(1.0, 8, -1), ValueError, "n"),
                            (lambda: c.sum_into(8, [], 10), ValueError, "bufs"),
                            (lambda: c.sum_into(8, [16, 8], 10), ValueError, r"bufs\[1\]"),
                            (lambda: c.sum_into(8, [16, -3], 10), ValueError, r"bufs\[1\]"),
                            (lambda: c.sum_into(8, [16, "a"], 10), TypeError, r"bufs\[1\]"),
                            (lambda: c.momentum_step(8, 0, 24, 0.9, 10), ValueError, "delta"),
                            (lambda: c.sgd_update(8, 16, 24, 0.1, float("nan"), 0.0, 10), ValueError, "momentum")):
        check_cuda_binding(call, exc, name)


def test_ops_call_the_compiled_bindings_correctly():
    with using(compiled_backend_without_device()):
        for call in (lambda: ops.axpy(0.5, _f(), _f()), lambda: ops.scale(2.0, _f()),
                     lambda: ops.sum_into(_f(), [_f() for _ in range(11)]),
                     lambda: ops.momentum_step(_f(), _f(), _f(), 0.9),
                     lambda: ops.sgd_update(_f(), _f(), _f(), 0.1, 0.9, 1e-4)):
            check_cuda_binding(call)
