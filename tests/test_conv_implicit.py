"""The implicit-GEMM convolution (im2col inside the SGEMM's packing, bias and
ReLU in its write-back) against the float64 direct convolution and the
explicit im2col path, on every micro-kernel this CPU runs."""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_conv import _data, close, conv_cases, ref_conv, ref_conv_grads

from engine import backend, ops
from engine.ops import conv

ISAS = [i for i in ("avx512", "avx2", "generic") if i in backend.set_backend("cpu").ext.gemm_info("")["supported"]]


@contextlib.contextmanager
def using(algo, isa=None):
    old_isa = os.environ.get("SPRINT_CPU_ISA")
    conv.set_conv_algo(algo)
    if isa:
        os.environ["SPRINT_CPU_ISA"] = isa
    try:
        yield
    finally:
        conv.set_conv_algo(None)
        if old_isa is None:
            os.environ.pop("SPRINT_CPU_ISA", None)
        else:
            os.environ["SPRINT_CPU_ISA"] = old_isa


def poison(shape):
    return np.full(shape, np.nan, np.float32)


def run(x, w, b, dy, stride, pad, relu=False):
    y = ops.conv2d_forward(x, w, b, stride=stride, pad=pad, relu=relu,
                           out=poison((x.shape[0], w.shape[0]) + dy.shape[2:]))
    grads = ops.conv2d_backward(x, w, dy, stride=stride, pad=pad, dx_out=poison(x.shape), dw_out=poison(w.shape),
                                db_out=poison(w.shape[0]))
    return (y,) + grads


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases())
def test_implicit_matches_reference_and_explicit(case):
    xs, wsh, stride, pad, bias, seed = case
    x, w, b = _data(xs, wsh, bias, seed)
    ref_y = ref_conv(x, w, b, *stride, *pad)
    dy = np.random.default_rng(seed + 1).standard_normal(ref_y.shape).astype(np.float32)
    refs = (ref_y,) + ref_conv_grads(x, w, dy, *stride, *pad)
    with using("im2col"):
        explicit = run(x, w, b, dy, stride, pad)
    for isa in ISAS:
        with using("implicit", isa):
            got = run(x, w, b, dy, stride, pad)
        for name, g, r, e in zip(("y", "dx", "dw", "db"), got, refs, explicit):
            assert not np.isnan(g).any(), (isa, name)
            assert close(g, r), (isa, name, np.abs(g - r).max())
            assert close(g, e.astype(np.float64)), (isa, name)


# Past the cache blocks (K = C*kh*kw > KC, so the fused ReLU must wait for the
# last k block), several threads, the k-split dW plan, batch 1, 1x1, non-square.
BIG = [((2, 40, 12, 12), (24, 40, 3, 3), (1, 1), (1, 1)),
       ((8, 8, 32, 32), (8, 8, 3, 3), (1, 1), (1, 1)),
       ((1, 70, 9, 7), (33, 70, 1, 1), (1, 1), (0, 0)),
       ((3, 9, 17, 13), (17, 9, 5, 3), (2, 1), (2, 0)),
       ((1, 5, 11, 11), (7, 5, 3, 3), (1, 1), (4, 4)),
       # rows of 16 and more output pixels: the dW packing's register
       # transposes, their masked lanes over padding, the scalar tails
       ((2, 3, 18, 33), (5, 3, 5, 5), (1, 1), (2, 2)),
       ((1, 4, 20, 18), (6, 4, 3, 3), (2, 1), (1, 0)),
       # the unit-stride packing's table of masked segments (padding read
       # from x as is): rows of >= NR pixels read in place except at the
       # borders; more runs per vector than the table holds and more taps
       # than it holds take the general path
       ((2, 3, 7, 60), (5, 3, 3, 3), (1, 1), (1, 1)),
       ((3, 4, 5, 2), (6, 4, 3, 3), (1, 1), (1, 1)),
       ((1, 2, 10, 12), (3, 2, 8, 7), (1, 1), (3, 3)),
       # "same" padding (W == OW): dW packs blocks of 16 pixels across output
       # rows (8 x 8 images), then the per-row tails (35-pixel images)
       ((3, 6, 8, 8), (10, 6, 3, 3), (1, 1), (1, 1)),
       ((2, 4, 5, 7), (5, 4, 5, 3), (1, 1), (2, 1)),
       # dW's tap kernel: 6 taps and 130 channels split over the threads by
       # channel (a 2-column edge panel on the narrowest kernel), pixels over
       # several k blocks, padding on one axis only
       ((4, 2, 33, 35), (130, 2, 1, 3), (1, 1), (0, 1)),
       # cifar conv1's shape (27 taps, 64 channels): dW splits the channels
       # over the threads by registers (a half panel each, its tile moves
       # partial), and the forward's write-back fetches rows ahead
       ((8, 3, 32, 32), (64, 3, 3, 3), (1, 1), (1, 1)),
       # K = 810 past KC (at most 768) for the forward and dX alike, so a k
       # block starts inside a channel's taps (768 = 85*9 + 3): the im2col
       # packer walks each block tap by tap, then channel by channel
       ((2, 90, 6, 6), (90, 90, 3, 3), (1, 1), (1, 1))]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("xs,ws,stride,pad", BIG, ids=lambda v: "x".join(map(str, v)))
