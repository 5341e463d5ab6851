"""The per-step times of Algorithms 1 and 2 at a given ``(T_GPU, T_Update)``.

``model.predict`` iterates these to its fixed point: each worker step
(lock waits, the fetch taken with probability ``T_GPU / T_Update``, the
deposit that finds the buffer empty or not) and each updater step (the
gradient sums, the barrier of the slowest node, the time-slice wait of a
shared host) from the per-step costs ``model.step_costs`` gives. Apart from
the model so that the step formulas and the solver read on their own.
"""
from __future__ import annotations

import math

from .queueing import _first_deposit_wait, barrier_wait, lock_wait, with_slice_wait
from .slice_wait import growth


def _means(c):
    return {k: val[0] for k, val in c.items() if not k.startswith("_")}


def _worker_steps(c, n_gpu, t_gpu, t_update):
    m = _means(c)
    p_fetch = min(t_gpu / t_update, 1.0) if t_update > 0 else 1.0
    p_ne = min(t_update / t_gpu, 1.0) if t_gpu > 0 else 1.0
    s = {}
    # LatestWeights: held by the updater to publish once per T_Update and by
    # each other worker for its copy when it fetches.
    s["LockWeights"] = lock_wait(m["update_weights"], t_update) + \
        (n_gpu - 1) * p_fetch * lock_wait(m["fetch"], t_gpu)
    # A deposit that wakes the updater on a shared host costs the worker its
    # core for a while (wake_wait): in its fetch, or in LoadImage when the
    # woken updater has not published yet; the share that lands in LoadImage
    # is the sweep's (wake_load_share).
    wake = c["_wake_wait"][0] * (_idle_at_deposit(c, n_gpu, t_gpu, t_update) or 0.0)
    s["FetchWeights"] = p_fetch * m["fetch"] + (1.0 - c["_wake_load"][0]) * wake
    s["LoadImage"] = m["load"] + c["_wake_load"][0] * wake
    s["DeformImage"] = m["deform"]
    s["ComputeGradient"] = m["compute_gradient"]
    s["ComputeUpdateVal"] = m["update_val"] + m["worker_loop"]
    # GradBuf_t: held by the updater while it takes this buffer (when non-empty).
    s["LockGradient"] = p_ne * lock_wait(m["sum_cs"], t_update)
    # The updater empties the buffer once per T_Update: a worker slower than
    # the updater always finds it empty (set), a faster one accumulates.
    s["UpdateGradient"] = p_fetch * m["deposit_set"] + (1 - p_fetch) * m["deposit_add"]
    return s, p_fetch


