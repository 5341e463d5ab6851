"""Whole-op sweeps: the convolution and FC ops as the layers call them.

The CPU convolutions are the implicit GEMM (engine.ops.conv: the engine
SGEMM packs its panels straight from the image, dX is the forward
convolution of dy with the flipped filters) and, by default, Winograd on the
3x3 layers it serves (engine.ops.conv_winograd): none of the im2col, col2im
and layout kernels the explicit path runs. Pricing it as those kernels and
correcting by a per-layer factor fitted on two nets held on those nets only
(RESULTS section 4, test set 2: conv passes 5-39 % short). These sweeps time
the ops themselves, through ``engine.ops`` with their Python, as
``engine.layers`` calls them (allocating their outputs), over random shapes
plus the swept nets' own layers, and ``fit.fit_op_terms`` fits each op's
time on its GEMM shape, with the SGEMM fit's regime tree.

Records: ``{"kind": op, "m", "n", "k", "c", "t", "std", "holdout", "path"}``
with (m, n, k) the op's forward GEMM: (M, B*OH*OW, C*c*c) for a convolution
of M filters c x c over C channels, (N, out, in) for an FC layer. Held out:
every fourth shape of each list (whole shapes).
"""
from __future__ import annotations

import numpy as np

from engine import spec as spec_mod

from .timing import _rand, _rec

# Forward; dW and db only (a net's first layer); dW, db and dX.
CONV_OPS = ("conv_fwd", "conv_bwd_dw", "conv_bwd")
FC_OPS = ("fc_fwd", "fc_bwd_dw", "fc_bwd")
OP_KINDS = CONV_OPS + FC_OPS


def op_path() -> dict:
    """Which CPU implementations the ops run now (a profile's op fits hold
    for the path they were swept on): the conv algorithm -- Winograd's tile
    added when not the default F(4x4,3x3), whose speed differs -- over the
    GEMM, and the FC layers' GEMM."""
    from engine.ops import conv_winograd
    from engine.ops.conv import conv_algo
    from engine.ops.gemm import gemm_impl
    algo = conv_algo()
    if algo == "winograd" and conv_winograd.tile() != conv_winograd.TILES[0]:
        algo = f"winograd-f{conv_winograd.tile()}"
    return {"conv": f"{algo}/{gemm_impl()}", "fc": gemm_impl()}


