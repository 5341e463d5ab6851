"""The fitting primitives every fit module shares: non-negative least squares
on *relative* residuals, the error summary of a fit and the sweep's noise.

They live apart from ``fit`` (which assembles the whole profile and imports
the step fits of ``fit_steps``) so that any fit module imports them without
importing ``fit`` first: a module-level cycle fit -> fit_steps -> fit made
``import engine.perf.fit_steps`` fail in a fresh interpreter.
"""
from __future__ import annotations

import numpy as np


def nnls_relative(X, t, offset=None):
    """argmin_{c >= 0} sum((X c + offset - t)/t)^2 (``offset``: a known part
    of each time, default 0), with column scaling for conditioning."""
    # SciPy's optimizers load here, where a fit runs: the modules that price
    # a step (pool_cost, ...) import this one, and building the CLI must not
    # pay for them (tests/test_cli.py).
    from scipy.optimize import nnls
    X = np.asarray(X, float)
    t = np.asarray(t, float)
    if X.ndim != 2 or len(X) != len(t):
        raise ValueError("X must be (points, features) matching t")
    if np.any(t <= 0):
        raise ValueError("measured times must be positive")
    A = X / t[:, None]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    rhs = np.ones(len(t)) if offset is None else 1.0 - np.asarray(offset, float) / t
    c, _ = nnls(A / scale, rhs, maxiter=50 * X.shape[1])
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


def sweep_cv(rs):
    """Median coefficient of variation (std / t) of sweep records: the noise a fit cannot beat."""
    cvs = [r["std"] / r["t"] for r in rs if r.get("std") is not None and r["t"] > 0]
    return float(np.median(cvs)) if cvs else 0.0