def test_implicit_fused_bias_relu_equals_unfused(isa, xs, ws, stride, pad):
    x, w, b = _data(xs, ws, True, 3)
    x = x * 0.5
    ref = ref_conv(x, w, b, *stride, *pad)
    dy = np.random.default_rng(4).standard_normal(ref.shape).astype(np.float32)
    with using("implicit", isa):
        y, dx, dw, db = run(x, w, b, dy, stride, pad)
        fused = ops.conv2d_forward(x, w, b, stride=stride, pad=pad, relu=True)
    unfused = ops.relu_forward(y.copy())
    assert np.array_equal(fused, unfused)
    assert (fused == 0).any() and (fused > 0).any()
    with using("im2col"):
        assert np.array_equal(ops.conv2d_forward(x, w, b, stride=stride, pad=pad, relu=True),
                              ops.relu_forward(ops.conv2d_forward(x, w, b, stride=stride, pad=pad)))
    rdx, rdw, rdb = ref_conv_grads(x, w, dy, *stride, *pad)
    for name, g, r in (("y", y, ref), ("dx", dx, rdx), ("dw", dw, rdw), ("db", db, rdb)):
        assert not np.isnan(g).any(), name
        assert close(g, r, rtol=1e-4), (name, np.abs(g - r).max())


def test_implicit_forms_no_column_matrix(monkeypatch):
    """Forward and stride-1 backward never call im2col/col2im; strided dX does."""
    calls = []
    for k in ("_k_im2col", "_k_col2im"):
        real = getattr(conv, k)
        monkeypatch.setattr(conv, k, lambda *a, _r=real, _k=k: (calls.append(_k), _r(*a)))
    x, w, b = _data((2, 3, 9, 8), (4, 3, 3, 3), True, 5)
    with using("implicit"):
        y = ops.conv2d_forward(x, w, b, pad=1)
        ops.conv2d_backward(x, w, np.ones_like(y), pad=1)
        assert not calls
        y = ops.conv2d_forward(x, w, b, stride=2, pad=1)
        ops.conv2d_backward(x, w, np.ones_like(y), stride=2, pad=1, need_dx=False)
        assert not calls
        ops.conv2d_backward(x, w, np.ones_like(y), stride=2, pad=1)
        assert calls == ["_k_col2im"]


def test_conv_algo_selection(monkeypatch):
    monkeypatch.delenv("SPRINT_CONV_ALGO", raising=False)
    assert conv.conv_algo() == "winograd"  # the default (issue 14: the fastest measured)
    monkeypatch.setenv("SPRINT_CONV_ALGO", "im2col")
    assert conv.conv_algo() == "im2col"
    with using("implicit"):
        assert conv.conv_algo() == "implicit"
    with using("winograd"):
        assert conv.conv_algo() == "winograd"
    monkeypatch.setenv("SPRINT_CONV_ALGO", "fft")
    with pytest.raises(ValueError, match="SPRINT_CONV_ALGO"):
        conv.conv_algo()
    with pytest.raises(ValueError, match="winograd, implicit, im2col"):
        conv.set_conv_algo("fft")


def test_net_step_same_under_both_algos():
    """A whole forward/backward of a small net (fused ReLU in the conv layers)
    gives the same loss and gradient with either algorithm."""
    from engine.net import Net
    rng = np.random.default_rng(0)
    shape = Net("digits").spec.input_shape
    x = rng.standard_normal((4,) + tuple(shape)).astype(np.float32)
    y = rng.integers(0, 10, 4)
    out = {}
    for algo in conv.CONV_ALGOS:
        with using(algo):
            net = Net("digits", seed=1)
            loss, _ = net.loss_and_grad(x, y)
            out[algo] = (loss, net.grads.copy())
    for algo in ("implicit", "winograd"):
        assert out["im2col"][0] == pytest.approx(out[algo][0], rel=1e-5), algo
        np.testing.assert_allclose(out[algo][1], out["im2col"][1], rtol=1e-4,
                                   atol=1e-5 * np.abs(out["im2col"][1]).max(), err_msg=algo)