def _winograd_runs(g) -> bool:
    """Whether the Winograd path runs a pass of spec layer g (every spec
    convolution is stride 1, padded (c-1)/2): its forward, or its dX (not
    the first layer's); the workspace limit is not priced."""
    from engine.ops.conv_winograd import shape_served
    if g.kind != "conv":
        return False
    M, C, kh, kw = g.w_shape
    window = (kh, kw, 1, 1, (kh - 1) // 2, (kw - 1) // 2)
    return shape_served(window, C) or (g.index > 0 and shape_served(window, M))


def _plain(path):
    """The path a layer Winograd does not run takes: implicit on the same GEMM."""
    return "implicit/" + path.split("/", 1)[1] if isinstance(path, str) and path.startswith("winograd") else path


def fits_hold(swept, fam: str, now: dict) -> bool:
    """Whether op fits of family ``fam`` swept on path ``swept`` are the
    nearest that price it as it runs now (``now``: op_path()): the same
    path, or for convolutions the implicit and Winograd paths of one GEMM
    (Winograd runs the other layers on implicit; path_mismatch says when
    the difference is priced)."""
    return swept == now[fam] or (fam == "conv" and _plain(swept) == _plain(now[fam]))


def path_mismatch(ops: dict, now: dict, layers=None) -> str:
    """What a CPU profile's op fits (``ops``) were swept on that differs from
    the path in force (``now``) for ``layers`` (spec geometries; None: any),
    in words, and what prices those layers instead; '' when nothing does.
    Winograd against implicit differs only on the layers Winograd runs."""
    out = {}
    for k, o in ops.items():
        fam, swept = k.split("_")[0], o.get("path")
        if swept == now[fam] or (fam == "conv" and layers is not None and fits_hold(swept, fam, now)
                                 and not any(map(_winograd_runs, layers))):
            continue
        how = f"priced as {swept} runs them" if fits_hold(swept, fam, now) else \
            "priced from the kernel fits (im2col, SGEMM, col2im)"
        out[fam] = f"its {fam} op fits were swept on {swept}, this process runs {now[fam]}: {how}"
    return "; ".join(out[f] for f in sorted(out))


def op_features(m, n, k, c=1, wide=None):
    """The SGEMM polynomial's eight monomials of the op's forward GEMM, plus
    what the implicit convolution's dX adds beyond them: packing dy for its
    GEMM (M c^2 per output column, ``m n c^2``) and writing dX (C per
    column, ``n k / c^2``). Zero for FC ops (c = 1 would double count).

    ``wide``: the tap count (c^2) above which the implicit packers leave
    their tap table for the general path (csrc/gemm_conv_pack.h keeps a
    table of at most 49 taps; the fit finds the threshold in the records,
    ``fit.fit_op_terms``). Beyond it every B element the forward packs
    (``n k``) and every dy element dX packs (``m n c^2``) costs more: a
    9x9 or 11x11 forward ran 1.5-2x, its dX 2.5-4x, the 3x3 convolution of
    the same GEMM shape (12 x 9 x 9 against 108 x 3 x 3 channels x taps,
    2026-12-01). None (profiles fitted before): both zero.

    ``tap_table``: ``n c^2`` up to that tap count (``TABLE_TAPS`` without
    one), for the forward, whose B panels that packer reads (``TABLE_OPS``): per
    panel of NR columns it first builds its table -- segments and masks of
    every tap, lane group and output-row run -- whatever the channel count,
    then packs C rows per tap. The ``n k`` term prices the packing per
    channel and tap; for a first convolution over 1-3 channels the table
    costs as much again: cpu_test18's records priced the 1-2 channel 5x5
    and 7x7 forwards 12-46 % short (median -18 / -22 % for C <= 3), the
    same kernels over more channels right. Profiles fitted before carry no
    coefficient for it (zero)."""
    m, n, k, c2 = float(m), float(n), float(k), float(c) ** 2
    extra = (m * n * c2, n * k / c2) if c > 1 else (0.0, 0.0)
    beyond = (n * k, m * n * c2) if c > 1 and wide is not None and c2 > wide else (0.0, 0.0)
    table = (n * c2,) if c > 1 and c2 <= (TABLE_TAPS if wide is None else wide) else (0.0,)
    return (m * n * k, m * n, m * k, n * k, m, n, k, 1.0) + extra + beyond + table


OP_FEATURES = ("mnk", "mn", "mk", "nk", "m", "n", "k", "1", "pack_dy", "dx_out", "nk_wide", "pack_dy_wide",
               "tap_table")
# The ops priced with the tap table (csrc/gemm_conv_pack.h PackIm2col) and
# the most taps it holds (kMaxTaps there). dX packs dy through it too, but
# over the layer's M filters (6-72 in the swept nets), where the table is a
# small share of the packing: fitted on cpu_test18's records, the term cut
# conv_bwd's fitted median 6.3 -> 5.5 % and raised its held-out one 7.2 ->
# 8.1 %. dW reads the image by tap offsets (no table).
TABLE_OPS, TABLE_TAPS = ("conv_fwd",), 49
# Kernel sides of the random conv shapes and how often each is drawn. 9 and
# 11 since test set 7, whose 9x9 layers ran 35-40 % slower than the fit
# extrapolated from 3-7 (bench/RESULTS.md section 4): the general packing
# path beyond 49 taps was in no sweep.
CONV_SIDES = ((3, 0.3), (5, 0.2), (7, 0.2), (9, 0.15), (11, 0.15))


def _log_int(rng, lo, hi):
    return max(1, int(round(2 ** rng.uniform(np.log2(lo), np.log2(hi)))))


def conv_op_shapes(cfg, rng=None):
    """[(B, C, H, c, M)]: the swept and seen nets' conv layers at the
    sweep's batch sizes, then random shapes (log-uniform sizes, c from
    ``CONV_SIDES``) up to ``cfg["op_max"]`` multiply-adds.

    7x7 kernels were 15 % of the random shapes until test set 4, whose 7x7
    layers then ran 13-85 % longer than the fit priced them (bench/RESULTS.md
    section 4): they are 20 % now, 9x9 and 11x11 30 %, and the seen nets
    (``SEEN_NETS``, 7x7 and 9x9 ones among them) are swept whole."""
    from .sweep_kernels import layer_net_convs
    rng = rng or np.random.default_rng(11)
    out = []
    for sp, g, b in list(layer_net_convs(cfg["batches"])) + list(_seen_layers("conv", cfg["batches"])):
        s = (b, g.in_shape[0], g.in_shape[1], sp.c, g.w_shape[0])
        # The swept nets' own layers up to 16x the random shapes' bound
        # (cifar's at batch 16): the fit must not extrapolate them.
        if _macs(s) <= 16 * cfg["op_max"] and s not in out:
            out.append(s)
    n_net = len(out)
    while len(out) < n_net + cfg["op_shapes"]:
        c = int(rng.choice([s for s, _ in CONV_SIDES], p=[q for _, q in CONV_SIDES]))
        s = (_log_int(rng, 1, 48), _log_int(rng, 1, 128), max(c, 2 * _log_int(rng, 2, 24)), c,
             _log_int(rng, 2, 128))
        if _macs(s) <= cfg["op_max"]:
            out.append(s)
    return out


def _macs(s):
    b, C, H, c, M = s
    return b * C * H * H * c * c * M


def _seen_layers(kind, batches):
    """(spec, geometry at batch 1, batch) of the ``kind`` layers of the seen
    test-set nets (``sweep_layer_passes.SEEN_NETS``)."""
    from .sweep_layer_passes import SEEN_NETS
    for net in SEEN_NETS:
        sp = spec_mod.get_spec(net)
        for g in spec_mod.layers(sp, 1):
            if g.kind == kind:
                for n in batches:
                    yield sp, g, n


def fc_op_shapes(cfg, rng=None):
    """[(N, in, out)]: the swept and seen nets' FC layers at the net batch sizes,
    then random ones (N 1-64, in 4-8192, out 2-1024, weights <= 4 M)."""
    from .sweep_kernels import SWEPT_NETS
    rng = rng or np.random.default_rng(12)
    out = []
    nets = [(sp, g, n) for name in SWEPT_NETS for sp in [spec_mod.get_spec(name)]
            for g in spec_mod.layers(sp, 1) if g.kind == "fc" for n in cfg["net_batches"]]
    for _, g, n in nets + list(_seen_layers("fc", cfg["net_batches"])):
        s = (n, g.w_shape[1], g.w_shape[0])
        if s not in out:
            out.append(s)
    n_net = len(out)
    while len(out) < n_net + cfg["op_shapes"]:
        s = (_log_int(rng, 1, 64), _log_int(rng, 4, 8192), _log_int(rng, 2, 1024))
        if s[1] * s[2] <= 1 << 22:
            out.append(s)
    return out


def sweep_conv_ops(cfg, skipped=None):
    """conv2d_forward (bias, fused ReLU), conv2d_backward without and with dX."""
    from engine import backend, ops
    from . import conv_tiles
    path = op_path()["conv"]
    cpu = backend.get_backend().name == "cpu"
    recs = []
    for i, (b, C, H, c, M) in enumerate(conv_op_shapes(cfg)):
        hold = i % 4 == 3
        pad = (c - 1) // 2
        x, w, bias = _rand((b, C, H, H), 1), _rand((M, C, c, c), 2), _rand((M,), 3)
        dy = _rand((b, M, H, H), 4)
        dw, db = _rand((M, C, c, c), 5), _rand((M,), 6)
        f = dict(m=M, n=b * H * H, k=C * c * c, c=c, holdout=hold, path=path)
        # on the CPU: the geometry, and which kernel ran on which tiles (conv_tiles)
        geo = lambda kind: dict(b=b, h=H, w=H, algo=conv_tiles.conv_algo(kind, M, C * c * c, c, (b, H, H)),
                                tiles=conv_tiles.tiles()) if cpu else {}
        recs.append(_rec("conv_fwd", lambda: ops.conv2d_forward(x, w, bias, stride=1, pad=pad, relu=True),
                         cfg, **f, **geo("conv_fwd")))
        for kind, need_dx in (("conv_bwd_dw", False), ("conv_bwd", True)):
            recs.append(_rec(kind, lambda: ops.conv2d_backward(x, w, dy, stride=1, pad=pad, dw_out=dw, db_out=db,
                                                               need_dx=need_dx), cfg, **f, **geo(kind)))
    return recs


def sweep_fc_ops(cfg, skipped=None):
    """linear_forward (bias), linear_backward without and with dX."""
    from engine import ops
    path = op_path()["fc"]
    recs = []
    for i, (n, fin, fout) in enumerate(fc_op_shapes(cfg)):
        hold = i % 4 == 3
        x, w, bias, dy = _rand((n, fin), 1), _rand((fout, fin), 2), _rand((fout,), 3), _rand((n, fout), 4)
        dw, db = _rand((fout, fin), 5), _rand((fout,), 6)
        f = dict(m=n, n=fout, k=fin, c=1, holdout=hold, path=path)
        recs.append(_rec("fc_fwd", lambda: ops.linear_forward(x, w, bias), cfg, **f))
        for kind, need_dx in (("fc_bwd_dw", False), ("fc_bwd", True)):
            recs.append(_rec(kind, lambda: ops.linear_backward(x, w, dy, dw_out=dw, db_out=db, need_dx=need_dx),
                             cfg, **f))
    return recs
