"""How fast this machine's caches empty with time, and what that leaves
a layer pass to fetch again: the ``refill_decay`` sweep (a large FC op
timed after idle gaps), its fit (``fit_refill_tau``), and the share of a
layer's cold bytes a pass refills at the age a step gives them
(``refill_share``, ``pass_ages``), which ``layer_cost`` prices and
``fit_steps.fit_layer_terms`` fits the cold-weight term ``w`` on.
"""
from __future__ import annotations

import math
import time

import numpy as np

# The op timed: cifar's fc1 (a swept net's; 8.4 MB of weights, beyond the
# L2, inside the LLC when warm), batch 4; the idle gaps in seconds.
DECAY_SHAPE = (4, 4096, 512)
DECAY_GAPS = (0.0, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064)
# The taus ``fit_refill_tau`` tries (those up to the longest gap).
TAU_GRID = np.geomspace(1e-4, 0.3, 241)


def _spin(seconds):
    """Wait ``seconds`` on the wall clock touching no data (a sleep would
    let the scheduler run another thread here; the sweeps hold the core)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sweep_refill_decay(cfg, repeats=11):
    """``refill_decay`` records: linear_forward and linear_backward (with
    dX) of ``DECAY_SHAPE`` after each idle gap of ``DECAY_GAPS``, the
    median of ``repeats`` calls on the sweeps' clock (the gap is not in
    it). Under a second."""
    from engine import ops
    from .timing import CLOCK, _rand
    clock = CLOCK["fn"]
    n, fin, fout = DECAY_SHAPE
    x, w, b, dy = _rand((n, fin), 1), _rand((fout, fin), 2), _rand((fout,), 3), _rand((n, fout), 4)
    dw, db = _rand((fout, fin), 5), _rand((fout,), 6)
    calls = {"fwd": lambda: ops.linear_forward(x, w, b),
             "bwd": lambda: ops.linear_backward(x, w, dy, dw_out=dw, db_out=db, need_dx=True)}
    recs = []
    for pas, fn in calls.items():
        fn()
        for gap in DECAY_GAPS:
            ts = []
            for _ in range(repeats):
                _spin(gap)
                t0 = clock()
                fn()
                ts.append(clock() - t0)
            recs.append({"kind": "refill_decay", "pass": pas, "gap": gap, "t": float(np.median(ts)),
                         "std": float(np.std(ts)), "m": n, "k": fin, "n": fout, "clock": CLOCK["name"]})
    return recs


def refill_share(age, tau) -> float:
    """Share of a layer's cold bytes (``cold_weight_bytes``) that a pass
    fetches from memory when its operands were last touched ``age`` seconds
    before: ``1 - exp(-age / tau)``; 1 without a fitted ``tau`` (profiles
    before session 14 price every cold byte).

    On this VM the caches empty with time, not only with the step's own
    traffic (bench/RESULTS.md, "Cold weights by age"): cifar's fc1 op
    (8.4 MB of weights) ran 0.68 ms forward back to back, 0.85 / 1.14 / 1.37
    ms after a 3 / 10 / 30 ms Python spin that touches no data, as after a
    read of 256 MB. The weights term was fitted on cifar's fc1 alone (steps
    of 10-40 ms: emptied) and priced heldout-bigfc's fc1 (7.9 MB, steps of
    2-5 ms) 1.8 ms long in its backward (set 11)."""
    if not tau:
        return 1.0
    return 1.0 - math.exp(-max(age, 0.0) / tau)


def pass_ages(t_fwd, t_bwd, t_step) -> dict:
    """{pass: seconds since its cold operands were last touched} of a layer
    whose passes take ``t_fwd`` and ``t_bwd`` in steps of ``t_step`` run
    back to back: the forward reads the weights the previous backward left
    (the rest of the step between); the backward writes the gradient it
    wrote one step before (the weights it reads were just read by its
    forward)."""
    return {"fwd": t_step - t_fwd - t_bwd, "bwd": t_step - t_bwd}


def step_passes(passes, gap=0.0):
    """``({(layer, pass): seconds}, step seconds)`` of a step made of
    ``passes`` ((layer, pass, seconds) each) run back to back after an idle
    ``gap``: what ``aged_share`` reads a pass's age from."""
    per = {}
    for layer, pas, t in passes:
        per[(layer, pas)] = per.get((layer, pas), 0.0) + t
    return per, gap + sum(per.values())


