"""The model on a shared host, the workers' side: contention slowdowns read
from the sweeps (the core share, the excess beyond it apart for small and
large vectors, the long compute-bound anchor) and the cold-vector terms
(engine/perf/profile_sharing.py)."""
import pytest

from engine import spec as spec_mod
from engine.perf import model
from engine.perf.profile import Profile

PROF = Profile.synthetic()


def test_contention_slows_compute_on_cpu_profiles():
    entries = [{"model": "cifar", "ranks": 1, "workers": 1, "ratio": 0.6},
               {"model": "cifar", "ranks": 2, "workers": 1, "ratio": 1.1},
               {"model": "tiny", "ranks": 2, "workers": 1, "ratio": 1.5}]
    prof = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": entries}))
    assert prof.slowdown(2, 1, "cifar") == pytest.approx(1.1)
    assert prof.slowdown(2, 1, "digits") == pytest.approx(1.3)       # mean over nets
    assert prof.slowdown(4, 1, "cifar") == pytest.approx(2.2)        # scaled by threads
    one = model.predict("cifar", 1, 1, 8, prof)
    two = model.predict("cifar", 2, 1, 8, prof, ranks_per_host=2)
    assert two.worker["ComputeGradient"] == pytest.approx(1.1 / 0.6 * one.worker["ComputeGradient"])


def test_cold_vector_terms_price_the_flat_buffer_steps():
    # A profile with cold sweeps of the vector ops uses them for the steps
    # that touch N_Param (their operands were evicted by ComputeGradient);
    # the warm ones stay for everything else.
    terms = dict(PROF.terms)
    for k in ("copy", "add", "scale", "sub", "fill"):
        t = terms[k]
        terms[k + "_cold"] = dict(t, a=7 * t["a"], b=7 * t["b"])
    cold = Profile(dict(PROF.data, terms=terms))
    n = spec_mod.n_params(spec_mod.get_spec("cifar"))
    warm_p = model.predict("cifar", 2, 2, 4, PROF)
    cold_p = model.predict("cifar", 2, 2, 4, cold)
    assert cold_p.worker["FetchWeights"] == pytest.approx(cold_p.p_fetch * cold.term("copy_cold", n))
    assert cold_p.worker["FetchWeights"] / cold_p.p_fetch == pytest.approx(
        7 * warm_p.worker["FetchWeights"] / warm_p.p_fetch)
    assert cold_p.worker["ComputeUpdateVal"] > warm_p.worker["ComputeUpdateVal"]
    assert cold_p.updater["AddMomentum"] == pytest.approx(7 * warm_p.updater["AddMomentum"])
    assert cold_p.worker["ComputeGradient"] == pytest.approx(warm_p.worker["ComputeGradient"])


def test_core_share_by_hand():
    # 4 workers on 2 cores, updaters idle: each gets half a core.
    assert model.core_share(2, 2, 2, 0.0) == pytest.approx(2.0)
    # Two updaters keep 0.25 core each busy: 4 workers split 1.5 cores.
    assert model.core_share(2, 2, 2, 0.25) == pytest.approx(4 / 1.5)
    # Fewer workers than free cores: no slowdown.
    assert model.core_share(1, 1, 2, 0.3) == 1.0


