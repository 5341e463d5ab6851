"""`sprint selfcheck`: runs every op of engine.ops on small random inputs
against a float64 NumPy reference and prints a table (check, max error,
bound, time), then names any public op no check covers (``coverage``).
Quick (well under a second per check on a CPU); exit status 1 if a check is
off. The references here are deliberately plain (loops / einsum)."""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from engine import backend


def _ref_conv(x, w, b, s, p):
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    OH, OW = (H + 2 * p - kh) // s + 1, (W + 2 * p - kw) // s + 1
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    y = np.zeros((N, M, OH, OW))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("nchw,mc->nmhw", xp[:, :, i:i + s * OH:s, j:j + s * OW:s], w[:, :, i, j])
    return y + b[None, :, None, None]


def _ref_conv_grads(x, w, dy, s, p):
    N, C, H, W = x.shape
    M, _, kh, kw = w.shape
    OH, OW = dy.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    dxp = np.zeros_like(xp)
    dw = np.zeros(w.shape)
    for i in range(kh):
        for j in range(kw):
            win = (slice(None), slice(None), slice(i, i + s * OH, s), slice(j, j + s * OW, s))
            dw[:, :, i, j] = np.einsum("nmhw,nchw->mc", dy, xp[win])
            dxp[win] += np.einsum("nmhw,mc->nchw", dy, w[:, :, i, j])
    return dxp[:, :, p:p + H, p:p + W], dw, dy.sum(axis=(0, 2, 3))


def _err(got, ref) -> tuple[float, float]:
    """(max |got - ref|, allowed: 1e-5 * (1 + max|ref|) + 1e-5 * |ref| at worst)."""
    got = backend.to_host(got).astype(np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max(initial=0.0)), float(2e-5 * (1 + np.abs(ref).max(initial=0.0)))


