"""What bench/fuzz.py calls: every public function of engine.ops (CPU
backend) and every raw binding of engine._sprint_cpu and engine._sprint_cuda,
each with a generator of valid calls (random small shapes) and a rule for
the shapes a successful call must return. A call is the valid one, mutated
(wrong dtype, rank, shape, strides, read-only, aliasing, NaN/Inf, huge,
negative or non-integer sizes, empty arrays with huge dimensions...), or
fully random arguments. Call k of seed s depends on (s, k) only, so any
failure replays alone (bench/fuzz.py --replay k)."""
from __future__ import annotations

import inspect
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

GUARD = 64            # guard bytes on both sides of every array the fuzzer makes
SENTINEL = 0xA5
HUGE = [1 << 31, (1 << 31) - 1, 1 << 62, (1 << 63) - 1, 1 << 63, -(1 << 40), -1, 0, 1 << 60, 1 << 20]
DTYPES = [np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_, np.complex64]


def huge_empty(shape, dtype=np.float32):
    """An empty array whose other dimensions are as large as NumPy allows
    (their product times the item size must stay below 2^63)."""
    shape = list(shape)
    while True:
        try:
            return np.empty(shape, dtype)
        except ValueError:
            i = max(range(len(shape)), key=lambda j: shape[j])
            shape[i] >>= 8


class Arrays:
    """Arrays carved from byte buffers between guard zones: a write outside
    an array shows up in intact()."""

    def __init__(self, rng):
        self.rng = rng
        self.buffers = []

    def new(self, shape, dtype=np.float32, fill="normal", contiguous=True, writable=True):
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        if np.prod(shape, dtype=object) * dtype.itemsize > 1 << 22:  # made from huge dims: keep them, empty
            i = max(range(len(shape)), key=lambda j: shape[j])
            return huge_empty(shape[:i] + (0,) + shape[i + 1:], dtype)
        full = shape if contiguous or not shape else shape[:-1] + (max(1, shape[-1]) * 2,)
        n = int(np.prod(full, dtype=np.int64)) if all(full) else 0
        base = np.full(n * dtype.itemsize + 2 * GUARD, SENTINEL, np.uint8)
        a = base[GUARD:GUARD + n * dtype.itemsize].view(dtype).reshape(full)
        if n and fill == "normal":
            if dtype.kind in "fc":
                a[...] = self.rng.standard_normal(full)
            else:
                a[...] = self.rng.integers(0, 5, size=full)
        if not contiguous and shape:
            a = a[..., ::2]
        a.flags.writeable = writable
        self.buffers.append(base)
        return a

    def like(self, a, **kw):
        b = self.new(a.shape, a.dtype, fill="none", **kw)
        b.flags.writeable = True
        b[...] = a
        b.flags.writeable = kw.get("writable", True)
        return b

    def intact(self) -> bool:
        return all((b[:GUARD] == SENTINEL).all() and (b[-GUARD:] == SENTINEL).all() for b in self.buffers)


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _out(size, k, s, p):
    return (size + 2 * p - k) // s + 1


# ---- engine.ops: valid calls and result shapes ------------------------------
# valid(rng, A) -> (args, kwargs); shape(b) -> the expected result, given the
# bound arguments b (defaults applied) of a call that succeeded.

def _conv_case(rng, A, pool=False):
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
    N, C, H, W, kh, kw, sh, sw, ph, pw = _conv_case(rng, A)
    return [A.new((N, C, H, W)), kh, kw], dict(stride=_maybe_pair(rng, sh, sw), pad=_maybe_pair(rng, ph, pw))


def s_im2col(b):
    N, C, H, W = b["x"].shape
    (sh, sw), (ph, pw) = _pair(b["stride"]), _pair(b["pad"])
    return [(C * b["kh"] * b["kw"], N * _out(H, b["kh"], sh, ph) * _out(W, b["kw"], sw, pw))]


def v_col2im(rng, A):
    N, C, H, W, kh, kw, sh, sw, ph, pw = _conv_case(rng, A)
    P = _out(H, kh, sh, ph) * _out(W, kw, sw, pw)
    return [A.new((C * kh * kw, N * P)), (N, C, H, W), kh, kw], dict(stride=(sh, sw), pad=(ph, pw))


def v_conv_out_size(rng, A):
    size, k = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    p = int(rng.integers(0, 3))
    return [size, min(k, size + 2 * p)], dict(stride=int(rng.integers(1, 4)), pad=p)


