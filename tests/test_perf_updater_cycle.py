"""The model on a shared host, the updater's side: the allreduce under load,
probes and runner entries, the updater's excess and memory bandwidth, the
workers' cycle gap and the wait of a deposit that wakes the updater
(engine/perf/step_times.py, engine/perf/profile_sharing.py)."""
import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import model
from engine.perf.profile import Profile

PROF = Profile.synthetic()


def test_allreduce_load_scales_the_fit_on_a_shared_host():
    n_tiny = spec_mod.n_params(spec_mod.get_spec("tiny"))
    base = PROF.allreduce_bw(4, n_tiny)
    entries = [{"model": "tiny", "ranks": 4, "workers": 1, "rel": 2.0, "host": 1.0, "n_subbatch": 8,
                "allreduce": 3 * base, "n_param": n_tiny, "source": "child"}]
    prof = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": entries}))
    assert prof.allreduce_load(4, 1, "tiny") == pytest.approx(3.0)
    assert prof.allreduce_load(2, 1, "tiny") == 1.0           # not measured: the idle fit
    shared = model.step_costs("tiny", 4, 1, 8, prof, ranks_per_host=4)
    alone = model.step_costs("tiny", 4, 1, 8, prof, ranks_per_host=1)
    assert shared["allreduce_bw"][0] == pytest.approx(3 * alone["allreduce_bw"][0])


def test_probe_scales_runner_entries_and_replaces_the_load_of_older_ones():
    new = {"model": "cifar", "ranks": 1, "workers": 1, "rel": 1.0, "host": 1.2, "n_subbatch": 4,
           "source": "runner", "solo_wall": 0.04}
    prof = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": [new]}))
    assert prof.slowdown(1, 1, "cifar") == pytest.approx(1.2)
    prof.host_factor = {"cifar": 1.1}          # the machine runs 10 % slower than at sweep time
    assert prof.slowdown(1, 1, "cifar") == pytest.approx(1.32)
    old = {k: v for k, v in new.items() if k not in ("source", "solo_wall")}
    prof = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": [old]}))
    prof.host_factor = {"cifar": 1.1}
    assert prof.slowdown(1, 1, "cifar") == pytest.approx(1.1)


def test_runner_entries_take_precedence_over_the_synthetic_child():
    child = {"model": "cifar", "ranks": 2, "workers": 1, "rel": 1.5, "host": 1.0, "source": "child"}
    runner = dict(child, rel=1.2, source="runner", solo_wall=0.04)
    prof = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": [child, runner]}))
    assert prof.slowdown(2, 1, "cifar") == pytest.approx(1.2)
    assert prof.contention_entry(2, 1, "cifar")["source"] == "runner"


def test_updater_excess_of_the_sharing_adds_to_each_cycle():
    e = {"model": "tiny", "ranks": 1, "workers": 2, "rel": 2.0, "host": 1.0, "n_subbatch": 8,
         "source": "runner", "solo_wall": 1e-3}
    plain = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": [e]}))
    extra = Profile(dict(PROF.data, backend="cpu", cores=2,
                         contention={"entries": [dict(e, updater_excess=5e-5)]}))
    a = model.step_costs("tiny", 1, 2, 8, plain)
    b = model.step_costs("tiny", 1, 2, 8, extra)
    assert b["updater_loop"][0] == pytest.approx(a["updater_loop"][0] + 5e-5)
    # Another sharing, or a GPU profile, is not charged.
    assert model.step_costs("tiny", 1, 1, 8, extra)["updater_loop"][0] == pytest.approx(
        model.step_costs("tiny", 1, 1, 8, plain)["updater_loop"][0])
    gpu = Profile(dict(extra.data, backend="gpu"))
    assert model.step_costs("tiny", 1, 2, 8, gpu)["updater_loop"][0] == pytest.approx(
        gpu.overhead("updater_loop"))


def test_updater_steps_share_memory_bandwidth_not_the_cores():
    mk = lambda r, w, rel: {"model": "cifar", "ranks": r, "workers": w, "rel": rel, "host": 1.0,
                            "n_subbatch": 4, "source": "runner", "solo_wall": 0.04}
    prof = Profile(dict(PROF.data, backend="cpu", cores=2,
                        contention={"entries": [mk(1, 1, 1.0), mk(2, 1, 1.2), mk(4, 2, 5.0)]}))
    assert prof.updater_slowdown("cifar") == pytest.approx(1.2)
    c = model.step_costs("cifar", 4, 2, 4, prof, ranks_per_host=4)
    assert c["_slowdown"][0] == pytest.approx(5.0) and c["_updater_slowdown"][0] == pytest.approx(1.2)
    n = spec_mod.n_params(spec_mod.get_spec("cifar"))
    assert c["sum_zero"][0] == pytest.approx(1.2 * prof.term("fill", n))
    assert c["fetch"][0] == pytest.approx(5.0 * prof.term("copy", n))      # a worker step


