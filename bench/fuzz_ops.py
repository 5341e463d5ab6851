"""The engine.ops half of bench/fuzz_targets.py: for every public function of
engine.ops, a generator of valid calls (random small shapes, arrays carved by
fuzz_targets.Arrays) and the rule for the shapes a successful call returns."""
from __future__ import annotations

import numpy as np


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def out_size(size, k, s, p):
    return (size + 2 * p - k) // s + 1


# ---- engine.ops: valid calls and result shapes ------------------------------
# valid(rng, A) -> (args, kwargs); shape(b) -> the expected result, given the
# bound arguments b (defaults applied) of a call that succeeded.

def conv_case(rng, A, pool=False):
    """N, C, H, W, kh, kw, sh, sw, ph, pw of a valid window. A quarter of them
    have extreme geometry: strides and pads up to 2^31 with small outputs
    (huge padded planes), big windows, or an empty batch."""
    N, C, H, W = (int(v) for v in rng.integers(1, 5, 4))
    if rng.random() < 0.1:
        N = 0
    wide = rng.random() < 0.25
    def side(L):
        if not wide:
            p = int(rng.integers(0, 3))
            return int(rng.integers(1, L + 2 * p + 1)), int(rng.integers(1, 4)), p
        s = 1 << int(rng.integers(1, 32))
        p = int(rng.choice([s >> 1, s - 1, s, int(rng.integers(0, 3)), (1 << 31) - 1, 1 << int(rng.integers(0, 32))]))
        p = min(p, 1 << 31)
        k = int(rng.choice([1, 2, 3, L + 2 * p, 1 << int(rng.integers(0, 31))]))
        return max(1, min(k, L + 2 * p, 1 << 31)), s, p
    kh, sh, ph = side(H)
    kw, sw, pw = side(W)
    if pool:
        ph, pw = min(ph, kh - 1), min(pw, kw - 1)
        kh, kw = min(kh, H + 2 * ph), min(kw, W + 2 * pw)
    return N, C, H, W, kh, kw, sh, sw, ph, pw


def _maybe_pair(rng, a, b):
    return (a, b) if a != b or rng.random() < 0.3 else a


def v_gemm(rng, A):
    m, k, n = (int(v) for v in rng.integers(0, 5, 3))
    ta, tb = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
    a = A.new((k, m) if ta else (m, k))
    b = A.new((n, k) if tb else (k, n))
    beta = float(rng.choice([0.0, 0.5, 1.0]))
    out = A.new((m, n)) if beta or rng.random() < 0.3 else None
    return [a, b], dict(trans_a=ta, trans_b=tb, alpha=float(rng.choice([1.0, -2.0])), beta=beta, out=out)


def s_gemm(b):
    return [(b["a"].shape[1] if b["trans_a"] else b["a"].shape[0], b["b"].shape[0] if b["trans_b"] else b["b"].shape[1])]


def v_im2col(rng, A):
    N, C, H, W, kh, kw, sh, sw, ph, pw = conv_case(rng, A)
    return [A.new((N, C, H, W)), kh, kw], dict(stride=_maybe_pair(rng, sh, sw), pad=_maybe_pair(rng, ph, pw))


def s_im2col(b):
    N, C, H, W = b["x"].shape
    (sh, sw), (ph, pw) = _pair(b["stride"]), _pair(b["pad"])
    return [(C * b["kh"] * b["kw"], N * out_size(H, b["kh"], sh, ph) * out_size(W, b["kw"], sw, pw))]


def v_col2im(rng, A):
    N, C, H, W, kh, kw, sh, sw, ph, pw = conv_case(rng, A)
    P = out_size(H, kh, sh, ph) * out_size(W, kw, sw, pw)
    return [A.new((C * kh * kw, N * P)), (N, C, H, W), kh, kw], dict(stride=(sh, sw), pad=(ph, pw))


def v_conv_out_size(rng, A):
    size, k = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    p = int(rng.integers(0, 3))
    return [size, min(k, size + 2 * p)], dict(stride=int(rng.integers(1, 4)), pad=p)