def v_conv2d_forward(rng, A):
    N, C, H, W, kh, kw, sh, sw, ph, pw = _conv_case(rng, A)
    M = int(rng.integers(1, 4))
    b = A.new((M,)) if rng.random() < 0.7 else None
    ws = None if rng.random() < 0.7 else int(rng.integers(1, 4096))
    return [A.new((N, C, H, W)), A.new((M, C, kh, kw)), b], dict(stride=(sh, sw), pad=(ph, pw), workspace_bytes=ws)


def s_conv2d_forward(b):
    N, _, H, W = b["x"].shape
    M, _, kh, kw = b["w"].shape
    (sh, sw), (ph, pw) = _pair(b["stride"]), _pair(b["pad"])
    return [(N, M, _out(H, kh, sh, ph), _out(W, kw, sw, pw))]


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
    N, C, H, W, kh, kw, sh, sw, ph, pw = _conv_case(rng, A, pool=True)
    stride = None if rng.random() < 0.3 else (sh, sw)
    return [A.new((N, C, H, W)), _maybe_pair(rng, kh, kw)], dict(stride=stride, pad=(ph, pw))


def _pool_shape(x_shape, k, stride, pad):
    (kh, kw), (ph, pw) = _pair(k), _pair(pad)
    sh, sw = _pair(k if stride is None else stride)
    return (x_shape[0], x_shape[1], _out(x_shape[2], kh, sh, ph), _out(x_shape[3], kw, sw, pw))


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
    "conv_out_size": (v_conv_out_size, lambda b: [_out(b["size"], b["k"], b["stride"], b["pad"])]),
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


# ---- raw bindings: argument kinds from the pybind11 signatures --------------

def binding_kinds(fn) -> list[tuple[str, str]]:
    """[(name, kind)], kind in array|int|float|bool|seq|any, from fn.__doc__."""
    first = (fn.__doc__ or "").strip().splitlines()[0]
    m = re.match(r"\w+\((.*)\)\s*->", first)
    params = []
    for part in re.split(r",\s*(?=\w+:)", m.group(1)) if m and m.group(1) else []:
        name, _, ann = part.partition(":")
        ann = ann.split("=")[0]
        kind = ("int" if "SupportsInt" in ann or ann.strip() == "int" else "float" if "SupportsFloat" in ann
                else "bool" if "bool" in ann else "seq" if "Sequence" in ann else "any" if "object" in ann
                else "array")
        params.append((name.strip(), kind))
    return params


def _f(A, *shape):
    return A.new(shape)


def _labels(A, rng, n, k, dtype):
    a = A.new((n,), dtype, fill="none")
    a[...] = rng.integers(0, k, n)
    return a


# The raw CPU bindings cpu_binding_valid() can call validly; others get mutated
# random calls only (and a note in the report).
CPU_VALID = ("im2col", "col2im", "cnhw_to_nchw", "nchw_to_cnhw", "channel_sum", "add_channel_bias",
             "maxpool_forward", "maxpool_backward", "softmax_xent", "relu_forward", "relu_backward", "bias_act",
             "axpy", "scale", "sum_into", "momentum_step", "sgd_update", "deform")


