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

from .cache_decay import refill_share
from .layer_cost import bytes_beyond_l2


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
    return 1.0 - bytes_beyond_l2(n_param, float(l2_bytes or 0)) * (1.0 - refill_share(age, tau)) / (4.0 * n_param)


def fit_per_step(t, kern, n_par, l2_bytes, tau):
    """``(c, d)`` of a net step's rest beyond its layer terms, ``t - kern =
    c + d * N_Param * vector_share(N_Param, l2, t, tau)`` (each ``net_step``
    record is a step run back to back: the vector's age is the step), by
    NNLS relative to ``t``; ``tau`` None: every step cold (as before)."""
    t, kern, n_par = (np.asarray(v, float) for v in (t, kern, n_par))
    s = np.array([vector_share(n, l2_bytes, a, tau) for n, a in zip(n_par, t)])
    from scipy.optimize import nnls   # fitting only: predictions need no SciPy import
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


def vector_passes(step, weight_decay) -> int:
    """Passes over the parameter vector a vector-sized worker step makes:
    FetchWeights one copy; ComputeUpdateVal ``-eta * grad``, and with weight
    decay ``eta * wd * w`` and the difference besides (engine/parallel/asgd)."""
    return 1 + 2 * bool(weight_decay) if step == "ComputeUpdateVal" else 1


def vector_step_price(v, n_param, age, tau, passes) -> float:
    """Seconds of a vector-sized worker step in the runner, one thread:
    ``c + passes * (d * N_Param + e * (bytes beyond the L2) * refill_share(age))``
    (``v``: its fitted ``{c, d, e, l2_bytes}``, ``fit_vector_step``); the
    ``e`` part cold without an age or ``tau``."""
    share = refill_share(age, tau) if (age is not None and tau) else 1.0
    beyond = bytes_beyond_l2(n_param, v["l2_bytes"]) if v.get("l2_bytes") else 0.0
    return v["c"] + passes * (v["d"] * n_param + v["e"] * beyond * share)


def fit_vector_step(n_param, age, passes, t, l2_bytes, tau):
    """``(c, d, e)`` of ``vector_step_price`` from the runner's one-thread
    times ``t`` of a step on nets of ``n_param`` parameters whose vector was
    ``age`` s old, by NNLS relative to ``t`` (each net weighs alike: tiny's
    3 us beside cifar's 1.7 ms).

    Why not the vector kernels' price (``c + kern * (1 + r * share)``, until
    session 16): the kernels were swept in a loop, a vector under 113 K
    parameters warm in the L2, but the runner's step comes after the layer
    passes streamed the net's activations through it. Its FetchWeights and
    ComputeUpdateVal run at 0.3 and 0.9 ns per parameter from mnist's and
    digits' 150-210 K down to heldout-four's 35 K, and the one slope ``r``
    that fitted cifar's 13 MB priced 80-100 K nets 2-3x short and
    heldout-bigfc's 7.9 MB 40 % long (sets 5-13, 1 x 1)."""
    n, age, passes, t = (np.asarray(v, float) for v in (n_param, age, passes, t))
    beyond = np.array([bytes_beyond_l2(x, l2_bytes) if l2_bytes else 0.0 for x in n])
    share = np.array([refill_share(a, tau) if tau else 1.0 for a in age])
    a = np.column_stack([np.ones_like(n), passes * n, passes * beyond * share])
    from scipy.optimize import nnls
    c, d, e = nnls(a / t[:, None], np.ones_like(t))[0]
    return float(c), float(d), float(e)
