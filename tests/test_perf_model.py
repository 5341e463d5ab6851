"""The closed-form performance model: counts, the barrier, the fixed point."""
import math

import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import model
from engine.perf.profile import Profile

PROF = Profile.synthetic()


def _mc_barrier(n_gpu, n_node, p, cost=None, sigma=0.0, draws=200_000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.binomial(n_gpu, p, size=(draws, n_node)).astype(float)
    if cost is not None:
        x = np.vectorize(cost)(x)
    if sigma:
        x = x + rng.normal(0, sigma, size=x.shape)
    d = x.max(axis=1) - x[:, 0]
    return d.mean(), d.std() / math.sqrt(draws)


@pytest.mark.parametrize("n_gpu,n_node,p", [(1, 2, 0.3), (2, 4, 0.5), (4, 16, 0.2), (8, 3, 0.9),
                                             (3, 64, 0.05), (8, 128, 0.6)])
def test_binomial_barrier_matches_monte_carlo(n_gpu, n_node, p):
    est, se = _mc_barrier(n_gpu, n_node, p)
    a = 2.5e-3
    closed = model.t_barrier(a, n_gpu, n_node, p)
    assert abs(closed / a - est) < 5 * se + 1e-9
    # The SPEC formula is the linear-cost case of the general barrier.
    assert model.barrier_wait(lambda x: a * x, n_gpu, n_node, p) == pytest.approx(closed, rel=1e-9, abs=1e-15)


def test_barrier_zero_when_no_spread():
    assert model.t_barrier(1.0, 4, 1, 0.3) == 0.0          # one node waits for nobody
    assert model.t_barrier(1.0, 4, 8, 1.0) == 0.0          # every buffer always full
    assert model.barrier_wait(lambda x: x, 4, 8, 1.0) == 0.0


def test_general_barrier_matches_monte_carlo_with_nonlinear_cost_and_noise():
    cost = lambda x: 0.7 if x == 0 else 0.5 + 1.2 * (x - 1)
    for sigma in (0.0, 0.4):
        est, se = _mc_barrier(4, 8, 0.3, cost=cost, sigma=sigma)
        got = model.barrier_wait(cost, 4, 8, 0.3, sigma)
        assert abs(got - est) < 5 * se + 2e-3, (sigma, got, est)


def test_lock_wait_matches_random_arrival():
    # Holder: critical section cs at the start of every period T; arrivals uniform.
    rng = np.random.default_rng(1)
    cs, T = 0.3, 2.0
    t = rng.uniform(0, T, 400_000)
    wait = np.where(t < cs, cs - t, 0.0)
    assert model.lock_wait(cs, T) == pytest.approx(wait.mean(), rel=0.01)
    assert model.lock_wait(0.0, T) == 0.0


def test_n_param_tiny_by_hand():
    # tiny: 8x8x2 input, conv(3, pool 2), conv(4), fc 6, fc 3; 3x3 kernels.
    conv1 = 3 * (3 * 3 * 2 + 1)
    conv2 = 4 * (3 * 3 * 3 + 1)
    fc1 = 6 * (4 * 4 * 4 + 1)
    fc2 = 3 * (6 + 1)
    sp = spec_mod.get_spec("tiny")
    assert spec_mod.n_params(sp) == conv1 + conv2 + fc1 + fc2 == 580
    assert spec_mod.n_params_formula(sp) == 580
    assert model.predict("tiny", 1, 1, 1, PROF).n_param == 580


def test_kernel_list_by_hand_for_a_small_net():
    sp = spec_mod.NetSpec("hand", 4, 1, 3, ((2, 2),), (5,))
    n = 3
    geoms = spec_mod.layers(sp, n)
    conv = model.layer_kernels(geoms[0], n, True, False)
    fc = model.layer_kernels(geoms[1], n, False, True)
    K, cols = 9 * 1, 4 * 4 * n
    assert ("fwd", "im2col", (K * cols, K * 4 * n)) in conv     # (elements, row segments)
    assert ("bwd", "im2col", (K * cols, K * 4 * n)) in conv     # conv2d_backward re-gathers
    assert ("fwd", "sgemm_nn", (2, cols, K)) in conv
    assert ("bwd", "sgemm_nt", (2, K, cols)) in conv
    assert not any(k == "col2im" for _, k, _ in conv)          # first layer: no dX
    # (elements, input rows, planes, side, pool)
    assert ("fwd", "pool_fwd", (2 * 16 * n, 2 * 4 * n, 2 * n, 4, 2)) in conv
    assert ("fwd", "relu_fwd", 2 * 4 * n) in conv              # ReLU runs on the pooled map
    assert ("fwd", "sgemm_nt", (n, 5, 2 * 2 * 2)) in fc
    assert ("bwd", "sgemm_nn", (n, 8, 5)) in fc                # dX of the FC layer
    assert ("loss", "softmax", 5 * n) in fc      # between the passes, outside the layer
    # FLOPs of the SGEMMs of the model agree with the spec's count.
    gflops = sum(2 * math.prod(s) for _, k, s in conv + fc if k.startswith("sgemm"))
    assert gflops == sum(g.flops_fwd + g.flops_bwd for g in geoms)
    assert gflops == 2 * (2 * 2 * cols * K) + 3 * (2 * n * 5 * 8)   # conv fwd+dW; fc fwd+dW+dX
    # With whole-op fits for the path in force: the ops as engine.layers calls them.
    ops = {"conv_fwd", "conv_bwd_dw", "conv_bwd", "fc_fwd", "fc_bwd_dw", "fc_bwd"}
    conv = model.layer_kernels(geoms[0], n, True, False, ops)
    fc = model.layer_kernels(geoms[1], n, False, True, ops)
    pool = (2 * 16 * n, 2 * 4 * n, 2 * n, 4, 2)
    assert conv == [("fwd", "conv_fwd", (2, cols, K, 3)), ("fwd", "pool_fwd", pool),
                    ("bwd", "relu_bwd", 2 * 4 * n), ("bwd", "pool_bwd", pool),
                    ("bwd", "conv_bwd_dw", (2, cols, K, 3))]       # ReLU fused, db inside, no dX
    assert fc == [("fwd", "fc_fwd", (n, 5, 8)), ("loss", "softmax", 5 * n), ("bwd", "fc_bwd", (n, 5, 8))]
    # Only some ops fitted: the layer keeps its kernels.
    assert model.layer_kernels(geoms[0], n, True, False, {"conv_fwd"})[0][1] == "im2col"


@pytest.mark.parametrize("cfg", [("tiny", 1, 1, 1), ("tiny", 4, 2, 8), ("cifar", 8, 4, 8),
                                 ("cnn-a", 16, 4, 8), ("cifar", 64, 8, 1), ("digits", 3, 2, 32)])
def test_fixed_point_converges_and_is_a_fixed_point(cfg):
    p = model.predict(*cfg, PROF)
    assert p.converged and p.iterations < 200
    c = model.step_costs(*cfg, PROF)
    w, _ = model._worker_steps(c, cfg[2], p.t_gpu, p.t_update)
    u, _, _ = model._updater_steps(c, cfg[2], cfg[1], p.t_gpu, p.t_update)
    assert sum(w.values()) == pytest.approx(p.t_gpu, rel=1e-8)
    assert sum(u.values()) == pytest.approx(p.t_update, rel=1e-8)
    workers = cfg[1] * cfg[2]
    assert p.n_minibatch_avg == pytest.approx(workers * cfg[3] * p.t_update / p.t_gpu)
    assert p.t_epoch == pytest.approx(p.n_file * p.t_update / p.n_minibatch_avg)
    assert p.p_fetch == pytest.approx(min(p.t_gpu / p.t_update, 1))
    assert sum(r[4] for r in p.layers) == pytest.approx(p.worker["ComputeGradient"])


def test_single_worker_terms_by_hand():
    # One node, one worker, huge compute: the updater spins, every iteration fetches.
    p = model.predict("tiny", 1, 1, 4, PROF)
    assert p.t_barrier == 0 and p.updater["Allreduce"] == 0
    assert p.p_fetch == pytest.approx(1.0, abs=0.01)
    assert p.worker["FetchWeights"] == pytest.approx(p.p_fetch * PROF.term("copy", 580))
    # The updater waits for the single worker: T_Update follows T_GPU.
    assert p.t_update == pytest.approx(p.t_gpu, rel=0.01)
    assert p.n_minibatch_avg == pytest.approx(4, rel=0.01)
    seed = model.predict("tiny", 1, 1, 4, PROF, impl=model.SEED_IMPL)
    assert seed.updater["WaitGradient"] == 0 and seed.t_update < seed.t_gpu


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="n_node"):
        model.predict("tiny", 0, 1, 1, PROF)
    with pytest.raises(ValueError, match="n_subbatch"):
        model.predict("tiny", 1, 1, 2.5, PROF)
    with pytest.raises(ValueError):
        model.predict("no-such-net", 1, 1, 1, PROF)


