"""conv2d and linear, forward and backward, against a naive float64 direct
convolution and central finite differences."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine import ops

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ref_conv(x, w, b, sh, sw, ph, pw):
    """Direct convolution, float64: loops over output pixels and the window."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    OH, OW = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    xp[:, :, ph:ph + H, pw:pw + W] = x
    w64 = w.astype(np.float64).reshape(M, -1)
    y = np.zeros((N, M, OH, OW))
    for oh in range(OH):
        for ow in range(OW):
            patch = xp[:, :, oh * sh:oh * sh + kh, ow * sw:ow * sw + kw].reshape(N, -1)
            y[:, :, oh, ow] = patch @ w64.T
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return y


def ref_conv_grads(x, w, dy, sh, sw, ph, pw):
    """Adjoint of ref_conv, float64 loops: (dx, dw, db)."""
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    _, _, OH, OW = dy.shape
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw))
    xp[:, :, ph:ph + H, pw:pw + W] = x
    dxp = np.zeros_like(xp)
    w64 = w.astype(np.float64).reshape(M, -1)
    dw = np.zeros((M, C * kh * kw))
    for oh in range(OH):
        for ow in range(OW):
            g = dy[:, :, oh, ow].astype(np.float64)              # (N, M)
            patch = xp[:, :, oh * sh:oh * sh + kh, ow * sw:ow * sw + kw].reshape(N, -1)
            dw += g.T @ patch
            dxp[:, :, oh * sh:oh * sh + kh, ow * sw:ow * sw + kw] += (g @ w64).reshape(N, C, kh, kw)
    return dxp[:, :, ph:ph + H, pw:pw + W], dw.reshape(w.shape), dy.astype(np.float64).sum(axis=(0, 2, 3))


def close(got, ref, rtol=2e-5):
    """|got - ref| <= tol + |ref| * eps, scaled to the magnitudes involved."""
    ref = np.asarray(ref, np.float64)
    scale = 1e-5 * (1 + np.abs(ref).max(initial=0))
    return np.all(np.abs(got - ref) <= scale + rtol * np.abs(ref))


@st.composite
def conv_cases(draw):
    N = draw(st.integers(1, 3))
    C = draw(st.integers(1, 3))
    M = draw(st.integers(1, 4))
    H, W = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    kh, kw = draw(st.sampled_from([(1, 1), (1, 3), (3, 1), (3, 3), (5, 5), (2, 3), (11, 11)]))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, kh + 1)), draw(st.integers(0, kw + 1))
    assume(H + 2 * ph >= kh and W + 2 * pw >= kw)
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return (N, C, H, W), (M, C, kh, kw), (sh, sw), (ph, pw), bias, seed


def _data(xs, ws, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    return x, w, b


@SETTINGS
@given(conv_cases(), st.sampled_from([None, 1, 4096]))
def test_conv_forward_and_backward_match_reference(case, ws_bytes):
    xs, wsh, stride, pad, bias, seed = case
    x, w, b = _data(xs, wsh, bias, seed)
    ref = ref_conv(x, w, b, *stride, *pad)
    y = ops.conv2d_forward(x, w, b, stride=stride, pad=pad, workspace_bytes=ws_bytes,
                           out=np.full(ref.shape, np.nan, np.float32))
    assert not np.isnan(y).any()
    assert close(y, ref)

    dy = np.random.default_rng(seed + 1).standard_normal(ref.shape).astype(np.float32)
    rdx, rdw, rdb = ref_conv_grads(x, w, dy, *stride, *pad)
    poison = lambda s: np.full(s, np.nan, np.float32)  # noqa: E731
    dx, dw, db = ops.conv2d_backward(x, w, dy, stride=stride, pad=pad, workspace_bytes=ws_bytes,
                                     dx_out=poison(x.shape), dw_out=poison(w.shape), db_out=poison(w.shape[0]))
    for got in (dx, dw, db):
        assert not np.isnan(got).any()
    assert close(dx, rdx) and close(dw, rdw) and close(db, rdb)


@pytest.mark.parametrize("xs,ws,stride,pad", [
    ((1, 1, 5, 4), (2, 1, 3, 3), (1, 1), (1, 1)),
    ((2, 2, 7, 6), (3, 2, 1, 3), (2, 1), (0, 2)),
    ((2, 3, 6, 5), (2, 3, 3, 1), (1, 3), (2, 0)),
    ((1, 2, 5, 5), (2, 2, 5, 5), (2, 2), (3, 3)),
    ((3, 2, 4, 4), (2, 2, 1, 1), (1, 1), (0, 0)),
])
def test_backward_matches_central_differences(xs, ws, stride, pad):
    """Engine gradients of L = <conv(x, w, b), g> vs central differences of the
    float64 reference, on every element of x, w and b."""
    x, w, b = _data(xs, ws, True, 11)
    x, w, b = (a.astype(np.float64) for a in (x, w, b))
    out_shape = ref_conv(x, w, b, *stride, *pad).shape
    g = np.random.default_rng(12).standard_normal(out_shape)
    loss = lambda x_, w_, b_: float((ref_conv(x_, w_, b_, *stride, *pad) * g).sum())  # noqa: E731

    def fd(arr, f, h=1e-6):
        grad = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + h
            up = f()
            arr[idx] = old - h
            down = f()
            arr[idx] = old
            grad[idx] = (up - down) / (2 * h)
        return grad

    fx = fd(x, lambda: loss(x, w, b))
    fw = fd(w, lambda: loss(x, w, b))
    fb = fd(b, lambda: loss(x, w, b))
    dx, dw, db = ops.conv2d_backward(x.astype(np.float32), w.astype(np.float32), g.astype(np.float32),
                                     stride=stride, pad=pad)
    for got, ref in ((dx, fx), (dw, fw), (db, fb)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * (1 + np.abs(ref).max()))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases())
