"""im2col / col2im and the layout kernels against plain float64 references."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine import ops
from engine.backend import get_backend

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ref_im2col(x, kh, kw, sh, sw, ph, pw):
    """Plain loops: cols[(c,i,j), (n,oh,ow)] = x[n,c,oh*sh-ph+i, ow*sw-pw+j] or 0."""
    N, C, H, W = x.shape
    OH, OW = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    cols = np.zeros((C * kh * kw, N * OH * OW), np.float64)
    for c in range(C):
        for i in range(kh):
            for j in range(kw):
                row = (c * kh + i) * kw + j
                for n in range(N):
                    for oh in range(OH):
                        h = oh * sh - ph + i
                        if not 0 <= h < H:
                            continue
                        for ow in range(OW):
                            w = ow * sw - pw + j
                            if 0 <= w < W:
                                cols[row, (n * OH + oh) * OW + ow] = x[n, c, h, w]
    return cols


def ref_col2im(cols, shape, kh, kw, sh, sw, ph, pw):
    """Plain loops, float64: x[n,c,h,w] += every cols entry im2col copied it to."""
    N, C, H, W = shape
    OH, OW = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    x = np.zeros(shape, np.float64)
    for c in range(C):
        for i in range(kh):
            for j in range(kw):
                row = (c * kh + i) * kw + j
                for n in range(N):
                    for oh in range(OH):
                        h = oh * sh - ph + i
                        for ow in range(OW):
                            w = ow * sw - pw + j
                            if 0 <= h < H and 0 <= w < W:
                                x[n, c, h, w] += cols[row, (n * OH + oh) * OW + ow]
    return x


@st.composite
def windows(draw, max_hw=9):
    """(x_shape, kh, kw, sh, sw, ph, pw): odd sizes, stride > 1, pad > k/2, batch 1, C 1."""
    N = draw(st.integers(1, 3))
    C = draw(st.integers(1, 3))
    H = draw(st.integers(1, max_hw))
    W = draw(st.integers(1, max_hw))
    kh = draw(st.sampled_from([1, 2, 3, 5, 11]))
    kw = draw(st.sampled_from([1, 2, 3, 5, 11]))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, kh + 1)), draw(st.integers(0, kw + 1))
    assume(H + 2 * ph >= kh and W + 2 * pw >= kw)
    return (N, C, H, W), kh, kw, sh, sw, ph, pw


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@SETTINGS
@given(windows())
def test_im2col_matches_reference_exactly(win):
    shape, kh, kw, sh, sw, ph, pw = win
    x = _rand(shape)
    ref = ref_im2col(x, kh, kw, sh, sw, ph, pw)
    out = np.full(ref.shape, np.nan, np.float32)
    cols = ops.im2col(x, kh, kw, (sh, sw), (ph, pw), out=out)
    assert cols is out
    assert not np.isnan(cols).any(), "some cols element was not written"
    assert np.array_equal(cols, ref.astype(np.float32))


@SETTINGS
@given(windows())
def test_col2im_matches_reference_and_is_adjoint(win):
    shape, kh, kw, sh, sw, ph, pw = win
    x = _rand(shape, 1)
    K = shape[1] * kh * kw
    OH, OW = (shape[2] + 2 * ph - kh) // sh + 1, (shape[3] + 2 * pw - kw) // sw + 1
    c = _rand((K, shape[0] * OH * OW), 2)
    ref = ref_col2im(c.astype(np.float64), shape, kh, kw, sh, sw, ph, pw)
    out = np.full(shape, np.nan, np.float32)
    got = ops.col2im(c, shape, kh, kw, (sh, sw), (ph, pw), out=out)
    assert not np.isnan(got).any(), "some x element was not written"
    # float32 sums of at most kh*kw terms
    tol = 1e-6 * kh * kw * (1 + np.abs(ref))
    assert np.all(np.abs(got - ref) <= tol)
    # <im2col(x), c> == <x, col2im(c)>
    lhs = float(np.dot(ops.im2col(x, kh, kw, (sh, sw), (ph, pw)).ravel().astype(np.float64), c.ravel()))
    rhs = float(np.dot(x.ravel().astype(np.float64), got.ravel().astype(np.float64)))
    assert abs(lhs - rhs) <= 1e-5 * (1 + np.abs(c).sum() * np.abs(x).max())


def test_col2im_deterministic_across_thread_counts():
    ext = get_backend().ext
    shape, k, s, p = (8, 32, 33, 31), 3, 1, 1  # large enough to be split over threads
    c = _rand((32 * 9, 8 * 33 * 31), 3)
    before = ext.get_num_threads()
    try:
        ext.set_num_threads(1)
        a = ops.col2im(c, shape, k, k, s, p)
        ext.set_num_threads(2)
        b = ops.col2im(c, shape, k, k, s, p)
    finally:
        ext.set_num_threads(before)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kh,kw,stride,pad", [(1, 3, (1, 1), (0, 1)), (3, 1, (2, 1), (2, 0)),
                                              (11, 11, (4, 4), (2, 2)), (1, 1, (1, 1), (0, 0))])
def test_named_kernels(kh, kw, stride, pad):
    x = _rand((2, 3, 23, 19), 4)
    ref = ref_im2col(x, kh, kw, *stride, *pad)
    assert np.array_equal(ops.im2col(x, kh, kw, stride, pad), ref.astype(np.float32))


def test_layout_kernels():
    ext = get_backend().ext
    rng = np.random.default_rng(5)
    B, M, P = 3, 4, 7
    yt = rng.standard_normal((M, B * P)).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    y = np.full((B, M, P), np.nan, np.float32)
    ext.cnhw_to_nchw(yt, bias, y)
    assert np.array_equal(y, yt.reshape(M, B, P).transpose(1, 0, 2) + bias[None, :, None])
    ext.cnhw_to_nchw(yt, None, y)
    assert np.array_equal(y, yt.reshape(M, B, P).transpose(1, 0, 2))
    out = np.full((M, B * P), np.nan, np.float32)
    db = np.full(M, np.nan, np.float32)
    ext.nchw_to_cnhw(y, out, db, False)
    assert np.array_equal(out, yt)
    np.testing.assert_allclose(db, y.astype(np.float64).sum(axis=(0, 2)), rtol=1e-6, atol=1e-6)
    ext.channel_sum(y, db, True)
    np.testing.assert_allclose(db, 2 * y.astype(np.float64).sum(axis=(0, 2)), rtol=1e-6, atol=1e-6)
    z = y.copy()
    ext.add_channel_bias(z, bias)
    assert np.array_equal(z, y + bias[None, :, None])


# ---- bad input ------------------------------------------------------------

X = np.zeros((2, 3, 5, 5), np.float32)


@pytest.mark.parametrize("call,exc,name", [
    (lambda: ops.im2col(X.astype(np.float64), 3, 3), TypeError, "x"),
    (lambda: ops.im2col(X[0], 3, 3), ValueError, "x"),
    (lambda: ops.im2col(X[:, :, ::2], 3, 3), ValueError, "x"),
    (lambda: ops.im2col(X[:0], 3, 3), ValueError, "x"),
    (lambda: ops.im2col(X.tolist(), 3, 3), TypeError, "x"),
    (lambda: ops.im2col(X, 0, 3), ValueError, "kh"),
    (lambda: ops.im2col(X, 3, 2.0), TypeError, "kw"),
    (lambda: ops.im2col(X, 3, 3, pad=-1), ValueError, "pad"),
    (lambda: ops.im2col(X, 3, 3, stride=(1, 0)), ValueError, "stride"),
    (lambda: ops.im2col(X, 3, 3, stride=True), TypeError, "stride"),
    (lambda: ops.im2col(X, 9, 3, pad=1), ValueError, "kernel"),
    (lambda: ops.im2col(X, 3, 3, out=np.zeros((27, 5), np.float32)), ValueError, "out"),
    (lambda: ops.col2im(np.zeros((27, 50), np.float32), (2, 3, 5, 5), 3, 3), ValueError, "cols"),
    (lambda: ops.col2im(np.zeros((27, 18), np.float32), (2, 3, 5), 3, 3), ValueError, "x_shape"),
    (lambda: ops.col2im(np.zeros((27, 18), np.int32), (2, 3, 5, 5), 3, 3), TypeError, "cols"),
])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


def test_binding_rejects_bad_arrays():
    ext = get_backend().ext
    cols = np.zeros((27, 18), np.float32)
    with pytest.raises(ValueError, match="cols"):
        ext.im2col(X, np.zeros((27, 17), np.float32), 3, 3, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="cols"):
        ext.im2col(X, np.zeros((27, 36), np.float32)[:, ::2], 3, 3, 1, 1, 0, 0)
    with pytest.raises(TypeError, match="x"):
        ext.im2col([1, 2], cols, 3, 3, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="ph"):
        ext.im2col(X, cols, 3, 3, 1, 1, -1, 0)
    with pytest.raises(ValueError, match="ph"):
        ext.im2col(X, cols, 3, 3, 1, 1, 1 << 40, 0)
    ro = np.zeros((27, 18), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="cols"):
        ext.im2col(X, ro, 3, 3, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="overlap"):
        buf = np.zeros(2 * 3 * 5 * 5, np.float32)
        ext.col2im(buf[:27 * 2].reshape(27, 2), buf.reshape(2, 3, 5, 5), 3, 3, 3, 3, 0, 0)


# ---- GPU: compiled module and RawModule against the CPU kernels -------------

def _gpu_backends():
    import cupy

    from engine.backend import Backend, RawKernels
    out = [Backend("gpu", cupy, RawKernels(cupy), "rawmodule")]
    try:
        from engine import _sprint_cuda
        if _sprint_cuda.device_count() > 0:
            out.append(Backend("gpu", cupy, _sprint_cuda, "compiled"))
    except ImportError:
        pass
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("win", [((3, 4, 13, 11), 3, 3, 1, 1, 1, 1), ((2, 3, 9, 17), 5, 3, 2, 1, 3, 0),
                                 ((1, 1, 7, 7), 1, 1, 1, 1, 0, 0), ((2, 2, 23, 23), 11, 11, 4, 4, 2, 2)])
def test_gpu_im2col_family_matches_cpu(win):
    import cupy

    from engine.ops import conv
    shape, kh, kw, sh, sw, ph, pw = win
    x = _rand(shape, 7)
    g = conv._geom(shape, kh, kw, (sh, sw), (ph, pw))
    cpu_cols = ops.im2col(x, kh, kw, (sh, sw), (ph, pw))
    c = _rand(cpu_cols.shape, 8)
    cpu_x = ops.col2im(c, shape, kh, kw, (sh, sw), (ph, pw))
    B, M, P = shape[0], 5, g.P
    yt = _rand((M, B * P), 9)
    bias = _rand((M,), 10)
    cpu_y = np.empty((B, M, P), np.float32)
    get_backend().ext.cnhw_to_nchw(yt, bias, cpu_y)
    cpu_db = np.empty(M, np.float32)
    get_backend().ext.channel_sum(cpu_y, cpu_db, False)
    cpu_yt = np.empty((M, B * P), np.float32)  # the transpose back: yt plus the bias
    get_backend().ext.nchw_to_cnhw(cpu_y, cpu_yt, None, False)
    for be in _gpu_backends():
        dcols = cupy.full(cpu_cols.shape, cupy.nan, cupy.float32)
        conv._k_im2col(be, cupy.asarray(x), dcols, g)
        assert np.array_equal(dcols.get(), cpu_cols), be.kernels
        dx = cupy.full(shape, cupy.nan, cupy.float32)
        conv._k_col2im(be, cupy.asarray(c), dx, g)
        np.testing.assert_allclose(dx.get(), cpu_x, rtol=1e-6, atol=1e-6, err_msg=be.kernels)
        dy = cupy.full((B, M, P), cupy.nan, cupy.float32)
        conv._k_cnhw_to_nchw(be, cupy.asarray(yt), cupy.asarray(bias), dy)
        assert np.array_equal(dy.get(), cpu_y), be.kernels
        dyt = cupy.full((M, B * P), cupy.nan, cupy.float32)
        ddb = cupy.full(M, cupy.nan, cupy.float32)
        conv._k_nchw_to_cnhw(be, dy, dyt, ddb, False)
        assert np.array_equal(dyt.get(), cpu_yt), be.kernels
        np.testing.assert_allclose(ddb.get(), cpu_db, rtol=1e-5, atol=1e-5, err_msg=be.kernels)
        z = dy.copy()
        conv._k_add_channel_bias(be, z, cupy.asarray(bias))
        np.testing.assert_allclose(z.get(), cpu_y + bias[None, :, None], rtol=1e-6, atol=1e-6)


# ---- kernels/im2col.cu run sequentially on the CPU (no GPU needed) -----------
# The ops take their GPU RawModule path with NumPy arrays; each launch runs the
# real CUDA source compiled as C++ (one thread, so grid-stride loops visit every
# index): checks kernel index arithmetic and the launch arguments (order,
# types) against the C++ twins. Helpers shared with K2's kernel tests.

@pytest.fixture(scope="module", params=["index32", "index64"])
def emulated(tmp_path_factory, request):
    """index64 forces the kernels' 64-bit index path (normally taken only
    beyond 2^31 elements) by lowering SPRINT_NARROW_INDEX_MAX to 0."""
    import ctypes
    import shutil
    import subprocess

    import k2_support
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to run the CUDA sources on the CPU")
    d = tmp_path_factory.mktemp(f"im2col_emulated_{request.param}")
    defines = ["-DSPRINT_NARROW_INDEX_MAX=0"] if request.param == "index64" else []
    shim = d / "shim.h"
    shim.write_text(k2_support._SHIM + "\n#define __shared__ static\n")
    src = backend_kernel("im2col.cu")
    lib_path = d / "libim2col_emulated.so"
    subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", *defines, "-include", str(shim), "-x", "c++",
                    str(src), "-I", str(src.parent), "-o", str(lib_path)], check=True)
    lib = ctypes.CDLL(str(lib_path))

    from engine.backend import Backend
    be = Backend("gpu", np, None, "rawmodule")
    launched = []

    def raw_launch(kernel, args, n=None, grid=None, block=256):
        launched.append(kernel)
        k2_support.kernel_call(lib, kernel, *args)

    be.raw_launch = raw_launch
    be.launched = launched
    return be


def backend_kernel(name):
    from engine.backend import kernel_dir
    return kernel_dir() / name


@pytest.mark.parametrize("win", [((3, 4, 9, 7), 3, 3, 1, 1, 1, 1), ((2, 3, 9, 12), 5, 3, 2, 3, 3, 0),
                                 ((1, 1, 6, 6), 1, 1, 1, 1, 0, 0), ((2, 2, 13, 13), 11, 11, 4, 4, 2, 2),
                                 # huge strides and pads: few windows, most pixels read by none
                                 ((1, 2, 40, 37), 3, 2, 20, 17, 19, 16), ((2, 1, 5, 4), 2, 3, 64, 128, 40, 70),
                                 # a 2^18-tall window, stride and pad: the gather visits only the
                                 # windows that read each pixel (it used to test all 2^18 rows)
                                 ((1, 1, 64, 64), 1 << 18, 1, 1 << 18, 64, (1 << 18) - 1, 0)])
def test_cuda_sources_match_cpu_twins(emulated, win):
    import k2_support

    from engine.ops import conv
    shape, kh, kw, sh, sw, ph, pw = win
    x, M = _rand(shape, 21), 3
    wt = _rand((M, shape[1], kh, kw), 22)
    b = _rand((M,), 23)
    ref_cols = ops.im2col(x, kh, kw, (sh, sw), (ph, pw))
    c = _rand(ref_cols.shape, 24)
    ref_x = ops.col2im(c, shape, kh, kw, (sh, sw), (ph, pw))
    ref_y = ops.conv2d_forward(x, wt, b, (sh, sw), (ph, pw))
    dy = _rand(ref_y.shape, 25)
    ref_g = ops.conv2d_backward(x, wt, dy, (sh, sw), (ph, pw))
    emulated.launched.clear()
    with k2_support.using(emulated):
        cols = ops.im2col(x, kh, kw, (sh, sw), (ph, pw), out=np.full(ref_cols.shape, np.nan, np.float32))
        xx = ops.col2im(c, shape, kh, kw, (sh, sw), (ph, pw), out=np.full(shape, np.nan, np.float32))
        y = ops.conv2d_forward(x, wt, b, (sh, sw), (ph, pw), out=np.full(ref_y.shape, np.nan, np.float32))
        g = ops.conv2d_backward(x, wt, dy, (sh, sw), (ph, pw))
        g1 = ops.conv2d_backward(x, wt, dy, (sh, sw), (ph, pw), workspace_bytes=1)  # one image per chunk
    assert np.array_equal(cols, ref_cols)
    for a, r in zip(g1, ref_g):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)
    assert np.array_equal(xx, ref_x)  # the same additions in the same (i, j) order
    np.testing.assert_allclose(y, ref_y, rtol=1e-6, atol=1e-5)
    for a, r in zip(g, ref_g):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)
    used = set(emulated.launched)
    pointwise = conv._geom(shape, kh, kw, (sh, sw), (ph, pw)).is_pointwise
    expect = {"sprint_im2col_f32", "sprint_col2im_f32", "sprint_nchw_to_cnhw_f32", "sprint_channel_sum_f32"}
    expect |= {"sprint_add_channel_bias_f32"} if pointwise else {"sprint_cnhw_to_nchw_f32"}
    assert expect <= used, expect - used


def _im2col_vectorized_ref(x, k, p):
    """Stride-1 reference by slicing (fast enough for large inputs)."""
    N, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    OH, OW = H + 2 * p - k + 1, W + 2 * p - k + 1
    out = np.empty((C, k, k, N, OH, OW), np.float32)
    for i in range(k):
        for j in range(k):
            out[:, i, j] = xp[:, :, i:i + OH, j:j + OW].transpose(1, 0, 2, 3)
    return out.reshape(C * k * k, N * OH * OW)


@pytest.mark.parametrize("shape", [(8, 64, 64, 64), (9, 64, 60, 62)])
def test_large_im2col_streaming_path_is_exact(shape):
    """cols above 64 MiB take the non-temporal-store path (row length % 4 == 0)
    or the plain one (otherwise); both must be exact, and col2im must agree."""
    x = _rand(shape, 30)
    cols = ops.im2col(x, 3, 3, 1, 1, out=np.full((shape[1] * 9, shape[0] * shape[2] * shape[3]), np.nan,
                                                 np.float32))
    assert cols.size * 4 > 64 << 20
    assert np.array_equal(cols, _im2col_vectorized_ref(x, 3, 1))
