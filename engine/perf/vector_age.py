"""The per-step costs that grow with the parameter vector, priced by the
vector's age: how long before a worker step the worker last touched it.

On this VM the caches lose idle data within 10-30 ms (``cache_decay``: tau
12.6 / 13.9 ms forward / backward from the refill-decay sweep), whatever
the step does. Three per-step costs scale with the vector: the net step's
rest beyond its layer terms (``per_step_param``), the runner's
ComputeGradient beyond the one-thread step (``runner_compute``'s ``d``) and
the share ``r`` of FetchWeights' and ComputeUpdateVal's kernels that the
runner adds (``runner_step_excess``). Each was fitted where the only large
vector is cifar's (13 MB, worker cycles of 35-45 ms: emptied between two
steps) and priced heldout-bigfc's 7.9 MB at cycles of 7-9 ms as cold: its
1 x 1 T_GPU came out +38-42 % (set 11), heldout-fc3's (6.8 MB) +13-23 %
(set 12), heldout-shallow's (2.4 MB) +11-21 % (set 9), while their layer
passes were priced about right. Each such part is now its coefficient times
``refill_share(age, tau)``: fitted at the age its record had (a net step
run back to back: the step; a runner sweep: its T_GPU), priced at the age
of the predicted worker cycle (``worker_cycle``). Profiles without
``overhead.vector_tau`` price every part cold, as before.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from .cache_decay import refill_share


# The runner's worker steps whose kernels are vector-sized: their share
# ``r`` of the kernel is priced at the vector's age (LoadImage and
# DeformImage move a sub-batch, not the vector).
VECTOR_STEPS = ("FetchWeights", "ComputeUpdateVal")


def vector_tau(prof: dict) -> float | None:
    """Seconds in which the caches empty, for a vector touched by both
    passes: the mean of the refill-decay taus the layer terms carry
    (forward and backward), None without them."""
    taus = sorted({float(v["tau"]) for v in (prof.get("layer_terms") or {}).values()
                   if isinstance(v, dict) and v.get("tau")})
    return float(np.mean(taus)) if taus else None


def vector_share(n_param, l2_bytes, age, tau) -> float:
    """Share of a vector's price that a step pays when the worker last
    touched the vector ``age`` s before: the bytes inside the L2 in full (a
    small vector's per-parameter cost, as fitted), those beyond it at
    ``refill_share(age, tau)`` (what the caches lost meanwhile); 1 without
    an age or ``tau``."""
    if age is None or not tau or n_param <= 0:
        return 1.0
    b = 4.0 * n_param
    inside = min(b, float(l2_bytes or 0))
    return (inside + (b - inside) * refill_share(age, tau)) / b


def fit_per_step(t, kern, n_par, l2_bytes, tau):
    """``(c, d)`` of a net step's rest beyond its layer terms, ``t - kern =
    c + d * N_Param * vector_share(N_Param, l2, t, tau)`` (each ``net_step``
    record is a step run back to back: the vector's age is the step), by
    NNLS relative to ``t``; ``tau`` None: every step cold (as before)."""
    t, kern, n_par = (np.asarray(v, float) for v in (t, kern, n_par))
    s = np.array([vector_share(n, l2_bytes, a, tau) for n, a in zip(n_par, t)])
    c, d = nnls(np.column_stack([1.0 / t, n_par * s / t]), (t - kern) / t)[0]
    return float(c), float(d)


def runner_age(e):
    """The vector's age in a runner sweep entry: its workers' T_GPU (one
    worker cycle), else the one-thread step timed beside it, else None."""
    return (e.get("cycle") or {}).get("T_GPU") or e.get("solo_wall")


def mark_runner_shares(entries, l2_bytes, tau) -> None:
    """Each runner entry's ``vector_share`` of its vector at its age
    (``runner_age``), what ``runner_step_excess`` fits the runner's share of
    the vector-sized kernels against (1 without ``tau``)."""
    for e in entries:
        if e.get("source") == "runner" and e.get("n_param"):
            e["vector_share"] = vector_share(e["n_param"], l2_bytes, runner_age(e), tau)


def worker_cycle(at, alone=True, rounds=60) -> dict:
    """The worker's steps ``{name: seconds}`` where the vector's age is
    their sum, one worker cycle: ``at(age)`` prices them at an age (None:
    cold). From the cold price the cycle shrinks to its fixed point (the
    shares saturate, so a few rounds reach it).

    Only a worker ``alone`` on its host keeps its vector between cycles:
    the decay was swept with one thread, and with another worker or rank
    beside it (their own copy of the weights and vectors streaming through
    the shared cache) the vector is priced cold. On the seen big-vector
    nets (sets 9, 11, 12) with the age at every sharing, heldout-fc3's
    1 x 2 and 2 x 1 came out 12-18 % short (cold: 4-12 %); priced cold
    there, set 12's T_Update went 11.0 -> 9.2 % (mean), set 11's 8.5 -> 9.4."""
    got = at(None)
    if not alone:
        return got
    for _ in range(rounds):
        age = sum(got.values())
        new = at(age)
        done = abs(sum(new.values()) - age) <= 1e-9 * max(age, 1e-12)
        got = new
        if done:
            break
    return got
