"""Fits over whole steps, from the kernel fits: each layer pass as a factor
on its kernels plus a per-call cost (``fit_layer_terms``), the net step's
own Python (``fit_overhead``), the runner's small worker steps beyond their
kernels (``runner_step_excess``), and the runner contention sweep expressed
against the model's own step (``anchor_contention``)."""
from __future__ import annotations

import numpy as np

from scipy.optimize import nnls

from engine import spec as spec_mod

from .nnls_fit import error_summary, nnls_relative
from .cache_decay import fit_refill_tau, measured_shares
from .l2_refill import REFILL_KEYS
from .layer_cost import (INPUT_TERM_KEYS, TERM_COLUMNS, cold_weight_bytes, fc_input_floats,
                         l2_weight_bytes, layer_term_keys, streams_in_sweep)
from .profile import Profile
from .runner_compute import runner_compute_excess  # noqa: F401  (anchor_contention; tests)
from .vector_age import (VECTOR_STEPS, fit_per_step, fit_vector_step, runner_age, vector_passes, vector_share,
                         vector_tau)


# -- per-layer terms ----------------------------------------------------------

def _kernel_sums(p, model, n):
    """{(layer, pass): (seconds of its kernels, kind)} from the kernel fits alone."""
    from engine import spec as spec_mod
    from .model import compute_gradient_terms
    sp = spec_mod.get_spec(model)
    kinds = {g.name: g.kind for g in spec_mod.layers(sp)}
    out = {}
    for name, pas, _, _, t in compute_gradient_terms(sp, n, p, kernels_only=True):
        if pas in ("fwd", "bwd"):
            k = (name, pas)
            out[k] = (out.get(k, (0.0, kinds[name]))[0] + t, kinds[name])
    return out


# What each fit holds out: whole shapes, never random points. Whole nets
# (bench/RESULTS.md section 4: digits, bench/specs/mnist_heldout.json) are
# held out of every sweep and scored by bench/validate_model.py.
HOLDOUT = {"sgemm": "non-power-of-2 shapes and the swept nets' own shapes",
           "im2col..relu": "every 4th conv layer shape", "pooling": "every 4th shape", "bias/softmax": "every 4th (batch, width)",
           "vectors": "every 4th size", "load/deform": "every 4th batch", "allreduce": "every 4th (size, ranks)",
           "layer passes": "the middle batch size of each net and the whole net heldout-b",
           "net step": "every 3rd batch size"}


