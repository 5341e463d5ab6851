"""The per-step costs that grow with the parameter vector, priced by the
vector's age (engine.perf.vector_age): each fit recovers known coefficients
from synthetic records whose vectors had known ages, a fit that ignores the
age misses them, and the model prices a worker alone on its host at the age
of its own cycle, one beside other workers cold."""
import math

import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import fit, model
from engine.perf.fit_steps import runner_compute_excess, runner_step_excess
from engine.perf.profile import Profile
from engine.perf.vector_age import fit_per_step, vector_share, vector_tau, worker_cycle

L2 = 1 << 20
TAU = 0.013


def _share(n, age, tau=TAU, l2=L2):
    """float64 reference: bytes inside the L2 in full, beyond it at 1 - exp(-age / tau)."""
    b = 4.0 * n
    inside = min(b, l2)
    return (inside + (b - inside) * (1.0 - math.exp(-age / tau))) / b


def test_vector_share_prices_only_the_bytes_beyond_the_l2_by_age():
    for n, age in ((1000, 0.001), (200_000, 0.004), (2_000_000, 0.002), (3_000_000, 0.040)):
        assert vector_share(n, L2, age, TAU) == pytest.approx(_share(n, age), rel=1e-12)
    assert vector_share(200_000, L2, 0.001, TAU) == 1.0           # 0.8 MB: inside the L2
    assert vector_share(2_000_000, L2, 0.0, TAU) == pytest.approx(L2 / 8e6)
    assert vector_share(2_000_000, L2, 10.0, TAU) == pytest.approx(1.0)
    # No age, no tau, no L2 size: cold, as before session 15 (no L2: the whole vector decays).
    assert vector_share(2_000_000, L2, None, TAU) == 1.0 and vector_share(2_000_000, L2, 0.002, None) == 1.0
    assert vector_share(2_000_000, None, 0.002, TAU) == pytest.approx(1.0 - math.exp(-0.002 / TAU))
    # The layer terms' refill taus (forward, backward) give the vector's.
    assert vector_tau({"layer_terms": {"fc_fwd": {"tau": 0.012}, "fc_bwd": {"tau": 0.014},
                                       "conv_fwd": {"tau": 0.012}}}) == pytest.approx(0.013)
    assert vector_tau({"layer_terms": {"fc_fwd": {"f": 1.0}}}) is None


def test_per_step_fit_recovers_c_and_d_at_each_steps_age():
    """Steps run back to back (age = the step) with known c, d: the fit
    with the age recovers them; the cold fit (no tau) puts a big vector's
    short step off by far."""
    c, d = 20e-6, 4e-10
    rng = np.random.default_rng(3)
    n_par = np.array([580, 60_000, 200_000, 1_500_000, 2_000_000, 3_200_000, 3_200_000], float)
    kern = rng.uniform(0.5e-3, 40e-3, len(n_par))
    kern[3], kern[4] = 2e-3, 3e-3                               # big vectors, short steps: warm
    t = kern.copy()
    for _ in range(200):                                         # t = kern + c + d N share(t)
        t = kern + c + d * n_par * np.array([_share(n, a) for n, a in zip(n_par, t)])
    got = fit_per_step(t, kern, n_par, L2, TAU)
    assert got == pytest.approx((c, d), rel=1e-6)
    c0, d0 = fit_per_step(t, kern, n_par, L2, None)              # every step cold: not recovered
    assert abs(c0 / c - 1) > 0.05 or abs(d0 / d - 1) > 0.05