def _updater_steps(c, n_gpu, n_node, t_gpu, t_update):
    m = _means(c)
    impl = c["_impl"][0]
    p_ne = min(t_update / t_gpu, 1.0) if t_gpu > 0 else 1.0
    p_fetch = min(t_gpu / t_update, 1.0) if t_update > 0 else 1.0
    G = n_gpu
    s = {}
    s["LockGradient"] = G * (p_fetch * lock_wait(m["deposit_set"], t_gpu)
                             + (1 - p_fetch) * lock_wait(m["deposit_add"], t_gpu))
    p_any = 1 - (1 - p_ne) ** G
    s["SumGradient"] = p_any * m["sum_first"] + (G * p_ne - p_any) * m["sum_add"] + (1 - p_any) * m["sum_zero"]
    s["AddMomentum"] = m["add_momentum"]
    # The barrier: the slowest node summed max_i X_i buffers, this one X_1.
    cost = lambda x: m["sum_zero"] if x == 0 else m["sum_first"] + (x - 1) * m["sum_add"]
    # A node also reaches the barrier late when it waited for a worker's
    # deposit: per worker, probability q of a wait uniform on (0, cs).
    cs = p_fetch * m["deposit_set"] + (1 - p_fetch) * m["deposit_add"]
    q = min(cs / t_gpu, 1.0) if t_gpu > 0 else 0.0
    var_lock = G * (q * cs * cs / 3 - (q * cs / 2) ** 2)
    sigma = math.sqrt(c["_updater_sigma"][0] ** 2 + max(var_lock, 0.0))
    barrier = barrier_wait(cost, G, n_node, p_ne, sigma)
    s["Allreduce"] = m["allreduce_bw"]
    s["UpdateMomentum"] = m["update_momentum"]
    s["LockWeights"] = G * p_fetch * lock_wait(m["fetch"], t_gpu)
    s["UpdateWeights"] = m["update_weights"] + m["updater_loop"]
    wait = 0.0
    if impl.min_grads:
        work = sum(s.values())
        wait, extra = _first_deposit_wait(work, t_gpu, G, n_node, c["_wait_state"][0])
        barrier += extra
    # The time-slice wait that grows with the step comes after the deposit
    # wait, not beside it: the updater that got its gradient waits for a
    # core (and its worker's GIL) before it sums, so the cycle outlasts
    # T_GPU by it (3 ranks on 2 cores: T_Update 38 ms at T_GPU 31 ms).
    # (Fitted against the runner's timed T_GPU, not its whole cycle.) It and
    # the barrier are both waits for the slowest node: they compose in
    # variance (queueing.with_slice_wait), not as a sum.
    gc, gb = c["_cycle_gap"][0]
    barrier = with_slice_wait(barrier, growth(c["_slice_beta"][0], c.get("_slice_t0", (math.inf,))[0],
                                            max(t_gpu - gc, 0.0) / (1.0 + gb)))
    s["Allreduce"] += barrier
    s = {"WaitGradient": wait, **s}
    return s, barrier, p_ne


def _idle_at_deposit(c, n_gpu, t_gpu, t_update):
    """P(a deposit finds the updater waiting for it).

    Not the updater's idle share of time: deposits are not random arrivals,
    the updater's work starts with one. A cycle ends its wait on exactly one
    of its N_GPU T_Update / T_GPU deposits, and cycles wait with the
    probability pi the waiting model solved for (None: no such model).
    """
    st = c["_wait_state"][0]
    if not c["_impl"][0].min_grads or "pi" not in st or t_update <= 0:
        return None
    return min(1.0, st["pi"] * t_gpu / (n_gpu * t_update))


def wake_load_share(profile, R, n_gpu, model, kw) -> float:
    """Share of the wake wait (``wake_wait``) a worker pays in LoadImage, not
    FetchWeights, at this sharing: per swept net of the runner contention
    sweep, LoadImage's excess over the model without the wait against both
    steps' (a swept net its own, another net the median over the nets whose
    vectors fit the L2, as ``wake_wait``); 0 (all in the fetch) unswept.

    The split depends on the sharing, not on a rule: LoadImage took 20 %
    of the two steps' excess at 1 x 2 (digits, mnist, cifar), 58-80 % at
    2 x 2 and 79-88 % at 3 x 2 (tiny, digits, mnist); the held-out runs of
    sets 5-7 33 / 43 / 67 %. With it all in FetchWeights, 2 x 2's
    LoadImage came out 0.05 ms against 0.57 measured."""
    from .model import per_swept_run
    from .wake_wait import MIN_WAKE_SHARE, _runner_with_steps, swept_or_small_median

    def load_share(e, ref):
        if (ref.extra.get("wake_share") or 0.0) < MIN_WAKE_SHARE:
            return None
        exc = [max(e["worker"][s] * profile.time_scale - ref.worker[s], 0.0) for s in ("LoadImage", "FetchWeights")]
        return (exc[0] / sum(exc), profile._overflows(e.get("n_param"))) if sum(exc) > 0 else None

    return swept_or_small_median(per_swept_run(profile, R, n_gpu, kw, "_wake_load_shares", load_share,
                                               accept=_runner_with_steps, wake=0.0), model)
