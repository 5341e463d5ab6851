"""Which kernel runs each convolution op, and its cost features on that kernel.

The engine picks a kernel for each pass of a convolution by its shape
(csrc/gemm_conv.cpp, engine/ops/conv_winograd.py):

- forward: Winograd on 3x3 stride-1 layers over ``MIN_DEPTH`` channels or
  more (the default conv path), else the implicit GEMM;
- dW: the small-K "lanes" kernel (K = C kh kw <= 64, rows a vector wide),
  else the "taps" kernel;
- dX: Winograd on 3x3 layers of ``MIN_DEPTH`` filters or more, else the
  implicit GEMM of dy with the flipped filters.

Their costs do not scale alike, and one polynomial per op over all of them
(``sweep_ops.op_features``) left held-out shapes 25-34 % off at the p90 on
the AMD VM's sweep (bench/RESULTS.md section 4, set 31). Two of the
kernels' structures showed in set 29's records: the lanes kernel ends each
output row whose width is not a multiple of its vector in one masked
vector, which cost far more than its share there (the first convs' dW of
widths 20 and 28 priced 24-44 % short, of widths 32 and 40 10-30 % long);
and every kernel computes whole register tiles (the GEMM's MR rows of
filters, the tap kernel's taps and channels, the lanes kernel's channel
and tap blocks), the spare rows dropped. So each op is fitted per kernel
(``fit.fit_op_terms``), on ``tile_features``: the SGEMM polynomial's
monomials with m n k replaced by the padded tiles' multiply-adds, plus two
row-tail terms. Refitting set 29's records so cut the held-out mean
|error| of conv_bwd_dw 15.0 -> 4.7 %, conv_fwd 10.9 -> 8.7 %, conv_bwd
11.1 -> 9.1 %. Judged on new records and nets (set 32, against the same
records fitted the old way, on the same runs): conv_bwd_dw 16.4 -> 6.2 %,
conv_bwd 11.5 -> 9.3 %, the nets' conv backward passes 13.0 -> 8.2 %,
calibrated T_GPU 14.4 -> 11.7 %.

A geometry here is ``(b, h, w)``: batch and the input's height and width
(every spec convolution is stride 1, padded (c-1)/2: the output's too).
"""
from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

from .sweep_ops import OP_FEATURES, TABLE_OPS, op_features

TILE_FEATURES = OP_FEATURES + ("tail_fma", "tail_pack")


