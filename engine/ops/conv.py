"""Convolution, forward and backward (SPEC §2; fully connected layers:
linear.py).

Three algorithms (`conv_algo()`: set_conv_algo / `--conv-algo`, else
$SPRINT_CONV_ALGO, else winograd -- the fastest measured, bench/RESULTS.md
issue 14; the table _ALGOS says which functions run each):

  winograd  (CPU, the default) F(4x4, 3x3) for the 3x3 stride-1 layers it
            serves (conv_winograd.py); dW and db the implicit path's; every
            other layer runs on implicit.
  implicit  (CPU) the engine's SGEMM packs its B panels straight from the
            image (csrc/gemm_driver.h): no column matrix; the write-back adds
            the bias, applies a fused ReLU and writes NCHW. dW reads x in place
            (csrc/gemm_dw.h) and sums db from its packed dy panels; dX (stride
            1) is the forward convolution of dy with the flipped, transposed
            filters (strided: the explicit path below).
  im2col    the explicit path below: the GPU path (cuBLAS) and the reference.

Layouts (csrc/im2col.h): x (N,C,H,W); cols (K, N*P) with K = C*kh*kw rows
(c,i,j) and P = OH*OW, columns (n,oh,ow). Per chunk of B images:

  forward   Yt (M, B*P) = W (M,K) @ cols          ; y[n,m,p] = Yt[m,n*P+p] + b[m]
  backward  dYt (M, B*P) = transpose(dy) (+ db)   ; dW (+)= dYt @ cols^T
            dcols = W^T @ dYt (reusing the cols buffer) ; dx = col2im(dcols)

so every GEMM is one large 2-D SGEMM per chunk; a 1x1 stride-1 pad-0 conv needs
no im2col (forward and dx: batched GEMMs into NCHW). The chunk (images per GEMM)
is the largest whose scratch fits workspace_bytes ($SPRINT_WORKSPACE_MB or 256 MiB).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine.backend import get_backend
from engine.ops import conv_winograd
from engine.ops._check import (check_array, check_bool, check_no_alias, check_nonneg_int, check_pair,
                               check_positive_int, out_array)
from engine.ops.gemm import gemm

_MAX_DIM = 1 << 31
CONV_ALGOS = ("winograd", "implicit", "im2col")
DEFAULT_CONV_ALGO = "winograd"
_algo: str | None = None


def set_conv_algo(algo: str | None) -> None:
    """Force the CPU convolution algorithm (None: back to $SPRINT_CONV_ALGO)."""
    global _algo
    if algo is not None and algo not in CONV_ALGOS:
        raise ValueError(f"conv algo must be one of {', '.join(CONV_ALGOS)}, got {algo!r}")
    _algo = algo


def conv_algo() -> str:
    """The CPU convolution algorithm in force: set_conv_algo, $SPRINT_CONV_ALGO, winograd."""
    if _algo is not None:
        return _algo
    env = os.environ.get("SPRINT_CONV_ALGO", "") or DEFAULT_CONV_ALGO
    if env not in CONV_ALGOS:
        raise ValueError(f"conv algo must be one of {', '.join(CONV_ALGOS)}, got {env!r} (SPRINT_CONV_ALGO)")
    return env


def _algo_for(be, g: "Geom", M: int, ws: int, dx: bool | None = False) -> tuple[str, int]:
    """(the algorithm that runs layer g's forward (dx False), its backward
    with dX (True) or without (None), the floats of workspace it asked for):
    im2col off the C++ kernels (the GPU: cuBLAS), conv_algo() where it
    serves g, else implicit. Only Winograd asks ahead (0 for the others):
    its size, computed to decide, is handed on rather than asked again; a
    backward without dX is dW and db alone, implicit's under Winograd too."""
    if be.kernels != "cpp":
        return "im2col", 0
    algo = conv_algo()
    if algo != "winograd":
        return algo, 0
    floats = 0 if dx is None else conv_winograd.serves(be, g, M, ws, dx)
    return ("winograd", floats) if floats else ("implicit", 0)