def test_contention_factor_is_rescaled_by_the_updater_duty():
    # The sweep measured x2.5 for 2 ranks x 2 workers of cifar at N_Subbatch 4.
    entries = [{"model": "cifar", "ranks": 1, "workers": 1, "rel": 1.0, "host": 1.0, "n_subbatch": 4},
               {"model": "cifar", "ranks": 2, "workers": 2, "rel": 2.5, "host": 1.0, "n_subbatch": 4}]
    prof = Profile(dict(PROF.data, backend="cpu", cores=2, contention={"entries": entries}))
    at_sweep = model.predict("cifar", 2, 2, 4, prof, ranks_per_host=2)
    assert at_sweep.slowdown == pytest.approx(2.5, rel=1e-3)
    # Smaller steps: the updaters cycle more often and take more of the
    # cores; larger ones leave the workers more. Each is a fixed point of
    # the duty it implies.
    small = model.predict("cifar", 2, 2, 1, prof, ranks_per_host=2)
    large = model.predict("cifar", 2, 2, 64, prof, ranks_per_host=2)
    assert small.slowdown > 2.5 > large.slowdown
    for p in (small, large):
        d_ref = p.extra["core_share"]["sweep_duty"]
        expect = 2.5 * model.core_share(2, 2, 2, model.updater_duty(p, prof)) / model.core_share(2, 2, 2, d_ref)
        assert p.slowdown == pytest.approx(expect, rel=1e-3)
    # A GPU profile has no host sharing at all.
    gpu = model.predict("cifar", 2, 2, 1, Profile(dict(prof.data, backend="gpu")), ranks_per_host=2)
    assert gpu.slowdown == 1.0


def test_a_net_not_swept_takes_the_swept_slowdowns_without_their_updaters_share():
    """Truth: every net's workers slow by S0 (the GIL and memory) times the
    core share its own updaters leave them. cifar's 3.2 M-parameter updaters
    and tiny's fast-cycling ones take different shares of the 2 cores; the
    entries record what that truth gives at their runs. Another net
    (digits, not swept) then slows by S0 times its own share, not by the
    swept nets' measured factors (phi or their mean)."""
    S0 = 1.3
    base = Profile(dict(PROF.data, backend="cpu", cores=2))
    phis = {"tiny": 0.05, "cifar": 0.001}
    entries = [{"model": m, "ranks": 1, "workers": 1, "rel": 1.0, "host": 1.0, "n_subbatch": n, "phi": phis[m]}
               for m, n in (("tiny", 8), ("cifar", 4))]
    for m, n in (("tiny", 8), ("cifar", 4)):
        # the slowdown that is its own fixed point at the sweep's run
        s = S0 * 2
        for _ in range(30):
            ref = model._predict(m, 2, 2, n, base, ranks_per_host=2, slowdown=s)
            s = 0.5 * (s + S0 * model.core_share(2, 2, 2, model.updater_duty(ref, base)))
        entries.append({"model": m, "ranks": 2, "workers": 2, "rel": s, "host": 1.0, "n_subbatch": n,
                        "phi": phis[m]})
    prof = Profile(dict(base.data, contention={"entries": entries}))
    rel = {e["model"]: e["rel"] for e in entries if e["ranks"] == 2}
    assert abs(rel["cifar"] / rel["tiny"] - 1) > 0.03      # their updaters' shares differ
    got = model.predict("digits", 2, 2, 16, prof, ranks_per_host=2)
    want = S0 * model.core_share(2, 2, 2, model.updater_duty(got, prof))
    assert got.slowdown == pytest.approx(want, rel=2e-3)
    # the swept nets keep their own measured factor at their own runs
    assert model.predict("cifar", 2, 2, 4, prof, ranks_per_host=2).slowdown == pytest.approx(rel["cifar"], rel=2e-3)


