"""Sweep records -> machine profile (SPEC section 4).

Every model is fitted by non-negative least squares on *relative* residuals
(each row divided by its measured time): timings span six orders of
magnitude and an absolute fit would ignore every small kernel.

SGEMM: the eight-term polynomial of SPEC section 4. A BLAS switches kernels
with shape, which shows up as structured residuals of a single fit; we grow
a small regression tree: split the points on a shape feature (log2 of m, n,
k, mn, ..., or of min(m,n,k)) where that most reduces the squared relative
residual, keep the split only if it cuts it by ``min_gain``, recurse. Each
leaf is one regime with its own polynomial and the rule that selects it.

Records are dicts: ``{"kind": str, ..., "t": median seconds, "std": seconds,
"holdout": bool}``; the held-out points are never fitted and give each fit
its error.
"""
from __future__ import annotations

import platform
import time

import numpy as np

from engine.parallel.threads import usable_cores

from .nnls_fit import error_summary, nnls_relative, sweep_cv
from .pool_cost import POOL_KINDS, fit_pool
from .profile import (FORMAT_VERSION, SGEMM_FEATURES, Profile, piece_time, regime_feature, rule_matches,
                      sgemm_features)

SPLIT_FEATURES = ("m", "n", "k", "mn", "mk", "nk", "mnk", "min")
# Terms fitted as a * size + b, with the record field holding the size.
LINEAR_TERMS = ("im2col", "col2im", "to_nchw", "to_cnhw", "bias", "bias_grad", "relu_fwd", "relu_bwd",
                "pool_fwd", "pool_bwd", "softmax", "copy", "add", "sub", "scale", "fill", "axpy",
                "handover", "load", "deform", "copy_cold", "add_cold", "sub_cold", "scale_cold", "fill_cold")


# -- SGEMM ------------------------------------------------------------------

def _sgemm_X(pts):
    return np.array([sgemm_features(*p) for p in pts])


def _leaf(X, t):
    c = nnls_relative(X, t)
    r = (X @ c - t) / t
    return c, float(r @ r)


def fit_sgemm_regimes(pts, t, max_regimes=4, min_points=16, min_gain=0.3, min_rms=0.03, X=None,
                      names=SGEMM_FEATURES):
    """[(rule, coef)] from shapes ``pts`` [(m,n,k)] and times ``t``.

    A leaf whose RMS relative residual is already below ``min_rms`` (the
    timing noise) is not split: a split there would fit noise. ``X``/``names``:
    other feature columns than the SGEMM polynomial's (the whole-op fits).
    """
    pts = [tuple(int(v) for v in p) for p in pts]
    t = np.asarray(t, float)
    X = _sgemm_X(pts) if X is None else np.asarray(X, float)
    feats = {f: np.array([regime_feature(f, *p) for p in pts]) for f in SPLIT_FEATURES}
    leaves = [([], np.arange(len(pts)))]
    while len(leaves) < max_regimes:
        best = None  # (gain, leaf index, feature, threshold)
        for li, (rule, idx) in enumerate(leaves):
            if len(idx) < 2 * min_points:
                continue
            _, base = _leaf(X[idx], t[idx])
            if base / len(idx) <= min_rms ** 2:
                continue
            for f in SPLIT_FEATURES:
                vals = np.unique(feats[f][idx])
                for lo, hi in zip(vals[:-1], vals[1:]):
                    thr = float((lo + hi) / 2)
                    left = idx[feats[f][idx] <= thr]
                    right = idx[feats[f][idx] > thr]
                    if len(left) < min_points or len(right) < min_points:
                        continue
                    cost = _leaf(X[left], t[left])[1] + _leaf(X[right], t[right])[1]
                    gain = (base - cost) / base if base > 0 else 0.0
                    if best is None or gain > best[0]:
                        best = (gain, li, f, thr)
        if best is None or best[0] < min_gain:
            break
        _, li, f, thr = best
        rule, idx = leaves.pop(li)
        left = idx[feats[f][idx] <= thr]
        right = idx[feats[f][idx] > thr]
        leaves += [(rule + [[f, "<=", thr]], left), (rule + [[f, ">", thr]], right)]
    return [(rule, dict(zip(names, map(float, _leaf(X[idx], t[idx])[0]))))
            for rule, idx in leaves]


def predict_sgemm(regimes, m, n, k):
    for rule, coef in regimes:
        if rule_matches(rule, m, n, k):
            break
    return sum(coef[f] * v for f, v in zip(SGEMM_FEATURES, sgemm_features(m, n, k)))


# -- the other terms --------------------------------------------------------