def cpu_binding_valid(name, rng, A):
    """A valid call of engine._sprint_cpu.<name> with random small shapes, or None."""
    if name in ("im2col", "col2im"):
        N, C, H, W, kh, kw, sh, sw, ph, pw = _conv_case(rng, A)
        cols = _f(A, C * kh * kw, N * _out(H, kh, sh, ph) * _out(W, kw, sw, pw))
        x = _f(A, N, C, H, W)
        return [x, cols, kh, kw, sh, sw, ph, pw] if name == "im2col" else [cols, x, kh, kw, sh, sw, ph, pw]
    B, M, P = (int(v) for v in rng.integers(0, 4, 3))
    if name == "cnhw_to_nchw":
        return [_f(A, M, B * P), _f(A, M) if rng.random() < 0.5 else None, _f(A, B, M, P)]
    if name == "nchw_to_cnhw":
        return [_f(A, B, M, P), _f(A, M, B * P), _f(A, M) if rng.random() < 0.5 else None, bool(rng.random() < 0.5)]
    if name == "channel_sum":
        return [_f(A, B, M, P), _f(A, M), bool(rng.random() < 0.5)]
    if name == "add_channel_bias":
        return [_f(A, B, M, P), _f(A, M)]
    if name in ("maxpool_forward", "maxpool_backward"):
        N, C, H, W, kh, kw, sh, sw, ph, pw = _conv_case(rng, A, pool=True)
        ys = (N, C, _out(H, kh, sh, ph), _out(W, kw, sw, pw))
        am = A.new(ys, np.int32, fill="none")
        am[...] = rng.integers(-1, H * W + 1, am.shape)
        if name == "maxpool_forward":
            return [_f(A, N, C, H, W), _f(A, *ys), am, kh, kw, sh, sw, ph, pw]
        return [_f(A, *ys), am, _f(A, N, C, H, W), kh, kw, sh, sw, ph, pw]
    if name == "softmax_xent":
        N, K = int(rng.integers(1, 5)), int(rng.integers(1, 40))
        return [_f(A, N, K), _labels(A, rng, N, K, rng.choice([np.int32, np.int64])), _f(A, N, K), _f(A, N, K),
                _f(A, N)]
    if name in ("relu_forward", "relu_backward", "bias_act"):
        (args, kw) = {"relu_forward": v_relu_forward, "relu_backward": v_relu_backward, "bias_act": v_bias_act}[name](rng, A)
        out = kw.get("out")
        out = A.new(args[0].shape) if out is None else out
        return args + [out] + ([kw["relu"]] if name == "bias_act" else [])
    if name in ("conv2d_implicit_forward", "conv2d_implicit_backward", "conv2d_implicit_dw_kernel"):
        N, C, H, W, kh, kw, sh, sw, ph, pw = _conv_case(rng, A)
        M = int(rng.integers(1, 5))
        ys = (N, M, _out(H, kh, sh, ph), _out(W, kw, sw, pw))
        x, w = _f(A, N, C, H, W), _f(A, M, C, kh, kw)
        if name == "conv2d_implicit_dw_kernel":
            return [x, w, sh, sw, ph, pw, ""]
        if name == "conv2d_implicit_forward":
            return [x, w, _f(A, M) if rng.random() < 0.5 else None, _f(A, *ys), sh, sw, ph, pw,
                    bool(rng.random() < 0.5), ""]
        dx = _f(A, N, C, H, W) if sh == sw == 1 else None
        return [x, w, _f(A, *ys), _f(A, M, C, kh, kw), dx, sh, sw, ph, pw, ""]
    if name.startswith("conv2d_winograd_"):  # 3x3 stride 1, pads 0-2, F(2,3) or F(4,3)
        from engine import _sprint_cpu as ext
        N, C, M = (int(v) for v in rng.integers(1, 5, 3))
        p, t = int(rng.integers(0, 3)), int(rng.choice([2, 4]))
        H, W = (max(3 - 2 * p, int(v)) for v in rng.integers(1, 12, 2))
        dx = name.endswith("backward_x")
        if name == "conv2d_winograd_workspace":
            return [N, C, H, W, M, p, p, t, bool(rng.random() < 0.5)]
        ws = _f(A, ext.conv2d_winograd_workspace(N, C, H, W, M, p, p, t, dx))
        x, w, y = _f(A, N, C, H, W), _f(A, M, C, 3, 3), _f(A, N, M, H + 2 * p - 2, W + 2 * p - 2)
        if dx:
            return [w, y, x, p, p, t, ws, ""]
        return [x, w, _f(A, M) if rng.random() < 0.5 else None, y, p, p, bool(rng.random() < 0.5), t, ws, ""]
    if name == "sgemm":
        m, n, k = (int(v) for v in rng.integers(1, 40, 3))
        ta, tb = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        return [_f(A, *((k, m) if ta else (m, k))), _f(A, *((n, k) if tb else (k, n))), _f(A, m, n), ta, tb,
                float(rng.standard_normal()), float(rng.standard_normal()), ""]
    if name == "gemm_info":
        return [str(rng.choice(["", "generic"]))]
    if name == "gemm_profile":
        return [False]
    if name == "fma_peak":  # a few iterations: the loop length is the argument
        return [int(rng.integers(1, 100)), int(rng.integers(1, 3)), str(rng.choice(["", "generic"]))]
    if name in OPS and name in ("axpy", "scale", "sum_into", "momentum_step", "sgd_update", "deform"):
        args, _ = OPS[name][0](rng, A)
        if name == "deform":
            x, params, (oh, ow), mean, std = args
            return [x, params, mean, std, _f(A, x.shape[0], x.shape[1], oh, ow)]
        return args
    return None