def test_backward_central_differences_random_shapes(case):
    """Engine gradients vs central differences of the float64 reference on
    random shapes (a random sample of elements of x, w and b)."""
    xs, wsh, stride, pad, _, seed = case
    x, w, b = (a.astype(np.float64) for a in _data(xs, wsh, True, seed))
    g = np.random.default_rng(seed + 2).standard_normal(ref_conv(x, w, b, *stride, *pad).shape)
    loss = lambda: float((ref_conv(x, w, b, *stride, *pad) * g).sum())  # noqa: E731
    dx, dw, db = ops.conv2d_backward(x.astype(np.float32), w.astype(np.float32), g.astype(np.float32),
                                     stride=stride, pad=pad)
    rng = np.random.default_rng(seed + 3)
    for arr, got in ((x, dx), (w, dw), (b, db)):
        for _ in range(4):
            idx = tuple(int(rng.integers(s)) for s in arr.shape)
            old = arr[idx]
            arr[idx] = old + 1e-6
            up = loss()
            arr[idx] = old - 1e-6
            down = loss()
            arr[idx] = old
            fd = (up - down) / 2e-6
            # float32 accumulation bound: eps * (sum of |terms|) <= eps * sum|g| * max(|x|, |w|, 1)
            tol = 1e-5 + 1e-6 * np.abs(g).sum() * max(np.abs(x).max(), np.abs(w).max(), 1.0)
            assert abs(got[idx] - fd) <= tol + 1e-5 * abs(fd), (idx, got[idx], fd, tol)


def test_chunked_equals_whole_batch():
    x, w, b = _data((7, 3, 12, 10), (5, 3, 3, 3), True, 3)
    dy = np.random.default_rng(4).standard_normal((7, 5, 12, 10)).astype(np.float32)
    whole = ops.conv2d_forward(x, w, b, pad=1)
    per_image = (3 * 9 + 5) * 120 * 4
    for ws in (1, per_image, 3 * per_image):  # chunks of 1, 1 and 3 images (last chunk 1)
        np.testing.assert_allclose(ops.conv2d_forward(x, w, b, pad=1, workspace_bytes=ws), whole,
                                   rtol=1e-6, atol=1e-5)
        got = ops.conv2d_backward(x, w, dy, pad=1, workspace_bytes=ws)
        ref = ops.conv2d_backward(x, w, dy, pad=1)
        for a, r in zip(got, ref):
            np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-4)


def test_pointwise_conv_skips_im2col_and_matches(monkeypatch):
    from engine.ops import conv
    calls = []
    real = conv._k_im2col
    monkeypatch.setattr(conv, "_k_im2col", lambda *a: (calls.append(1), real(*a)))
    x, w, b = _data((3, 4, 5, 6), (7, 4, 1, 1), True, 5)
    y = ops.conv2d_forward(x, w, b)
    assert not calls, "1x1 stride-1 conv forward must not call im2col"
    assert close(y, ref_conv(x, w, b, 1, 1, 0, 0))
    dy = np.random.default_rng(6).standard_normal(y.shape).astype(np.float32)
    dx, dw, db = ops.conv2d_backward(x, w, dy)
    assert not calls, "1x1 stride-1 conv backward must not call im2col"
    rdx, rdw, rdb = ref_conv_grads(x, w, dy, 1, 1, 0, 0)
    assert close(dx, rdx) and close(dw, rdw) and close(db, rdb)