def fit_op_terms(records, min_points=12) -> dict:
    """{op: {"regimes", "path", "cv", "error", "wide_taps"}} of the whole-op
    sweeps (``sweep_ops``): each op's time on its forward GEMM shape, the
    SGEMM polynomial plus the implicit convolution's terms
    (``sweep_ops.op_features``), in regimes split as the SGEMM fits are.
    Conv records that carry their geometry and kernel add one fit per
    kernel on the padded tiles (``conv_tiles.fit_kernels``: "kernels",
    "pooled", "tiles"), which then price them and give the errors.
    Held out: every fourth shape."""
    from . import conv_tiles
    from .sweep_ops import CONV_OPS, OP_FEATURES, OP_KINDS
    out = {}
    for kind in OP_KINDS:
        fit_r, hold = _split(records, kind)
        if len(fit_r) < 2 * min_points:
            continue
        wide = wide_taps(fit_r, min_points)
        X = op_matrix(fit_r, wide)
        regimes = fit_sgemm_regimes([(r["m"], r["n"], r["k"]) for r in fit_r], [r["t"] for r in fit_r],
                                    min_points=min_points, X=X, names=OP_FEATURES)
        entry = {"regimes": [{"rule": rule, "coef": coef} for rule, coef in regimes],
                 "path": fit_r[0].get("path"), "cv": sweep_cv(fit_r + hold), "wide_taps": wide}
        p = Profile({"ops": {kind: entry}})
        price = lambda r: p.op(kind, r["m"], r["n"], r["k"], r.get("c", 1))
        if kind in CONV_OPS and conv_tiles.has_geometry(fit_r + hold):
            # one fit per kernel the engine ran (the records say which); the
            # plain regimes stay for callers that give no geometry
            entry.update(conv_tiles.fit_kernels(kind, fit_r, wide, min_points))
            price = lambda r: conv_tiles.record_price(entry, kind, r)
        ev = lambda rs: error_summary([price(r) for r in rs], [r["t"] for r in rs]) if rs else {"n": 0}
        entry["error"] = {"fit": ev(fit_r), "holdout": ev(hold)}
        out[kind] = entry
    return out


def op_matrix(recs, wide):
    """The ``sweep_ops.op_features`` rows of one op's records, the tap-table
    column zero for the ops that build no table (``sweep_ops.TABLE_OPS``):
    its coefficient stays 0 there."""
    from .sweep_ops import OP_FEATURES, TABLE_OPS, op_features
    X = np.array([op_features(r["m"], r["n"], r["k"], r.get("c", 1), wide) for r in recs], float)
    if recs and recs[0].get("kind") not in TABLE_OPS:
        X[:, OP_FEATURES.index("tap_table")] = 0.0
    return X


def wide_taps(recs, min_points=12, min_gain=0.1, min_rms=0.03):
    """The tap count beyond which a convolution's packing costs more per
    element (``sweep_ops.op_features``), or None: of the thresholds between
    the swept tap counts with ``min_points`` records beyond, the one whose
    single fit leaves the least squared relative residual, kept only if it
    cuts the residual without one by ``min_gain`` and that residual is above
    the timing noise (RMS ``min_rms``, as the regime splits)."""
    conv = [r for r in recs if r.get("c", 1) > 1]
    taps = sorted({r["c"] ** 2 for r in conv})
    if len(taps) < 2:
        return None
    t = np.array([r["t"] for r in recs], float)

    def residual(w):
        return _leaf(op_matrix(recs, w), t)[1]

    best, base = None, residual(None)
    if base / len(recs) <= min_rms ** 2:
        return None
    for w in taps[:-1]:
        if sum(r["c"] ** 2 > w for r in conv) < min_points:
            continue
        res = residual(w)
        if res < (1 - min_gain) * base and (best is None or res < best[0]):
            best = (res, w)
    return None if best is None else int(best[1])


def fit_linear(x, t):
    """(a, b) >= 0 of t = a x + b."""
    x = np.asarray(x, float)
    a, b = nnls_relative(np.column_stack([x, np.ones_like(x)]), t)
    return float(a), float(b)


