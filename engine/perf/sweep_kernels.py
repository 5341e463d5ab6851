"""Kernel sweeps: SGEMM, the im2col family and layer kernels, FC bias and
softmax, the flat-vector operations of Algorithms 1 and 2 (warm and cold),
the lock handover, loading and deformation, and whole net steps.

Each returns records ``{"kind", <size fields>, "t", "std", "holdout"}`` for
``fit.fit_profile``; held-out points are whole shapes (every fourth conv
shape, every fourth vector size, the in-between SGEMM sizes) or, for the net
steps, whole batch sizes of a net.
"""
from __future__ import annotations

import itertools

import numpy as np

from engine import spec as spec_mod

from .fingerprint import cache_bytes
from .timing import CLOCK, _rand, _rec, _xp, time_call

TRANS = {"nn": (False, False), "nt": (False, True), "tn": (True, False)}
# Conv layer shapes for the im2col family: the small presets whole, the big
# ones' early layers (their later layers have the same K x P products).
# ``digits`` is left out on purpose: it is a held-out net of the validation
# (bench/RESULTS.md section 4), which no sweep may see.
LAYER_NETS = ("tiny", "cifar", "cnn-a")
# Nets whose SGEMM shapes and whole steps the sweeps time.
SWEPT_NETS = ("tiny", "cifar")

# -- SGEMM ----------------------------------------------------------------------

def sgemm_grid(cfg, rng=None):
    """(m, n, k, holdout) points: powers of two to fit, in-between sizes held out.

    k = 1 (kexp 0) must be on the grid: an FC layer's dW at N_Subbatch 1 is
    an outer product, which this BLAS runs ~10x slower per output element
    than k = 2 (cifar fc1, 512 x 4096 x 1: 2.1 ms against 0.16 ms at k = 2);
    without those points the fit extrapolated it at 0.1 ms.
    """
    pts = [(2 ** a, 2 ** b, 2 ** c, False) for a, b, c in
           itertools.product(cfg["sgemm_exp"], cfg["sgemm_nexp"], cfg["sgemm_kexp"])
           if 2 ** (a + b + c) <= cfg["sgemm_max"]]
    rng = rng or np.random.default_rng(0)
    mid = []
    while len(mid) < cfg["sgemm_mid"]:
        e = [rng.uniform(min(x), max(x)) for x in (cfg["sgemm_exp"], cfg["sgemm_nexp"], cfg["sgemm_kexp"])]
        m, n, k = (max(1, int(round(2 ** v))) for v in e)
        if m * n * k <= cfg["sgemm_max"]:
            mid.append((m, n, k, True))
    return pts + mid


def net_gemm_shapes(nets=SWEPT_NETS, batches=(1, 4, 16)):
    """(m, n, k, trans) of every SGEMM the presets run: held-out checks."""
    from .model import layer_kernels
    out = set()
    for name in nets:
        sp = spec_mod.get_spec(name)
        for n in batches:
            geoms = spec_mod.layers(sp, n)
            for i, g in enumerate(geoms):
                for _, kern, size in layer_kernels(g, n, i == 0, i == len(geoms) - 1):
                    if kern.startswith("sgemm"):
                        out.add(tuple(size) + (kern.split("_")[1],))
    return sorted(out)


def sweep_sgemm(cfg, variants=("nn", "nt", "tn"), extra_shapes=(), progress=None):
    from engine import ops
    recs = []
    pts = sgemm_grid(cfg)
    for var in variants:
        ta, tb = TRANS[var]
        todo = [(m, n, k, h, "grid") for m, n, k, h in pts] + \
               [(m, n, k, True, "net") for m, n, k, v in extra_shapes if v == var]
        for m, n, k, hold, src in todo:
            a = _rand((k, m) if ta else (m, k), 1)
            b = _rand((n, k) if tb else (k, n), 2)
            c = _xp().empty((m, n), np.float32)
            recs.append(_rec("sgemm", lambda: ops.gemm(a, b, trans_a=ta, trans_b=tb, out=c), cfg,
                             m=m, n=n, k=k, trans=var, holdout=hold, src=src))
            if progress:
                progress(1)
    return recs