def test_need_dx_false_returns_none():
    x, w, _ = _data((2, 2, 5, 5), (3, 2, 3, 3), False, 7)
    dy = np.ones((2, 3, 5, 5), np.float32)
    dx, dw, db = ops.conv2d_backward(x, w, dy, pad=1, need_dx=False)
    assert dx is None
    assert close(dw, ref_conv_grads(x, w, dy, 1, 1, 1, 1)[1])


def test_cifar_layer_shapes_batch_32():
    """The reference net's widest layer at batch 32 (several chunks of the default workspace)."""
    x, w, b = _data((32, 64, 16, 16), (128, 64, 3, 3), True, 8)
    y = ops.conv2d_forward(x, w, b, pad=1, workspace_bytes=8 << 20)
    idx = (slice(0, 2), slice(0, 3))
    ref = ref_conv(x[idx[0]], w[idx[1]], b[idx[1]], 1, 1, 1, 1)
    assert close(y[idx[0], idx[1]], ref)


# ---- linear ------------------------------------------------------------------

@SETTINGS
@given(st.integers(1, 6), st.integers(1, 9), st.integers(1, 7), st.booleans(), st.integers(0, 999))
def test_linear_matches_reference(n, fin, fout, bias, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, fin)).astype(np.float32)
    w = rng.standard_normal((fout, fin)).astype(np.float32)
    b = rng.standard_normal(fout).astype(np.float32) if bias else None
    y = ops.linear_forward(x, w, b, out=np.full((n, fout), np.nan, np.float32))
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b)
    assert close(y, ref)
    dy = rng.standard_normal((n, fout)).astype(np.float32)
    dx, dw, db = ops.linear_backward(x, w, dy, dw_out=np.full(w.shape, np.nan, np.float32),
                                     db_out=np.full(fout, np.nan, np.float32))
    d64 = dy.astype(np.float64)
    assert close(dx, d64 @ w) and close(dw, d64.T @ x) and close(db, d64.sum(0))


def test_linear_backward_central_differences():
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((3, 5)), rng.standard_normal((4, 5)), rng.standard_normal(4)
    g = rng.standard_normal((3, 4))
    loss = lambda: float(((x @ w.T + b) * g).sum())  # noqa: E731
    grads = []
    for arr in (x, w, b):
        gr = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + 1e-6
            up = loss()
            arr[idx] = old - 1e-6
            gr[idx] = (up - loss()) / 2e-6
            arr[idx] = old
        grads.append(gr)
    got = ops.linear_backward(*(a.astype(np.float32) for a in (x, w, g)))
    for a, r in zip(got, grads):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)


# ---- bad input -------------------------------------------------------------

X = np.zeros((2, 3, 5, 5), np.float32)
Wt = np.zeros((4, 3, 3, 3), np.float32)
DY = np.zeros((2, 4, 5, 5), np.float32)


