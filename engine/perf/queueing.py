"""The queueing pieces of the SPRINT model: lock waits, the allreduce
barrier over nodes of binomially many buffers, the updater's wait for its
first deposit, and the expected staleness (SPEC section 4)."""
from __future__ import annotations

import math

import numpy as np

from .fixed_point import mixed_step


def _trapezoid(y, h):
    """np.trapezoid(y, dx=h) of a uniform grid, without its per-call
    overhead (the fixed points below call it hundreds of thousands of times
    in one ``sprint tune``)."""
    return float(h) * (float(y.sum()) - 0.5 * (float(y[0]) + float(y[-1])))


def lock_wait(t_cs, t_iter):
    """Expected wait behind one holder with critical section t_cs per t_iter."""
    if t_iter <= 0 or t_cs <= 0:
        return 0.0
    frac = min(t_cs / t_iter, 1.0)
    return frac * t_cs / 2.0


def binom_cdf(i, n, p):
    """P(X <= i) for X ~ Binomial(n, p)."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if i >= n else 0.0
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(0, i + 1))


def barrier_factor(n_gpu, n_node, p):
    """E[max_i X_i - X_1], X_i ~ Binomial(n_gpu, p) i.i.d. over n_node nodes."""
    if n_node <= 1 or p >= 1 or n_gpu < 1:
        return 0.0
    p = max(p, 0.0)
    return n_gpu * (1 - p) - sum(binom_cdf(i, n_gpu, p) ** n_node for i in range(n_gpu))


def t_barrier(a, n_gpu, n_node, p):
    """SPEC section 4: a * (N_GPU (1-p) - sum_{i<N_GPU} F(i)^N_Node)."""
    return a * barrier_factor(n_gpu, n_node, p)


def barrier_wait(cost, n_gpu, n_node, p, sigma=0.0):
    """E[max_i Y_i] - E[Y_1], Y_i = cost(X_i) + eps_i, over ``n_node`` i.i.d. nodes.

    X_i ~ Binomial(n_gpu, p) non-empty buffers; ``cost(x)``: time to sum x of
    them; eps_i ~ N(0, sigma^2): the spread of the node's other updater steps
    before the allreduce. With sigma = 0 and cost(x) = a x this is exactly the
    SPEC formula; the updater's real cost is not linear (an empty node
    zero-fills SendBuf, the first buffer is a copy, the rest additions) and
    measured steps are not deterministic, so the general form is used.
    """
    if n_node <= 1 or n_gpu < 1:
        return 0.0
    p = min(max(p, 0.0), 1.0)
    F = np.array([binom_cdf(i, n_gpu, p) for i in range(n_gpu + 1)])
    pmf = np.diff(np.concatenate([[0.0], F]))
    c = np.array([cost(x) for x in range(n_gpu + 1)], float)
    mean = float(pmf @ c)
    if sigma <= 0:
        pmax = np.diff(np.concatenate([[0.0], F ** n_node]))
        return max(float(pmax @ c) - mean, 0.0)
    from scipy.special import ndtr
    lo, hi = c.min() - 9 * sigma, c.max() + 9 * sigma
    y, h = np.linspace(lo, hi, 4001, retstep=True)
    G = (pmf[None, :] * ndtr((y[:, None] - c[None, :]) / sigma)).sum(axis=1)
    emax = lo + _trapezoid(1.0 - np.minimum(G, 1.0) ** n_node, h)
    return max(float(emax) - mean, 0.0)


def with_slice_wait(barrier, slice_wait):
    """The updater's wait at the allreduce for the slowest node, from the
    part the barrier prices (buffer counts and deposit waits: ``barrier``)
    and the time-slice wait of a shared host (``slice_wait``).

    Both are waits for the last of N nodes to arrive: E[max_i X_i] - E[X]
    grows with the spread of the arrival times X_i (k_N sigma for Gaussian
    ones). A node is late for its deposit and, independently, for a core or
    its GIL, so the two spreads add in variance, and the waits compose as
    sqrt(barrier**2 + slice_wait**2), not as their sum: the slowest node is
    seldom the slowest on both counts. Summed, 3 ranks x 2 workers of
    compute-bound nets (T_Update about T_GPU, every updater waiting for its
    deposit) were priced 0.96-1.25 T_GPU at the allreduce and took 0.57-0.89
    (N_Minibatch_avg +20 % mean on sets 1-10); the slice wait was measured
    on nets whose updaters never wait for a deposit, where both rules agree.
    """
    return math.hypot(max(barrier, 0.0), max(slice_wait, 0.0))


def slice_from_excess(barrier, excess):
    """The time-slice wait that ``with_slice_wait`` composes with ``barrier``
    into ``barrier + excess``: what a sweep measured beyond a model that
    priced ``barrier`` alone (``fit_steps.anchor_contention``)."""
    barrier = max(barrier, 0.0)
    total = max(barrier + excess, 0.0)
    return math.sqrt(max(total * total - barrier * barrier, 0.0))


def _first_deposit_wait(w, t_gpu, n_gpu, n_node, state=None, points=401, tol=1e-8):
    """(own wait, extra barrier) of updaters that wait for one local gradient.

    Mean-field model of one cycle, which starts when the allreduce releases
    every node. A node whose previous sum waited for a deposit took it right
    as it came: that worker deposits again T_GPU after the sum, the other
    N_GPU-1 at uniform phases; L_w (sum -> cycle start) = T_Update - its
    wait. A node that did not wait summed at the cycle start, L = T_Update,
    all N_GPU workers at uniform phases. So the time D to the first deposit
    survives x with

        S(x) = pi 1{L_w+x < T} (1-(L_w+x)/T)^(N_GPU-1) + (1-pi) (1-(T_Update+x)/T)^N_GPU

    pi = S(0) (the share of nodes that wait), own wait = int S, and the
    allreduce ends after the slowest node: T_Update = W + int 1-(1-S)^N_Node.
    The three unknowns are iterated to their fixed point; ``state`` carries
    the last solution between calls (the outer fixed point calls this often).
    """
    T = t_gpu
    if T <= 0:
        return 0.0, 0.0
    st = state if state is not None else {}
    U, pi, dw = st.get("U", w + T / 2), st.get("pi", 1.0), st.get("dw", T / 2)
    x, h = np.linspace(0.0, T, points, retstep=True)
    own = emax = 0.0
    prev = None
    for _ in range(200):
        lw = max(U - dw, 0.0)
        sw = np.where(lw + x < T, np.clip(1 - (lw + x) / T, 0, 1) ** (n_gpu - 1), 0.0)
        sn = np.clip(1 - (U + x) / T, 0, 1) ** n_gpu
        S = pi * sw + (1 - pi) * sn
        own = _trapezoid(S, h)
        emax = _trapezoid(1 - (1 - S) ** n_node, h) if n_node > 1 else own
        new = (w + emax, float(S[0]), own / S[0] if S[0] > 0 else 0.0)
        diff = max(abs(new[0] - U) / max(U, 1e-300), abs(new[1] - pi), abs(new[2] - dw) / T)
        if diff < 0.1 * tol:        # a tenth, as model._predict: mixed steps stop sooner
            U, pi, dw = 0.5 * (U + new[0]), 0.5 * (pi + new[1]), 0.5 * (dw + new[2])
            break
        # The damped step mixed with the last one (engine.perf.fixed_point).
        (U, pi, dw), prev = mixed_step((U, pi, dw), new, prev, scale=(max(U, 1e-300), 1.0, T),
                                       lo=(1e-300, 0.0, 0.0), hi=(math.inf, 1.0, math.inf))
        U, pi, dw = float(U), float(pi), float(dw)
    st.update(U=U, pi=pi, dw=dw)
    return own, max(emax - own, 0.0)


def expected_staleness(w, u, n_gpu, t_gpu, t_update, offset=1.0, idle=None):
    """Updates published between a worker reading LatestWeights and the
    update that applies its gradient.

    The version is read when the worker takes the LatestWeights lock; the
    gradient is as good as delivered once the worker holds its GradBuf lock
    (a pickup arriving during the deposit waits for it): G later. A periodic
    updater of random phase publishes G/T_Update times in that span on
    average, plus ``offset`` (one) more unless the updater reaches the
    buffer before its next publish: it is idle waiting for a gradient
    (WaitGradient of T_Update), or the buffer is reached delta into the
    cycle (lock waits and the buffers before it). A worker that arrives
    while the publish holds the lock (probability q) reads right after a
    publish instead of at a random phase, which saves half an update.
    """
    g = t_gpu - w["LockWeights"] - w["LockGradient"] - w["UpdateGradient"]
    delta = u["LockGradient"] / 2 + u["SumGradient"] * (n_gpu - 1) / (2 * n_gpu)
    q = min(u["UpdateWeights"] / t_update, 1.0)
    if idle is None:
        idle = u.get("WaitGradient", 0.0) / t_update
    return (g - delta) / t_update + offset * (1 - idle) - q / 2