def fit_linear_pieces(x, t, max_pieces=3, min_points=6, min_gain=0.3, min_rms=0.05):
    """Piecewise a x + b: where caches make one line too stiff, split on
    log2(x) where that cuts the squared relative residual by ``min_gain``.
    Returns [(upper x bound or None, a, b, lowest x, highest x of the piece's
    records)], sorted by x; ``profile.piece_time`` prices them."""
    x, t = np.asarray(x, float), np.asarray(t, float)
    order = np.argsort(x)
    x, t = x[order], t[order]

    def cost(lo, hi):
        a, b = fit_linear(x[lo:hi], t[lo:hi])
        if lo > 0:
            # Past the first piece the line only has to hold on its own
            # range: a negative intercept is fine there (a steeper slope
            # once the data leaves a cache).
            A = np.column_stack([x[lo:hi], np.ones(hi - lo)]) / t[lo:hi, None]
            ua, ub = np.linalg.lstsq(A, np.ones(hi - lo), rcond=None)[0]
            if ua > 0 and np.all(ua * x[lo:hi] + ub > 0):
                a, b = float(ua), float(ub)
        r = (a * x[lo:hi] + b - t[lo:hi]) / t[lo:hi]
        return float(r @ r), a, b
    cuts = [0, len(x)]
    while len(cuts) - 1 < max_pieces:
        best = None
        for i in range(len(cuts) - 1):
            lo, hi = cuts[i], cuts[i + 1]
            base = cost(lo, hi)[0]
            if hi - lo < 2 * min_points or base / (hi - lo) <= min_rms ** 2:
                continue
            for c in range(lo + min_points, hi - min_points + 1):
                if x[c] == x[c - 1]:
                    continue
                gain = (base - cost(lo, c)[0] - cost(c, hi)[0]) / base
                if best is None or gain > best[0]:
                    best = (gain, c)
        if best is None or best[0] < min_gain:
            break
        cuts = sorted(cuts + [best[1]])
    pieces = []
    for i in range(len(cuts) - 1):
        _, a, b = cost(cuts[i], cuts[i + 1])
        upper = float(np.sqrt(x[cuts[i + 1] - 1] * x[cuts[i + 1]])) if cuts[i + 1] < len(x) else None
        pieces.append((upper, a, b, float(x[cuts[i]]), float(x[cuts[i + 1] - 1])))
    return pieces


def piece_dicts(pieces):
    """fit_linear_pieces' tuples as a profile keeps them (a 3-tuple: no ranges)."""
    return [dict(zip(("upper", "a", "b", "lo", "hi"), p)) for p in pieces]


def eval_pieces(pieces, x):
    """``Profile.term``'s price of fit_linear_pieces' pieces."""
    got = piece_time(piece_dicts(pieces), x)
    return got if got is not None else max(0.0, pieces[-1][1] * x + pieces[-1][2])


def _fit_two_feature(name, fit_r, hold):
    """a x + c x2 + b (x: elements, x2: contiguous segments) for the layout kernels."""
    X = lambda rs: np.array([[r["x"], r["x2"], 1.0] for r in rs])
    a, c, b = map(float, nnls_relative(X(fit_r), [r["t"] for r in fit_r]))
    ev = lambda rs: error_summary(X(rs) @ np.array([a, c, b]), [r["t"] for r in rs]) if rs else {"n": 0}
    return {"a": a, "c": c, "b": b, "unit": "elements, segments", "cv": sweep_cv(fit_r + hold),
            "error": {"fit": ev(fit_r), "holdout": ev(hold)}}


def _allreduce_X(n_node, n_param):
    lg = np.log2(np.maximum(np.asarray(n_node, float), 1))
    p = np.asarray(n_param, float)
    return np.column_stack([lg * p, p, lg, np.ones_like(p)])


def fit_allreduce(n_node, n_param, t):
    """(a log2 N + b) N_Param + c log2 N + d, all >= 0."""
    c = nnls_relative(_allreduce_X(n_node, n_param), t)
    return dict(zip(("a_log", "b", "c_log", "d"), map(float, c)))


def _split(records, kind):
    rs = [r for r in records if r.get("kind") == kind and r.get("t", 0) > 0]
    return [r for r in rs if not r.get("holdout")], [r for r in rs if r.get("holdout")]