def _up(v, q):
    return -(-int(v) // int(q)) * int(q)


def tiles() -> dict:
    """The kernels' register tiles on the ISA in force (``gemm_info``:
    $SPRINT_CPU_ISA, else the best): ``mr`` (the GEMM's rows of filters),
    the tap kernel's ``dw_mr`` taps x ``dw_nr`` channels in multiples of
    ``dw_l``, the lanes kernel's ``lanes_mb`` channels x ``lanes_tb`` taps
    over ``lanes_l`` pixels."""
    return dict(_tiles(os.environ.get("SPRINT_CPU_ISA", "")))


@lru_cache(maxsize=None)
def _tiles(isa_env) -> dict:
    info = _cpu_ext().gemm_info("")
    return {"isa": info["isa"], "mr": info["mr"], **info["conv"]}


def _cpu_ext():
    """The C++ extension, whichever backend this process computes on (a CPU
    profile may be priced anywhere): the CPU backend's, with its error when
    the extension is not built."""
    from engine import backend
    return backend._make_cpu().ext


def _dw_kernel(C, h, w, c, M) -> str:
    """The dW kernel the engine picks (its own dispatch, asked) on the ISA
    in force: the lanes kernel's width, and so its choice, is the ISA's."""
    return _dw_kernel_on(os.environ.get("SPRINT_CPU_ISA", ""), C, h, w, c, M)


@lru_cache(maxsize=4096)
def _dw_kernel_on(isa_env, C, h, w, c, M) -> str:
    x, wt = np.zeros((1, C, h, w), np.float32), np.zeros((M, C, c, c), np.float32)
    return _cpu_ext().conv2d_implicit_dw_kernel(x, wt, 1, 1, (c - 1) // 2, (c - 1) // 2)


def _wino(c, depth) -> bool:
    from engine.ops import conv_winograd
    from engine.ops.conv import conv_algo
    return conv_algo() == "winograd" and conv_winograd.shape_served((c, c, 1, 1, (c - 1) // 2, (c - 1) // 2), depth)


def conv_algo(kind, m, k, c, geom) -> str:
    """The kernel(s) op ``kind`` runs on this process for a layer of m
    filters over k / c^2 channels at ``geom``: "impl"/"wino" (forward),
    "lanes"/"taps" (dW), "<dW>+<dX>" (dW and dX)."""
    _, h, w = geom
    C = k // (c * c)
    if kind == "conv_fwd":
        return "wino" if _wino(c, C) else "impl"
    dw = _dw_kernel(C, h, w, c, m)
    return dw if kind == "conv_bwd_dw" else f"{dw}+{'wino' if _wino(c, m) else 'impl'}"


def _wino_pixels(b, h, w) -> int:
    from engine.ops import conv_winograd
    side = conv_winograd.tile()
    return b * _up(h, side) * _up(w, side)


def _padded_macs(part, m, k, c, geom, t) -> float:
    """Multiply-adds of one kernel over whole register tiles."""
    b, h, w = geom
    n, C = b * h * w, k // (c * c)
    if part == "impl":              # forward: rows of m filters in MR tiles
        return _up(m, t["mr"]) * n * k
    if part == "dx-impl":           # dX: the forward of dy, its rows the C channels
        return _up(C, t["mr"]) * n * m * c * c
    if part in ("wino", "dx-wino"):  # whole output tiles
        return m * _wino_pixels(b, h, w) * k
    if part == "taps":              # dW^T: taps x channels, each panel's broadcasts too
        nq = _up(m, t["dw_l"])
        return _up(k, t["dw_mr"]) * (nq + _up(nq, t["dw_nr"]) // t["dw_nr"] * t["dw_l"]) * n
    if part == "lanes":             # channel x tap blocks over the rows' whole vectors
        return _up(m, t["lanes_mb"]) * _up(k, t["lanes_tb"]) * b * h * (w // t["lanes_l"] * t["lanes_l"])
    raise ValueError(f"unknown conv kernel {part!r}")


def tile_features(kind, algo, m, n, k, c, geom, wide, t=None) -> tuple:
    """``TILE_FEATURES`` of op ``kind`` on kernel(s) ``algo``: the op
    features with ``mnk`` the padded tiles' multiply-adds, then
    ``tail_fma`` (m k per output row that ends in a masked vector: the
    lanes kernel's tail) and ``tail_pack`` (k per such row: the packers'
    masked segments)."""
    t = t or tiles()
    f = list(op_features(m, n, k, c, wide))
    if kind not in TABLE_OPS:
        f[OP_FEATURES.index("tap_table")] = 0.0
    if kind == "conv_bwd":
        dw, dx = algo.split("+")
        f[0] = _padded_macs(dw, m, k, c, geom, t) + _padded_macs("dx-" + dx, m, k, c, geom, t)
    else:
        f[0] = _padded_macs(algo, m, k, c, geom, t)
    b, h, w = geom
    rows = b * h if w % t["lanes_l"] else 0
    return tuple(f) + (float(m * k * rows), float(k * rows))


# -- fitting and pricing (fit.fit_op_terms, Profile.op) ---------------------------

def has_geometry(records) -> bool:
    """Whether conv op records carry what ``fit_kernels`` needs (sweeps
    since set 32): geometry, the kernel that ran and its tiles."""
    return bool(records) and all(all(f in r for f in ("b", "h", "w", "algo", "tiles")) for r in records)


def _features(kind, r, wide, algo=None):
    return tile_features(kind, algo or r["algo"], r["m"], r["n"], r["k"], r["c"], (r["b"], r["h"], r["w"]), wide,
                         r["tiles"])


def fit_kernels(kind, fit_r, wide, min_points=12) -> dict:
    """{"kernels": {algo: coef}, "pooled": coef, "tiles"} of op ``kind``:
    one polynomial on ``tile_features`` per kernel with ``min_points``
    records or more, and one over all of them for the rest. No regime
    splits: on set 29's records one leaf per kernel held out better than
    up to four (conv_bwd held-out mean 9.1 % against 10.5 %)."""
    from .nnls_fit import nnls_relative

    def fit(rs):
        X = np.array([_features(kind, r, wide) for r in rs], float)
        return dict(zip(TILE_FEATURES, map(float, nnls_relative(X, np.array([r["t"] for r in rs], float)))))
    algos = sorted({r["algo"] for r in fit_r})
    kernels = {a: fit(rs) for a in algos for rs in [[r for r in fit_r if r["algo"] == a]] if len(rs) >= min_points}
    return {"kernels": kernels, "pooled": fit(fit_r), "tiles": dict(fit_r[0]["tiles"])}


def kernel_coef(entry, algo) -> dict:
    """The fit that prices kernel(s) ``algo``: its own, else the pooled one."""
    return entry["kernels"].get(algo, entry["pooled"])


def price_features(entry, kind, m, n, k, c, geom):
    """(coef, names, features) that price op ``kind`` at ``geom`` on the
    kernel this process would run, with the tiles the profile was swept on."""
    algo = conv_algo(kind, m, k, c, geom)
    feats = tile_features(kind, algo, m, n, k, c, geom, entry.get("wide_taps"), entry["tiles"])
    return kernel_coef(entry, algo), TILE_FEATURES, feats


def record_price(entry, kind, r) -> float:
    """Fitted time of sweep record ``r`` on the kernel it ran (the fit table's errors)."""
    return float(sum(kernel_coef(entry, r["algo"]).get(f, 0.0) * v
                     for f, v in zip(TILE_FEATURES, _features(kind, r, entry.get("wide_taps")))))