def test_fit_overhead_stores_the_tau_and_prices_the_records_at_their_age():
    prof = Profile.synthetic(backend="cpu").data
    prof["cache"] = {"l2_bytes": L2}
    p = Profile(prof)
    c, d = 30e-6, 5e-10
    prof["layer_terms"] = {"fc_fwd": {"f": 1.0, "b": 0.0, "tau": TAU}}   # only its tau matters here
    steps = []
    for net in ("tiny", "mnist", "cifar"):
        for i, n in enumerate((1, 4, 16)):
            sp = spec_mod.get_spec(net)
            kern = sum(r[4] for r in model.compute_gradient_terms(sp, n, p))
            N = spec_mod.n_params(sp)
            t = kern
            for _ in range(200):
                t = kern + c + d * N * _share(N, t)
            steps.append({"kind": "net_step", "model": net, "n_subbatch": n, "t": t, "holdout": i == 1})
    ov = fit.fit_overhead(prof, [s for s in steps if not s["holdout"]], [s for s in steps if s["holdout"]])
    assert ov["vector_tau"] == pytest.approx(TAU)
    assert ov["per_step"] == pytest.approx(c, rel=1e-5) and ov["per_step_param"] == pytest.approx(d, rel=1e-5)
    assert ov["error"]["holdout"]["max"] < 1e-6
    priced = Profile(dict(prof, overhead=ov))
    assert priced.per_step(3_000_000, 0.005) == pytest.approx(c + d * 3e6 * _share(3e6, 0.005))
    assert priced.per_step(3_000_000) == pytest.approx(c + d * 3e6)          # no age: cold


def test_profiles_without_a_vector_tau_price_every_age_cold():
    p = Profile.synthetic(backend="cpu")
    p.data["cache"] = {"l2_bytes": L2}
    p.data["overhead"] = {"per_step": 1e-5, "per_step_param": 4e-10,
                          "runner_compute": {"c": 2e-4, "d": 2e-10, "l2_bytes": L2},
                          "runner_steps": {"FetchWeights": {"c": 1e-5, "r": 0.7}}}
    for age in (None, 0.001, 0.1):
        assert p.per_step(2_000_000, age) == pytest.approx(1e-5 + 4e-10 * 2e6)
        assert p.runner_compute(2_000_000, age) == pytest.approx(2e-4 + 2e-10 * (8e6 - L2))
        assert p.runner_step_terms("FetchWeights", age, 2_000_000) == pytest.approx((1e-5, 0.7))


BIGVEC = spec_mod.NetSpec("bigvec", 32, 1, 3, ((12, 2),), (640, 10))      # 1.97 M parameters, 7.9 MB


def _runner_entries(c, d, r, l2=L2):
    """1 x 1 runner entries of four nets with known runner costs at the
    age of their T_GPU: ComputeGradient excess ``c + d cold share``,
    FetchWeights ``2 us + kern (1 + r vector_share)``; two big vectors, one
    at a long cycle (cifar) and one at a short one."""
    out = []
    for net, n, t_gpu in (("tiny", 8, 0.0006), ("mnist", 4, 0.002), ("cifar", 4, 0.045), (BIGVEC, 4, 0.004)):
        sp = spec_mod.get_spec(net)
        N = spec_mod.n_params(sp)
        exc = c + d * max(4 * N - l2, 0) * (1.0 - math.exp(-t_gpu / TAU))
        kern = 1e-9 * N + 1e-6
        out.append({"kind": "contention", "source": "runner", "model": net, "n_subbatch": n, "ranks": 1,
                    "workers": 1, "n_param": N, "solo_wall": 0.8 * t_gpu, "excess_solo": exc,
                    "cycle": {"T_GPU": t_gpu}, "host": 1.0, "rel": 1.0,
                    "worker": {"FetchWeights": kern * (1 + r * _share(N, t_gpu, l2=l2)) + 2e-6},
                    "worker_model": {"FetchWeights": kern}, "worker_slowdown": 1.0})
    return out


def test_runner_fits_recover_their_coefficients_at_the_runs_vector_age():
    c, d, r = 180e-6, 2e-10, 0.7
    for tau, exact in ((TAU, True), (None, False)):       # without the age every run is cold
        prof = Profile.synthetic(backend="cpu").data
        prof["cache"] = {"l2_bytes": L2}
        prof["overhead"] = {"vector_tau": tau} if tau else {}
        es = _runner_entries(c, d, r)
        prof["contention"] = {"entries": es}
        runner_compute_excess(prof, {e["model"]: [e] for e in es}, Profile(prof))
        got = prof["overhead"]["runner_compute"]
        exc = runner_step_excess(es)["FetchWeights"]
        if exact:
            assert got["c"] == pytest.approx(c, rel=1e-6) and got["d"] == pytest.approx(d, rel=1e-6)
            assert exc["c"] == pytest.approx(2e-6, rel=1e-5) and exc["r"] == pytest.approx(r, rel=1e-6)
            # priced at an age: the share of the bytes beyond the L2
            fitted = Profile(prof)
            assert fitted.runner_compute(2_000_000, 0.003) == pytest.approx(
                c + d * (8e6 - L2) * (1 - math.exp(-0.003 / TAU)))
        else:
            assert abs(got["d"] / d - 1) > 0.05 or abs(got["c"] / c - 1) > 0.05
            assert abs(exc["r"] / r - 1) > 0.05