def fit_layer_terms(prof: dict, records, refill_keys=REFILL_KEYS) -> dict:
    """Each layer pass as ``f * (its kernels) + b``, one (f, b) per layer kind
    and pass (conv/fc x fwd/bwd), a net's first convolution and output
    layer apart (``layer_term_keys``), by NNLS on relative residuals.

    ``b`` carries what small layers are made of: the per-call Python of the
    layer and its ops, allocation, the per-call cost of each kernel beyond
    its swept one; ``f`` the caches a whole step leaves cold for the next
    kernel; ``w`` seconds per byte of weights beyond the L2
    (``cold_weight_bytes``; 0 where no fitted layer has such weights);
    ``x`` seconds per float of a hidden FC layer's input (``fc_input_floats``,
    for the keys of ``INPUT_TERM_KEYS``; 0 for the others); ``r`` and ``s``
    the refills at age of ``l2_refill``, for ``refill_keys`` only
    (``l2_refill.REFILL_KEYS`` by default). Without ``w`` cifar's fc layers, 1.5-4x their op sweep in a step, pulled
    ``f`` up and every small FC layer 20-40 % slow. ``f`` scales only the FC
    passes whose op sweep ran from the L2 (``streams_in_sweep``; the others
    enter at their swept price: ``l2_only``). Fitted on the ``layer_pass``
    records of the swept nets (the gapped ones, aged, only the passes of refill_keys);
    held out: whole batch sizes (and in bench/validate_model.py whole nets)."""
    p = Profile({k: v for k, v in prof.items() if k not in ("overhead", "layer_terms")})
    l2 = (prof.get("cache") or {}).get("l2_bytes")
    recs = [r for r in records if r.get("kind") == "layer_pass" and r.get("t", 0) > 0 and (refill_keys or not r.get("gap"))]
    taus = fit_refill_tau(records)
    # Without the decay sweep's taus every share is 1: s would be b again and r a second w.
    refill_keys = refill_keys if taus else ()
    share = measured_shares(recs, taus)
    cache, rows = {}, {}
    for r in recs:
        key = (r["model"], r["n_subbatch"])
        if key not in cache:
            try:
                gs = spec_mod.layers(sp := spec_mod.get_spec(r.get("spec") or r["model"]))
                cold = {g.name: (cold_weight_bytes(g, l2), l2_weight_bytes(g, l2)) for g in gs}
                xin = {g.name: fc_input_floats(g, r["n_subbatch"]) for g in gs}
                keys = {(g.name, pas): layer_term_keys(g.kind, i, len(gs), pas)
                        for i, g in enumerate(gs) for pas in ("fwd", "bwd")}
                streams = {(g.name, pas): streams_in_sweep(g, l2) for g in gs for pas in ("fwd", "bwd")}
                cache[key] = (_kernel_sums(p, sp, r["n_subbatch"]), cold, keys, streams, xin)
            except ValueError:        # a kernel this net needs was not swept
                cache[key] = ({}, {}, {}, {}, {})
        got = cache[key][0].get((r["layer"], r["pass"]))
        # A gapped pass fits only a term with the refill columns (the others have nothing for its age).
        if got is None or (r.get("gap") and cache[key][2][(r["layer"], r["pass"])][0] not in refill_keys):
            continue
        # (kernels f scales, kernels as swept, TERM_COLUMNS' columns, time, held out); no refill where the sweep streamed
        kf, k1 = (0.0, got[0]) if (streams := cache[key][3][(r["layer"], r["pass"])]) else (got[0], 0.0)
        (cold, warm), sh = cache[key][1][r["layer"]], share(r)
        rows.setdefault(cache[key][2][(r["layer"], r["pass"])], []).append(
            (kf, k1, 1.0, cold * sh, cache[key][4][r["layer"]], warm * sh * (not streams), sh * (not streams),
             r["t"], bool(r.get("holdout"))))
    # A role with too few fitted passes is priced by its kind's term.
    for keys in [k for k in rows if len(k) > 1]:
        if sum(not h for *_, h in rows[keys]) < 3:
            rows.setdefault(keys[-1:], []).extend(rows.pop(keys))
    rows = {keys[0]: rs for keys, rs in rows.items()}
    out = {}
    for key, rs in sorted(rows.items()):
        fit_r, hold = [r[:-1] for r in rs if not r[-1]], [r[:-1] for r in rs if r[-1]]
        if len(fit_r) < 3:
            continue
        X = lambda rr: np.array([[r[0]] + list(r[2:-1]) for r in rr])
        A = X(fit_r)
        coef = np.zeros(A.shape[1])
        keys = {"b": [key], "w": [key], "x": INPUT_TERM_KEYS, "r": refill_keys, "s": refill_keys}
        used = [0] + [j for j, c in enumerate(TERM_COLUMNS, 1) if (j == 1 or A[:, j].any()) and key in keys[c]]
        coef[used] = nnls_relative(A[:, used], [r[-1] for r in fit_r], offset=[r[1] for r in fit_r])
        ev = lambda rr: error_summary(X(rr) @ coef + np.array([r[1] for r in rr]), [r[-1] for r in rr]) \
            if rr else {"n": 0}
        out[key] = {"f": float(coef[0]), **{c: float(v) for c, v in zip(TERM_COLUMNS, coef[1:])},
                    "l2_only": True, **({"tau": taus[key.rsplit("_", 1)[1]]} if taus else {}),
                    "error": {"fit": ev(fit_r), "holdout": ev(hold),
                              "kernels_only_holdout": error_summary([r[0] + r[1] for r in hold],
                                                                    [r[-1] for r in hold]) if hold else {"n": 0}}}
    return out


# The runner's worker steps whose cost beyond their kernels is priced
# (UpdateGradient is too small to tell from the timers' own cost).
RUNNER_STEPS = ("FetchWeights", "LoadImage", "DeformImage", "ComputeUpdateVal")