@pytest.mark.parametrize("call,exc,name", [
    (lambda: ops.conv2d_forward(X.astype(np.float64), Wt), TypeError, "x"),
    (lambda: ops.conv2d_forward(X, Wt.astype(np.float16)), TypeError, "w"),
    (lambda: ops.conv2d_forward(X[0], Wt), ValueError, "x"),
    (lambda: ops.conv2d_forward(X[..., ::2], Wt), ValueError, "x"),
    (lambda: ops.conv2d_forward(X[:0], Wt), ValueError, "x"),
    (lambda: ops.conv2d_forward(X, Wt[:, :2]), ValueError, "w"),
    (lambda: ops.conv2d_forward(X, Wt, np.zeros(3, np.float32)), ValueError, "b"),
    (lambda: ops.conv2d_forward(X, Wt, pad=-1), ValueError, "pad"),
    (lambda: ops.conv2d_forward(X, Wt, stride=0), ValueError, "stride"),
    (lambda: ops.conv2d_forward(X, Wt, stride=1.5), TypeError, "stride"),
    (lambda: ops.conv2d_forward(X, np.zeros((4, 3, 9, 9), np.float32), pad=1), ValueError, "w"),
    (lambda: ops.conv2d_forward(X, Wt, workspace_bytes=0), ValueError, "workspace_bytes"),
    (lambda: ops.conv2d_forward(X, Wt, pad=1, out=np.zeros((2, 4, 5, 4), np.float32)), ValueError, "out"),
    (lambda: ops.conv2d_forward(X, Wt, pad=1, out=X), ValueError, "out"),
    (lambda: ops.conv2d_backward(X, Wt, DY[:, :3], pad=1), ValueError, "dy"),
    (lambda: ops.conv2d_backward(X, Wt, DY, pad=1, dw_out=np.zeros(3, np.float32)), ValueError, "dw_out"),
    (lambda: ops.conv2d_backward(X, Wt, DY, pad=1, db_out=np.zeros(4, np.float64)), TypeError, "db_out"),
    (lambda: ops.conv2d_backward(X, Wt, DY, pad=1, need_dx=1), TypeError, "need_dx"),
    (lambda: ops.linear_forward(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32)), ValueError, "w"),
    (lambda: ops.linear_forward(np.zeros((0, 3), np.float32), np.zeros((4, 3), np.float32)), ValueError, "x"),
    (lambda: ops.linear_backward(np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32),
                                 np.zeros((2, 5), np.float32)), ValueError, "dy"),
])
def test_bad_input(call, exc, name):
    with pytest.raises(exc, match=rf"\b{name}\b"):
        call()


# ---- GPU ---------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["compiled", "rawmodule"])
def test_gpu_conv_matches_cpu(kernels, monkeypatch):
    import cupy

    from engine import backend
    monkeypatch.setenv("SPRINT_KERNELS", kernels)
    x, w, b = _data((5, 3, 11, 9), (4, 3, 3, 5), True, 9)
    dy = np.random.default_rng(10).standard_normal((5, 4, 6, 5)).astype(np.float32)
    backend.set_backend("cpu")
    ref_y = ops.conv2d_forward(x, w, b, stride=(2, 2), pad=(1, 2))
    ref_g = ops.conv2d_backward(x, w, dy, stride=(2, 2), pad=(1, 2))
    try:
        be = backend.set_backend("gpu")
        if be.kernels != kernels:
            pytest.skip(f"{kernels} kernels unavailable (got {be.kernels})")
        gx, gw, gb, gdy = (cupy.asarray(a) for a in (x, w, b, dy))
        y = ops.conv2d_forward(gx, gw, gb, stride=(2, 2), pad=(1, 2), workspace_bytes=4000)
        np.testing.assert_allclose(y.get(), ref_y, rtol=1e-4, atol=1e-4)
        got = ops.conv2d_backward(gx, gw, gdy, stride=(2, 2), pad=(1, 2), workspace_bytes=4000)
        for a, r in zip(got, ref_g):
            np.testing.assert_allclose(a.get(), r, rtol=1e-4, atol=1e-4)
    finally:
        backend.set_backend("cpu")


def test_workspace_is_bounded(monkeypatch):
    """Explicit path: scratch buffers stay within workspace_bytes whenever one
    image fits. Implicit path: no column matrix or layout buffer at all."""
    from engine import backend
    from engine.ops import conv
    be = backend.get_backend()
    real = be.workspace.__func__
    sizes = {}

    def spy(self, key, n, dtype=np.float32):
        if key.startswith("conv_"):
            sizes[key] = max(sizes.get(key, 0), n)
        return real(self, key, n, dtype)

    monkeypatch.setattr(type(be), "workspace", spy)
    x, w, b = _data((9, 4, 10, 10), (6, 4, 3, 3), True, 13)
    dy = np.ones((9, 6, 10, 10), np.float32)
    per_image = 4 * (4 * 9 + 6) * 100
    monkeypatch.setattr(conv, "_algo", "im2col")
    for images in (1, 2, 4, 9):
        sizes.clear()
        ws = images * per_image
        ops.conv2d_forward(x, w, b, pad=1, workspace_bytes=ws)
        ops.conv2d_backward(x, w, dy, pad=1, workspace_bytes=ws)
        assert 4 * sum(sizes.values()) <= ws, (images, sizes)
        assert sizes["conv_cols"] == 4 * 9 * 100 * images  # the chunk is as large as allowed
    if be.kernels == "cpp":
        monkeypatch.setattr(conv, "_algo", "implicit")
        sizes.clear()
        ops.conv2d_forward(x, w, b, pad=1)
        ops.conv2d_backward(x, w, dy, pad=1)
        assert sizes == {}
