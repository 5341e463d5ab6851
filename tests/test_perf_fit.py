"""Fits recover known coefficients from synthetic sweeps."""
import itertools

import numpy as np
import pytest

from engine.perf import fit, sweep
from engine.perf.profile import SGEMM_FEATURES, Profile, sgemm_features

TRUE = {"mnk": 2e-10, "mn": 3e-9, "mk": 1e-9, "nk": 5e-10, "m": 0.0, "n": 4e-8, "k": 1e-8, "1": 3e-6}
GRID = [2 ** e for e in range(1, 11, 1)]


def _time(coef, m, n, k):
    return sum(coef[f] * v for f, v in zip(SGEMM_FEATURES, sgemm_features(m, n, k)))


def _grid(step=2):
    es = range(1, 11, step)
    return [(2 ** a, 2 ** b, 2 ** c) for a, b, c in itertools.product(es, es, es)]


def test_nnls_relative_recovers_exact_linear():
    x = np.geomspace(1e2, 1e7, 20)
    a, b = fit.fit_linear(x, 3e-9 * x + 5e-6)
    assert a == pytest.approx(3e-9, rel=1e-6) and b == pytest.approx(5e-6, rel=1e-6)


def test_linear_fit_with_noise():
    rng = np.random.default_rng(0)
    x = np.geomspace(1e2, 1e7, 60)
    t = (3e-9 * x + 5e-6) * (1 + 0.01 * rng.standard_normal(len(x)))
    a, b = fit.fit_linear(x, t)
    assert a == pytest.approx(3e-9, rel=0.02) and b == pytest.approx(5e-6, rel=0.05)


def test_sgemm_polynomial_recovered_and_single_regime():
    pts = _grid(1)
    t = [_time(TRUE, *p) for p in pts]
    regs = fit.fit_sgemm_regimes(pts, t)
    assert len(regs) == 1
    coef = regs[0][1]
    for f in ("mnk", "mn", "n", "1"):       # the terms that are not drowned by others
        assert coef[f] == pytest.approx(TRUE[f], rel=1e-3), f
    # In-between sizes, never fitted.
    for m, n, k in [(24, 1500, 96), (3, 5, 700), (640, 48, 320)]:
        assert fit.predict_sgemm(regs, m, n, k) == pytest.approx(_time(TRUE, m, n, k), rel=1e-4)


def test_sgemm_two_regimes_are_detected_from_residuals():
    other = dict(TRUE, mnk=6e-10, **{"1": 2e-5})
    pts = _grid(1)
    t = [_time(TRUE if k <= 64 else other, m, n, k) for m, n, k in pts]
    regs = fit.fit_sgemm_regimes(pts, t)
    assert len(regs) >= 2
    rules = [r for r, _ in regs]
    assert any(r and r[0][0] == "k" and 6 < r[0][2] < 7 for r in rules), rules
    for (m, n, k) in [(12, 40, 24), (300, 80, 48), (12, 40, 300), (300, 80, 900)]:
        want = _time(TRUE if k <= 64 else other, m, n, k)
        assert fit.predict_sgemm(regs, m, n, k) == pytest.approx(want, rel=1e-3)


def test_allreduce_fit_recovered():
    nn, pp = np.meshgrid([2, 3, 4, 8], np.geomspace(1e3, 1e7, 8))
    nn, pp = nn.ravel(), pp.ravel()
    t = (2e-9 * np.log2(nn) + 1e-9) * pp + 1e-5 * np.log2(nn) + 2e-6
    got = fit.fit_allreduce(nn, pp, t)
    assert got["a_log"] == pytest.approx(2e-9, rel=1e-4)
    assert got["b"] == pytest.approx(1e-9, rel=1e-4)
    assert got["c_log"] == pytest.approx(1e-5, rel=1e-3)