def v_conv2d_forward(rng, A):
    N, C, H, W, kh, kw, sh, sw, ph, pw = conv_case(rng, A)
    M = int(rng.integers(1, 4))
    b = A.new((M,)) if rng.random() < 0.7 else None
    ws = None if rng.random() < 0.7 else int(rng.integers(1, 4096))
    return [A.new((N, C, H, W)), A.new((M, C, kh, kw)), b], dict(stride=(sh, sw), pad=(ph, pw), workspace_bytes=ws)


def s_conv2d_forward(b):
    N, _, H, W = b["x"].shape
    M, _, kh, kw = b["w"].shape
    (sh, sw), (ph, pw) = _pair(b["stride"]), _pair(b["pad"])
    return [(N, M, out_size(H, kh, sh, ph), out_size(W, kw, sw, pw))]


def v_conv2d_backward(rng, A):
    (x, w, _), kw = v_conv2d_forward(rng, A)
    dy = A.new(s_conv2d_forward(dict(x=x, w=w, **kw))[0])
    return [x, w, dy], dict(stride=kw["stride"], pad=kw["pad"], need_dx=bool(rng.random() < 0.7),
                            workspace_bytes=kw["workspace_bytes"])


def s_conv2d_backward(b):
    return [b["x"].shape if b["need_dx"] else None, b["w"].shape, (b["w"].shape[0],)]


def v_linear_forward(rng, A):
    N, I, O = (int(v) for v in rng.integers(1, 5, 3))
    return [A.new((N, I)), A.new((O, I)), A.new((O,)) if rng.random() < 0.7 else None], {}


def v_linear_backward(rng, A):
    N, I, O = (int(v) for v in rng.integers(1, 5, 3))
    return [A.new((N, I)), A.new((O, I)), A.new((N, O))], dict(need_dx=bool(rng.random() < 0.7))


def _any_shape(rng, lo=0):
    return tuple(int(v) for v in rng.integers(lo, 4, int(rng.integers(0, 5))))


def v_relu_forward(rng, A):
    x = A.new(_any_shape(rng))
    return [x], dict(out=x if rng.random() < 0.3 else None)


def v_relu_backward(rng, A):
    shape = _any_shape(rng)
    dy = A.new(shape)
    return [A.new(shape), dy], dict(out=dy if rng.random() < 0.3 else None)


def v_bias_act(rng, A):
    shape = (int(rng.integers(0, 4)), int(rng.integers(1, 4))) + _any_shape(rng)[:2]
    x = A.new(shape)
    return [x, A.new(shape[1:2])], dict(relu=bool(rng.random() < 0.5), out=x if rng.random() < 0.3 else None)


def v_maxpool_forward(rng, A):
    N, C, H, W, kh, kw, sh, sw, ph, pw = conv_case(rng, A, pool=True)
    stride = None if rng.random() < 0.3 else (sh, sw)
    return [A.new((N, C, H, W)), _maybe_pair(rng, kh, kw)], dict(stride=stride, pad=(ph, pw))


def _pool_shape(x_shape, k, stride, pad):
    (kh, kw), (ph, pw) = _pair(k), _pair(pad)
    sh, sw = _pair(k if stride is None else stride)
    return (x_shape[0], x_shape[1], out_size(x_shape[2], kh, sh, ph), out_size(x_shape[3], kw, sw, pw))


def v_maxpool_backward(rng, A):
    (x, k), kw = v_maxpool_forward(rng, A)
    ys = _pool_shape(x.shape, k, kw["stride"], kw["pad"])
    am = A.new(ys, np.int32, fill="none")
    am[...] = rng.integers(0, x.shape[2] * x.shape[3], am.shape)
    return [A.new(ys), am, x.shape, k], kw


def v_pool_out_shape(rng, A):
    (x, k), kw = v_maxpool_forward(rng, A)
    return [x.shape, k], kw


def v_softmax_xent(rng, A):
    N, K = int(rng.integers(1, 5)), int(rng.integers(1, 40))
    labels = A.new((N,), rng.choice([np.int64, np.int32, np.uint8]), fill="none")
    labels[...] = rng.integers(0, K, N)
    return [A.new((N, K)), labels], {}