def fit_profile(records, machine=None, backend="cpu", cores=None, **sgemm_kw) -> dict:
    """Fit every term present in ``records``; returns the profile dict."""
    prof = {"version": FORMAT_VERSION, "machine": machine or f"{platform.node()} {platform.processor() or platform.machine()}",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backend": backend,
            "cores": int(cores or usable_cores()), "terms": {}, "n_records": len(records)}
    sg = [r for r in records if r.get("kind") == "sgemm"]
    variants = {}
    for var in sorted({r.get("trans", "nn") for r in sg}):
        rs = [dict(r) for r in sg if r.get("trans", "nn") == var]
        fit_r, hold = _split(rs, "sgemm")
        if len(fit_r) < 8:
            continue
        regimes = fit_sgemm_regimes([(r["m"], r["n"], r["k"]) for r in fit_r], [r["t"] for r in fit_r],
                                    **sgemm_kw)
        ev = lambda rs: error_summary([predict_sgemm(regimes, r["m"], r["n"], r["k"]) for r in rs],
                                      [r["t"] for r in rs])
        err = {"fit": ev(fit_r), "holdout": ev([r for r in hold if r.get("src") != "net"])}
        net = [r for r in hold if r.get("src") == "net"]
        if net:
            err["net_shapes"] = ev(net)
        variants[var] = {"regimes": [{"rule": rule, "coef": coef} for rule, coef in regimes],
                         "cv": sweep_cv(rs), "error": err}
    if variants:
        prof["sgemm"] = {"variants": variants}
    for name in LINEAR_TERMS:
        fit_r, hold = _split(records, name)
        if len(fit_r) < 2:
            continue
        xs, ts = [r["x"] for r in fit_r], [r["t"] for r in fit_r]
        if name in POOL_KINDS and all("p" in r for r in fit_r + hold):
            prof["terms"][name] = fit_pool(name, fit_r, hold)
            continue
        if all("x2" in r for r in fit_r + hold):
            prof["terms"][name] = _fit_two_feature(name, fit_r, hold)
            continue
        a, b = fit_linear(xs, ts)
        pieces = fit_linear_pieces(xs, ts)
        ev = lambda rs: error_summary([eval_pieces(pieces, r["x"]) for r in rs], [r["t"] for r in rs])
        prof["terms"][name] = {"a": a, "b": b, "unit": fit_r[0].get("unit", "elements"),
                               "cv": sweep_cv(fit_r + hold), "error": {"fit": ev(fit_r), "holdout": ev(hold)}}
        if len(pieces) > 1:
            prof["terms"][name]["pieces"] = piece_dicts(pieces)
    ops = fit_op_terms(records)
    if ops:
        prof["ops"] = ops
    fit_r, hold = _split(records, "allreduce")
    if len(fit_r) >= 4:
        ar = fit_allreduce([r["n_node"] for r in fit_r], [r["n_param"] for r in fit_r],
                           [r["t"] for r in fit_r])
        ev = lambda rs: error_summary(_allreduce_X([r["n_node"] for r in rs], [r["n_param"] for r in rs])
                                      @ np.array([ar["a_log"], ar["b"], ar["c_log"], ar["d"]]),
                                      [r["t"] for r in rs]) if rs else {"n": 0}
        ar["error"] = {"fit": ev(fit_r), "holdout": ev(hold)}
        ar["cv"] = sweep_cv(fit_r + hold)
        prof["allreduce"] = ar
    cont = [r for r in records if r.get("kind") == "contention" and r.get("ratio")]
    if cont:
        keys = ("model", "n_subbatch", "ranks", "workers", "ratio", "rel", "host", "allreduce", "n_param",
                "source", "solo_cpu", "solo_wall", "t", "updater", "worker", "cycle", "spec")
        prof["contention"] = {"entries": [{k: r.get(k) for k in keys} for r in cont]}
    llc = [r["llc_bytes"] for r in records if r.get("llc_bytes")]
    if llc:
        prof["cache"] = {"llc_bytes": int(llc[0])}
    l2 = [r["l2_bytes"] for r in records if r.get("l2_bytes")]
    if any(r.get("kind") == "layer_pass" for r in records):
        # Records swept before they carried it: this machine's (a refit runs
        # where its records were swept).
        from .fingerprint import cache_bytes
        got = int(l2[0]) if l2 else cache_bytes(2)
        if got:
            prof.setdefault("cache", {})["l2_bytes"] = got
    loops = [r for r in records if r.get("kind") == "loop"]
    overhead = {}
    if loops:
        overhead["worker_loop"] = float(np.median([r["worker_loop"] for r in loops]))
        overhead["updater_loop"] = float(np.median([r["updater_loop"] for r in loops]))
    if "sgemm" in prof and any(r.get("kind") == "layer_pass" for r in records):
        try:
            lt = fit_layer_terms(prof, records)
        except ValueError as e:      # a kernel term the nets need was not swept
            lt, prof["layer_terms_error"] = {}, str(e)
        if lt:
            prof["layer_terms"] = lt
    steps = [r for r in records if r.get("kind") == "net_step" and not r.get("holdout")]
    held_steps = [r for r in records if r.get("kind") == "net_step" and r.get("holdout")]
    if steps and "sgemm" in prof:
        try:
            overhead.update(fit_overhead(prof, steps, held_steps))
        except ValueError as e:      # a kernel term the nets need was not swept
            overhead["error"] = str(e)
    if overhead:
        prof["overhead"] = overhead
    if "contention" in prof and "sgemm" in prof:
        anchor_contention(prof)
    return prof


# Whole-step fits live beside the kernel fits they start from; the fit
# table that reports them all, apart (fit_report).
from .fit_steps import (HOLDOUT, RUNNER_STEPS, _kernel_sums, anchor_contention, fit_layer_terms,  # noqa: E402,F401
                        fit_overhead, runner_step_excess)
from .fit_report import format_errors  # noqa: E402,F401
