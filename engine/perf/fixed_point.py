"""One step of the model's damped fixed-point iterations x = F(x), mixed with
the step before it (Anderson mixing of depth 1).

The model solves two fixed points per prediction: (T_GPU, T_Update) in
``model._predict`` and, inside each of its steps, the updater's wait for its
first deposit (``queueing._first_deposit_wait``: the updaters' cycle, the
share that waits and its wait). Both were iterated by the damped step
x + (F(x) - x) / 2, which contracts where the plain one oscillates (the
min() kinks at T_GPU = T_Update) but converges slowly: 34 outer steps a
prediction on average, and `sprint tune` prices hundreds of
configurations. Mixing the damped step with the last one's residual (the
secant through both) reaches the same fixed point in about half the steps;
the plain damped step is kept wherever the mixed one would leave the
unknowns' range or the residual grew.
"""
from __future__ import annotations

import math


def mixed_step(x, fx, prev, scale, lo=None, hi=None, damping=0.5):
    """(next x, state for the next call) of the iteration x = F(x).

    ``x``, ``fx``: the point and F at it (sequences of a few floats: plain
    Python, numpy's per-call overhead on 2-3 elements cost more than the
    steps saved); ``prev``: the state the last call returned (None at the
    first step); ``scale``: each unknown's unit for the residual's norm (its
    size, or 1 for a share); ``lo``/``hi``: bounds the mixed point must keep
    (else the damped step is taken)."""
    r = [b - a for a, b in zip(x, fx)]
    rs = [v / s for v, s in zip(r, scale)]
    norm = math.sqrt(sum(v * v for v in rs))
    damped = [a + damping * v for a, v in zip(x, r)]
    state = (list(x), r, norm)
    if prev is None or not norm < prev[2]:
        return damped, state
    dx = [a - b for a, b in zip(x, prev[0])]
    dr = [a - b for a, b in zip(r, prev[1])]
    drs = [v / s for v, s in zip(dr, scale)]
    den = sum(v * v for v in drs)
    if not den > 0:
        return damped, state
    g = sum(a * b for a, b in zip(drs, rs)) / den
    mixed = [d - g * (a + damping * b) for d, a, b in zip(damped, dx, dr)]
    if (lo is not None and any(m < b for m, b in zip(mixed, lo))) or \
            (hi is not None and any(m > b for m, b in zip(mixed, hi))):
        return damped, state
    return mixed, state
