"""The discrete-event simulator against the closed form where its assumptions hold."""
import pytest

from engine.perf import model
from engine.perf.profile import Profile
from engine.perf.simulate import compare, format_compare, simulate

PROF = Profile.synthetic()
SEED = model.SEED_IMPL
STEPS = [k for k in model.step_costs("tiny", 1, 1, 1, PROF) if not k.startswith("_")]


def _random_phase_only(cv_compute=0.3):
    """Deterministic steps except the worker's compute: phases randomise, nothing else is noisy."""
    cv = dict.fromkeys(STEPS, 0.0)
    cv["compute"] = cv_compute
    return cv


@pytest.mark.parametrize("impl", [SEED, model.ENGINE_IMPL], ids=["seed", "engine"])
@pytest.mark.parametrize("cfg", [("cifar", 1, 1, 8), ("cifar", 1, 4, 2), ("tiny", 1, 2, 16)])
def test_single_node_agrees_with_closed_form(cfg, impl):
    pred = model.predict(*cfg, PROF, impl=impl)
    sim = simulate(*cfg, PROF, cv=_random_phase_only(), n_updates=600, min_worker_steps=1500, seed=2,
                   impl=impl)
    # The seed's free-running updater is exact here; the waiting updater's
    # mean-field wait is an approximation (a few %).
    tol = 0.02 if impl is SEED else 0.05
    assert sim.t_gpu == pytest.approx(pred.t_gpu, rel=0.02)
    assert sim.t_update == pytest.approx(pred.t_update, rel=tol)
    assert sim.n_minibatch_avg == pytest.approx(pred.n_minibatch_avg, rel=tol + 0.02)
    assert sim.t_epoch == pytest.approx(pred.t_epoch, rel=0.03)
    assert sim.p_fetch == pytest.approx(pred.p_fetch, abs=0.03)
    assert sim.staleness == pytest.approx(pred.staleness, rel=0.06)
    assert sim.t_barrier == 0.0


@pytest.mark.parametrize("cfg", [("cifar", 8, 4, 4), ("cifar", 16, 2, 8)])
def test_many_nodes_far_from_the_kink(cfg):
    # The seed's free-running updater: the binomial barrier's own setting.
    pred = model.predict(*cfg, PROF, impl=SEED)
    assert pred.t_gpu > 2 * pred.t_update      # p = T_Update/T_GPU well inside (0, 1)
    sim = simulate(*cfg, PROF, cv=_random_phase_only(), n_updates=400, min_worker_steps=2000, seed=3,
                   impl=SEED)
    assert sim.t_epoch == pytest.approx(pred.t_epoch, rel=0.02)
    assert sim.t_update == pytest.approx(pred.t_update, rel=0.05)
    assert sim.n_minibatch_avg == pytest.approx(pred.n_minibatch_avg, rel=0.05)
    assert sim.p_nonempty == pytest.approx(pred.p_nonempty, rel=0.05)
    # The binomial barrier is the right size (it is a small term; the simulated
    # one also carries the cycle-length variation the closed form ignores).
    assert 0.5 * pred.t_barrier < sim.t_barrier < 1.6 * pred.t_barrier


@pytest.mark.parametrize("cfg", [("cifar", 4, 2, 8), ("tiny", 4, 2, 16), ("cifar", 16, 4, 2)])
def test_waiting_updater_across_nodes(cfg):
    # engine.parallel.asgd: the updater waits for a local gradient; the
    # mean-field wait keeps T_Update and N_Minibatch_avg within 10 %.
    pred = model.predict(*cfg, PROF)
    sim = simulate(*cfg, PROF, cv=0.2, n_updates=400, min_worker_steps=1000, seed=4)
    assert sim.t_update == pytest.approx(pred.t_update, rel=0.10)
    assert sim.n_minibatch_avg == pytest.approx(pred.n_minibatch_avg, rel=0.10)
    assert sim.t_epoch == pytest.approx(pred.t_epoch, rel=0.02)
    assert sim.staleness == pytest.approx(pred.staleness, rel=0.10)


def test_deterministic_run_counts_exactly():
    # One worker slower than the updater by a fixed ratio, no noise at all:
    # every iteration fetches, every gradient is applied, and staleness takes
    # the two integers around T_GPU/T_Update + 1 (the phases beat).
    sim = simulate("cifar", 1, 1, 8, PROF, cv=0.0, n_updates=4000, impl=SEED)
    pred = model.predict("cifar", 1, 1, 8, PROF, impl=SEED)
    assert sim.p_fetch == 1.0
    seen = [s for s, h in enumerate(sim.staleness_hist) if h]
    assert len(seen) <= 2 and max(seen) - min(seen) <= 1
    assert min(seen) <= pred.staleness <= max(seen) + 1
    samples_per_update = sim.n_minibatch_avg
    assert samples_per_update * sim.t_gpu / sim.t_update == pytest.approx(8, rel=0.02)


def test_near_the_kink_the_simulator_reports_the_broken_assumption():
    # T_GPU ~ T_Update across 64 nodes: min(T_Update/T_GPU, 1) = 1 says every
    # buffer is full at every update, but with spread some are empty.
    pred = model.predict("cifar", 64, 4, 1, PROF, impl=SEED)
    sim = simulate("cifar", 64, 4, 1, PROF, cv=0.4, n_updates=120, seed=5, impl=SEED)
    assert pred.p_nonempty == 1.0 and sim.p_nonempty < 0.95
    text = format_compare(compare(pred, sim))
    assert "Binomial" in text


def test_simulation_is_reproducible():
    a = simulate("tiny", 2, 2, 4, PROF, cv=0.2, n_updates=50, seed=7)
    b = simulate("tiny", 2, 2, 4, PROF, cv=0.2, n_updates=50, seed=7)
    assert a.as_dict(wall=False) == b.as_dict(wall=False)
