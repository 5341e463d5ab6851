"""The Winograd convolution (`--conv-algo winograd`, the CPU default, beside
implicit and im2col; engine/ops/conv.py dispatches to it).

F(m x m, 3x3) (Lavin & Gray 2015; csrc/winograd.h): the filters and the
input tiles transformed, one SGEMM of the engine per tile position, the
output transform adding the bias and a fused ReLU. It serves 3x3 layers at
stride 1 with pads of 0 to 2 (so dX, the convolution of dy with the flipped
filters padded by 2 - p, is one too) and a GEMM depth of 32 or more
(MIN_DEPTH: the layer's C forward, its M for dX); conv.py runs every other
layer, and one whose workspace would pass the workspace limit, on the
implicit GEMM.
dW and db are the implicit path's (its tap kernel; the Winograd dW is not
built). m = $SPRINT_WINOGRAD_TILE: 4 (default: 4x fewer multiplies than the
direct convolution) or 2 (2.25x fewer, a smaller rounding error).
"""
from __future__ import annotations

import os

TILES = (4, 2)
# The least depth (input channels) of the convolution computed -- the layer's
# C for the forward, its M for dX -- that Winograd runs: measured on cifar's
# 32x32 layers with 64 filters (RESULTS.md, issue 14), the forward F(4,3) took
# 1.04x, 1.30x, 1.05x and 0.74x the implicit GEMM's time at C = 3, 8, 16 and
# 32: with a shallow GEMM the transforms cost more than the multiplies saved.
MIN_DEPTH = 32


def tile() -> int:
    """The output tile m of F(m x m, 3x3): $SPRINT_WINOGRAD_TILE, else 4."""
    env = os.environ.get("SPRINT_WINOGRAD_TILE", "") or str(TILES[0])
    if env not in tuple(str(t) for t in TILES):
        raise ValueError(f"SPRINT_WINOGRAD_TILE must be one of {', '.join(map(str, TILES))}, got {env!r}")
    return int(env)


def shape_served(window, depth: int) -> bool:
    """Whether a (kh, kw, sh, sw, ph, pw) window over ``depth`` channels (the
    GEMM's: C forward, M for dX) is a layer Winograd runs, its workspace apart."""
    kh, kw, sh, sw, ph, pw = window
    return kh == kw == 3 and sh == sw == 1 and ph <= 2 and pw <= 2 and depth >= MIN_DEPTH


def serves(be, g, M: int, ws_bytes: int, need_dx: bool = False) -> int:
    """The floats of workspace the Winograd path takes for layer g (M
    filters) forward (or, need_dx, its dX), 0 where it does not serve it:
    3x3, stride 1, pads <= 2, a depth of MIN_DEPTH channels or more, and the
    workspace within ws_bytes. forward and backward_x take this count (the
    size is asked of the C++ side once per pass)."""
    if not shape_served((g.kh, g.kw, g.sh, g.sw, g.ph, g.pw), M if need_dx else g.C):
        return 0
    n = be.ext.conv2d_winograd_workspace(g.B, g.C, g.H, g.W, M, g.ph, g.pw, tile(), need_dx)
    return n if 0 < 4 * n <= ws_bytes else 0


def forward(be, x, w, b, y, g, relu: bool, floats: int) -> None:
    """y of layer g; floats: serves' answer for it."""
    ws = be.workspace("conv_winograd", floats)
    be.ext.conv2d_winograd_forward(x, w, b, y, g.ph, g.pw, relu, tile(), ws)


def backward_x(be, w, dy, dx, g, floats: int) -> None:
    """dx of layer g; floats: serves' answer for its dX."""
    ws = be.workspace("conv_winograd", floats)
    be.ext.conv2d_winograd_backward_x(w, dy, dx, g.ph, g.pw, tile(), ws)