def runner_step_excess(entries, l2_bytes=None, tau=None) -> dict:
    """{step: {"c": seconds per call, "r": fraction of the kernel}} that the
    runner spends on its small worker steps beyond the kernels that price
    them, one thread: excess = measured / slowdown - kernel of the runner
    contention sweep's 1 x 1 runs, fitted as ``c + r * kernel`` over the
    swept nets (NNLS).

    One constant (the median over nets, until session 4) priced the cost of
    ``cifar``'s 3.2 M-parameter ComputeUpdateVal (1.7 ms beyond its kernel)
    into every net's: ``tiny``'s is 12 us. The excess is the Python around
    the loader and the timers (``c``) plus the kernel running slower inside
    the runner than in its sweep (``r``): caches shared with the updater."""
    out = {}
    for k in RUNNER_STEPS:
        pts = []
        for e in entries:
            if not (e.get("source") == "runner" and (e["ranks"], e["workers"]) == (1, 1)
                    and e.get("worker") and e.get("worker_model") and k in e["worker"]):
                continue
            slow = max(e.get("worker_slowdown", 1.0), 1e-9)
            kern = e["worker_model"][k] / slow
            # r of a vector-sized step at the run's vector age (vector_age).
            share = e.get("vector_share", 1.0) if k in VECTOR_STEPS else 1.0
            pts.append((kern * share, e["worker"][k] / slow - kern))
        if not pts:
            continue
        vec = _vector_step_fit(entries, k, l2_bytes, tau) if k in VECTOR_STEPS else None
        if vec is not None:
            out[k] = vec
            continue
        kern, exc = (np.array(v) for v in zip(*pts))
        # Telling c from r needs kernels of very different sizes (ComputeUpdateVal:
        # 580 against 3.2 M parameters); LoadImage's two nets differ by 30 %,
        # and a slope through two such points is noise.
        if len(pts) == 1 or kern.max() < 10 * max(kern.min(), 1e-12):
            c, r = max(float(np.median(exc)), 0.0), 0.0
        else:
            c, r = nnls(np.column_stack([np.ones_like(kern), kern]), exc)[0]
        out[k] = {"c": float(c), "r": float(r)}
    return out


def _vector_step_fit(entries, step, l2_bytes, tau):
    """``{c, d, e, l2_bytes}`` of a vector-sized step from the runner's
    (1, 1) runs (``vector_age.fit_vector_step``: the step's whole time, not
    its excess over the kernels), None where the L2 is unknown or the swept
    vectors are too few or too alike to tell a slope (< 3 nets, < 10x)."""
    from .model import RUNNER_SWEEP_IMPL      # the runner the sweep ran
    pts = [(e["n_param"], runner_age(e), vector_passes(step, RUNNER_SWEEP_IMPL.weight_decay),
            e["worker"][step] / max(e.get("worker_slowdown", 1.0), 1e-9))
           for e in entries if e.get("source") == "runner" and (e["ranks"], e["workers"]) == (1, 1)
           and e.get("n_param") and e.get("worker") and step in e["worker"] and runner_age(e)]
    if not l2_bytes or len(pts) < 3 or max(p[0] for p in pts) < 10 * min(p[0] for p in pts):
        return None
    c, d, e = fit_vector_step(*zip(*pts), l2_bytes, tau)
    return {"c": c, "d": d, "e": e, "l2_bytes": l2_bytes}


