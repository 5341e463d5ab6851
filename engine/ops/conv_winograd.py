"""The Winograd convolution (`--conv-algo winograd`, a CPU algorithm beside
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


def _floats(be, g, M: int, dx: bool) -> int:
    return be.ext.conv2d_winograd_workspace(g.B, g.C, g.H, g.W, M, g.ph, g.pw, tile(), dx)


def serves(be, g, M: int, ws_bytes: int, need_dx: bool = False) -> bool:
    """Whether the Winograd path runs layer g (M filters) forward (or, need_dx,
    its dX): 3x3, stride 1, pads <= 2, a depth of MIN_DEPTH channels or more,
    and its workspace within ws_bytes."""
    if not (g.kh == g.kw == 3 and g.sh == g.sw == 1 and g.ph <= 2 and g.pw <= 2):
        return False
    if (M if need_dx else g.C) < MIN_DEPTH:
        return False
    n = _floats(be, g, M, need_dx)
    return 0 < 4 * n <= ws_bytes


def forward(be, x, w, b, y, g, relu: bool) -> None:
    ws = be.workspace("conv_winograd", _floats(be, g, w.shape[0], False))
    be.ext.conv2d_winograd_forward(x, w, b, y, g.ph, g.pw, relu, tile(), ws)


def backward_x(be, w, dy, dx, g) -> None:
    ws = be.workspace("conv_winograd", _floats(be, g, w.shape[0], True))
    be.ext.conv2d_winograd_backward_x(w, dy, dx, g.ph, g.pw, tile(), ws)