@pytest.mark.parametrize("isa", ISAS)
def test_rows_of_a_micro_batch_equal_the_whole_batch_bitwise(isa):
    """Each output of the forward (and of dX) sums its terms in one order
    whatever the batch, tile and thread split: a micro-batch reproduces its
    rows of the whole batch exactly (the pipeline's gpipe equals one process)."""
    x, w, b = _data((23, 6, 17, 19), (13, 6, 3, 3), True, 7)
    dy = np.random.default_rng(8).standard_normal((23, 13, 17, 19)).astype(np.float32)
    with using("implicit", isa):
        y = ops.conv2d_forward(x, w, b, pad=1, relu=True)
        dx = ops.conv2d_backward(x, w, dy, pad=1)[0]
        for lo, hi in ((0, 1), (1, 9), (9, 23)):
            assert np.array_equal(ops.conv2d_forward(x[lo:hi], w, b, pad=1, relu=True), y[lo:hi]), (lo, hi)
            assert np.array_equal(ops.conv2d_backward(x[lo:hi], w, dy[lo:hi], pad=1)[0], dx[lo:hi]), (lo, hi)


@pytest.mark.parametrize("algo,isa", [("implicit", i) for i in ISAS] + [("im2col", None), ("winograd", None)])
def test_gradients_accumulated_over_micro_batches_equal_the_whole_batch(algo, isa, monkeypatch):
    """conv2d_backward / linear_backward with accumulate on consecutive
    micro-batches give the whole batch's dw and db bit for bit (the engine
    SGEMM continues each sum; the pipeline's gpipe relies on it)."""
    monkeypatch.setenv("SPRINT_GEMM", "engine")
    x, w, b = _data((13, 5, 11, 10), (7, 5, 3, 3), True, 9)
    dy = np.random.default_rng(10).standard_normal((13, 7, 11, 10)).astype(np.float32)
    with using(algo, isa):
        _, dw, db = ops.conv2d_backward(x, w, dy, pad=1, need_dx=False)
        gw, gb = poison(w.shape), poison(7)
        for i, (lo, hi) in enumerate(((0, 4), (4, 5), (5, 13))):
            ops.conv2d_backward(x[lo:hi], w, dy[lo:hi], pad=1, need_dx=False, dw_out=gw, db_out=gb,
                                accumulate=i > 0)
    assert np.array_equal(gw, dw) and np.array_equal(gb, db)
    xf = x.reshape(13, -1)
    wf = np.random.default_rng(11).standard_normal((6, xf.shape[1])).astype(np.float32)
    d6 = dy.reshape(13, -1)[:, :6].copy()
    _, dw, db = ops.linear_backward(xf, wf, d6, need_dx=False)
    gw, gb = poison(wf.shape), poison(6)
    for i, (lo, hi) in enumerate(((0, 1), (1, 8), (8, 13))):
        ops.linear_backward(xf[lo:hi], wf, d6[lo:hi], need_dx=False, dw_out=gw, db_out=gb, accumulate=i > 0)
    assert np.array_equal(gw, dw) and np.array_equal(gb, db)
    with pytest.raises(ValueError, match="accumulate needs dw_out"):
        ops.conv2d_backward(x, w, dy, pad=1, accumulate=True)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("xs,ws", [((10, 24, 12, 12), (40, 24, 3, 3)), ((9, 3, 32, 32), (64, 3, 3, 3)),
                                    ((12, 64, 16, 16), (128, 64, 3, 3))])
def test_dw_accumulated_on_threads_equals_the_whole_batch_and_reference(isa, xs, ws):
    """dW^T's running sums (transposed out of dw when accumulating, into it at
    the end, each thread its own cell) on a shape split over the threads, with
    whole register transposes and edges: micro-batches continue the whole
    batch's chains bit for bit, and both match float64; so does db. The third
    shape's dW^T (576 x 128) takes the L2-sized pixel blocks (2728 pixels
    with a 2 MiB L2): its 3072 pixels end a block inside the last
    micro-batch, its micro-batches (768, 256, 2048 pixels) each a block."""
    x, w, b = _data(xs, ws, True, 12)
    M = ws[0]
    dy = np.random.default_rng(13).standard_normal((xs[0], M) + xs[2:]).astype(np.float32)
    with using("implicit", isa):
        _, dw, db = ops.conv2d_backward(x, w, dy, pad=1, need_dx=False, dw_out=poison(w.shape), db_out=poison(M))
        gw, gb = poison(w.shape), poison(M)
        for i, (lo, hi) in enumerate(((0, 3), (3, 4), (4, xs[0]))):
            ops.conv2d_backward(x[lo:hi], w, dy[lo:hi], pad=1, need_dx=False, dw_out=gw, db_out=gb,
                                accumulate=i > 0)
    assert np.array_equal(gw, dw) and np.array_equal(gb, db)
    rdw, rdb = ref_conv_grads(x, w, dy, 1, 1, 1, 1)[1:]
    assert close(dw, rdw, rtol=1e-4), np.abs(dw - rdw).max()
    assert close(db, rdb, rtol=1e-4)
    kernel = backend.get_backend().ext.conv2d_implicit_dw_kernel(x, w, 1, 1, 1, 1, isa)
    assert kernel == ("lanes" if ws[1] == 3 else "taps")  # K = 27 is small, 216 is not
    if kernel == "taps":
        # db comes from dW's packed dy^T panels: per channel one float32 chain of
        # adds over (image, pixel) in order, which a sequential cumsum reproduces
        seq = np.cumsum(dy.transpose(1, 0, 2, 3).reshape(M, -1), axis=1, dtype=np.float32)[:, -1]
        assert np.array_equal(db, seq)