def test_worker_cycle_reaches_the_age_that_is_its_own_sum():
    k = 2e-3

    def at(age):
        s = 1.0 if age is None else 1.0 - math.exp(-age / TAU)
        return {"a": 1e-3, "b": k * s}
    got = worker_cycle(at)
    age = sum(got.values())
    assert got["b"] == pytest.approx(k * (1.0 - math.exp(-age / TAU)), rel=1e-9)
    assert got["b"] < k
    assert worker_cycle(at, alone=False) == at(None)


def test_model_prices_a_lone_worker_at_its_cycle_and_a_shared_one_cold():
    """A big vector's (heldout-bigfc's 7.9 MB) per-step parts at 1 x 1 pay
    the share of its own cycle; with a second worker or rank on the host,
    the cold price, as profiles without a tau price every configuration."""
    net = spec_mod.NetSpec("bigvec", 32, 1, 3, ((12, 2),), (640, 10))
    N = spec_mod.n_params(net)
    prof = Profile.synthetic(backend="cpu")
    prof.data["cache"] = {"l2_bytes": L2}
    ov = {"per_step": 0.0, "per_step_param": 5e-10, "runner_compute": {"c": 1e-4, "d": 2e-10, "l2_bytes": L2},
          "runner_steps": {"FetchWeights": {"c": 0.0, "r": 0.7}, "ComputeUpdateVal": {"c": 0.0, "r": 0.4}}}
    prof.data["overhead"] = dict(ov)
    cold1 = model.step_costs(net, 1, 1, 8, prof)
    prof.data["overhead"] = dict(ov, vector_tau=TAU)
    warm1 = model.step_costs(net, 1, 1, 8, prof)
    steps = ("fetch", "load", "deform", "compute_gradient", "update_val")
    age = sum(warm1[s][0] for s in steps)
    layers = sum(r[4] for r in model.compute_gradient_terms(net, 8, prof))
    want = layers + 5e-10 * N * _share(N, age) + 1e-4 + 2e-10 * (4 * N - L2) * (1 - math.exp(-age / TAU))
    assert warm1["compute_gradient"][0] == pytest.approx(want, rel=1e-7)
    assert cold1["compute_gradient"][0] == pytest.approx(layers + 5e-10 * N + 1e-4 + 2e-10 * (4 * N - L2), rel=1e-9)
    assert warm1["compute_gradient"][0] < cold1["compute_gradient"][0] - 2e-4
    assert warm1["fetch"][0] < cold1["fetch"][0] and warm1["update_val"][0] < cold1["update_val"][0]
    for n_node, n_gpu, rph in ((1, 2, 1), (2, 1, 2)):
        prof.data["overhead"] = dict(ov)
        cold = model.step_costs(net, n_node, n_gpu, 8, prof, ranks_per_host=rph)
        prof.data["overhead"] = dict(ov, vector_tau=TAU)
        got = model.step_costs(net, n_node, n_gpu, 8, prof, ranks_per_host=rph)
        for s in steps:
            assert got[s][0] == pytest.approx(cold[s][0], rel=1e-12)


