"""The updaters' wait for time slices when more ranks than cores share a
CPU host (3 ranks on 2 cores), as a curve in T_GPU fitted through the
runner contention sweeps' 3-rank runs.

With more processes than cores a rank's updater, woken by a deposit or
polling the collective, waits for a core its worker or another rank's
holds. The runner sweep measured that wait per updater cycle beyond the
model (``fit_steps.anchor_contention``: ``slice_wait``) on tiny, mnist,
digits and cifar, and its long-step runs (``sweep_runner.LONG_SOURCE``)
timed the updater's WaitGradient and Allreduce of compute-bound nets with
20-75 ms steps (their wait: what those took beyond the model at the T_GPU
they measured). Through all of them the wait grows with the step and then
levels off: at 3 x 1 (cpu_test14's records) 0.8 ms at T_GPU 0.9 ms, 2.1 at
3.6, 4.8-5.2 at 24-35 and 7.3 at cifar's 93 ms; at 3 x 2 it keeps growing
longer, 4.1 ms at 6 ms, 24-32 at 46-73 and 55 at 190. So

    slice(T) = c + a T / (1 + T / t0)

fitted per sharing, whatever the net's parameter count (those records:
c 0.56 ms, a 0.33, t0 25 ms at 3 x 1; 0.42 ms, 0.64, 158 ms at 3 x 2). The
line the profile fits apart for small- and large-vector nets
(``Profile.slice_terms``) read the large ones from cifar alone, whose
long step sits on the flat end: it priced 1.2-2 M-parameter nets with
15-45 ms steps at about half the small nets' wait (beta 0.11-0.12 against
0.24 at 3 x 1, 0.35-0.37 against 0.60 at 3 x 2), and the seen held-out
sets 11-14 ran their T_Update 7-30 % longer than priced at 3 ranks.
"""
from __future__ import annotations

import math

import numpy as np

# t0 candidates of the fit, in seconds (log grid), plus the straight line.
T0_GRID = tuple(float(v) for v in np.geomspace(1e-3, 10.0, 81)) + (math.inf,)
# Fewest swept nets, and widest spread of their steps, a curve is fitted through.
MIN_NETS = 4
MIN_SPAN = 10.0


def growth(a: float, t0: float, t: float) -> float:
    """The part of the wait that grows with the step: a t / (1 + t / t0)."""
    if t <= 0 or a <= 0:
        return 0.0
    return a * t if math.isinf(t0) else a * t / (1.0 + t / t0)


def fit_saturating(t, s, grid=T0_GRID) -> tuple:
    """``(c, a, t0)`` of ``s = c + a t / (1 + t / t0)`` (c, a >= 0), least
    squares on relative residuals: NNLS in (c, a) at each t0 of ``grid``,
    the t0 with the smallest residual kept (the first of equals)."""
    from scipy.optimize import nnls
    t, s = np.asarray(t, float), np.asarray(s, float)
    if len(t) != len(s) or len(t) < 2 or (t <= 0).any() or (s <= 0).any():
        raise ValueError("fit_saturating needs >= 2 points with positive steps and waits")
    best = None
    for t0 in grid:
        g = t if math.isinf(t0) else t / (1.0 + t / t0)
        (c, a), res = nnls(np.column_stack([np.ones_like(t), g]) / s[:, None], np.ones_like(s))
        if best is None or res < best[0] - 1e-12:
            best = (res, float(c), float(a), float(t0))
    return best[1:]


def _long_points(profile, R, n_gpu) -> list:
    """``(T_GPU, whole wait)`` of each long-step net of this sharing (median
    over its runs): what its WaitGradient + Allreduce took beyond the model
    without a slice wait, priced at the T_GPU the run measured, composed
    with that model's barrier as ``queueing.with_slice_wait`` composes them."""
    from engine import spec as spec_mod
    from .model import RUNNER_SWEEP_IMPL, _predict
    from .queueing import slice_from_excess
    from .sweep_runner import LONG_SOURCE
    runs = {}
    for e in profile.data.get("contention", {}).get("entries", []):
        cyc = e.get("cycle") or {}
        if (e.get("source") == LONG_SOURCE and (e["ranks"], e["workers"]) == (R, n_gpu) and e.get("n_subbatch")
                and cyc.get("T_GPU") and "WaitGradient" in cyc and "Allreduce" in cyc):
            runs.setdefault((e.get("model"), int(e["n_subbatch"])), []).append(e)
    out = []
    for group in runs.values():
        pts = []
        for e in group:
            cyc = e["cycle"]
            try:
                sp = spec_mod.get_spec(e.get("spec") or e["model"])
                slow = max(float(e.get("rel") or 1.0), 1.0)
                for _ in range(3):       # the slowdown at which the model steps as the run did
                    q = _predict(sp, R, n_gpu, int(e["n_subbatch"]), profile, ranks_per_host=R,
                                 impl=RUNNER_SWEEP_IMPL, slowdown=slow, slice_wait=(0.0, 0.0), wake=0.0)
                    slow *= cyc["T_GPU"] / q.t_gpu
            except (KeyError, ValueError):      # a net this install cannot build
                break
            excess = cyc["WaitGradient"] + cyc["Allreduce"] - q.updater["WaitGradient"] - q.updater["Allreduce"]
            pts.append((cyc["T_GPU"], slice_from_excess(q.t_barrier, excess)))
        if pts:
            out.append((e.get("model"), float(np.median([p[0] for p in pts])), float(np.median([p[1] for p in pts]))))
    return out


def sweep_points(profile, R, n_gpu) -> list:
    """``[(net, T_GPU, whole wait)]`` of every swept net at R x n_gpu, in the
    sweep's seconds: the runner entries' ``slice_wait`` with their own
    barrier put back (``Profile._whole_slice_waits``) and the long-step runs."""
    es = [e for e in profile._contention() if (e["ranks"], e["workers"]) == (R, n_gpu)
          and e.get("slice_wait") is not None and (e.get("cycle") or {}).get("T_GPU")]
    pts = [(e.get("model"), float(e["cycle"]["T_GPU"]), float(e["slice_wait"]))
           for e in profile._whole_slice_waits(es, R, n_gpu)] if es else []
    return pts + _long_points(profile, R, n_gpu)


def slice_curve(profile, R, n_gpu):
    """``(c, a, t0)`` of the slice wait ``c + a T / (1 + T / t0)`` at R ranks
    of n_gpu workers, c and t0 in this profile's seconds (by ``time_scale``,
    as the other host terms); None where the host has as many cores as
    ranks, or fewer than MIN_NETS swept nets with a positive wait span
    steps MIN_SPAN x apart (the caller keeps ``Profile.slice_terms``).
    Fitted once per profile data and sharing, in the sweep's seconds."""
    if R <= profile.cores:
        return None
    cache = profile.__dict__.setdefault("_slice_curves", {})
    key = (R, n_gpu)
    if key not in cache:
        from .profile import Profile
        bare = Profile(profile.data, profile.source)      # the sweep's seconds: no calibration
        pts = [p for p in sweep_points(bare, R, n_gpu) if p[1] > 0 and p[2] > 0]
        t = [p[1] for p in pts]
        ok = len({p[0] for p in pts}) >= MIN_NETS and t and max(t) >= MIN_SPAN * min(t)
        cache[key] = fit_saturating(t, [p[2] for p in pts]) if ok else None
    got = cache[key]
    if got is None:
        return None
    c, a, t0 = got
    k = profile.time_scale
    return k * c, a, k * t0