def test_a_net_not_swept_reads_the_excess_apart_for_small_and_large_vectors():
    """The swept nets' slowdowns beyond their core shares (``shares``): per-
    call Python (phi) for the nets whose vectors fit the L2, read from
    (phi 0, x1); cifar's vectors overflow it, its excess is its own. A net
    of compute-bound layers and few parameters is read on the small nets'
    line, not at cifar's phi; one between the groups in log N_Param."""
    base = Profile(dict(PROF.data, backend="cpu", cores=2, cache={"l2_bytes": 2 << 20}))
    shares = {"tiny": 1.5, "mnist": 1.5, "cifar": 1.6}
    truth = {"tiny": (0.04, 580, 1.2), "mnist": (0.01, 200_000, 1.1), "cifar": (0.0025, 3_200_000, 1.4)}
    entries = [{"model": m, "ranks": 3, "workers": 1, "ratio": x * shares[m], "phi": phi, "n_param": n,
                "n_subbatch": 4} for m, (phi, n, x) in truth.items()]
    prof = Profile(dict(base.data, contention={"entries": entries}))
    read = lambda phi, n: prof.slowdown(3, 1, "other", phi, shares=shares, n_param=n)   # noqa: E731
    # sqrt(phi) 0.05: halfway from (0, 1) to mnist's (0.1, 1.1)
    assert read(0.0025, 50_000) == pytest.approx(1.05)
    assert read(0.04, 580) == pytest.approx(1.2)
    assert read(0.0025, 3_200_000) == pytest.approx(1.4)       # cifar's, at and beyond its size
    assert read(0.0025, 10_000_000) == pytest.approx(1.4)
    # 800 k parameters: halfway in log between mnist's 200 k and cifar's 3.2 M
    assert read(0.0025, 800_000) == pytest.approx(0.5 * 1.05 + 0.5 * 1.4)
    # phi alone (the reading before) put cifar's x1.4 on the compute-bound net
    assert read(0.0025, 50_000) < 0.8 * 1.4
    # Within the cores (1 x 2): read in phi, a quarter of the way to mnist's 0.01.
    within = Profile(dict(base.data, contention={"entries": [dict(e, ranks=1, workers=2) for e in entries]}))
    assert within.slowdown(1, 2, "other", 0.0025, shares=shares, n_param=50_000) == pytest.approx(1.025)
    assert within.slowdown(1, 2, "other", 0.04, shares=shares, n_param=580) == pytest.approx(1.2)


LONG_NET = {"name": "long-steps", "x0": 16, "m0": 3, "c": 3, "convs": [[16, 1], [24, 2]], "fcs": [10]}


def _long_entries(base, K, R, W, n=16, spread=(0.9, 1.0, 1.15)):
    """``runner contention long`` entries of LONG_NET at R x W whose truth is
    K times the core share its own updaters leave (the slowdown that is its
    own fixed point at that run), repeated with a spread whose median is it."""
    from engine.perf.sweep_runner import LONG_SOURCE
    s = 2.0 * K
    for _ in range(40):
        ref = model._predict(LONG_NET, R, W, n, base, ranks_per_host=R, impl=model.RUNNER_SWEEP_IMPL, slowdown=s)
        s = 0.5 * (s + K * model.core_share(R, W, base.cores, model.updater_duty(ref, base)))
    return [{"model": LONG_NET["name"], "spec": LONG_NET, "source": LONG_SOURCE, "ranks": R, "workers": W,
             "n_subbatch": n, "rel": s * f, "host": 1.0, "n_param": spec_mod.n_params(spec_mod.get_spec(LONG_NET))}
            for f in spread], s


