"""`sprint selfcheck`: runs every op of engine.ops on small random inputs
against a float64 NumPy reference and prints a table (op, max error, bound,
time). Quick (well under a second per op on a CPU); exit status 1 if any op is
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

    def maxpool():
        x = f32(2, 3, 6, 6)
        y, arg = ops.maxpool_forward(A(x), 2)
        ref = x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5))
        return [_err(y, ref)]

    def softmax_xent():
        logits, labels = f32(6, 5) * 3, rng.integers(0, 5, 6)
        loss, dl, probs = ops.softmax_xent(A(logits), backend.get_backend().xp.asarray(labels))
        z = logits.astype(np.float64) - logits.max(1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
        ref_loss = -np.log(p[np.arange(6), labels]).mean()
        onehot = np.eye(5)[labels]
        return [(abs(float(loss) - ref_loss), 1e-5 * (1 + ref_loss)), _err(dl, (p - onehot) / 6), _err(probs, p)]

    def vector():
        x, y = f32(100), f32(100)
        yy = A(y.copy())  # updated in place
        ops.axpy(0.5, A(x), yy)
        return [_err(yy, y + 0.5 * x.astype(np.float64))]

    out = [("gemm", gemm), ("im2col/col2im", im2col_col2im), ("conv2d fwd/bwd", conv2d),
           ("linear fwd/bwd", linear)]
    for name, fn, op in (("relu fwd/bwd", relu, "relu_forward"), ("maxpool fwd", maxpool, "maxpool_forward"),
                         ("softmax+xent", softmax_xent, "softmax_xent"), ("axpy", vector, "axpy")):
        if hasattr(ops, op):
            out.append((name, fn))
    return out


def run(device: str | None = None, seed: int = 0) -> int:
    be = backend.set_backend(device) if device else backend.get_backend()
    rng = np.random.default_rng(seed)
    rows, bad = [], 0
    for name, fn in checks(rng):
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
    print("all ops match the float64 reference" if not bad else f"{bad} op(s) failed")
    return 1 if bad else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("selfcheck", help="check every kernel against a float64 reference")
    # SUPPRESS: an absent --device here must not overwrite the global one
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=argparse.SUPPRESS,
                   help="backend to check (default: the global --device / $SPRINT_DEVICE)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=lambda a: run(getattr(a, "device", None), a.seed))
