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
    size = (2, cols, K, 3, n, 4, 4)     # GEMM, kernel side, then the geometry that picks the kernel
    assert conv == [("fwd", "conv_fwd", size), ("fwd", "pool_fwd", pool),
                    ("bwd", "relu_bwd", 2 * 4 * n), ("bwd", "pool_bwd", pool),
                    ("bwd", "conv_bwd_dw", size)]       # ReLU fused, db inside, no dX
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