def anchor_contention(prof: dict) -> None:
    """Express the runner contention entries against the model's own
    ComputeGradient instead of the sweep's one-thread probe.

    ``host`` of a runner entry is its (1, 1) run's ComputeGradient over an
    undisturbed step; dividing by the step the kernel fits predict instead
    makes the model reproduce the runner at the swept N_Subbatch exactly,
    and leaves the other sizes to the kernel fits. (The probe's own ratio
    stays as ``host_solo``.)"""
    from .model import compute_gradient_terms
    from engine import spec as spec_mod
    p = Profile(prof)
    for e in prof["contention"]["entries"]:
        if e.get("source") != "runner" or not e.get("t") or not e.get("rel"):
            continue
        try:
            sp = spec_mod.get_spec(e["model"])
            cg = sum(r[4] for r in compute_gradient_terms(sp, int(e["n_subbatch"]), p)) \
                + p.per_step(spec_mod.n_params(sp))
        except ValueError:          # a kernel this net needs was not swept
            continue
        if cg > 0:
            e.setdefault("host_solo", e["host"])
            e["host"] = e["t"] / e["rel"] / cg
    # Every pair was measured after a (1, 1) run of its own: rel cancels the
    # minute-to-minute drift, and the (1, 1) runs are repeated measurements
    # of one factor -- priced by their median, not by the one before the pair.
    by_net = {}
    for e in prof["contention"]["entries"]:
        if e.get("source") == "runner" and "host_solo" in e:
            by_net.setdefault(e["model"], []).append(e)
    for net, es in by_net.items():
        h = float(np.median([e["host"] for e in es]))
        # The (1, 1) step against the one-thread step timed beside it, in
        # seconds: what the runner adds, whatever the layer terms price
        # (runner_compute_excess).
        paired = [e["t"] / e["rel"] - e["solo_wall"] for e in es if e.get("solo_wall")]
        # Repeated sweeps of one sharing (records merged from several runs):
        # one entry each, at the median of their rel and updater steps.
        pooled = {}
        for e in es:
            pooled.setdefault((e["ranks"], e["workers"], e["n_subbatch"]), []).append(e)
        by_net[net] = []
        for group in pooled.values():
            e = group[0]
            e["host_base"], e["host"] = float(np.median([g["host"] for g in group])), h
            e["rel"] = float(np.median([g["rel"] for g in group]))
            e["t"] = float(np.median([g["t"] for g in group]))
            for key in ("updater", "worker", "cycle"):
                got = [g[key] for g in group if g.get(key)]
                if got:
                    e[key] = {k: float(np.median([u[k] for u in got if u.get(k) is not None]))
                          for k in got[0] if got[0][k] is not None}
            e["ratio"] = e["rel"] * h
            e["n_runs"] = len(group)
            if paired:
                e["excess_solo"] = float(np.median(paired))
            gap = cycle_gap(e)
            if gap is not None:
                e["cycle_gap"] = gap
            by_net[net].append(e)
            for g in group[1:]:
                prof["contention"]["entries"].remove(g)
    runner_compute_excess(prof, by_net, p)
    # Where each swept net sits between all-Python and all-kernel steps:
    # other nets' slowdowns are read between them (Profile.slowdown).
    from .model import python_share
    for net, es in by_net.items():
        for e in es:
            e["phi"] = python_share(net, int(e["n_subbatch"]), p)
    # What the updater's own steps cost in the runner beyond their kernels:
    # its Python between them waits for the GIL the node's workers hold.
    from .model import RUNNER_SWEEP_IMPL, predict
    bare = []     # every entry against the model without any excess (set below)
    for es in by_net.values():
        for e in es:
            if not e.get("updater"):
                continue
            try:
                bare.append((e, predict(e["model"], e["ranks"], e["workers"], int(e["n_subbatch"]), p,
                                        ranks_per_host=e["ranks"], impl=RUNNER_SWEEP_IMPL)))
            except ValueError:
                continue
    for e, q in bare:
        e["updater_excess"] = sum(e["updater"].values()) - sum(q.updater.get(k, 0.0) for k in e["updater"])
        cyc = e.get("cycle") or {}
        if e["ranks"] > 1 and "Allreduce" in cyc and "WaitGradient" in cyc:
            # What the updater's wait for a gradient and the collective (its
            # barrier included) took beyond the model's: with more ranks than
            # cores, each rank's polls wait for a time slice (a worker of
            # another rank holds the core, or its own holds the GIL while
            # descheduled). Seconds per cycle, priced where the model
            # prices the collective (host._allreduce_cost).
            e["slice_wait"] = (cyc["WaitGradient"] + cyc["Allreduce"]
                               - q.updater.get("WaitGradient", 0.0) - q.updater.get("Allreduce", 0.0))
        # The worker's small steps as the runner timed them, beside the
        # model's: kept for diagnosis, not priced yet (a per-step factor
        # at one N_Subbatch over- or under-shoots the others).
        if e.get("worker"):
            e["worker_model"] = {k: q.worker.get(k, 0.0) for k in e["worker"]}
            e["worker_slowdown"] = q.slowdown
    exc = runner_step_excess(prof["contention"]["entries"], (prof.get("cache") or {}).get("l2_bytes"),
                             (prof.get("overhead") or {}).get("vector_tau"))
    if exc:
        prof.setdefault("overhead", {})["runner_steps"] = exc