def test_cycle_gap_rates_the_workers_by_their_whole_cycle():
    # Runner entries whose workers' real cycle (W S T_Update / N_Minibatch_avg)
    # exceeds their timed T_GPU by c + beta T_GPU, c = 0.5 ms, beta = 0.05:
    # fitted back from the entries and priced.
    from engine.perf import fit  # noqa: F401  (fit_steps is imported through fit)
    from engine.perf.fit_steps import cycle_gap

    def entry(model, t_gpu, n=8):
        gap = 5e-4 + 0.05 * t_gpu
        return {"model": model, "ranks": 3, "workers": 2, "rel": 2.0, "host": 1.0, "n_subbatch": n,
                "source": "runner", "solo_wall": 1e-3,
                "cycle": {"T_GPU": t_gpu, "T_Update": 1e-3, "N_Minibatch_avg": 3 * 2 * n * 1e-3 / (t_gpu + gap)}}
    es = [entry("tiny", 1e-3), entry("cifar", 80e-3, 4), entry("mnist", 3e-3, 4)]
    assert cycle_gap(es[0]) == pytest.approx(0.55)
    assert cycle_gap(dict(es[0], cycle={"T_GPU": 2e-3})) is None
    for e in es:
        e["cycle_gap"] = cycle_gap(e)
    plain = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": [dict(es[0])]}))
    for e in plain.data["contention"]["entries"]:
        e.pop("cycle_gap")
    gap = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": es}))
    assert gap.cycle_gap(3, 2, "digits") == pytest.approx((5e-4, 0.05), rel=1e-6)
    assert gap.cycle_gap(2, 1, "tiny") == (0.0, 0.0) and plain.cycle_gap(3, 2, "tiny") == (0.0, 0.0)
    # One net only: its fraction.
    one = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": es[:1]}))
    assert one.cycle_gap(3, 2, "digits") == (0.0, pytest.approx(0.55))
    a = model.predict("tiny", 3, 2, 8, plain, n_file=4800, ranks_per_host=3)
    b = model.predict("tiny", 3, 2, 8, gap, n_file=4800, ranks_per_host=3)
    cyc = 5e-4 + 1.05 * b.t_gpu
    assert a.extra["cycle"] == pytest.approx(a.t_gpu) and b.extra["cycle"] == pytest.approx(cyc)
    # T_GPU stays the timed steps; the rate of samples follows the cycle.
    assert b.t_epoch == pytest.approx(4800 * cyc / (3 * 2 * 8), rel=1e-9)
    assert b.n_minibatch_avg == pytest.approx(3 * 2 * 8 * b.t_update / cyc, rel=1e-9)
    assert a.t_epoch == pytest.approx(4800 * a.t_gpu / (3 * 2 * 8), rel=1e-9)
    assert b.n_minibatch_avg < a.n_minibatch_avg
    gpu = Profile(dict(gap.data, backend="gpu"))
    g = model.predict("tiny", 3, 2, 8, gpu, ranks_per_host=3)
    assert g.extra["cycle"] == pytest.approx(g.t_gpu)


def _runner_entries_2x2():
    """Runner contention entries of tiny, digits and mnist at 2 x 2 (their
    worker steps for the test to fill in) and a CPU profile that holds them."""
    es = [{"model": m, "n_subbatch": n, "ranks": 2, "workers": 2, "rel": 2.0, "host": 1.0, "source": "runner",
           "solo_wall": 1e-3, "n_param": spec_mod.n_params(spec_mod.get_spec(m))}
          for m, n in (("tiny", 8), ("digits", 16), ("mnist", 4))]
    return es, Profile(dict(PROF.data, backend="cpu", cores=2, cache={"l2_bytes": 2 << 20},
                            contention={"entries": es}))