def test_fit_profile_end_to_end_with_holdout():
    rng = np.random.default_rng(3)
    recs = []
    for m, n, k in _grid(2):
        recs.append({"kind": "sgemm", "m": m, "n": n, "k": k, "t": _time(TRUE, m, n, k), "std": 0.0})
    for m, n, k in [(3, 12, 48), (24, 96, 6), (192, 768, 24)]:
        recs.append({"kind": "sgemm", "m": m, "n": n, "k": k, "t": _time(TRUE, m, n, k), "holdout": True})
    for name in fit.LINEAR_TERMS:
        a, b = rng.uniform(1e-10, 1e-8), rng.uniform(1e-7, 1e-5)
        for i, x in enumerate(np.geomspace(10, 1e6, 12)):
            recs.append({"kind": name, "x": float(x), "t": a * x + b, "std": 0.05 * (a * x + b),
                         "holdout": i % 4 == 3})
    for n in (2, 3, 4):
        for P in (1e3, 1e5, 1e7):
            recs.append({"kind": "allreduce", "n_node": n, "n_param": P, "t": (1e-9 * np.log2(n) + 1e-9) * P + 1e-5})
    prof = fit.fit_profile(recs, machine="test", cores=2)
    assert prof["sgemm"]["variants"]["nn"]["error"]["holdout"]["max"] < 1e-4
    for name in fit.LINEAR_TERMS:
        assert prof["terms"][name]["error"]["holdout"]["max"] < 1e-6
        assert prof["terms"][name]["cv"] == pytest.approx(0.05)
    P = Profile(prof)
    assert P.sgemm(100, 200, 300) == pytest.approx(_time(TRUE, 100, 200, 300), rel=1e-4)
    # The fitted profile is complete enough to predict with.
    from engine.perf.model import predict
    assert predict("cifar", 2, 2, 4, P).converged


def test_bad_times_rejected():
    with pytest.raises(ValueError, match="positive"):
        fit.nnls_relative(np.ones((3, 2)), [1.0, 0.0, 2.0])
    with pytest.raises(ValueError):
        fit.nnls_relative(np.ones((3, 2)), [1.0, 2.0])


def test_piecewise_linear_term_finds_the_cache_edge():
    x = np.geomspace(64, 1 << 24, 40)
    t = np.where(x <= 1 << 16, 1e-10 * x + 1e-6, 8e-10 * x - 4.5e-5)
    pieces = fit.fit_linear_pieces(x, t)
    assert len(pieces) >= 2
    assert (1 << 15) < pieces[0][0] < (1 << 17)
    for v in (100.0, 3e4, 2e5, 1e7):
        want = 1e-10 * v + 1e-6 if v <= 1 << 16 else 8e-10 * v - 4.5e-5
        assert fit.eval_pieces(pieces, v) == pytest.approx(want, rel=0.02)
    # A straight line stays one piece.
    assert len(fit.fit_linear_pieces(x, 3e-9 * x + 2e-6)) == 1


def test_a_fitted_piece_is_never_priced_below_zero():
    """A piece past the first is fitted to its own records (fit_linear_pieces)
    but priced from the cut, the geometric mean of the sizes either side; in
    that gap its line may cross zero. The shipped profile's `sub` did, and
    `sprint predict --model digits --nodes 2 --workers 2 --subbatch 16`
    printed UpdateMomentum -12 us: the price is floored at zero."""
    from pathlib import Path
    prof = Profile.load(Path(__file__).resolve().parents[1] / "bench" / "profiles" / "cpu_test18.json")
    sub = prof.terms["sub"]["pieces"]
    assert sub[0]["upper"] < 75_653 and sub[1]["a"] * 75_653 + sub[1]["b"] < 0     # digits' slice on 2 nodes
    assert prof.term("sub", 75_653) == 0.0
    assert prof.term("sub", 1 << 20) == pytest.approx(sub[1]["a"] * (1 << 20) + sub[1]["b"])
    assert prof.term("sub", 1000) == pytest.approx(sub[0]["a"] * 1000 + sub[0]["b"])
    # a calibration's per-call scale above its per-unit one takes a positive line below zero too
    line = Profile({"terms": {"v": {"a": 1e-10, "b": 0.0, "pieces": [
        {"upper": 1e4, "a": 1e-10, "b": 1e-7}, {"upper": None, "a": 4e-10, "b": -4e-6}]}}})
    assert line.term("v", 1.1e4) > 0
    line.time_scale, line.call_scale = 1.0, 1.2
    assert line.term("v", 1.1e4) == 0.0 and line.term("v", 1e6) > 0