def cuda_binding_valid(kinds, rng):
    """Plausible arguments of an engine._sprint_cuda launcher: nonzero fake
    pointers and small sizes (only used when no device is present: the launch
    then fails with a CUDA error and no memory is touched)."""
    args = []
    for name, kind in kinds:
        if kind == "int":
            small = name in ("kh", "kw", "sh", "sw", "ph", "pw", "stream") or len(name) <= 2
            args.append(0 if name in ("stream", "ph", "pw") else int(rng.integers(1, 4)) if small else 4096 * int(rng.integers(1, 9)))
        elif kind == "float":
            args.append(0.5)
        elif kind == "bool":
            args.append(bool(rng.random() < 0.5))
        elif kind == "seq":
            args.append([4096 * int(v) for v in rng.integers(1, 9, int(rng.integers(1, 10)))])
        else:
            args.append(4096)
    return args


@dataclass
class Target:
    name: str                 # e.g. "ops.im2col", "cpu.im2col", "cuda.im2col"
    fn: Callable
    kinds: list               # [(param name, kind)]
    valid: Callable           # (rng, A) -> (args, kwargs) or None
    shape: Callable | None    # result rule (ops only)
    errors: tuple             # exception types a rejected call may raise


def op_kinds(fn) -> list[tuple[str, str]]:
    kinds = []
    for p in inspect.signature(fn).parameters.values():
        n = p.name
        kind = ("array" if n in ("a", "b", "x", "w", "dy", "y", "cols", "logits", "labels", "params", "mean", "std",
                                 "argmax", "delta", "upd", "v", "g") or n.endswith("out") else
                "seq" if n == "bufs" else "shape" if n.endswith("_shape") else
                "pair" if n in ("stride", "pad", "k", "out_hw") else
                "bool" if n in ("trans_a", "trans_b", "need_dx", "relu") else
                "float" if n in ("alpha", "beta", "nu", "lr", "momentum", "weight_decay") else
                "skip" if n == "xp" else "int")
        kinds.append((n, kind))
    return kinds


REJECT = (TypeError, ValueError, OverflowError, MemoryError)


class CudaError(Exception):
    """Marker: a RuntimeError that names a CUDA error counts as a rejection."""


# ---- the ops' GPU path on the CPU ------------------------------------------------
# The ops take their RawModule path with NumPy arrays and each launch runs the
# real kernels/*.cu compiled as sequential C++ (tests/k2_support.py's shim: one
# thread, so grid-stride loops visit every index): the GPU path's validation,
# launch arguments and kernel index arithmetic, fuzzed without a GPU. Softmax
# needs warp shuffles and is not emulated.
EMU_FAMILIES = ("im2col", "pool", "elementwise", "vector", "deform")
EMU_OPS = ("im2col", "col2im", "conv2d_forward", "conv2d_backward", "relu_forward", "relu_backward", "bias_act",
           "maxpool_forward", "maxpool_backward", "axpy", "scale", "sum_into", "momentum_step", "sgd_update", "deform")


# A launch over more elements is refused (as a MemoryError, counted as a
# rejection): one CPU thread runs the emulated kernel, and legitimately large
# outputs (a 2 GB cols from a huge pad) would read as hangs.
EMU_MAX_LAUNCH = 1 << 23


class EmulationLimit(MemoryError):
    pass


def emulated_backend():
    """A Backend whose raw_launch runs the emulated kernels; the libraries are
    built once per source version into a shared temp folder (atomically, so
    concurrent fuzz children reuse them)."""
    import ctypes
    import hashlib
    import os
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    from engine import backend
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import k2_support

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise OSError("no C++ compiler")
    kdir = backend.kernel_dir()
    shim = k2_support._SHIM + "\n#define __shared__ static\n"
    h = hashlib.sha256(shim.encode())
    for f in sorted(kdir.glob("*.cu*")):
        h.update(f.read_bytes())
    cache = Path(tempfile.gettempdir()) / f"sprint_fuzz_emu_{h.hexdigest()[:16]}"
    cache.mkdir(exist_ok=True)
    libs = []
    for fam in EMU_FAMILIES:
        lib = cache / f"lib{fam}.so"
        if not lib.exists():
            (cache / "shim.h").write_text(shim)
            tmp = cache / f".lib{fam}.{os.getpid()}.so"
            subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-include", str(cache / "shim.h"),
                            "-x", "c++", str(kdir / f"{fam}.cu"), "-I", str(kdir), "-o", str(tmp)],
                           check=True, capture_output=True)
            os.replace(tmp, lib)
        libs.append(ctypes.CDLL(str(lib)))

    def raw_launch(kernel, args, n=None, grid=None, block=256):
        if n is not None and n > EMU_MAX_LAUNCH:
            raise EmulationLimit(f"{kernel}: {n} elements are too many to emulate on one CPU thread")
        for lib in libs:
            if hasattr(lib, kernel):
                return k2_support.kernel_call(lib, kernel, *args)
        raise AssertionError(f"kernel {kernel} is not emulated")

    be = backend.Backend("gpu", np, None, "rawmodule")
    be.raw_launch = raw_launch
    return be