def test_long_compute_bound_steps_anchor_the_small_nets_reading_beyond_the_cores():
    """Truth: beyond the cores a long compute-bound step slows by K = 1.25
    times its core share (entries of three runs, median at the truth). The
    small nets' reading then ends at (phi 0, K) instead of (0, 1): a net at
    sqrt(phi) 0.05, halfway to mnist's (0.1, x1.1), reads (K + 1.1) / 2.
    The entries price nothing else: not the sharings they were not swept at,
    not a swept net's own reading, not the runner entries' other reads."""
    K = 1.25
    base = Profile(dict(PROF.data, backend="cpu", cores=2, cache={"l2_bytes": 2 << 20}))
    shares = {"tiny": 1.5, "mnist": 1.5, "cifar": 1.6}
    truth = {"tiny": (0.04, 580, 1.2), "mnist": (0.01, 200_000, 1.1), "cifar": (0.0025, 3_200_000, 1.4)}
    swept = [{"model": m, "ranks": r, "workers": w, "ratio": x * shares[m], "phi": phi, "n_param": n,
              "n_subbatch": 4} for m, (phi, n, x) in truth.items() for r, w in ((3, 2), (2, 2))]
    long, s = _long_entries(base, K, 3, 2)
    without = Profile(dict(base.data, contention={"entries": swept}))
    prof = Profile(dict(base.data, contention={"entries": swept + long}))
    phi, got = prof.long_step_anchor(3, 2)
    assert phi == 0.0 and got == pytest.approx(K, rel=1e-3)          # no layer terms: phi 0
    read = lambda p, R, W, phi, n: p.slowdown(R, W, "other", phi, shares=shares, n_param=n)   # noqa: E731
    assert read(prof, 3, 2, 0.0025, 50_000) == pytest.approx(0.5 * (K + 1.1), rel=1e-3)
    assert read(without, 3, 2, 0.0025, 50_000) == pytest.approx(1.05)
    assert read(prof, 3, 2, 0.0, 50_000) == pytest.approx(K, rel=1e-3)
    # the small nets' own points and the large-vector net's reading are as before
    for phi_n in ((0.04, 580), (0.01, 200_000), (0.0025, 3_200_000)):
        assert read(prof, 3, 2, *phi_n) == pytest.approx(read(without, 3, 2, *phi_n))
    # a sharing the long steps were not swept at reads as before
    assert prof.long_step_anchor(2, 2) is None
    assert read(prof, 2, 2, 0.0025, 50_000) == pytest.approx(read(without, 2, 2, 0.0025, 50_000))
    # the entries are no runner entries: the other reads never see them
    assert all(e.get("source") is None for e in prof._contention())
    assert prof.contention_entry(3, 2, "long-steps")["model"] == "tiny"
    one = [model.predict("digits", 1, 2, 16, p, ranks_per_host=1) for p in (prof, without)]
    assert one[0].t_gpu == one[1].t_gpu


def test_one_worker_per_rank_sees_one_publish_and_one_more_unless_its_deposit_starts_the_cycle():
    """With N_GPU = 1 a worker reads right after its own deposit; the
    deposit a cycle starts with sees one publish, the others one more: one
    of T_Update / cycle deposits starts a cycle, so 2 - cycle / T_Update,
    and 1 where the updater keeps up (the random-phase count gave 0.93 for
    tiny here). Two workers per rank keep the count."""
    for R in (1, 3):
        p = model.predict("tiny", R, 1, 1, PROF)
        assert p.staleness == pytest.approx(2.0 - min(p.extra["cycle"] / p.t_update, 1.0), rel=1e-9)
        assert 1.0 <= p.staleness < 2.0
    # An updater slower than its worker (a costly allreduce) sums several
    # deposits a cycle: all but the first wait through one more publish.
    slow = Profile(dict(PROF.data, allreduce=dict(PROF.data["allreduce"], b=1e-7, a_log=1e-7)))
    p = model.predict("cifar", 2, 1, 1, slow)
    assert p.t_update > 4 * p.extra["cycle"]
    assert p.staleness == pytest.approx(2.0 - p.extra["cycle"] / p.t_update, rel=1e-9)
    two = model.predict("tiny", 2, 2, 16, PROF)
    assert two.staleness > 1.0


def test_cold_terms_only_when_a_step_overflows_the_last_level_cache():
    terms = dict(PROF.terms)
    for k in ("copy", "add", "scale", "sub", "fill"):
        terms[k + "_cold"] = dict(terms[k], a=7 * terms[k]["a"], b=7 * terms[k]["b"])
    prof = Profile(dict(PROF.data, terms=terms, cache={"llc_bytes": 32 << 20}))
    tiny, cifar = spec_mod.get_spec("tiny"), spec_mod.get_spec("cifar")
    assert model.step_footprint(tiny, 8) < 32 << 20 < model.step_footprint(cifar, 1)
    # tiny's vectors stay cached between steps: warm prices.
    p = model.predict("tiny", 1, 1, 8, prof)
    assert p.worker["FetchWeights"] == pytest.approx(p.p_fetch * prof.term("copy", 580))
    c = model.predict("cifar", 1, 1, 1, prof)
    assert c.worker["FetchWeights"] == pytest.approx(
        c.p_fetch * prof.term("copy_cold", spec_mod.n_params(cifar)))
