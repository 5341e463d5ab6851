"""engine.perf.fixed_point.mixed_step: the damped step of the model's fixed
points, mixed with the last one, reaches the same fixed point in fewer
steps, and falls back to the damped step where mixing would leave the
unknowns' range."""
import math

import pytest

from engine.perf.fixed_point import mixed_step


def _solve(F, x, mixed, tol=1e-12, lo=None, hi=None):
    prev = None
    for it in range(1, 2000):
        fx = F(x)
        if max(abs(a - b) / max(abs(b), 1e-300) for a, b in zip(x, fx)) < tol:
            return fx, it
        if mixed:
            x, prev = mixed_step(x, fx, prev, scale=[max(abs(v), 1e-300) for v in x], lo=lo, hi=hi)
        else:
            x = [a + 0.5 * (b - a) for a, b in zip(x, fx)]
    raise AssertionError("no convergence")


def _map(x):
    # A coupled, nonlinear contraction with a kink (min), like T_GPU/T_Update's.
    g, u = x
    return [1.0 + 0.6 * min(g, u) + 0.1 * math.sqrt(u), 0.5 + 0.7 * g * u / (g + u)]


def test_same_fixed_point_in_fewer_steps_than_the_damped_iteration():
    damped, n_damped = _solve(_map, [1.0, 1.0], mixed=False)
    mixed, n_mixed = _solve(_map, [1.0, 1.0], mixed=True)
    assert mixed == pytest.approx(damped, rel=1e-10)
    assert _map(mixed) == pytest.approx(mixed, rel=1e-10)
    assert n_mixed < 0.7 * n_damped


def test_first_step_and_a_growing_residual_take_the_damped_step():
    x, fx = [1.0, 2.0], [3.0, 1.0]
    nxt, state = mixed_step(x, fx, None, scale=[1.0, 1.0])
    assert nxt == pytest.approx([2.0, 1.5])
    # A residual larger than the last one: damped again, not extrapolated.
    nxt2, _ = mixed_step(nxt, [nxt[0] + 10.0, nxt[1] - 10.0], state, scale=[1.0, 1.0])
    assert nxt2 == pytest.approx([nxt[0] + 5.0, nxt[1] - 5.0])


def test_bounds_keep_a_share_a_share():
    # A linear map whose secant step overshoots a share's bound (pi <= 1).
    x0, f0 = [0.5], [0.9]
    _, state = mixed_step(x0, f0, None, scale=[1.0])
    x1, f1 = [0.7], [0.99]
    free, _ = mixed_step(x1, f1, state, scale=[1.0])
    bounded, _ = mixed_step(x1, f1, state, scale=[1.0], lo=[0.0], hi=[1.0])
    assert free[0] > 1.0                      # the extrapolation leaves the range
    assert bounded == pytest.approx([0.7 + 0.5 * 0.29])   # the damped step instead
