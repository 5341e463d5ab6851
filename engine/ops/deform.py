"""DeformImage of SPRINT in one kernel (kernels/deform.cu, CPU twin
csrc/deform.cpp): per sample, scale jitter + crop offset + horizontal flip,
bilinear, zero outside, then per-channel normalisation.

Output pixel (i, j) of sample n, params[n] = (scale, dy, dx, flip), reads the
input at
    sy = (H-1)/2 + (i - (oh-1)/2) / scale + dy
    sx = (W-1)/2 + (j - (ow-1)/2) / scale + dx,   sx -> (W-1) - sx if flip > 0.5
and writes ((v / 255 if x is uint8 else v) - mean[c]) / std[c]. With scale=1,
dy=dx=0, flip=0 and out_hw == (H, W) the input comes back exactly; an integer
(dy, dx) is a crop offset with zero padding (out[i, j] = x[i + dy, j + dx]);
with flip the same offset applies to the mirror image; scale > 1 zooms in
about the center."""
from __future__ import annotations

import numpy as np

from engine.backend import get_backend
from engine.ops._check import check_array, check_no_alias, check_pair, out_array

__all__ = ["deform", "identity_params"]

_MAX_SIDE = (1 << 31) - 1


def identity_params(n: int, xp=np):
    """(n, 4) float32 rows [1, 0, 0, 0]: deform copies (and normalises) the input."""
    p = xp.zeros((n, 4), dtype=xp.float32)
    p[:, 0] = 1
    return p


def deform(x, params, out_hw, mean, std, out=None):
    """float32 (N, C, oh, ow) <- x (N, C, H, W) uint8|float32 deformed by
    params (N, 4) float32 [scale, dy, dx, flip]; mean, std (C,) float32."""
    be = get_backend()
    xp = be.xp
    check_array("x", x, ndim=4, dtype=(np.uint8, np.float32))
    N, C, H, W = x.shape
    check_array("params", params, shape=(N, 4))
    OH, OW = check_pair("out_hw", out_hw, 1, _MAX_SIDE)
    check_array("mean", mean, shape=(C,))
    check_array("std", std, shape=(C,))
    if C < 1 or H < 1 or W < 1:
        raise ValueError(f"x must have C, H, W >= 1, got shape {tuple(x.shape)}")
    if H * W > _MAX_SIDE or OH * OW > _MAX_SIDE:
        raise ValueError(f"out_hw: image planes must hold < 2^31 pixels, got {H}x{W} -> {OH}x{OW}")
    if N and not (bool(xp.isfinite(params).all()) and bool((params[:, 0] > 0).all())):
        raise ValueError("params must be finite with scale (column 0) > 0")
    if not bool(xp.isfinite(mean).all()):
        raise ValueError("mean must be finite")
    if not (bool(xp.isfinite(std).all()) and bool((std > 0).all())):
        raise ValueError("std must be finite and > 0")
    out = out_array("out", out, (N, C, OH, OW))
    for name, a in (("x", x), ("params", params), ("mean", mean), ("std", std)):
        check_no_alias(name, a, "out", out)
    if be.kernels == "cpp":
        be.ext.deform(x, params, mean, std, out)
    elif be.kernels == "compiled":
        be.ext.deform(be.ptr(x), x.dtype == np.uint8, be.ptr(params), be.ptr(mean), be.ptr(std),
                      be.ptr(out), N, C, H, W, OH, OW, stream=be.stream_ptr())
    elif out.size:
        kernel = "sprint_deform_u8" if x.dtype == np.uint8 else "sprint_deform_f32"
        be.raw_launch(kernel, (x, params, mean, std, out, N, C, H, W, OH, OW), n=out.size)
    return out