# Small K (C*kh*kw <= 64): dW in vector lanes over each output row
# (csrc/gemm_conv_small.h). Batch 1, odd sizes, rows with a masked tail (OW
# not a multiple of 16 or 8), row stride 2, no padding, non-square kernels,
# channels not a multiple of the kernel's 2 or 3 per block, K = 64 at the limit.
LANES = [((1, 3, 17, 21), (5, 3, 3, 3), (1, 1), (1, 1)),
         ((3, 2, 19, 33), (13, 2, 5, 5), (1, 1), (2, 2)),
         ((2, 3, 20, 18), (7, 3, 3, 3), (2, 1), (1, 0)),
         ((2, 1, 16, 40), (4, 1, 3, 3), (1, 1), (0, 0)),
         ((2, 4, 9, 24), (10, 4, 4, 4), (1, 1), (1, 2)),
         ((5, 3, 32, 32), (64, 3, 3, 3), (1, 1), (1, 1))]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("xs,ws,stride,pad", LANES, ids=lambda v: "x".join(map(str, v)))
def test_small_k_dw_in_lanes_matches_reference_and_micro_batches(isa, xs, ws, stride, pad):
    """The lanes kernel runs these shapes (and says so); dW and db match
    float64 into poisoned buffers, and micro-batches with accumulate continue
    the whole batch's sums bit for bit (one chain of per-image sums)."""
    x, w, b = _data(xs, ws, True, 21)
    ext = backend.set_backend("cpu").ext
    assert ext.conv2d_implicit_dw_kernel(x, w, *stride, *pad, isa) == "lanes"
    ref = ref_conv(x, w, b, *stride, *pad)
    dy = np.random.default_rng(22).standard_normal(ref.shape).astype(np.float32)
    _, rdw, rdb = ref_conv_grads(x, w, dy, *stride, *pad)
    with using("implicit", isa):
        _, dw, db = ops.conv2d_backward(x, w, dy, stride=stride, pad=pad, need_dx=False, dw_out=poison(ws),
                                        db_out=poison(ws[0]))
        assert not np.isnan(dw).any() and not np.isnan(db).any()
        assert close(dw, rdw, rtol=1e-4), np.abs(dw - rdw).max()
        assert close(db, rdb, rtol=1e-4), np.abs(db - rdb).max()
        gw, gb = poison(ws), poison(ws[0])
        cuts = sorted({0, xs[0] // 2, xs[0] - 1 if xs[0] > 1 else 0, xs[0]})
        for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
            ops.conv2d_backward(x[lo:hi], w, dy[lo:hi], stride=stride, pad=pad, need_dx=False, dw_out=gw, db_out=gb,
                                accumulate=i > 0)
    assert np.array_equal(gw, dw) and np.array_equal(gb, db)


def test_small_k_dw_kernel_choice():
    """Lanes for small K with rows at least a register wide; the tap kernel
    for K > 64, strided rows or rows narrower than the register."""
    ext = backend.set_backend("cpu").ext
    x = np.zeros((1, 3, 8, 40), np.float32)
    assert ext.conv2d_implicit_dw_kernel(x, np.zeros((4, 3, 3, 3), np.float32), 1, 1, 1, 1) == "lanes"
    assert ext.conv2d_implicit_dw_kernel(x, np.zeros((4, 3, 3, 3), np.float32), 1, 2, 1, 1) == "taps"
    assert ext.conv2d_implicit_dw_kernel(np.zeros((1, 8, 8, 40), np.float32), np.zeros((4, 8, 3, 3), np.float32),
                                         1, 1, 1, 1) == "taps"  # K = 72
    for isa in ISAS:  # OW = 3: narrower than any ISA's register
        assert ext.conv2d_implicit_dw_kernel(np.zeros((1, 3, 8, 3), np.float32), np.zeros((4, 3, 3, 3), np.float32),
                                             1, 1, 1, 1, isa) == "taps"