def _vector_runs(c, d, e, tau=TAU, l2=L2):
    """1 x 1 runner entries of five nets whose vector-sized steps take
    ``c + passes (d N + e (4 N - L2)+ (1 - exp(-age / tau)))`` at the age of
    their T_GPU (float64, written out here): FetchWeights one pass,
    ComputeUpdateVal three (the runner's weight decay)."""
    out = []
    for n_param, t_gpu in ((580, 0.0006), (84_000, 0.004), (207_000, 0.002), (1_970_000, 0.007),
                           (3_250_000, 0.045)):
        unit = d * n_param + e * max(4.0 * n_param - l2, 0.0) * (1.0 - math.exp(-t_gpu / tau))
        out.append({"kind": "contention", "source": "runner", "model": f"net{n_param}", "n_subbatch": 4,
                    "ranks": 1, "workers": 1, "n_param": n_param, "cycle": {"T_GPU": t_gpu},
                    "worker": {"FetchWeights": c + unit, "ComputeUpdateVal": c + 3 * unit},
                    "worker_model": {"FetchWeights": 1e-9 * n_param, "ComputeUpdateVal": 3e-9 * n_param},
                    "worker_slowdown": 1.0})
    return out


def test_vector_steps_fitted_whole_recover_their_coefficients_at_the_runs_age():
    c, d, e = 5e-6, 3e-10, 8e-11
    es = _vector_runs(c, d, e)
    got = runner_step_excess(es, L2, TAU)
    for step in ("FetchWeights", "ComputeUpdateVal"):
        assert got[step]["c"] == pytest.approx(c, rel=1e-6)
        assert got[step]["d"] == pytest.approx(d, rel=1e-6)
        assert got[step]["e"] == pytest.approx(e, rel=1e-6)
        assert got[step]["l2_bytes"] == L2
    # Fitted without the age (every run cold), the big vectors' e misses.
    cold = runner_step_excess(es, L2, None)["FetchWeights"]
    assert abs(cold["e"] / e - 1) > 0.05
    # Without the L2, or with too few nets, the kernels' excess (c, r) as before.
    assert "d" not in runner_step_excess(es, None, TAU)["FetchWeights"]
    assert "d" not in runner_step_excess(es[:2], L2, TAU)["FetchWeights"]


def test_a_vector_step_fitted_whole_is_priced_by_passes_age_and_slowdown():
    c, d, e = 5e-6, 3e-10, 8e-11
    p = Profile.synthetic(backend="cpu")
    p.data["cache"] = {"l2_bytes": L2}
    p.data["overhead"] = {"vector_tau": TAU, "runner_steps": dict(
        runner_step_excess(_vector_runs(c, d, e), L2, TAU), LoadImage={"c": 2e-5, "r": 0.5})}
    n, beyond = 2_000_000, 8e6 - L2
    for passes, age, slow in ((1, 0.003, 1.0), (3, 0.003, 1.0), (3, None, 1.7), (1, 0.05, 2.0)):
        share = 1.0 if age is None else 1.0 - math.exp(-age / TAU)
        want = slow * (c + passes * (d * n + e * beyond * share))
        for step in ("FetchWeights", "ComputeUpdateVal"):
            got = p.runner_step_time(step, kernel=123.0, slow=slow, age=age, n_param=n, passes=passes)
            assert got == pytest.approx(want, rel=1e-6)     # the kernel's price plays no part
    # A step stored as the kernels' excess keeps kernel + slow c + r kernel.
    assert p.runner_step_time("LoadImage", 1e-4, 2.0) == pytest.approx(1e-4 + 2.0 * 2e-5 + 0.5 * 1e-4)
    # The model: a worker beside another (1 x 2) pays the vector cold, times its slowdown.
    sp = spec_mod.NetSpec("vec", 32, 1, 3, ((12, 2),), (1024, 10))     # 12.6 MB
    N = spec_mod.n_params(sp)
    cs = model.step_costs(sp, 1, 2, 4, p, slowdown=1.5, impl=model.RUNNER_SWEEP_IMPL)
    unit = d * N + e * max(4.0 * N - L2, 0.0)
    assert cs["fetch"][0] == pytest.approx(1.5 * (c + unit), rel=1e-6)
    assert cs["update_val"][0] == pytest.approx(1.5 * (c + 3 * unit), rel=1e-6)
    assert model.step_costs(sp, 1, 2, 4, p, slowdown=1.5)["update_val"][0] == \
        pytest.approx(1.5 * (c + unit), rel=1e-6)            # no weight decay: one pass
