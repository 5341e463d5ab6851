"""Pooling's cost model (engine/perf/pool_cost.py): its features count what
csrc/pool.cpp does, its fit recovers known coefficients from synthetic
records, and the profile prices a layer's pool with it (older profiles on
elements and rows as before). No timing: the sweep itself is not run."""
import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import fit
from engine.perf.pool_cost import FEATURES, fit_pool, pool_features, pool_shapes, pool_size
from engine.perf.profile import Profile


def test_features_count_the_kernel_loops_by_hand():
    # 3 planes of 28 x 28 pooled by 4: OW = OH = 7, one SIMD loop per
    # (plane, output row, window element) of 7 iterations: one 4-float
    # vector and 3 one by one.
    loops = 3 * 7 * 16
    assert pool_features("pool_fwd", 3, 28, 4) == (loops, 0.0, loops, 3 * loops, 3 * 7, 1.0)
    # by 2: OW 14 = 8 + 4 + 2
    loops = 3 * 14 * 4
    assert pool_features("pool_fwd", 3, 28, 2)[:4] == (loops, loops, loops, 2 * loops)
    # 32 / 4 = 8 outputs a row: one whole vector
    assert pool_features("pool_fwd", 5, 32, 4)[1:4] == (5 * 8 * 16, 0.0, 0.0)
    # a side the pool does not divide: the last rows and columns are dropped
    assert pool_features("pool_fwd", 1, 14, 4)[0] == 3 * 16
    assert pool_features("pool_bwd", 3, 28, 4) == (3 * 784, 3 * 49, 1.0)
    assert len(pool_features("pool_fwd", 1, 8, 2)) == len(FEATURES["pool_fwd"])
    with pytest.raises(ValueError):
        pool_features("pool_sideways", 1, 8, 2)


def _synthetic(kind, coef, noise=0.0, seed=0, n=80):
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        p = int(rng.integers(2, 6))
        h = int(rng.integers(p, 60))
        planes = int(rng.integers(1, 2000))
        t = float(np.dot(coef, pool_features(kind, planes, h, p))) * (1 + noise * rng.standard_normal())
        recs.append({"kind": kind, "x": planes * h * h, "planes": planes, "h": h, "p": p, "t": t, "std": 0.0,
                     "holdout": i % 4 == 3})
    return recs


@pytest.mark.parametrize("kind,coef", [("pool_fwd", [2e-9, 4e-9, 3e-9, 2e-9, 5e-9, 7e-6]),
                                       ("pool_bwd", [5e-11, 1.5e-9, 1e-5])])
def test_fit_recovers_known_coefficients(kind, coef):
    recs = _synthetic(kind, coef)
    fit_r = [r for r in recs if not r["holdout"]]
    hold = [r for r in recs if r["holdout"]]
    got = fit_pool(kind, fit_r, hold)
    assert got["features"] == list(FEATURES[kind])
    np.testing.assert_allclose(got["coef"], coef, rtol=1e-6)
    assert got["error"]["holdout"]["n"] == len(hold) and got["error"]["holdout"]["max"] < 1e-6
    # 3 % noise on 400 shapes: the coefficients within 15 %, the held-out error at the noise
    noisy = _synthetic(kind, coef, noise=0.03, seed=1, n=400)
    got = fit_pool(kind, [r for r in noisy if not r["holdout"]], [r for r in noisy if r["holdout"]])
    np.testing.assert_allclose(got["coef"], coef, rtol=0.15)
    assert got["error"]["holdout"]["median"] < 0.05


def test_fit_profile_fits_pooling_on_its_features_only_when_records_carry_the_pool():
    coef = [2e-9, 4e-9, 3e-9, 2e-9, 5e-9, 7e-6]
    prof = fit.fit_profile(_synthetic("pool_fwd", coef))
    np.testing.assert_allclose(prof["terms"]["pool_fwd"]["coef"], coef, rtol=1e-6)
    # records swept before (elements and input rows, no pool): the old two-feature fit
    old = [{"kind": "pool_fwd", "x": 1000 * k, "x2": 10 * (9 - k) ** 2,
            "t": 1e-9 * 1000 * k + 2e-9 * 10 * (9 - k) ** 2 + 5e-6, "holdout": False} for k in range(1, 9)]
    t = fit.fit_profile(old)["terms"]["pool_fwd"]
    assert "coef" not in t and t["a"] == pytest.approx(1e-9, rel=1e-4) and t["c"] == pytest.approx(2e-9, rel=1e-4)


def test_profile_prices_a_layer_pool_with_the_kernel_features():
    sp = spec_mod.NetSpec("p4", 28, 1, 5, ((12, 4),), (10,))
    n = 3
    g = spec_mod.layers(sp, n)[0]
    size = pool_size(g, n)
    assert size == (12 * 28 * 28 * n, 12 * 28 * n, 12 * n, 28, 4)
    cf, cb = [2e-9, 4e-9, 3e-9, 2e-9, 5e-9, 7e-6], [5e-11, 1.5e-9, 1e-5]
    p = Profile({"terms": {"pool_fwd": {"coef": cf}, "pool_bwd": {"coef": cb}}})
    want = float(np.dot(cf, pool_features("pool_fwd", 12 * n, 28, 4)))
    assert p.term("pool_fwd", size) == pytest.approx(want, rel=1e-12)
    assert p.term("pool_bwd", size) == pytest.approx(float(np.dot(cb, pool_features("pool_bwd", 12 * n, 28, 4))))
    # a slower machine scales the per-unit parts, its per-call scale the fixed one
    p.time_scale, p.call_scale = 2.0, 3.0
    assert p.term("pool_fwd", size) == pytest.approx(2 * (want - cf[-1]) + 3 * cf[-1], rel=1e-12)
    # an older profile's term: elements and input rows, the same 5-tuple
    old = Profile({"terms": {"pool_fwd": {"a": 1e-9, "c": 2e-9, "b": 5e-6}}})
    assert old.term("pool_fwd", size) == pytest.approx(1e-9 * size[0] + 2e-9 * size[1] + 5e-6)


def test_pool_sweep_covers_pools_2_to_5_on_the_seen_nets_maps():
    from engine.perf.sweep import mode_config
    for quick in (True, False):
        shapes = pool_shapes(mode_config(quick))
        assert {p for *_, p in shapes} == {2, 3, 4, 5}
        assert all(side >= p for _, _, side, p in shapes)
        # cifar's conv2 map (64 x 32 x 32) at batch 1, by its own pool and by 4
        assert {(1, 64, 32, 2), (1, 64, 32, 4)} <= set(shapes)


def test_the_layer_sweep_leaves_pooling_to_its_own_sweep():
    from engine import ops
    from engine.perf.sweep_kernels import _elementwise_fns
    y = np.zeros((1, 2, 4, 4), np.float32)
    assert [k for k, _ in _elementwise_fns(ops, y, 2, [])] == ["relu_fwd", "relu_bwd"]
