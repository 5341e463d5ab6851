"""engine.perf.slice_wait: the updaters' wait for time slices beyond the
cores, a curve c + a T / (1 + T / t0) through the swept nets' waits,
checked against synthetic waits of known coefficients."""
import math

import numpy as np
import pytest

from engine.perf import model, slice_wait
from engine.perf.profile import Profile
from engine.perf.queueing import slice_from_excess
from engine.perf.sweep_runner import LONG_SOURCE

T = np.array([0.9e-3, 3.6e-3, 5.1e-3, 24e-3, 35e-3, 93e-3])


def curve(c, a, t0, t):
    return c + np.array([slice_wait.growth(a, t0, x) for x in np.atleast_1d(t)])


def test_growth_levels_off_past_t0_and_is_a_line_without_it():
    assert slice_wait.growth(0.3, math.inf, 0.02) == pytest.approx(0.006)
    assert slice_wait.growth(0.3, 0.02, 0.02) == pytest.approx(0.003)
    assert slice_wait.growth(0.3, 0.02, 10.0) == pytest.approx(0.3 * 0.02, rel=3e-3)   # the level a t0
    assert slice_wait.growth(0.3, 0.02, 0.0) == 0.0 and slice_wait.growth(0.0, 0.02, 1.0) == 0.0


@pytest.mark.parametrize("c,a,i", [(0.55e-3, 0.33, 28), (0.4e-3, 0.64, 44), (0.0, 0.5, 10)])
def test_fit_recovers_known_coefficients(c, a, i):
    t0 = slice_wait.T0_GRID[i]
    got = slice_wait.fit_saturating(T, curve(c, a, t0, T))
    assert got == pytest.approx((c, a, t0), rel=1e-6, abs=1e-12)


def test_fit_of_a_line_is_the_line():
    got = slice_wait.fit_saturating(T, 1e-3 + 0.25 * T)
    assert got[0] == pytest.approx(1e-3, rel=1e-6) and got[1] == pytest.approx(0.25, rel=1e-6)
    assert math.isinf(got[2])


def test_fit_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError):
        slice_wait.fit_saturating(T[:1], [1e-3])
    with pytest.raises(ValueError):
        slice_wait.fit_saturating(T, np.zeros_like(T))


def _profile():
    prof = Profile.synthetic(backend="cpu", cores=2)
    prof.data["contention"] = {"entries": []}
    return prof


def test_curve_is_fitted_through_the_sweep_points_in_the_profiles_seconds(monkeypatch):
    c, a, t0 = 0.5e-3, 0.4, slice_wait.T0_GRID[30]
    pts = [(f"net{i}", t, float(curve(c, a, t0, t)[0])) for i, t in enumerate(T)]
    seen = []

    def fake(p, R, n_gpu):
        seen.append(p.time_scale)
        return pts if (R, n_gpu) == (3, 1) else pts[:3]
    monkeypatch.setattr(slice_wait, "sweep_points", fake)
    prof = _profile()
    assert slice_wait.slice_curve(prof, 3, 1) == pytest.approx((c, a, t0), rel=1e-6)
    # A calibrated profile: the same curve, its times by time_scale, fitted in the sweep's seconds.
    slow = Profile(prof.data, prof.source)
    slow.time_scale = 1.3
    assert slice_wait.slice_curve(slow, 3, 1) == pytest.approx((1.3 * c, a, 1.3 * t0), rel=1e-6)
    assert seen == [1.0, 1.0]
    # Within the cores, too few nets, or steps too close together: none (the profile's line).
    assert slice_wait.slice_curve(prof, 2, 1) is None
    assert slice_wait.slice_curve(prof, 3, 2) is None
    monkeypatch.setattr(slice_wait, "sweep_points", lambda p, R, n: [(f"n{i}", t, 1e-3) for i, t in
                                                                      enumerate(np.linspace(10e-3, 60e-3, 6))])
    assert slice_wait.slice_curve(_profile(), 3, 1) is None


def test_the_model_prices_the_curve_where_it_is_fitted(monkeypatch):
    prof = Profile.synthetic(backend="cpu", cores=2)
    prof.data["contention"] = {"entries": [
        {"source": "runner", "model": "tiny", "n_subbatch": 8, "ranks": r, "workers": 1, "rel": 1.0 + 0.4 * (r - 1),
         "host": 1.0, "ratio": 1.0 + 0.4 * (r - 1), "t": 1e-3} for r in (1, 2, 3)]}
    line = model.predict("mnist", 3, 1, 8, prof, ranks_per_host=3)
    c, a, t0 = 2e-3, 0.5, 1e-3
    monkeypatch.setattr(slice_wait, "slice_curve", lambda p, R, n: (c, a, t0) if R > p.cores else None)
    got = model.predict("mnist", 3, 1, 8, prof, ranks_per_host=3)
    costs = model.step_costs("mnist", 3, 1, 8, prof, ranks_per_host=3, slowdown=got.slowdown)
    assert costs["_slice_beta"][0] == a and costs["_slice_t0"][0] == t0
    # c is paid in the collective; the growing part, about a t0 at a step of many t0, with the barrier.
    assert got.updater["Allreduce"] - line.updater["Allreduce"] == pytest.approx(c + a * t0, rel=0.35)
    # An infinite t0 is the line c + beta T_GPU the profile priced before.
    two = model._predict("mnist", 3, 1, 8, prof, ranks_per_host=3, slowdown=1.0, slice_wait=(c, a))
    three = model._predict("mnist", 3, 1, 8, prof, ranks_per_host=3, slowdown=1.0, slice_wait=(c, a, math.inf))
    assert three.t_update == two.t_update and three.n_minibatch_avg == two.n_minibatch_avg


def test_a_long_step_run_gives_its_wait_beyond_the_model_at_its_own_step():
    """A long-step entry timed WaitGradient + Allreduce; its point is that
    beyond the model without a slice wait at the T_GPU it measured, composed
    with that model's barrier (as the runner entries' slice_wait)."""
    prof = Profile.synthetic(backend="cpu", cores=2)
    prof.data["contention"] = {"entries": []}
    slow, extra = 1.7, 4e-3
    q = model._predict("mnist", 3, 2, 8, prof, ranks_per_host=3, impl=model.RUNNER_SWEEP_IMPL, slowdown=slow,
                       slice_wait=(0.0, 0.0), wake=0.0)
    cyc = {"T_GPU": q.t_gpu, "WaitGradient": q.updater["WaitGradient"],
           "Allreduce": q.updater["Allreduce"] + extra}
    prof.data["contention"]["entries"] = [
        {"source": LONG_SOURCE, "model": "mnist", "n_subbatch": 8, "ranks": 3, "workers": 2, "rel": slow,
         "cycle": dict(cyc)} for _ in range(3)] + [
        {"source": LONG_SOURCE, "model": "mnist", "n_subbatch": 8, "ranks": 3, "workers": 1, "rel": slow,
         "cycle": dict(cyc)}]
    (net, t, w), = slice_wait._long_points(prof, 3, 2)
    assert net == "mnist" and t == q.t_gpu
    assert w == pytest.approx(slice_from_excess(q.t_barrier, extra), rel=1e-6)
    assert w >= extra