# -- the im2col family and the layer kernels -----------------------------------

def layer_net_convs(batches):
    """(spec, geometry at batch 1, batch) of every conv layer of LAYER_NETS
    at each of ``batches``, in net and layer order."""
    for name in LAYER_NETS:
        sp = spec_mod.get_spec(name)
        for g in spec_mod.layers(sp, 1):
            if g.kind == "conv":
                for n in batches:
                    yield sp, g, n


def conv_shapes(cfg):
    """(C, H, c, M, pool, N) of the preset conv layers, batch sizes from cfg."""
    return sorted({(g.in_shape[0], g.in_shape[1], sp.c, g.w_shape[0], g.pool, n)
                   for sp, g, n in layer_net_convs(cfg["batches"]) if g.im2col_elems * n <= cfg["im2col_max"]})


def _private_conv_kernels():
    """The layout kernels conv2d runs between im2col and SGEMM (engine.ops.conv)."""
    try:
        from engine.backend import get_backend
        from engine.ops import conv as conv_mod
        return get_backend(), conv_mod
    except Exception:  # pragma: no cover - only while the kernels are being built
        return None, None


def sweep_layers(cfg, skipped=None):
    """im2col, col2im, layout/bias and ReLU over the presets' conv shapes."""
    from engine import ops
    skipped = skipped if skipped is not None else []
    be, conv_mod = _private_conv_kernels()
    recs = []
    for i, (C, H, c, M, p, n) in enumerate(conv_shapes(cfg)):
        hold = i % 4 == 3
        pad = (c - 1) // 2
        x = _rand((n, C, H, H), 3)
        cols = ops.im2col(x, c, c, (1, 1), (pad, pad))
        K = C * c * c
        # x2: contiguous row segments (one per (k, n, output row)): the
        # per-segment cost makes the same element count cheaper on wide maps.
        recs.append(_rec("im2col", lambda: ops.im2col(x, c, c, (1, 1), (pad, pad), out=cols), cfg,
                         x=K * H * H * n, x2=K * H * n, holdout=hold))
        xo = _xp().empty_like(x)
        recs.append(_rec("col2im", lambda: ops.col2im(cols, x.shape, c, c, (1, 1), (pad, pad), out=xo), cfg,
                         x=K * H * H * n, x2=K * H * n, holdout=hold))
        y = _rand((n, M, H, H), 4)
        elems = n * M * H * H
        if conv_mod is not None:
            g = conv_mod.Geom(n, M, H, H, 1, 1, 1, 1, 0, 0, H, H)
            yt = _rand((M, n * H * H), 5)
            b = _rand((M,), 6)
            db = _xp().empty(M, np.float32)
            y3 = y.reshape(n, M, H * H)
            recs.append(_rec("to_nchw", lambda: conv_mod._k_cnhw_to_nchw(be, yt, b, y3), cfg, x=elems,
                             x2=n * M, holdout=hold))
            recs.append(_rec("to_cnhw", lambda: conv_mod._k_nchw_to_cnhw(be, y3, yt, db, False), cfg,
                             x=elems, x2=n * M, holdout=hold))
            del g
        for name, fn in _elementwise_fns(ops, y, p, skipped):
            recs.append(_rec(name, fn, cfg, x=elems, holdout=hold))
    return recs


def _elementwise_fns(ops, y, p, skipped):
    """(kind, callable) of ReLU on a conv output, where the op exists
    (pooling has its own sweep: pool_cost.sweep_pooling)."""
    fns = []
    if hasattr(ops, "relu_forward"):
        r = ops.relu_forward(y)
        out = _xp().empty_like(y)
        fns.append(("relu_fwd", lambda: ops.relu_forward(y, out=out)))
        fns.append(("relu_bwd", lambda: ops.relu_backward(r, y, out=out)))
    else:
        skipped.append("relu")
    return fns