def _two_regimes():
    """A vector op leaving a cache between 3e4 and 1e5 elements, no record in between."""
    lo, hi = np.geomspace(1e3, 3e4, 12), np.geomspace(1e5, 3e6, 12)
    return lo, hi, 1e-10 * lo + 1e-6, 8e-10 * hi - 1.5e-5


def test_pieces_price_continuously_across_the_gap_between_their_records():
    """Each piece keeps its records' range; between the lower piece's highest
    record and the upper one's lowest the price runs straight between the two
    pieces' values there: no jump at the cut (it was 6.5 -> 28.8 us here),
    exact on both sides' records."""
    lo, hi, tlo, thi = _two_regimes()
    pieces = fit.fit_linear_pieces(np.r_[lo, hi], np.r_[tlo, thi])
    assert len(pieces) == 2
    assert pieces[0][3:] == pytest.approx((1e3, 3e4)) and pieces[1][3:] == pytest.approx((1e5, 3e6))
    recs = [{"kind": "axpy", "x": float(v), "t": float(t), "std": 0.0} for v, t in zip(np.r_[lo, hi], np.r_[tlo, thi])]
    prof = fit.fit_profile(recs + [{"kind": "axpy", "x": 5e4, "t": 3.5e-5, "holdout": True}], machine="m", cores=2)
    P = Profile(prof)
    assert P.terms["axpy"]["pieces"] == fit.piece_dicts(pieces)
    for v, t in zip(np.r_[lo, hi], np.r_[tlo, thi]):
        assert P.term("axpy", v) == pytest.approx(t, rel=1e-6) and fit.eval_pieces(pieces, v) == P.term("axpy", v)
    cut, eps = pieces[0][0], 1e-9
    for edge in (3e4, cut, 1e5):
        assert P.term("axpy", edge * (1 + eps)) == pytest.approx(P.term("axpy", edge * (1 - eps)), rel=1e-6)
    y0, y1 = 1e-10 * 3e4 + 1e-6, 8e-10 * 1e5 - 1.5e-5
    assert P.term("axpy", 6.5e4) == pytest.approx(y0 + (y1 - y0) * 3.5e4 / 7e4, rel=1e-9)
    assert fit.eval_pieces(pieces, 6.5e4) == P.term("axpy", 6.5e4)
    # the held-out record in the gap is scored by that price
    assert prof["terms"]["axpy"]["error"]["holdout"]["max"] == pytest.approx(abs(P.term("axpy", 5e4) / 3.5e-5 - 1))
    # a calibration scales both ends' parts as it scales the lines
    P.time_scale, P.call_scale = 1.5, 2.0
    z0, z1 = 1.5e-10 * 3e4 + 2e-6, 1.2e-9 * 1e5 - 3e-5
    assert P.term("axpy", 6.5e4) == pytest.approx(z0 + (z1 - z0) * 0.5, rel=1e-9)
    assert P.term("axpy", 1e6) == pytest.approx(1.2e-9 * 1e6 - 3e-5, rel=1e-9)


def test_pieces_without_ranges_price_as_before():
    """A profile fitted before the pieces kept their ranges prices each piece up
    to its cut, the jump there included."""
    lo, hi, tlo, thi = _two_regimes()
    pieces = fit.fit_linear_pieces(np.r_[lo, hi], np.r_[tlo, thi])
    old = [{"upper": u, "a": a, "b": b} for u, a, b, _, _ in pieces]
    P = Profile({"terms": {"axpy": {"a": 1e-9, "b": 0.0, "pieces": old}}})
    cut, (a0, b0), (a1, b1) = old[0]["upper"], pieces[0][1:3], pieces[1][1:3]
    for v in (1e2, 3e4, cut, cut + 1, 6.5e4, 1e5, 1e7):
        want = max(0.0, a0 * v + b0 if v <= cut else a1 * v + b1)
        assert P.term("axpy", v) == want and fit.eval_pieces([p[:3] for p in pieces], v) == want
    assert P.term("axpy", cut + 1) - P.term("axpy", cut) > 1e-5