def default_workspace_bytes() -> int:
    mb = os.environ.get("SPRINT_WORKSPACE_MB")
    return int(float(mb) * 2**20) if mb else 256 * 2**20


def conv_out_size(size: int, k: int, stride: int = 1, pad: int = 0) -> int:
    """Output length of a window k, stride, pad over size (>= 1 or ValueError)."""
    size, k = check_positive_int("size", size, _MAX_DIM), check_positive_int("k", k, _MAX_DIM)
    stride, pad = check_positive_int("stride", stride, _MAX_DIM), check_nonneg_int("pad", pad, _MAX_DIM)
    if size + 2 * pad < k:
        raise ValueError(f"kernel {k} larger than the padded input {size}+2*{pad}")
    return (size + 2 * pad - k) // stride + 1


@dataclass(frozen=True)
class Geom:
    B: int
    C: int
    H: int
    W: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    OH: int
    OW: int

    @property
    def K(self) -> int:
        return self.C * self.kh * self.kw

    @property
    def P(self) -> int:
        return self.OH * self.OW

    def window(self) -> tuple[int, ...]:
        return (self.kh, self.kw, self.sh, self.sw, self.ph, self.pw)

    def with_batch(self, b: int) -> "Geom":
        return Geom(b, *(getattr(self, f) for f in ("C", "H", "W", "kh", "kw", "sh", "sw", "ph", "pw", "OH", "OW")))

    @property
    def is_pointwise(self) -> bool:
        return self.kh == self.kw == self.sh == self.sw == 1 and self.ph == self.pw == 0