def test_a_deposit_that_wakes_the_updater_costs_the_worker_the_measured_wait():
    """Runner entries at 2 x 2 whose FetchWeights ran W per waking deposit
    beyond the model's price: ``wake_wait`` gives a swept net its own W and
    another net the median over the small-vector nets; the prediction's
    FetchWeights grows by W times its share of deposits that wake the updater."""
    from engine.perf.wake_wait import swept_wake_waits, wake_wait
    W = {"tiny": 2e-3, "digits": 3e-3, "mnist": 5e-3}
    impl = model.RUNNER_SWEEP_IMPL
    es, prof = _runner_entries_2x2()
    shares = {}
    for e in es:
        ref = model._predict(e["model"], 2, 2, e["n_subbatch"], prof, slowdown=prof.slowdown(2, 2, e["model"]),
                             wake=0.0, ranks_per_host=2, impl=impl)
        shares[e["model"]] = ref.extra["wake_share"]
        e["worker"] = {"FetchWeights": ref.worker["FetchWeights"] + W[e["model"]] * ref.extra["wake_share"],
                       "LoadImage": ref.worker["LoadImage"]}
    used = {m for m, s in shares.items() if s >= 0.1}
    assert len(used) >= 2, shares
    got = swept_wake_waits(prof, 2, 2, {"impl": impl})
    assert set(got) == used
    for m, (w, big) in got.items():
        assert w == pytest.approx(W[m], rel=1e-6) and not big
    med = float(np.median([W[m] for m in used]))
    assert wake_wait(prof, 2, 2, "cifar", {"impl": impl}) == pytest.approx(med, rel=1e-6)
    p = model._predict("cifar", 2, 2, 4, prof, slowdown=2.0, ranks_per_host=2, impl=impl)
    c = model.step_costs("cifar", 2, 2, 4, prof, 2, impl, 2.0)
    assert p.extra["wake_share"] > 0.1
    assert p.worker["FetchWeights"] - p.p_fetch * c["fetch"][0] == pytest.approx(med * p.extra["wake_share"],
                                                                                 rel=1e-3)
    assert p.worker["LoadImage"] == pytest.approx(c["load"][0], rel=1e-9)    # the sweep's wait: all in the fetch
    # One worker on one rank, or a GPU profile: nothing to wake on a shared core.
    assert wake_wait(prof, 1, 1, "cifar", {"impl": impl}) == 0.0
    assert wake_wait(Profile(dict(prof.data, backend="gpu")), 2, 2, "cifar", {"impl": impl}) == 0.0


def test_the_wake_wait_splits_between_fetch_and_load_as_the_sweep_did():
    """Runner entries at 2 x 2 whose wait per waking deposit W fell a known
    share q in LoadImage, the rest in FetchWeights: ``wake_load_share``
    gives a swept net its own q, another net the median over the nets whose
    vectors fit the L2, and the prediction splits its wait so."""
    from engine.perf.step_times import wake_load_share
    W, q = {"tiny": 2e-3, "digits": 3e-3, "mnist": 5e-3}, {"tiny": 0.2, "digits": 0.7, "mnist": 0.5}
    impl = model.RUNNER_SWEEP_IMPL
    es, prof = _runner_entries_2x2()
    used = set()
    for e in es:
        ref = model._predict(e["model"], 2, 2, e["n_subbatch"], prof, slowdown=prof.slowdown(2, 2, e["model"]),
                             wake=0.0, ranks_per_host=2, impl=impl)
        w = W[e["model"]] * ref.extra["wake_share"]
        e["worker"] = {"FetchWeights": ref.worker["FetchWeights"] + (1 - q[e["model"]]) * w,
                       "LoadImage": ref.worker["LoadImage"] + q[e["model"]] * w}
        if ref.extra["wake_share"] >= 0.1:
            used.add(e["model"])
    assert len(used) >= 2
    for m in used:
        assert wake_load_share(prof, 2, 2, m, {"impl": impl}) == pytest.approx(q[m], rel=1e-6)
    med = float(np.median([q[m] for m in used]))
    assert wake_load_share(prof, 2, 2, "cifar", {"impl": impl}) == pytest.approx(med, rel=1e-6)
    assert wake_load_share(prof, 2, 1, "cifar", {"impl": impl}) == 0.0           # not swept: all in the fetch
    p = model._predict("cifar", 2, 2, 4, prof, slowdown=2.0, ranks_per_host=2, impl=impl)
    c = model.step_costs("cifar", 2, 2, 4, prof, 2, impl, 2.0)
    wait = c["_wake_wait"][0] * p.extra["wake_share"]
    assert wait > 0
    assert p.worker["LoadImage"] - c["load"][0] == pytest.approx(med * wait, rel=1e-3)
    assert p.worker["FetchWeights"] - p.p_fetch * c["fetch"][0] == pytest.approx((1 - med) * wait, rel=1e-3)