def _on_backend(be, fn):
    import functools

    from engine import backend

    @functools.wraps(fn)
    def call(*args, **kwargs):
        old = backend._current
        backend._current = be
        try:
            return fn(*args, **kwargs)
        finally:
            backend._current = old
    return call


def targets(kinds=("ops", "cpu", "cuda")) -> tuple[list[Target], list[str]]:
    """The fuzz targets, sorted by name, and notes on what was left out."""
    import engine.ops as ops
    from engine import backend
    backend.set_backend("cpu")
    notes = []
    out = []
    if "ops" in kinds:
        for name in ops.__all__:
            fn = getattr(ops, name)
            if name not in OPS:
                notes.append(f"ops.{name}: no valid-call generator, random calls only")
            gen, rule = OPS.get(name, (lambda r, A: None, None))
            out.append(Target(f"ops.{name}", fn, op_kinds(fn), gen, rule, REJECT))
    if "cpu" in kinds:
        from engine import _sprint_cpu as m
        for name in sorted(dir(m)):
            fn = getattr(m, name)
            if name.startswith("_") or not callable(fn) or name in ("get_num_threads", "set_num_threads"):
                continue
            if name in ("fma_peak",):  # a benchmark probe: it runs as many iterations as asked (2^31: minutes)
                notes.append(f"cpu.{name}: not fuzzed (runs as long as its iteration count asks)")
                continue
            if name not in CPU_VALID:
                notes.append(f"cpu.{name}: no valid-call generator, random and mutated calls only")
            out.append(Target(f"cpu.{name}", fn, binding_kinds(fn),
                              lambda r, A, n=name: (lambda a: None if a is None else (a, {}))(cpu_binding_valid(n, r, A)),
                              None, REJECT))
    if "cuda" in kinds:
        try:
            from engine import _sprint_cuda as c
        except ImportError:
            notes.append("cuda: engine._sprint_cuda is not built")
            c = None
        if c is not None and c.device_count() > 0:
            notes.append("cuda: a device is present, raw launchers are not fuzzed (fake pointers would be used)")
        elif c is not None:
            for name in sorted(dir(c)):
                fn = getattr(c, name)
                if name.startswith("_") or not callable(fn) or name in ("device_count", "synchronize"):
                    continue
                k = binding_kinds(fn)
                out.append(Target(f"cuda.{name}", fn, k, lambda r, A, k=k: (cuda_binding_valid(k, r), {}), None,
                                  REJECT + (CudaError,)))
    if "emu" in kinds:
        try:
            be = emulated_backend()
        except (OSError, subprocess.CalledProcessError) as e:
            notes.append(f"emu: the CUDA sources could not be built for the CPU ({e})")
            be = None
        for name in EMU_OPS if be is not None else ():
            fn = _on_backend(be, getattr(ops, name))
            out.append(Target(f"emu.{name}", fn, op_kinds(fn), OPS[name][0], OPS[name][1], REJECT))
    if "selftest" in kinds:  # targets that crash or hang on purpose: the fuzzer must catch them
        import ctypes
        import os
        import time
        for name, fn in (("segfault", lambda *a: ctypes.string_at(0)), ("abort", lambda *a: os.abort()),
                         ("hang", lambda *a: time.sleep(3600)), ("bad_exception", lambda *a: {}["missing"])):
            out.append(Target(f"selftest.{name}", fn, [], lambda r, A: ([], {}), None, REJECT))
    return sorted(out, key=lambda t: t.name), notes