def checks(rng) -> list[tuple[str, Callable[[], list[tuple]]]]:
    from engine import ops
    A = backend.asarray
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731

    def gemm():
        a, b = f32(17, 23), f32(19, 23)
        return [_err(ops.gemm(A(a), A(b), trans_b=True), a.astype(np.float64) @ b.T)]

    def im2col_col2im():
        x = f32(2, 3, 9, 7)
        cols = ops.im2col(A(x), 3, 3, 2, 1)
        c = backend.to_host(cols)
        # exact copy: every entry equals a padded-input sample
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        ref = np.stack([xp[:, ch, i:i + 9:2, j:j + 7:2] for ch in range(3) for i in range(3) for j in range(3)])
        back = ops.col2im(cols, x.shape, 3, 3, 2, 1)
        lhs = float((c.astype(np.float64) ** 2).sum())
        rhs = float((x.astype(np.float64) * backend.to_host(back)).sum())  # <im2col x, im2col x> = <x, col2im im2col x>
        return [_err(c, ref.reshape(27, -1)), (abs(lhs - rhs), 1e-5 * (1 + abs(lhs)))]

    def conv2d():
        x, w, b = f32(2, 3, 8, 7), f32(4, 3, 3, 3), f32(4)
        y = ops.conv2d_forward(A(x), A(w), A(b), stride=1, pad=1, workspace_bytes=4096)
        dy = f32(*backend.to_host(y).shape)
        dx, dw, db = ops.conv2d_backward(A(x), A(w), A(dy), stride=1, pad=1, workspace_bytes=4096)
        rdx, rdw, rdb = _ref_conv_grads(x, w, dy.astype(np.float64), 1, 1)
        return [_err(y, _ref_conv(x, w, b, 1, 1)), _err(dx, rdx), _err(dw, rdw), _err(db, rdb)]

    def linear():
        x, w, b, dy = f32(5, 7), f32(3, 7), f32(3), f32(5, 3)
        y = ops.linear_forward(A(x), A(w), A(b))
        dx, dw, db = ops.linear_backward(A(x), A(w), A(dy))
        d = dy.astype(np.float64)
        return [_err(y, x.astype(np.float64) @ w.T + b), _err(dx, d @ w), _err(dw, d.T @ x), _err(db, d.sum(0))]

    def relu():
        x, dy = f32(4, 5), f32(4, 5)
        y = ops.relu_forward(A(x))
        return [_err(y, np.maximum(x, 0)), _err(ops.relu_backward(y, A(dy)), dy * (x > 0))]

    def bias_act():
        x, b = f32(3, 4, 5), f32(4)
        ref = x.astype(np.float64) + b[None, :, None]
        return [_err(ops.bias_act(A(x), A(b)), np.maximum(ref, 0)),
                _err(ops.bias_act(A(x), A(b), relu=False), ref)]

    def maxpool():
        errs = []
        for k, stride, pad in ((2, None, 0), (3, 2, 1)):     # tiling and overlapping windows
            x = f32(2, 3, 7, 6)
            y, arg = ops.maxpool_forward(A(x), k, stride, pad)
            ref, am = ref_pool(x, k, k, stride or k, stride or k, pad, pad)
            dy = f32(*ref.shape)
            dx = ops.maxpool_backward(A(dy), arg, x.shape, k, stride, pad)
            errs += [_err(y, ref), _err(dx, ref_pool_backward(dy.astype(np.float64), am, x.shape))]
        return errs

    def softmax_xent():
        logits, labels = f32(6, 5) * 3, rng.integers(0, 5, 6)
        loss, dl, probs = ops.softmax_xent(A(logits), backend.get_backend().xp.asarray(labels))
        z = logits.astype(np.float64) - logits.max(1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        ref_loss = -np.log(p[np.arange(6), labels]).mean()
        onehot = np.eye(5)[labels]
        return [(abs(float(loss) - ref_loss), 1e-5 * (1 + ref_loss)), _err(dl, (p - onehot) / 6), _err(probs, p)]

    def vector():
        x, y, w, d, u, bufs = f32(100), f32(100), f32(100), f32(100), f32(100), [f32(100) for _ in range(11)]
        h = [a.astype(np.float64) for a in (x, y, w, d, u)]
        yy = ops.axpy(0.5, A(x), A(y.copy()))
        xs = ops.scale(-1.5, A(x.copy()))
        total = ops.sum_into(A(np.empty(100, np.float32)), [A(b) for b in bufs])   # > 8: several passes
        ww, dd = A(w.copy()), A(d.copy())
        ops.momentum_step(ww, dd, A(u), 0.9)
        w2, v2, g2 = A(w.copy()), A(d.copy()), A(u.copy())
        ops.sgd_update(w2, v2, g2, 0.1, 0.9, 0.01)
        v_ref = 0.9 * h[3] - 0.1 * (h[4] + 0.01 * h[2])
        return [_err(yy, h[1] + 0.5 * h[0]), _err(xs, -1.5 * h[0]),
                _err(total, np.sum([b.astype(np.float64) for b in bufs], axis=0)),
                _err(dd, 0.9 * h[3] + h[4]), _err(ww, h[2] + 0.9 * h[3] + h[4]),
                _err(v2, v_ref), _err(w2, h[2] + v_ref)]

    def deform():
        x8 = rng.integers(0, 256, (3, 2, 6, 7), dtype=np.uint8)
        xf = f32(3, 2, 6, 7)
        params = np.array([[1, 0, 0, 0], [1, -1, 2, 1], [1.25, 0.5, -0.25, 0]], np.float32)
        mean, std = np.array([0.5, -0.25], np.float32), np.array([0.5, 2.0], np.float32)
        errs = []
        for x in (x8, xf):
            for out_hw in ((6, 7), (4, 5)):
                got = ops.deform(A(x, dtype=x.dtype), A(params), out_hw, A(mean), A(std))
                errs.append(_err(got, ref_deform(x, params, out_hw, mean, std)))
        return errs

    # (label, check, the ops of engine.ops it covers)
    return [("gemm", gemm, ("gemm",)),
            ("im2col/col2im", im2col_col2im, ("im2col", "col2im")),
            ("conv2d fwd/bwd", conv2d, ("conv2d_forward", "conv2d_backward")),
            ("linear fwd/bwd", linear, ("linear_forward", "linear_backward")),
            ("relu fwd/bwd", relu, ("relu_forward", "relu_backward")),
            ("bias+relu", bias_act, ("bias_act",)),
            ("maxpool fwd/bwd", maxpool, ("maxpool_forward", "maxpool_backward")),
            ("softmax+xent", softmax_xent, ("softmax_xent",)),
            ("vector ops", vector, ("axpy", "scale", "sum_into", "momentum_step", "sgd_update")),
            ("deform", deform, ("deform",))]


# Public names of engine.ops that launch no kernel.
HELPERS = {"conv_out_size": "shape arithmetic", "pool_out_shape": "shape arithmetic",
           "identity_params": "builds deform's parameter rows on the host"}


def ref_pool(x, kh, kw, sh, sw, ph, pw):
    """float64 max pooling; argmax = the flat (h*W + w) input index of the
    first maximum in row-major window order (padding never wins)."""
    N, C, H, W = x.shape
    OH, OW = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    y = np.empty((N, C, OH, OW))
    am = np.empty((N, C, OH, OW), np.int64)
    for oh in range(OH):
        for ow in range(OW):
            h0, w0 = oh * sh - ph, ow * sw - pw
            hs, he, ws, we = max(h0, 0), min(h0 + kh, H), max(w0, 0), min(w0 + kw, W)
            win = x[:, :, hs:he, ws:we].reshape(N, C, -1).astype(np.float64)
            k = win.argmax(axis=2)  # first maximum
            y[:, :, oh, ow] = np.take_along_axis(win, k[..., None], 2)[..., 0]
            am[:, :, oh, ow] = (hs + k // (we - ws)) * W + ws + k % (we - ws)
    return y, am


def ref_pool_backward(dy, am, x_shape):
    """float64 dx of max pooling: each dy added at its argmax (windows may overlap)."""
    N, C, H, W = x_shape
    dx = np.zeros((N * C, H * W))
    for p, (d, a) in enumerate(zip(dy.reshape(N * C, -1), am.reshape(N * C, -1))):
        np.add.at(dx[p], a, d)
    return dx.reshape(x_shape)


def ref_deform(x, params, out_hw, mean, std):
    """float64 DeformImage as engine/ops/deform.py documents it: bilinear, zero outside."""
    N, C, H, W = x.shape
    oh, ow = out_hw
    xf = x.astype(np.float64) / (255.0 if x.dtype == np.uint8 else 1.0)
    out = np.zeros((N, C, oh, ow))
    i, j = np.meshgrid(np.arange(oh, dtype=np.float64), np.arange(ow, dtype=np.float64), indexing="ij")
    for n in range(N):
        sc, dy, dx, flip = params[n].astype(np.float64)
        sy = (H - 1) / 2 + (i - (oh - 1) / 2) / sc + dy
        sx = (W - 1) / 2 + (j - (ow - 1) / 2) / sc + dx
        if flip > 0.5:
            sx = (W - 1) - sx
        y0, x0 = np.floor(sy).astype(np.int64), np.floor(sx).astype(np.int64)
        ty, tx = sy - y0, sx - x0
        for yy, xx, wgt in ((y0, x0, (1 - ty) * (1 - tx)), (y0, x0 + 1, (1 - ty) * tx),
                            (y0 + 1, x0, ty * (1 - tx)), (y0 + 1, x0 + 1, ty * tx)):
            inside = (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
            out[n] += np.where(inside, xf[n][:, np.clip(yy, 0, H - 1), np.clip(xx, 0, W - 1)], 0.0) * wgt
    return (out - mean.astype(np.float64)[:, None, None]) / std.astype(np.float64)[:, None, None]


def coverage(check_list=None) -> tuple[list, list]:
    """(checks to run, names of engine.ops that none of them checks)."""
    from engine import ops
    check_list = checks(np.random.default_rng(0)) if check_list is None else check_list
    runnable = [c for c in check_list if all(hasattr(ops, op) for op in c[2])]
    covered = {op for c in runnable for op in c[2]}
    return runnable, sorted(set(ops.__all__) - covered - set(HELPERS))


def run(device: str | None = None, seed: int = 0) -> int:
    if device:
        backend.set_backend(device)
    else:
        backend.get_backend()     # chosen now: a backend error comes before the table
    rng = np.random.default_rng(seed)
    rows, bad = [], 0
    runnable, unchecked = coverage(checks(rng))
    for name, fn, _ in runnable:
        t0 = time.perf_counter()
        try:
            errs = fn()
            status = "ok" if all(e <= tol for e, tol in errs) else "FAIL"
            err = max(e for e, _ in errs)
            tol = min(t for _, t in errs)
        except Exception as e:  # report every op, not just the first failure
            status, err, tol = f"ERROR {type(e).__name__}: {e}", float("nan"), float("nan")
        bad += status != "ok"
        rows.append((name, err, tol, (time.perf_counter() - t0) * 1e3, status))
    print(f"sprint selfcheck: backend {backend.describe()}, kernels {backend.source_digest()}")
    print(f"{'op':18s} {'max err':>10s} {'bound':>10s} {'ms':>8s}  status")
    for name, err, tol, ms, status in rows:
        print(f"{name:18s} {err:10.2e} {tol:10.2e} {ms:8.1f}  {status}")
    helpers = ", ".join(sorted(HELPERS))
    if unchecked:
        print(f"NOT checked: {', '.join(unchecked)} (no check written yet); not kernels: {helpers}")
    else:
        print(f"every op of engine.ops checked (not kernels: {helpers})")
    print("all checked ops match the float64 reference" if not bad else f"{bad} check(s) failed")
    return 1 if bad else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("selfcheck", help="check every kernel against a float64 reference",
                              description="Run every op of engine.ops (forward and backward) on small random "
                                          "inputs against a float64 NumPy reference; the last lines name any op "
                                          "not checked. Exit status 1 if a check fails.")
    # SUPPRESS: an absent --device here must not overwrite the global one
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=argparse.SUPPRESS,
                   help="backend to check (default: the global --device / $SPRINT_DEVICE)")
    from engine.argtypes import nonneg_int
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the random inputs (default 0)")
    p.set_defaults(func=lambda a: run(getattr(a, "device", None), a.seed))