def test_missing_term_names_itself():
    data = dict(PROF.data)
    data["terms"] = {k: v for k, v in PROF.terms.items() if k != "im2col"}
    with pytest.raises(ValueError, match="im2col"):
        model.predict("tiny", 1, 1, 1, Profile(data))


def test_format_mentions_every_term():
    p = model.predict("cifar", 4, 2, 8, PROF)
    text = model.format_prediction(p)
    for k in list(p.worker) + list(p.updater) + ["T_GPU", "T_Update", "N_Minibatch_avg", "T_Epoch", "conv6"]:
        assert k in text


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


@pytest.mark.parametrize("sa,sd", [(1.0, 0.0), (0.0, 2.0), (1.0, 1.0), (1.0, 3.0), (2.5, 0.7)])
def test_two_independent_causes_of_lateness_compose_in_variance(sa, sd):
    """The wait for the slowest of N nodes, E[max_i X_i] - E[X], when each
    node is late for two independent reasons (Gaussian spreads sa and sd):
    the composition of the two waits each alone, not their sum."""
    rng = np.random.default_rng(3)
    n_node, draws = 3, 400_000
    a = rng.normal(0.0, sa, size=(draws, n_node))
    d = rng.normal(0.0, sd, size=(draws, n_node))
    wait = lambda x: float((x.max(axis=1) - x[:, 0]).mean())
    both, alone_a, alone_d = wait(a + d), wait(a), wait(d)
    assert model.with_slice_wait(alone_a, alone_d) == pytest.approx(both, rel=0.01, abs=0.01)
    if sa and sd:
        assert alone_a + alone_d > 1.1 * both          # the sum overprices it
    # What a sweep measured beyond a model that priced one of them, as the other.
    excess = both - alone_a
    assert model.with_slice_wait(alone_a, model.slice_from_excess(alone_a, excess)) == pytest.approx(both, rel=1e-12)
    assert model.slice_from_excess(0.0, excess) == pytest.approx(excess)
    assert model.slice_from_excess(alone_a, -alone_a) == 0.0