def cycle_gap(e) -> float | None:
    """What a runner entry's workers spent per cycle outside their timed
    steps, as a fraction of T_GPU: their real cycle, the samples of an
    update over the workers' rate, ``W S T_Update / N_Minibatch_avg``, over
    the timed iteration ``T_GPU``, minus 1; None without those numbers.

    A worker's timed iteration ends when it deposits its gradient; waking
    the updater hands it the GIL, and with more ranks than cores the worker
    waits for a time slice before its next iteration starts. Held-out set
    5's nets run again on 2026-12-01 (development data): on 1-2 ranks the
    real cycle is 0-8 % longer than T_GPU, on 3 ranks 10-47 %, so the model
    that rates the workers by T_GPU put N_Minibatch_avg up to 45 % high and
    T_Epoch 36 % short there."""
    c = e.get("cycle") or {}
    t_gpu, t_upd, nmb = c.get("T_GPU"), c.get("T_Update"), c.get("N_Minibatch_avg")
    if not (t_gpu and t_upd and nmb):
        return None
    return e["ranks"] * e["workers"] * int(e["n_subbatch"]) * t_upd / nmb / t_gpu - 1.0


def fit_overhead(prof: dict, steps, held=()) -> dict:
    """Framework cost the kernels do not explain: per layer and per step.

    Each ``net_step`` record is one measured forward+backward of a preset at
    some batch; the kernel terms predict the rest; NNLS on the remainder.
    """
    from engine import spec as spec_mod
    from .model import compute_gradient_terms
    p = Profile({k: v for k, v in prof.items() if k != "overhead"})

    def kernels(rs):
        out = []
        for r in rs:
            sp = spec_mod.get_spec(r.get("spec") or r["model"])
            out.append((sum(x[4] for x in compute_gradient_terms(sp, r["n_subbatch"], p)),
                        len(spec_mod.layers(sp))))
        return np.array([k for k, _ in out]), np.array([[n, 1.0] for _, n in out])
    t = np.array([r["t"] for r in steps])
    kern, rows = kernels(steps)
    if "layer_terms" in prof:
        # The layers are priced by their own terms: what is left of a step
        # is the net's per-step work outside them, c + d N_Param (loss and
        # flatten per call; zeroing and flattening the gradient per
        # parameter). One constant, the median over tiny and cifar, was
        # cifar's 2 ms put on every net.
        # The vector's bytes beyond the L2 at its age (vector_age).
        n_par = lambda rs: np.array([spec_mod.n_params(spec_mod.get_spec(r.get("spec") or r["model"])) for r in rs],
                                    float)
        l2, tau = (prof.get("cache") or {}).get("l2_bytes"), vector_tau(prof)
        c, d = fit_per_step(t, kern, n_par(steps), l2, tau)
        extra = lambda rs, ks: ks + c + d * np.array([n * vector_share(n, l2, r["t"], tau)
                                                      for n, r in zip(n_par(rs), rs)])
        err = {"fit": error_summary(extra(steps, kern), t)}
        if held:
            th = np.array([r["t"] for r in held])
            kh, _ = kernels(held)
            err["holdout"] = error_summary(extra(held, kh), th)
        return {"kernel_factor": 1.0, "per_layer": 0.0, "per_step": float(c), "per_step_param": float(d),
                **({"vector_tau": tau} if tau else {}), "error": err}
    # t = f * kernels + per_layer * L + per_step: the sweeps run each kernel
    # on warm caches, a step streams every layer's data through them (f),
    # and the Python of the layers costs per layer and per step.
    A = np.column_stack([kern, rows])
    f, per_layer, per_step = map(float, nnls_relative(A, t))
    coef = np.array([f, per_layer, per_step])
    err = {"fit": error_summary(A @ coef, t), "kernels_only": error_summary(kern, t)}
    if held:
        th = np.array([r["t"] for r in held])
        kh, rh = kernels(held)
        err["holdout"] = error_summary(np.column_stack([kh, rh]) @ coef, th)
        err["holdout_kernels_only"] = error_summary(kh, th)
    return {"kernel_factor": f, "per_layer": per_layer, "per_step": per_step, "error": err}