def _flat(rng, A, k):
    n = int(rng.integers(0, 70))
    return [A.new((n,)) for _ in range(k)]


def v_deform(rng, A):
    N, C, H, W = int(rng.integers(0, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 7))
    x = A.new((N, C, H, W), rng.choice([np.uint8, np.float32]))
    params = A.new((N, 4), fill="none")
    params[...] = np.column_stack([rng.uniform(0.5, 2, N), rng.uniform(-3, 3, (N, 2)), rng.random(N) < 0.5])
    std = A.new((C,), fill="none")
    std[...] = rng.uniform(0.1, 2, C)
    return [x, params, (int(rng.integers(1, 8)), int(rng.integers(1, 8))), A.new((C,)), std], {}


OPS = {  # name: (valid-call generator, result shape rule)
    "gemm": (v_gemm, s_gemm),
    "im2col": (v_im2col, s_im2col),
    "col2im": (v_col2im, lambda b: [tuple(b["x_shape"])]),
    "conv_out_size": (v_conv_out_size, lambda b: [out_size(b["size"], b["k"], b["stride"], b["pad"])]),
    "conv2d_forward": (v_conv2d_forward, s_conv2d_forward),
    "conv2d_backward": (v_conv2d_backward, s_conv2d_backward),
    "linear_forward": (v_linear_forward, lambda b: [(b["x"].shape[0], b["w"].shape[0])]),
    "linear_backward": (v_linear_backward,
                        lambda b: [b["x"].shape if b["need_dx"] else None, b["w"].shape, (b["w"].shape[0],)]),
    "relu_forward": (v_relu_forward, lambda b: [b["x"].shape]),
    "relu_backward": (v_relu_backward, lambda b: [b["y"].shape]),
    "bias_act": (v_bias_act, lambda b: [b["x"].shape]),
    "maxpool_forward": (v_maxpool_forward, lambda b: [_pool_shape(b["x"].shape, b["k"], b["stride"], b["pad"])] * 2),
    "maxpool_backward": (v_maxpool_backward, lambda b: [tuple(b["x_shape"])]),
    "pool_out_shape": (v_pool_out_shape, lambda b: [_pool_shape(b["x_shape"], b["k"], b["stride"], b["pad"])]),
    "softmax_xent": (v_softmax_xent, lambda b: ["float", b["logits"].shape, b["logits"].shape]),
    "axpy": (lambda r, A: ([float(r.standard_normal()), *_flat(r, A, 2)], {}), lambda b: [b["y"].shape]),
    "scale": (lambda r, A: ([float(r.standard_normal()), *_flat(r, A, 1)], {}), lambda b: [b["x"].shape]),
    "sum_into": (lambda r, A: ([(f := _flat(r, A, int(r.integers(2, 12))))[0], f[int(r.random() < 0.5):]], {}),
                 lambda b: [b["out"].shape]),
    "momentum_step": (lambda r, A: ([*_flat(r, A, 3), 0.9], {}), lambda b: [b["w"].shape]),
    "sgd_update": (lambda r, A: ([*_flat(r, A, 3), 0.1, 0.9, 1e-4], {}), lambda b: [b["w"].shape]),
    "deform": (v_deform, lambda b: [tuple(b["x"].shape[:2]) + tuple(_pair(b["out_hw"]))]),
    "identity_params": (lambda r, A: ([int(r.integers(0, 5))], {}), lambda b: [(b["n"], 4)]),
}


def result_shapes(res) -> list:
    """A call's result as the list the shape rules return."""
    items = list(res) if isinstance(res, tuple) and not all(isinstance(v, (int, np.integer)) for v in res) else [res]
    out = []
    for v in items:
        if isinstance(v, np.ndarray):
            out.append(v.shape)
        elif isinstance(v, float):
            out.append("float")
        elif isinstance(v, tuple):
            out.append(tuple(int(s) for s in v))
        else:
            out.append(v)
    return out