def sweep_fc_softmax(cfg, skipped=None):
    """The FC layer's bias add and row sum (numpy, as linear_* run them) and softmax."""
    from engine import ops
    skipped = skipped if skipped is not None else []
    xp = _xp()
    recs = []
    i = 0
    for n in (1, 2, 4, 8, 16, 32, 64):
        for width in (3, 10, 64, 256, 1000, 4096):
            hold = i % 4 == 3
            i += 1
            y = _rand((n, width), 7)
            b = _rand((width,), 8)
            db = xp.empty(width, np.float32)
            recs.append(_rec("bias", lambda: y.__iadd__(b), cfg, x=n * width, holdout=hold))
            recs.append(_rec("bias_grad", lambda: xp.sum(y, axis=0, out=db), cfg, x=n * width, holdout=hold))
            if hasattr(ops, "softmax_xent"):
                lab = xp.asarray(np.random.default_rng(0).integers(0, width, n))
                recs.append(_rec("softmax", lambda: ops.softmax_xent(y, lab), cfg, x=n * width, holdout=hold))
    if not hasattr(ops, "softmax_xent"):
        skipped.append("softmax_xent")
    return recs


# -- flat-vector work of the ASGD worker and updater ----------------------------

def _vector_cases(cfg, xp):
    """(N_Param, held out, (source, target), {op: call}) of the flat-buffer
    sweeps: powers of two and 1.5x in between, the operations the ASGD
    runner itself runs."""
    for i, e in enumerate(cfg["vec_exp"]):
        n = 2 ** e + (0 if i % 2 else 2 ** (e - 1))
        a, b, c = _rand((n,), 1), _rand((n,), 2), xp.empty(n, np.float32)
        yield n, i % 4 == 3, (a, c), {"copy": lambda: xp.copyto(c, a), "add": lambda: c.__iadd__(a),
                                      "scale": lambda: xp.multiply(a, 0.5, out=c),
                                      "sub": lambda: xp.subtract(a, b, out=c), "fill": lambda: c.fill(0)}


def sweep_vectors(cfg, skipped=None):
    """The flat-buffer operations Algorithms 1 and 2 run, over N_Param."""
    from engine import ops
    skipped = skipped if skipped is not None else []
    recs = []
    for n, hold, (a, c), fns in _vector_cases(cfg, _xp()):
        if hasattr(ops, "axpy"):
            fns["axpy"] = lambda: ops.axpy(0.5, a, c)
        for name, fn in fns.items():
            recs.append(_rec(name, fn, cfg, x=n, holdout=hold))
    if not hasattr(ops, "axpy"):
        skipped.append("axpy")
    return recs


def _llc_bytes():
    return cache_bytes(3, 32 << 20)