def test_sgemm_grid_covers_outer_products():
    """k = 1 (an FC dW at batch 1) is its own BLAS regime: the grids sweep it."""
    from engine.perf import sweep
    for quick in (True, False):
        cfg = sweep.mode_config(quick)
        pts = sweep.sgemm_grid(cfg)
        assert any(k == 1 and not hold and m * n >= 2 ** 20 for m, n, k, hold in pts)


def test_outer_product_regime_is_fitted_apart():
    """Points at k = 1 costing far more per m*n than k >= 2 get a regime of their own."""
    rng = np.random.default_rng(0)
    pts, t = [], []
    for m in (1, 4, 16, 64, 256, 512):
        for n in (1, 4, 16, 64, 256, 1024, 4096, 16384):
            for k in (1, 4, 16, 64, 256, 1024):
                if m * n * k > 2 ** 30:
                    continue
                pts.append((m, n, k))
                slow = 1e-9 * m * n if k == 1 else 0.0
                t.append((6e-6 + 2e-11 * m * n * k + 5e-11 * m * n + slow) * (1 + 0.01 * rng.standard_normal()))
    regimes = fit.fit_sgemm_regimes(pts, t)
    pred = fit.predict_sgemm(regimes, 512, 4096, 1)
    true = 6e-6 + 2e-11 * 512 * 4096 + 5e-11 * 512 * 4096 + 1e-9 * 512 * 4096
    assert abs(pred / true - 1) < 0.15


def test_in_situ_allreduce_is_timed_from_the_last_arrival():
    # Two ranks, three calls: (enter, exit) on one host's monotonic clock.
    got = [{"allreduce": [(0.0, 1.0), (2.0, 2.5), (3.0, 3.2)]},
           {"allreduce": [(0.6, 1.0), (2.1, 2.5), (3.1, 3.2)]}]
    assert sweep._allreduce_after_last(got) == pytest.approx([0.4, 0.4, 0.4, 0.4, 0.1, 0.1])
    # Records of plain durations (older sweeps) pass through.
    assert sweep._allreduce_after_last([{"allreduce": [0.3, 0.2]}]) == [0.3, 0.2]


def test_cold_vector_records_fit_and_carry_the_cache_size():
    recs = []
    for i, n in enumerate((1 << 10, 1 << 14, 1 << 18, 1 << 22)):
        for name, a in (("copy_cold", 2e-10), ("add_cold", 3e-10)):
            recs.append({"kind": name, "x": n, "t": a * n + 1e-6, "std": 0.0, "holdout": i == 2,
                         "llc_bytes": 32 << 20})
    prof = fit.fit_profile(recs)
    assert prof["cache"] == {"llc_bytes": 32 << 20}
    assert prof["terms"]["add_cold"]["a"] == pytest.approx(3e-10, rel=1e-3)
    assert prof["terms"]["copy_cold"]["error"]["holdout"]["median"] < 1e-3


def test_repeated_runner_sweeps_pool_to_one_entry_per_sharing():
    prof = Profile.synthetic(backend="cpu").data
    mk = lambda r, rel, t, base: {"kind": "contention", "source": "runner", "model": "tiny", "n_subbatch": 8,
                                  "ranks": r, "workers": 1, "rel": rel, "t": t, "host": base, "ratio": rel * base}
    prof["contention"] = {"entries": [mk(1, 1.0, 1e-3, 1.0), mk(1, 1.0, 3e-3, 1.0), mk(2, 1.2, 1.2e-3, 1.0),
                                      mk(2, 1.4, 4.2e-3, 1.0), mk(2, 2.0, 2e-3, 1.0)]}
    fit.anchor_contention(prof)
    es = prof["contention"]["entries"]
    assert [(e["ranks"], e["n_runs"]) for e in es] == [(1, 2), (2, 3)]
    assert es[1]["rel"] == pytest.approx(1.4)
    # One factor for the net: the median of every run's (1, 1) time over the model's step.
    cg = es[0]["host"] * 1.0
    assert es[1]["host"] == pytest.approx(cg) and es[1]["ratio"] == pytest.approx(1.4 * cg)