def aged_share(per, step, layer, pas, tau) -> float:
    """``refill_share`` of pass ``pas`` of ``layer`` at the age a step of
    ``step`` seconds whose passes took ``per`` (``step_passes``) gives its
    cold operands (``pass_ages``). The one rule for the fit, on measured
    passes (``measured_shares``), and the prediction, on priced ones
    (``layer_cost``)."""
    ages = pass_ages(per.get((layer, "fwd"), 0.0), per.get((layer, "bwd"), 0.0), step)
    return refill_share(ages[pas], tau)


def measured_shares(recs, taus):
    """``record -> refill_share`` of its layer's cold bytes at the age the
    record's own step gave them (the passes of its net and batch, measured,
    run back to back; a gapped record's step has its idle gap before it);
    1 without fitted ``taus``."""
    if not taus:
        return lambda r: 1.0
    groups = {}
    for r in recs:
        groups.setdefault((r["model"], r["n_subbatch"], r.get("gap", 0.0)), []).append((r["layer"], r["pass"], r["t"]))
    steps = {key: step_passes(v, key[2]) for key, v in groups.items()}

    def share(r):
        per, step = steps[(r["model"], r["n_subbatch"], r.get("gap", 0.0))]
        return aged_share(per, step, r["layer"], r["pass"], taus[r["pass"]])
    return share


def fit_refill_tau(records) -> dict | None:
    """{pass: tau} of ``refill_share`` from the ``refill_decay`` records
    (``sweep_refill_decay`` above: a large FC op timed after
    idle gaps of 0-64 ms), None without them: ``t(gap) = t0 + a (1 -
    exp(-gap / tau))`` by least squares, ``t0`` and ``a`` linear for each
    ``tau`` of a log grid (``TAU_GRID``, 0.1-300 ms) up to the longest gap
    and that gap itself, the best ``tau`` kept.

    Not beyond the longest gap: a pass whose time still climbs in a line at
    64 ms fits the grid's end (300 ms), which prices every age beyond the
    gaps by extrapolation, and the runner terms fitted at the swept runs'
    age through ``refill_share`` grow with it. cpu_test22 (2026-12-02
    21:01, this Xeon VM in a fast hour: the backward 1.48 -> 3.04 ms over
    0-64 ms, no bend) fitted 300 ms and priced the fitted grid's cifar,
    whose shared configurations run cycles of 50-230 ms, 43-55 % long at
    1 x 2 to 3 x 2 (1 x 1 +7 %); capped at 64 ms, 10-19 % (T_GPU mean
    41.5 -> 13 %), held-out set 21's nets (vectors inside the L2) moved
    by under a point."""
    out = {}
    for pas in ("fwd", "bwd"):
        rs = [r for r in records if r.get("kind") == "refill_decay" and r.get("pass") == pas and r.get("t", 0) > 0]
        if len({r["gap"] for r in rs}) < 3:
            return None
        gap, t = np.array([r["gap"] for r in rs], float), np.array([r["t"] for r in rs], float)
        best = None
        # tau no longer than the longest gap: a curve that has not bent within
        # the gaps says nothing of the ages beyond them (below).
        for tau in np.append(TAU_GRID[TAU_GRID < gap.max()], gap.max()):
            A = np.column_stack([np.ones_like(gap), 1.0 - np.exp(-gap / tau)])
            coef, *_ = np.linalg.lstsq(A, t, rcond=None)
            res = float(np.sum((A @ coef - t) ** 2))
            if coef[1] > 0 and (best is None or res < best[0]):
                best = (res, float(tau))
        if best is None:
            return None
        out[pas] = best[1]
    return out


