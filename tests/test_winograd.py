"""The Winograd convolution (`--conv-algo winograd`, csrc/winograd.h) against
the float64 direct convolution and the implicit path, F(2x2,3x3) and
F(4x4,3x3), on every transform/GEMM ISA this CPU runs, with poisoned outputs;
its fallback to implicit for the layers it does not serve."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_conv import _data, close, ref_conv, ref_conv_grads
from test_conv_implicit import ISAS, poison, using

from engine import backend, ops
from engine.ops import conv, conv_winograd

# Error bound, in units of 2^-24 times the largest |x|*|w| sum of the output
# (the convolution of |x| with |w|: the magnitude of the terms the outputs
# sum). Per tile, not per output: the transforms mix the tile's inputs and
# the inverse transform cancels them, so a small output next to large ones
# carries their rounding. Measured on 3x3 layers of 1-256 channels, 3x3 to
# 32x32 images, forward and dX: the implicit GEMM stays under 5, F(2x2,3x3)
# under 2 and F(4x4,3x3) under 38. F(4,3)'s transforms hold the points +-2
# (coefficients 4, 5, 8 and 1/24) that scale terms by up to 2^3 before the
# inverse cancels them, so its rounding is about ten times the direct sum's;
# F(2,3)'s hold only +-1 and 1/2. The tolerances are those maxima with a
# margin of 4-8x, no more: a wrong coefficient or a dropped tile is far past.
ULPS = {2: 16, 4: 160}
TILES = (2, 4)


@contextlib.contextmanager
def tile(m):
    old = os.environ.get("SPRINT_WINOGRAD_TILE")
    os.environ["SPRINT_WINOGRAD_TILE"] = str(m)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPRINT_WINOGRAD_TILE", None)
        else:
            os.environ["SPRINT_WINOGRAD_TILE"] = old


@contextlib.contextmanager
def winograd(m=4, isa=None, depth=1):
    """--conv-algo winograd with tile m on `isa`, serving layers down to
    `depth` channels (1: the small test shapes too; the engine's is
    conv_winograd.MIN_DEPTH, a speed threshold, not a numerical one)."""
    old = conv_winograd.MIN_DEPTH
    conv_winograd.MIN_DEPTH = depth
    try:
        with using("winograd", isa), tile(m):
            yield
    finally:
        conv_winograd.MIN_DEPTH = old


def within(got, ref, mag, m):
    """|got - ref| <= ULPS[m] * 2^-24 * max(mag) (mag: the outputs' |terms| sums)."""
    return np.all(np.abs(got.astype(np.float64) - ref) <= ULPS[m] * 2.0**-24 * np.max(mag) + 1e-30)


def run(x, w, b, dy, pad, relu=False):
    y = ops.conv2d_forward(x, w, b, pad=pad, relu=relu, out=poison((x.shape[0], w.shape[0]) + dy.shape[2:]))
    grads = ops.conv2d_backward(x, w, dy, pad=pad, dx_out=poison(x.shape), dw_out=poison(w.shape),
                                db_out=poison(w.shape[0]))
    return (y,) + grads


@st.composite
def cases(draw):
    """3x3 stride-1 layers: batch 1-3, 1-20 channels in and out, images of 1 to
    13 pixels a side (most not a multiple of the tile), pads 0-2."""
    pad = draw(st.integers(0, 2))
    H = draw(st.integers(max(1, 3 - 2 * pad), 13))
    W = draw(st.integers(max(1, 3 - 2 * pad), 13))
    xs = (draw(st.integers(1, 3)), draw(st.integers(1, 20)), H, W)
    ws = (draw(st.integers(1, 20)), xs[1], 3, 3)
    return xs, ws, pad, draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_winograd_matches_float64_and_implicit(case):
    xs, wsh, pad, bias, relu, seed = case
    x, w, b = _data(xs, wsh, bias, seed)
    ref_y = ref_conv(x, w, b, 1, 1, pad, pad)
    # The transforms mix all nine taps of a filter (G w), so an output's
    # rounding scales with the sum of |w| over its taps, not only over those
    # its window meets: on a 1x1 image padded by 1 only the centre tap meets
    # the input, and F(2,3) erred by 17.8 x 2^-24 of that tight sum (found
    # by this test). Each tap's |w| is replaced by its filter's tap sum.
    wsum = np.broadcast_to(np.abs(w).sum(axis=(2, 3), keepdims=True), w.shape)
    mag_y = ref_conv(np.abs(x), wsum, None, 1, 1, pad, pad) + (np.abs(b)[None, :, None, None] if bias else 0)
    if relu:
        ref_y = np.maximum(ref_y, 0)  # 1-Lipschitz: the bound carries over
    dy = np.random.default_rng(seed + 1).standard_normal(ref_y.shape).astype(np.float32)
    rdx, rdw, rdb = ref_conv_grads(x, w, dy, 1, 1, pad, pad)
    mag_dx = ref_conv_grads(np.abs(x), wsum, np.abs(dy), 1, 1, pad, pad)[0]
    for isa in ISAS:
        with using("implicit", isa):
            implicit = run(x, w, b, dy, pad, relu)
        for m in TILES:
            with winograd(m, isa):
                y, dx, dw, db = run(x, w, b, dy, pad, relu)
            for name, g in (("y", y), ("dx", dx), ("dw", dw), ("db", db)):
                assert not np.isnan(g).any(), (isa, m, name)
            assert within(y, ref_y, mag_y, m), (isa, m, np.abs(y - ref_y).max())
            assert within(dx, rdx, mag_dx, m), (isa, m, np.abs(dx - rdx).max())
            assert within(y, implicit[0], mag_y, m) and within(dx, implicit[1], mag_dx, m), (isa, m)
            # dW and db are the implicit path's own kernels: equal to its results
            assert np.array_equal(dw, implicit[2]) and np.array_equal(db, implicit[3]), (isa, m)
            assert close(dw, rdw, rtol=1e-4) and close(db, rdb, rtol=1e-4), (isa, m)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", TILES)
@pytest.mark.parametrize("xs,ws,pad", [((4, 64, 16, 16), (128, 64, 3, 3), 1),   # cifar conv3 (smaller batch)
                                       ((3, 40, 9, 11), (24, 40, 3, 3), 0),
                                       ((2, 3, 32, 32), (64, 3, 3, 3), 1),      # cifar conv1: C = 3
                                       ((1, 256, 8, 8), (256, 256, 3, 3), 1)],  # cifar conv6: 1 block per thread
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_fused_bias_relu_equals_unfused_on_cifar_shapes(isa, m, xs, ws, pad):
    """Several tile blocks and threads; the bias and ReLU in the output
    transform equal a separate ReLU after it bit for bit."""
    x, w, b = _data(xs, ws, True, 3)
    w = w / np.float32(np.sqrt(9 * xs[1]))
    with winograd(m, isa):
        y = ops.conv2d_forward(x, w, b, pad=pad, out=poison((xs[0], ws[0], xs[2] + 2 * pad - 2, xs[3] + 2 * pad - 2)))
        fused = ops.conv2d_forward(x, w, b, pad=pad, relu=True)
        nobias = ops.conv2d_forward(x, w, None, pad=pad)
    assert np.array_equal(fused, ops.relu_forward(y.copy()))
    assert (fused == 0).any() and (fused > 0).any()
    ref = ref_conv(x, w, b, 1, 1, pad, pad)
    mag = ref_conv(np.abs(x), np.abs(w), None, 1, 1, pad, pad)
    assert within(y, ref, mag + np.abs(b)[None, :, None, None], m), np.abs(y - ref).max()
    assert within(nobias, ref - b[None, :, None, None], mag, m)


@pytest.mark.parametrize("m", TILES)
def test_dx_central_differences(m):
    """dX against central differences of the float64 loss sum(conv(x, w) * g)."""
    x, w, b = (a.astype(np.float64) for a in _data((2, 3, 6, 5), (4, 3, 3, 3), True, 21))
    g = np.random.default_rng(22).standard_normal((2, 4, 6, 5))
    loss = lambda: float((ref_conv(x, w, b, 1, 1, 1, 1) * g).sum())  # noqa: E731
    with winograd(m):
        dx = ops.conv2d_backward(x.astype(np.float32), w.astype(np.float32), g.astype(np.float32), pad=1)[0]
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + 1e-6
        up = loss()
        x[idx] = old - 1e-6
        down = loss()
        x[idx] = old
        fd = (up - down) / 2e-6
        assert abs(dx[idx] - fd) <= 1e-4 * (1 + abs(fd)), (idx, dx[idx], fd)


@pytest.mark.parametrize("m", TILES)
def test_rows_of_a_micro_batch_equal_the_whole_batch_bitwise(m):
    """Every tile is transformed alone and every GEMM element is one chain over
    the channels whatever the block: a micro-batch reproduces its rows of the
    whole batch exactly, forward and dX (the pipeline's gpipe relies on it)."""
    x, w, b = _data((23, 6, 17, 19), (13, 6, 3, 3), True, 7)
    dy = np.random.default_rng(8).standard_normal((23, 13, 17, 19)).astype(np.float32)
    with winograd(m):
        y = ops.conv2d_forward(x, w, b, pad=1, relu=True)
        dx = ops.conv2d_backward(x, w, dy, pad=1)[0]
        for lo, hi in ((0, 1), (1, 9), (9, 23)):
            assert np.array_equal(ops.conv2d_forward(x[lo:hi], w, b, pad=1, relu=True), y[lo:hi]), (lo, hi)
            assert np.array_equal(ops.conv2d_backward(x[lo:hi], w, dy[lo:hi], pad=1)[0], dx[lo:hi]), (lo, hi)


def test_layers_it_does_not_serve_run_on_implicit(monkeypatch):
    """Not 3x3, stride 2, pad 3, a workspace past the limit, or fewer input
    channels than MIN_DEPTH (C forward, M for dX): the implicit path's
    results bit for bit, and the Winograd kernels never called; the layers it
    serves call them (forward and dX apart)."""
    ext = backend.get_backend().ext
    calls = []
    for k in ("conv2d_winograd_forward", "conv2d_winograd_backward_x"):
        real = getattr(ext, k)
        monkeypatch.setattr(ext, k, lambda *a, _r=real, _k=k, **kw: (calls.append(_k), _r(*a, **kw))[1])
    deep = conv_winograd.MIN_DEPTH
    layers = [((2, 3, 9, 8), (4, 3, 5, 5), 1, 2, None, 1), ((2, 3, 9, 8), (4, 3, 3, 3), 2, 1, None, 1),
              ((2, 3, 9, 8), (4, 3, 1, 1), 1, 0, None, 1), ((1, 2, 5, 5), (3, 2, 3, 3), 1, 3, None, 1),
              ((2, 3, 9, 8), (4, 3, 3, 3), 1, 1, 64, 1), ((2, 3, 9, 8), (4, 3, 3, 3), 1, 1, None, deep)]
    for xs, ws, stride, pad, limit, depth in layers:
        x, w, b = _data(xs, ws, True, 5)
        outs = {}
        for algo, ctx in (("implicit", lambda: using("implicit")), ("winograd", lambda: winograd(4, None, depth))):
            with ctx():
                y = ops.conv2d_forward(x, w, b, stride=stride, pad=pad, workspace_bytes=limit)
                outs[algo] = (y,) + ops.conv2d_backward(x, w, np.ones_like(y), stride=stride, pad=pad,
                                                        workspace_bytes=limit)
        assert all(np.array_equal(a, c) for a, c in zip(outs["implicit"], outs["winograd"])), (ws, stride, pad)
    assert not calls
    for ws, served in (((4, 3, 3, 3), []), ((4, deep, 3, 3), ["conv2d_winograd_forward"]),
                       ((deep, 4, 3, 3), ["conv2d_winograd_backward_x"]),
                       ((deep, deep, 3, 3), ["conv2d_winograd_forward", "conv2d_winograd_backward_x"])):
        x, w, b = _data((2, ws[1], 9, 8), ws, True, 5)
        calls.clear()
        with winograd(4, None, deep):
            y = ops.conv2d_forward(x, w, b, pad=1)
            ops.conv2d_backward(x, w, np.ones_like(y), pad=1)
            ops.conv2d_backward(x, w, np.ones_like(y), pad=1, need_dx=False)
        assert calls == served, ws


def test_a_served_pass_asks_its_workspace_size_once(monkeypatch):
    """serves computes the size to decide and hands it on: one call per
    pass (forward; dX), none for the dW-only backward, which Winograd does
    not compute."""
    ext = backend.get_backend().ext
    real, dx_flags = ext.conv2d_winograd_workspace, []
    monkeypatch.setattr(ext, "conv2d_winograd_workspace", lambda *a: (dx_flags.append(a[-1]), real(*a))[1])
    x, w, b = _data((2, 4, 9, 8), (5, 4, 3, 3), True, 5)
    with winograd(4):
        y = ops.conv2d_forward(x, w, b, pad=1)
        ops.conv2d_backward(x, w, np.ones_like(y), pad=1)
        ops.conv2d_backward(x, w, np.ones_like(y), pad=1, need_dx=False)
    assert dx_flags == [False, True]


def test_winograd_workspace_stops_growing_with_the_batch():
    """U plus one tile block per thread: past a few blocks per thread, the
    same for batch 256 and 4096, and a small part of the workspace limit."""
    ext = backend.get_backend().ext
    for C, M, H in ((64, 64, 32), (256, 256, 8)):
        for m in TILES:
            n = ext.conv2d_winograd_workspace(256, C, H, H, M, 1, 1, m, False)
            assert 0 < n == ext.conv2d_winograd_workspace(4096, C, H, H, M, 1, 1, m, False)
            assert 4 * n <= conv.default_workspace_bytes() // 8


def test_bad_arguments_are_refused():
    ext = backend.get_backend().ext
    x = np.zeros((1, 2, 5, 5), np.float32)
    w = np.zeros((3, 2, 3, 3), np.float32)
    y = np.zeros((1, 3, 5, 5), np.float32)
    ws = np.zeros(ext.conv2d_winograd_workspace(1, 2, 5, 5, 3, 1, 1, 4, False), np.float32)
    ext.conv2d_winograd_forward(x, w, None, y, 1, 1, False, 4, ws)
    with pytest.raises(ValueError, match="tile must be 2 or 4"):
        ext.conv2d_winograd_forward(x, w, None, y, 1, 1, False, 3, ws)
    with pytest.raises(ValueError, match="workspace smaller"):
        ext.conv2d_winograd_forward(x, w, None, y, 1, 1, False, 4, ws[:-1])
    with pytest.raises(ValueError, match="ph"):
        ext.conv2d_winograd_forward(x, w, None, np.zeros((1, 3, 9, 9), np.float32), 3, 3, False, 4, ws)
    with pytest.raises(ValueError, match="w"):
        ext.conv2d_winograd_forward(x, np.zeros((3, 2, 5, 5), np.float32), None, y, 1, 1, False, 4, ws)
    with pytest.raises(ValueError, match="overlap"):
        ext.conv2d_winograd_forward(x, w, None, y, 1, 1, False, 4, y.reshape(-1))
    with winograd(3), pytest.raises(ValueError, match="SPRINT_WINOGRAD_TILE"):
        ops.conv2d_forward(x, w, None, pad=1)


def test_training_with_conv_algo_winograd_follows_the_implicit_loss_curve(tmp_path, monkeypatch):
    """`sprint train --conv-algo winograd` (the tiny net: a strided 3x3 layer on
    implicit, a stride-1 one on Winograd) gives implicit's training loss per
    epoch within F(4,3)'s rounding, carried through 40 SGD steps."""
    import json

    from test_train import _blobs, _cfg

    import engine
    from engine import cli
    data = _blobs(tmp_path / "blobs.npz")
    monkeypatch.setattr(conv_winograd, "MIN_DEPTH", 1)  # the tiny net's 3 channels
    monkeypatch.setenv("SPRINT_CONV_ALGO", "implicit")  # restored after the CLI's setting
    engine.train(_cfg(data, out=str(tmp_path / "implicit")))
    assert cli.main(["train", "--model", "tiny", "--data", str(data), "--epochs", "4", "--batch", "16",
                     "--lr", "0.05", "--crop-pad", "1", "--no-progress", "--quiet", "--conv-algo", "winograd",
                     "--out", str(tmp_path / "winograd")]) == 0
    assert os.environ["SPRINT_CONV_ALGO"] == "winograd"
    curves = {a: [json.loads(line)["train_loss"] for line in (tmp_path / a / "metrics.jsonl").read_text().splitlines()]
              for a in ("implicit", "winograd")}
    assert len(curves["winograd"]) == 4 and curves["winograd"][-1] < curves["winograd"][0]
    assert curves["winograd"] == pytest.approx(curves["implicit"], rel=1e-4)
    assert curves["winograd"] != curves["implicit"]  # not bitwise: the Winograd layer did run



def _priced(model, profile):
    """The model's ComputeGradient seconds at batch 32 and the op fits that priced it."""
    from engine import spec as spec_mod
    from engine.perf.layer_cost import compute_gradient_terms
    rows = compute_gradient_terms(spec_mod.get_spec(model), 32, profile, measured=False)
    return sum(r[-1] for r in rows), profile.op_kinds()


def test_a_profile_swept_on_implicit_prices_winograd_by_its_nearest_fits_and_says_so(monkeypatch, capsys):
    """A profile whose conv fits were swept on implicit/engine (cpu_test9,
    shipped until cpu_test10 was swept on Winograd), in the shipped one's
    place. Under the default Winograd they still price the convolutions
    (not the im2col kernels), and `sprint predict` says once that they
    misprice a net with a layer Winograd runs, and nothing for a net without
    one; with another GEMM the conv fits do not hold at all and the warning
    says what prices them instead."""
    import json
    from pathlib import Path
    from engine import cli
    from engine.perf.profile import Profile
    implicit = Path(__file__).resolve().parents[1] / "bench" / "profiles" / "cpu_test9.json"
    load = Profile.load.__func__
    monkeypatch.setattr(Profile, "load", classmethod(
        lambda cls, path=None: load(cls, path) if path is not None
        else cls(json.loads(implicit.read_text()), source="default_profile.json")))
    for var in ("SPRINT_GEMM", "SPRINT_WINOGRAD_TILE", "SPRINT_CONV_ALGO"):
        monkeypatch.delenv(var, raising=False)
    assert Profile.load().data["ops"]["conv_fwd"]["path"] == "implicit/engine"
    assert conv.conv_algo() == "winograd"
    predict = ["predict", "--nodes", "1", "--subbatch", "32", "--no-calibrate", "--json", "--model"]
    conv_ops = {"conv_fwd", "conv_bwd", "conv_bwd_dw"}
    winograd = {m: _priced(m, Profile.load()) for m in ("tiny", "cifar")}
    assert winograd["cifar"][1] >= conv_ops
    assert Profile.load().path_warning("tiny") == ""  # 3-16 channels: Winograd runs none of its layers
    assert cli.main(predict + ["tiny"]) == 0 and capsys.readouterr().err == ""
    assert cli.main(predict + ["cifar"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sprint predict: warning: default_profile.json: its conv op fits "
                                               "were swept on implicit/engine, this process runs winograd/engine: "
                                               "priced as implicit/engine runs them"), err
    assert "`sprint profile`" in err[0]
    monkeypatch.setenv("SPRINT_CONV_ALGO", "implicit")
    assert {m: _priced(m, Profile.load()) for m in ("tiny", "cifar")} == winograd  # the same fits
    assert Profile.load().path_warning("cifar") == ""
    monkeypatch.setenv("SPRINT_GEMM", "blas")
    t, kinds = _priced("cifar", Profile.load())
    assert not kinds & conv_ops and t != winograd["cifar"][0]
    assert "its conv op fits were swept on implicit/engine, this process runs implicit/blas: priced from the " \
           "kernel fits" in Profile.load().path_warning("tiny")
