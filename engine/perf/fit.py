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

import math
import platform
import time

import numpy as np
from scipy.optimize import nnls

from .profile import SGEMM_FEATURES, Profile, regime_feature, rule_matches, sgemm_features

SPLIT_FEATURES = ("m", "n", "k", "mn", "mk", "nk", "mnk", "min")
# Terms fitted as a * size + b, with the record field holding the size.
LINEAR_TERMS = ("im2col", "col2im", "to_nchw", "to_cnhw", "bias", "bias_grad", "relu_fwd", "relu_bwd",
                "pool_fwd", "pool_bwd", "softmax", "copy", "add", "sub", "scale", "fill", "axpy",
                "handover", "load", "deform")


def nnls_relative(X, t):
    """argmin_{c >= 0} sum((X c - t)/t)^2, with column scaling for conditioning."""
    X = np.asarray(X, float)
    t = np.asarray(t, float)
    if X.ndim != 2 or len(X) != len(t):
        raise ValueError("X must be (points, features) matching t")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive")
    A = X / t[:, None]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    c, _ = nnls(A / scale, np.ones(len(t)), maxiter=50 * X.shape[1])
    return c / scale


def rel_errors(pred, t):
    pred, t = np.asarray(pred, float), np.asarray(t, float)
    return np.abs(pred - t) / t


def error_summary(pred, t) -> dict:
    if len(t) == 0:
        return {"n": 0}
    e = rel_errors(pred, t)
    return {"n": int(len(e)), "median": float(np.median(e)), "mean": float(np.mean(e)),
            "p90": float(np.percentile(e, 90)), "max": float(np.max(e))}


# -- SGEMM ------------------------------------------------------------------

def _sgemm_X(pts):
    return np.array([sgemm_features(*p) for p in pts])


def _leaf(X, t):
    c = nnls_relative(X, t)
    r = (X @ c - t) / t
    return c, float(r @ r)


def fit_sgemm_regimes(pts, t, max_regimes=4, min_points=16, min_gain=0.3, min_rms=0.03):
    """[(rule, coef)] from shapes ``pts`` [(m,n,k)] and times ``t``.

    A leaf whose RMS relative residual is already below ``min_rms`` (the
    timing noise) is not split: a split there would fit noise.
    """
    pts = [tuple(int(v) for v in p) for p in pts]
    t = np.asarray(t, float)
    X = _sgemm_X(pts)
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
    return [(rule, dict(zip(SGEMM_FEATURES, map(float, _leaf(X[idx], t[idx])[0]))))
            for rule, idx in leaves]


def predict_sgemm(regimes, m, n, k):
    for rule, coef in regimes:
        if rule_matches(rule, m, n, k):
            break
    return sum(coef[f] * v for f, v in zip(SGEMM_FEATURES, sgemm_features(m, n, k)))


# -- the other terms --------------------------------------------------------

def fit_linear(x, t):
    """(a, b) >= 0 of t = a x + b."""
    x = np.asarray(x, float)
    a, b = nnls_relative(np.column_stack([x, np.ones_like(x)]), t)
    return float(a), float(b)


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


def _cv(rs):
    cvs = [r["std"] / r["t"] for r in rs if r.get("std") is not None and r["t"] > 0]
    return float(np.median(cvs)) if cvs else 0.0


def fit_profile(records, machine=None, backend="cpu", cores=None, **sgemm_kw) -> dict:
    """Fit every term present in ``records``; returns the profile dict."""
    prof = {"version": 1, "machine": machine or f"{platform.node()} {platform.processor() or platform.machine()}",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "backend": backend,
            "cores": int(cores or _cores()), "terms": {}, "n_records": len(records)}
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
                         "cv": _cv(rs), "error": err}
    if variants:
        prof["sgemm"] = {"variants": variants}
    for name in LINEAR_TERMS:
        fit_r, hold = _split(records, name)
        if len(fit_r) < 2:
            continue
        a, b = fit_linear([r["x"] for r in fit_r], [r["t"] for r in fit_r])
        ev = lambda rs: error_summary([a * r["x"] + b for r in rs], [r["t"] for r in rs])
        prof["terms"][name] = {"a": a, "b": b, "unit": fit_r[0].get("unit", "elements"),
                               "cv": _cv(fit_r + hold), "error": {"fit": ev(fit_r), "holdout": ev(hold)}}
    fit_r, hold = _split(records, "allreduce")
    if len(fit_r) >= 4:
        ar = fit_allreduce([r["n_node"] for r in fit_r], [r["n_param"] for r in fit_r],
                           [r["t"] for r in fit_r])
        ev = lambda rs: error_summary(_allreduce_X([r["n_node"] for r in rs], [r["n_param"] for r in rs])
                                      @ np.array([ar["a_log"], ar["b"], ar["c_log"], ar["d"]]),
                                      [r["t"] for r in rs]) if rs else {"n": 0}
        ar["error"] = {"fit": ev(fit_r), "holdout": ev(hold)}
        ar["cv"] = _cv(fit_r + hold)
        prof["allreduce"] = ar
    cont = sorted((r["threads"], r["ratio"]) for r in records if r.get("kind") == "contention")
    if cont:
        prof["contention"] = {"threads": [c[0] for c in cont], "ratio": [c[1] for c in cont]}
    steps = [r for r in records if r.get("kind") == "net_step"]
    if steps and "sgemm" in prof:
        prof["overhead"] = fit_overhead(prof, steps)
    return prof


def fit_overhead(prof: dict, steps) -> dict:
    """Framework cost the kernels do not explain: per layer and per step.

    Each ``net_step`` record is one measured forward+backward of a preset at
    some batch; the kernel terms predict the rest; NNLS on the remainder.
    """
    from engine import spec as spec_mod
    from .model import compute_gradient_terms
    p = Profile({k: v for k, v in prof.items() if k != "overhead"})
    rows, t, kern = [], [], []
    for r in steps:
        sp = spec_mod.get_spec(r["model"])
        k = sum(x[4] for x in compute_gradient_terms(sp, r["n_subbatch"], p))
        rows.append([len(spec_mod.layers(sp)), 1.0])
        t.append(r["t"])
        kern.append(k)
    t, kern = np.array(t), np.array(kern)
    rem = np.maximum(t - kern, 1e-12)
    # Fit the remainder on the same relative scale as the step itself.
    A = np.array(rows) / t[:, None]
    c, _ = nnls(A, rem / t)
    per_layer, per_step = map(float, c)
    pred = kern + np.array(rows) @ c
    return {"per_layer": per_layer, "per_step": per_step,
            "error": {"fit": error_summary(pred, t), "kernels_only": error_summary(kern, t)}}


def _cores():
    import os
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