def _geom(x_shape, kh, kw, stride, pad, kname="kernel") -> Geom:
    kh = check_positive_int("kh", kh, _MAX_DIM)
    kw = check_positive_int("kw", kw, _MAX_DIM)
    sh, sw = check_pair("stride", stride, 1, _MAX_DIM)
    ph, pw = check_pair("pad", pad, 0, _MAX_DIM)
    B, C, H, W = (int(s) for s in x_shape)
    if H + 2 * ph < kh or W + 2 * pw < kw:
        raise ValueError(f"{kname}: {kh}x{kw} window larger than the padded input "
                         f"({H}+2*{ph})x({W}+2*{pw})")
    return Geom(B, C, H, W, kh, kw, sh, sw, ph, pw, (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1)


# ---- kernel dispatch: C++ (CPU), compiled CUDA module, or RawModule --------

def _k_im2col(be, x, cols, g: Geom):
    if be.kernels == "cpp":
        be.ext.im2col(x, cols, *g.window())
    elif be.kernels == "compiled":
        be.ext.im2col(be.ptr(x), be.ptr(cols), g.B, g.C, g.H, g.W, *g.window(), stream=be.stream_ptr())
    else:
        be.raw_launch("sprint_im2col_f32", (x, cols, g.B, g.C, g.H, g.W, *g.window(), g.OH, g.OW), n=cols.size)


def _k_col2im(be, cols, x, g: Geom):
    if be.kernels == "cpp":
        be.ext.col2im(cols, x, *g.window())
    elif be.kernels == "compiled":
        be.ext.col2im(be.ptr(cols), be.ptr(x), g.B, g.C, g.H, g.W, *g.window(), stream=be.stream_ptr())
    else:
        be.raw_launch("sprint_col2im_f32", (cols, x, g.B, g.C, g.H, g.W, *g.window(), g.OH, g.OW), n=x.size)


def _k_cnhw_to_nchw(be, yt, bias, y3):
    B, M, P = y3.shape
    if be.kernels == "cpp":
        be.ext.cnhw_to_nchw(yt, bias, y3)
    elif be.kernels == "compiled":
        be.ext.cnhw_to_nchw(be.ptr(yt), be.ptr(bias), be.ptr(y3), B, M, P, stream=be.stream_ptr())
    else:
        be.raw_launch("sprint_cnhw_to_nchw_f32", (yt, yt if bias is None else bias, bias is not None, y3, B, M, P),
                      n=y3.size)


def _k_nchw_to_cnhw(be, y3, out, db, accumulate):
    B, M, P = y3.shape
    if be.kernels == "cpp":
        return be.ext.nchw_to_cnhw(y3, out, db, accumulate)
    if be.kernels == "compiled":
        be.ext.nchw_to_cnhw(be.ptr(y3), be.ptr(out), B, M, P, stream=be.stream_ptr())
    else:
        be.raw_launch("sprint_nchw_to_cnhw_f32", (y3, out, B, M, P), n=out.size)
    if db is not None:
        _k_channel_sum(be, y3, db, accumulate)


def _k_channel_sum(be, y3, db, accumulate):
    B, M, P = y3.shape
    if be.kernels == "cpp":
        be.ext.channel_sum(y3, db, accumulate)
    elif be.kernels == "compiled":
        be.ext.channel_sum(be.ptr(y3), be.ptr(db), accumulate, B, M, P, stream=be.stream_ptr())
    else:
        be.raw_launch("sprint_channel_sum_f32", (y3, db, accumulate, B, M, P), grid=min(M, 1 << 20))


def _k_add_channel_bias(be, y3, bias):
    B, M, P = y3.shape
    if be.kernels == "cpp":
        be.ext.add_channel_bias(y3, bias)
    elif be.kernels == "compiled":
        be.ext.add_channel_bias(be.ptr(y3), be.ptr(bias), B, M, P, stream=be.stream_ptr())
    else:
        be.raw_launch("sprint_add_channel_bias_f32", (y3, bias, B, M, P), n=y3.size)


# ---- im2col / col2im --------------------------------------------------------

def im2col(x, kh, kw, stride=(1, 1), pad=(0, 0), out=None):
    """cols (C*kh*kw, N*OH*OW) of x (N,C,H,W) float32; zeros where the
    window covers padding."""
    be = get_backend()
    check_array("x", x, ndim=4, nonempty=True)
    g = _geom(x.shape, kh, kw, stride, pad)
    cols = out_array("out", out, (g.K, g.B * g.P))
    check_no_alias("out", cols, "x", x)
    _k_im2col(be, x, cols, g)
    return cols


def col2im(cols, x_shape, kh, kw, stride=(1, 1), pad=(0, 0), out=None):
    """The adjoint of im2col: x (x_shape) where each element sums the cols
    entries that copied it (a deterministic gather)."""
    be = get_backend()
    check_array("cols", cols, ndim=2)
    if not isinstance(x_shape, (tuple, list)) or len(x_shape) != 4:
        raise ValueError(f"x_shape must be a 4-tuple (N, C, H, W), got {x_shape!r}")
    x_shape = tuple(check_positive_int("x_shape", s, _MAX_DIM) for s in x_shape)
    g = _geom(x_shape, kh, kw, stride, pad)
    check_array("cols", cols, shape=(g.K, g.B * g.P))
    x = out_array("out", out, x_shape)
    check_no_alias("out", x, "cols", cols)
    _k_col2im(be, cols, x, g)
    return x


# ---- conv2d ------------------------------------------------------------------

def _check_conv(x, w, stride, pad, workspace_bytes):
    check_array("x", x, ndim=4, nonempty=True)
    check_array("w", w, ndim=4, nonempty=True)
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w must have shape (M, {x.shape[1]}, kh, kw) to match x's {x.shape[1]} channels, "
                         f"got {tuple(w.shape)}")
    g = _geom(x.shape, w.shape[2], w.shape[3], stride, pad, kname="w")
    ws = default_workspace_bytes() if workspace_bytes is None else \
        check_positive_int("workspace_bytes", workspace_bytes)
    return g, ws


def _per_image_gemm(be, a, b3, out3, trans_a=False):
    """out3[n] = op(a) @ b3[n]: the engine's SGEMM per image (CPU), batched cuBLAS via CuPy (GPU)."""
    if be.kernels == "cpp":
        for n in range(b3.shape[0]):
            gemm(a, b3[n], trans_a=trans_a, out=out3[n])
    else:
        be.xp.matmul(a.T if trans_a else a, b3, out=out3)