def sweep_vectors_cold(cfg, skipped=None):
    """The same flat-buffer operations with their operands evicted from the
    caches first (kinds ``<op>_cold``).

    In a run they are cold: between two fetches a worker's ComputeGradient
    streams its activations and im2col buffers through the caches, and the
    updater touches each vector once per cycle. On the CPU that is up to 3x
    the warm sweep's time for N_Param in the millions; on a GPU the step
    sizes dwarf the caches' reach and the warm sweep stands.
    """
    from engine import backend
    if backend.get_backend().name != "cpu":
        if skipped is not None:
            skipped.append("cold vectors (CPU only)")
        return []
    llc = _llc_bytes()
    scratch = np.ones(2 * llc // 4, np.float32)
    clock = CLOCK["fn"]
    recs = []
    for n, hold, _, fns in _vector_cases(cfg, np):
        for op, fn in fns.items():
            name = op + "_cold"
            fn()
            samples = []
            for _ in range(3 * cfg["repeats"]):
                scratch += 1.0          # evicts a, b and c from every cache level
                t0 = clock()
                fn()
                samples.append(clock() - t0)
            recs.append(dict(kind=name, t=float(np.median(samples)), std=float(np.std(samples)),
                             clock=CLOCK["name"], x=n, holdout=hold, llc_bytes=llc))
    return recs


def sweep_handover(cfg):
    """A lock round trip with a pointer swap: the O(1) critical sections of the runner."""
    import threading
    lock = threading.Lock()
    box = [np.zeros(1), np.zeros(1)]

    def swap():
        with lock:
            box[0], box[1] = box[1], box[0]
    t, s = time_call(swap, cfg["repeats"], cfg["min_time"])
    return [{"kind": "handover", "x": 1, "t": t, "std": s}, {"kind": "handover", "x": 2, "t": t, "std": s}]


# -- data -------------------------------------------------------------------------

def sweep_data(cfg, skipped=None):
    """LoadImage (gather N_Subbatch samples) and DeformImage over N_Subbatch."""
    from engine.data import Loader
    from engine.data.dataset import Dataset
    from engine.data.deform import DeformConfig
    skipped = skipped if skipped is not None else []
    recs = []
    rng = np.random.default_rng(0)
    for shape in ((1, 8, 8), (2, 8, 8), (3, 32, 32)):
        ds = Dataset(rng.integers(0, 256, (2048,) + shape, dtype=np.uint8), rng.integers(0, 3, 2048), 3)
        dc = DeformConfig(crop_pad=2, flip=True, mean=(0.5,) * shape[0], std=(0.25,) * shape[0],
                          out_hw=shape[1:])
        for i, n in enumerate(cfg["data_batches"]):
            hold = i % 4 == 3
            loader = Loader(ds, n, prefetch=0, deform=dc)
            idx = rng.permutation(len(ds))[:n]
            px = n * int(np.prod(shape))
            recs.append(_rec("load", lambda: loader.load(idx), cfg, x=px, holdout=hold))
            x, y = loader.load(idx)
            r = np.random.default_rng(1)
            try:
                recs.append(_rec("deform", lambda: loader.deform(x, y, r), cfg, x=px, holdout=hold))
            except (AttributeError, ImportError):
                if "deform" not in skipped:
                    skipped.append("deform")
    return recs


# -- whole steps: what the kernels do not explain ----------------------------------

def sweep_net_steps(cfg, skipped=None):
    """Net.loss_and_grad of the swept nets (``net_step_nets`` where given):
    the fit of the per-step work outside the layers and a check.

    With two nets (tiny, cifar) the fit of that work, ``c + d N_Param``,
    had two points for two unknowns, and cifar's layer-sum error (a few ms
    of 20-150 ms) became d: 0.36 ms per step on heldout-wide's 243 K
    parameters, where its runs show about 0.1 ms beyond the layers. The
    seen nets of the layer-pass sweep give it N_Param from 580 to 3.2 M."""
    from engine.net import Net
    from .sweep_layer_passes import LAYER_PASS_HELDOUT
    recs = []
    for net in cfg.get("net_step_nets", cfg["nets"]):
        sp = spec_mod.get_spec(net)
        name = sp.name
        try:
            net = Net(sp, seed=0)
        except Exception as e:  # kernels still missing
            (skipped if skipped is not None else []).append(f"net {name}: {type(e).__name__}")
            continue
        for i, n in enumerate(cfg["net_batches"]):
            x = _rand((n,) + sp.input_shape, 9)
            y = _xp().asarray(np.random.default_rng(0).integers(0, sp.n_classes, n))
            try:
                recs.append(_rec("net_step", lambda: net.loss_and_grad(x, y), cfg, model=name, spec=sp.to_dict(),
                                 n_subbatch=n, holdout=i % 3 == 2 or name in LAYER_PASS_HELDOUT))
            except Exception as e:
                (skipped if skipped is not None else []).append(f"net {name}: {type(e).__name__}: {e}")
                break
    return recs