def test_where_no_swept_deposit_wakes_its_updater_the_wait_is_priced_per_cycle(monkeypatch):
    """Runner entries at 3 x 2 whose FetchWeights + LoadImage ran X a cycle
    beyond the model's price. Where their runs woke the updater often
    enough, the per-deposit reading (``wake_wait``) prices it and nothing is
    added per cycle; where none did (no run reaches ``MIN_WAKE_SHARE``, here
    raised above 1), ``wake_cycle_wait`` gives a swept net its own X, another
    small-vector net the median, and the prediction's LoadImage grows by it."""
    from engine.perf import wake_wait as ww
    X = {"tiny": 1e-4, "digits": 4e-4, "mnist": 3e-4}
    impl, kw = model.RUNNER_SWEEP_IMPL, {"impl": model.RUNNER_SWEEP_IMPL}
    es = [{"model": m, "n_subbatch": n, "ranks": 3, "workers": 2, "rel": 3.0, "host": 1.0, "source": "runner",
           "solo_wall": 1e-3, "n_param": spec_mod.n_params(spec_mod.get_spec(m))}
          for m, n in (("tiny", 8), ("digits", 16), ("mnist", 4))]
    data = dict(PROF.data, backend="cpu", cores=2, cache={"l2_bytes": 2 << 20}, contention={"entries": es})
    prof = Profile(data)
    for e in es:
        ref = model._predict(e["model"], 3, 2, e["n_subbatch"], prof, slowdown=prof.slowdown(3, 2, e["model"]),
                             wake=0.0, ranks_per_host=3, impl=impl)
        e["worker"] = {"FetchWeights": ref.worker["FetchWeights"], "LoadImage": ref.worker["LoadImage"] + X[e["model"]]}
    assert ww.swept_wake_waits(prof, 3, 2, kw) and ww.wake_cycle_wait(prof, 3, 2, "cifar", kw) == 0.0
    monkeypatch.setattr(ww, "MIN_WAKE_SHARE", 1.01)
    prof = Profile(data)
    assert ww.swept_wake_waits(prof, 3, 2, kw) == {} and ww.wake_wait(prof, 3, 2, "lenet", kw) == 0.0
    assert ww.wake_cycle_wait(prof, 3, 2, "digits", kw) == pytest.approx(X["digits"], rel=1e-6)
    med = float(np.median(list(X.values())))
    assert ww.wake_cycle_wait(prof, 3, 2, "cifar", kw, 3_000_000) == pytest.approx(med, rel=1e-6)
    a = model.step_costs("cifar", 3, 2, 4, prof, 3, impl, 2.0)
    b = model.step_costs("cifar", 3, 2, 4, prof, 3, impl, 2.0, wake=0.0)
    assert a["load"][0] - b["load"][0] == pytest.approx(med, rel=1e-6)
    assert ww.wake_cycle_wait(prof, 1, 1, "cifar", kw) == 0.0
    assert ww.wake_cycle_wait(Profile(dict(data, backend="gpu")), 3, 2, "cifar", kw) == 0.0


def test_a_net_not_swept_waits_as_the_swept_nets_of_its_size_whose_vectors_fit_the_llc(monkeypatch):
    """Waits per waking deposit W of swept nets: ``wake_wait`` gives a swept
    net its own; another net, with the profile's LLC size, W read in log
    N_Param between the swept nets whose vectors fit the LLC, clamped at
    their ends (cifar's 13 MB, beyond an 8 MB LLC, is left out); without an
    LLC size or the net's size, the median over the L2-fitting nets as before."""
    from engine.perf import wake_wait as ww
    W = {"tiny": (2e-4, False), "digits": (4e-3, True), "mnist": (3e-3, True), "cifar": (8e-3, True)}
    sizes = {"tiny": 580, "digits": 150_000, "mnist": 200_000, "cifar": 3_200_000}
    es = [{"model": m, "ranks": 2, "workers": 2, "source": "runner", "n_param": n} for m, n in sizes.items()]
    monkeypatch.setattr(ww, "swept_wake_waits", lambda *a, **k: W)
    cache = {"l2_bytes": 512 << 10, "llc_bytes": 8 << 20}
    prof = Profile(dict(PROF.data, backend="cpu", cores=2, cache=cache, contention={"entries": es}))
    kw = {"impl": model.RUNNER_SWEEP_IMPL}
    assert ww.wake_wait(prof, 2, 2, "mnist", kw, 200_000) == 3e-3                  # its own
    assert ww.wake_wait(prof, 2, 2, "cifar", kw, 3_200_000) == 8e-3
    # halfway in log between tiny and digits
    mid = float(np.sqrt(580 * 150_000))
    assert ww.wake_wait(prof, 2, 2, "other", kw, mid) == pytest.approx(0.5 * (2e-4 + 4e-3))
    # beyond mnist: mnist's, not toward cifar's
    assert ww.wake_wait(prof, 2, 2, "other", kw, 400_000) == pytest.approx(3e-3)
    assert ww.wake_wait(prof, 2, 2, "other", kw, 10) == pytest.approx(2e-4)
    # no LLC size, or no size of the net: the L2-fitting nets' median (tiny's)
    old = Profile(dict(prof.data, cache={"l2_bytes": 512 << 10}))
    assert ww.wake_wait(old, 2, 2, "other", kw, 400_000) == pytest.approx(2e-4)
    assert ww.wake_wait(prof, 2, 2, "other", kw) == pytest.approx(2e-4)