def _chunk(g: Geom, per_image_floats: int, ws_bytes: int) -> int:
    """Images per chunk: as many as fit in ws_bytes (at least one)."""
    return max(1, min(g.B, ws_bytes // max(1, 4 * per_image_floats)))


def conv2d_forward(x, w, b=None, stride=1, pad=0, workspace_bytes=None, out=None, relu=False):
    """y (N,M,OH,OW) = conv(x (N,C,H,W), w (M,C,kh,kw)) + b (M,), then
    max(y, 0) if relu (fused into the GEMM's write-back by the implicit path)."""
    be = get_backend()
    g, ws = _check_conv(x, w, stride, pad, workspace_bytes)
    relu = check_bool("relu", relu)
    M = w.shape[0]
    if b is not None:
        check_array("b", b, shape=(M,))
    y = out_array("out", out, (g.B, M, g.OH, g.OW))
    check_no_alias("out", y, "x", x)
    algo, floats = _algo_for(be, g, M, ws)
    _ALGOS[algo][0](be, x, w, b, y, g, ws, relu, floats)
    return y


def _implicit_forward(be, x, w, b, y, g: Geom, ws: int, relu: bool, floats: int):
    be.ext.conv2d_implicit_forward(x, w, b, y, g.sh, g.sw, g.ph, g.pw, relu)


def _winograd_forward(be, x, w, b, y, g: Geom, ws: int, relu: bool, floats: int):
    conv_winograd.forward(be, x, w, b, y, g, relu, floats)


def _im2col_forward(be, x, w, b, y, g: Geom, ws: int, relu: bool, floats: int):
    _explicit_forward(be, x, w, b, y, g, ws)
    if relu:
        from engine.ops.elementwise import relu_forward
        relu_forward(y, out=y)


def _explicit_forward(be, x, w, b, y, g: Geom, ws: int):
    M = w.shape[0]
    w2 = w.reshape(M, g.K)
    if g.is_pointwise:
        _per_image_gemm(be, w2, x.reshape(g.B, g.C, g.P), y.reshape(g.B, M, g.P))
        if b is not None:
            _k_add_channel_bias(be, y.reshape(g.B, M, g.P), b)
        return
    step = _chunk(g, (g.K + M) * g.P, ws)
    for n0 in range(0, g.B, step):
        n1 = min(g.B, n0 + step)
        gc = g.with_batch(n1 - n0)
        cols = be.workspace("conv_cols", gc.K * gc.B * gc.P).reshape(gc.K, gc.B * gc.P)
        _k_im2col(be, x[n0:n1], cols, gc)
        yt = be.workspace("conv_yt", M * gc.B * gc.P).reshape(M, gc.B * gc.P)
        gemm(w2, cols, out=yt)
        _k_cnhw_to_nchw(be, yt, b, y[n0:n1].reshape(gc.B, M, gc.P))


def conv2d_backward(x, w, dy, stride=1, pad=0, dw_out=None, db_out=None, need_dx=True,
                    workspace_bytes=None, dx_out=None, accumulate=False):
    """Gradients of conv2d_forward given dy (N,M,OH,OW): (dx or None, dw, db).
    dw_out/db_out/dx_out, when given, are overwritten; with accumulate the
    gradients are added to dw_out/db_out (both required) by continuing their
    sums sample by sample -- with the engine's SGEMM, calls on consecutive
    micro-batches give the whole batch's dw and db bit for bit."""
    be = get_backend()
    g, ws = _check_conv(x, w, stride, pad, workspace_bytes)
    need_dx = check_bool("need_dx", need_dx)
    accumulate = check_bool("accumulate", accumulate)
    if accumulate and (dw_out is None or db_out is None):
        raise ValueError("accumulate needs dw_out and db_out (the sums to add to)")
    M = w.shape[0]
    check_array("dy", dy, shape=(g.B, M, g.OH, g.OW))
    dw = out_array("dw_out", dw_out, w.shape)
    db = out_array("db_out", db_out, (M,))
    dx = out_array("dx_out", dx_out, x.shape) if need_dx else None
    for name, o in (("dw_out", dw), ("db_out", db), ("dx_out", dx)):
        for iname, i in (("x", x), ("w", w), ("dy", dy)):
            check_no_alias(name, o, iname, i)
    check_no_alias("dw_out", dw, "db_out", db)
    check_no_alias("dx_out", dx, "dw_out", dw)
    check_no_alias("dx_out", dx, "db_out", db)
    algo, floats = _algo_for(be, g, M, ws, True if need_dx else None)
    _ALGOS[algo][1](be, x, w, dy, dw, db, dx, g, ws, accumulate, floats)
    return dx, dw, db


def _implicit_backward(be, x, w, dy, dw, db, dx, g: Geom, ws: int, accumulate: bool, floats: int = 0):
    implicit_dx = dx is not None and g.sh == g.sw == 1
    be.ext.conv2d_implicit_backward(x, w, dy, dw, dx if implicit_dx else None, g.sh, g.sw, g.ph, g.pw,
                                    accumulate=accumulate, db=db)  # db from dW's packed dy panels
    if dx is not None and not implicit_dx:  # strided: explicit W^T @ dy + col2im
        _explicit_backward(be, x, w, dy, None, None, dx, g, ws)


def _winograd_backward(be, x, w, dy, dw, db, dx, g: Geom, ws: int, accumulate: bool, floats: int):
    _implicit_backward(be, x, w, dy, dw, db, None, g, ws, accumulate)  # dW, db: the implicit tap kernel
    if dx is not None:
        conv_winograd.backward_x(be, w, dy, dx, g, floats)


def _explicit_backward(be, x, w, dy, dw, db, dx, g: Geom, ws: int, accumulate=False, floats: int = 0):
    """dw, db (when not None; accumulate: added to) and dx (when not None) by
    im2col + SGEMM + col2im."""
    M = w.shape[0]
    need_dx = dx is not None
    w2 = w.reshape(M, g.K)
    if g.is_pointwise and need_dx:
        # dx = W^T @ dy per image, written straight into NCHW
        _per_image_gemm(be, w2, dy.reshape(g.B, M, g.P), dx.reshape(g.B, g.C, g.P), trans_a=True)
        need_dx = False
    step = _chunk(g, (g.K + M) * g.P, ws)
    for n0 in range(0, g.B, step):
        n1 = min(g.B, n0 + step)
        gc = g.with_batch(n1 - n0)
        first = n0 == 0 and not accumulate  # later chunks continue the sums
        cols = be.workspace("conv_cols", gc.K * gc.B * gc.P).reshape(gc.K, gc.B * gc.P)
        if dw is None:  # dx only: cols is just the dcols buffer
            pass
        elif g.is_pointwise:  # the cols of a 1x1 window are x transposed to (C, B*P)
            _k_nchw_to_cnhw(be, x[n0:n1].reshape(gc.B, gc.C, gc.P), cols, None, False)
        else:
            _k_im2col(be, x[n0:n1], cols, gc)
        dyt = be.workspace("conv_yt", M * gc.B * gc.P).reshape(M, gc.B * gc.P)
        _k_nchw_to_cnhw(be, dy[n0:n1].reshape(gc.B, M, gc.P), dyt, db, not first)
        if dw is not None:
            gemm(dyt, cols, trans_b=True, beta=0.0 if first else 1.0, out=dw.reshape(M, g.K))
        if need_dx:
            gemm(w2, dyt, trans_a=True, out=cols)  # dcols reuses the cols buffer
            _k_col2im(be, cols, dx[n0:n1], gc)


# algorithm -> (forward, backward): conv_algo()'s names, as _algo_for picks
# them; each takes the workspace limit ws and the floats _algo_for says the
# algorithm asked for (Winograd's; 0 for the others)
_ALGOS = {"implicit": (_implicit_forward, _implicit_backward), "winograd": (_winograd_forward, _winograd_backward),
          "im2col": (_im2col_forward, _explicit_backward)}
