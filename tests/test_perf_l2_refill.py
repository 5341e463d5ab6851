"""The refill terms of the layer passes (engine/perf/l2_refill.py): r per
byte of weights within the L2 and s per pass, each times the refill share
of the pass's age, come back from synthetic records with known
coefficients (plain and gapped steps), price a held-out net exactly, and
are fitted for the default keys (REFILL_KEYS) unless others are asked."""
import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import fit, model
from engine.perf.cache_decay import pass_ages, refill_share
from engine.perf.l2_refill import REFILL_CALL_LABEL, REFILL_KEYS, REFILL_LABEL, l2_weight_bytes
from engine.perf.layer_cost import layer_term_keys, streams_in_sweep
from engine.perf.profile import Profile
from test_perf_layers import F, _truth

L2 = 4 << 20          # mnist and digits run their fc1 from it in the sweep, cifar (8 MiB) streams
R = {"fc_fwd": 2e-10, "fc_bwd": 6e-10, "fcout_fwd": 9e-10}
S = {"fc_fwd": 12e-6, "fc_bwd": 30e-6, "fcout_fwd": 20e-6}
GRID = np.geomspace(1e-4, 0.3, 241)          # fit_refill_tau's grid: taus on it come back exactly
TAU = {"fwd": float(GRID[np.argmin(abs(GRID - 0.004))]), "bwd": float(GRID[np.argmin(abs(GRID - 0.003))])}


def _prof():
    prof = Profile.synthetic(backend="cpu").data
    prof["cache"] = {"l2_bytes": L2}
    return prof


def _truth_aged(prof, net, n, gap=0.0):
    """{(layer, pass): seconds}: the plain layer terms plus, for the keys of R,
    (r x bytes within the L2 + s) x the refill share of the pass's age in
    steps of its passes and ``gap`` run back to back (none where the op
    sweep streamed); the fixed point, as the ages hold the refills."""
    base = _truth(prof, net, n)
    geoms = spec_mod.layers(spec_mod.get_spec(net))
    at = {g.name: (i, g) for i, g in enumerate(geoms)}
    full = {}
    for (layer, pas) in base:
        i, g = at[layer]
        key = layer_term_keys(g.kind, i, len(geoms), pas)[0]
        full[(layer, pas)] = 0.0 if key not in R or streams_in_sweep(g, L2) else \
            R[key] * l2_weight_bytes(g, L2) + S[key]
    t = dict(base)
    for _ in range(300):
        step = gap + sum(t.values())
        t = {k: base[k] + full[k] * refill_share(pass_ages(t[(k[0], "fwd")], t[(k[0], "bwd")], step)[k[1]],
                                                 TAU[k[1]]) for k in base}
    return t


def _records(prof, gaps=(0.0, 0.03)):
    recs = [{"kind": "refill_decay", "pass": pas, "gap": g, "t": 1e-3 + 1e-3 * (1 - np.exp(-g / TAU[pas]))}
            for pas in TAU for g in (0.0, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032)]
    for net in ("tiny", "cifar", "mnist", "digits"):
        for gap in gaps:
            for n in (1, 4, 16):
                for (layer, pas), t in _truth_aged(prof, net, n, gap).items():
                    recs.append({"kind": "layer_pass", "model": net, "n_subbatch": n, "layer": layer, "pass": pas,
                                 "t": t, "holdout": n == 4, **({"gap": gap} if gap else {})})
    return recs


def _priced(profile, net, n):
    got = {}
    for layer, pas, _, _, t in model.compute_gradient_terms(spec_mod.get_spec(net), n, profile):
        if pas != "loss":
            got[(layer, pas)] = got.get((layer, pas), 0.0) + t
    return got


def test_refill_terms_recovered_and_price_a_held_out_net():
    prof = _prof()
    lt = fit.fit_layer_terms(prof, _records(prof), refill_keys=tuple(R))
    for key in R:
        assert lt[key]["f"] == pytest.approx(F[key], rel=1e-5)
        assert lt[key]["r"] == pytest.approx(R[key], rel=1e-4)
        assert lt[key]["s"] == pytest.approx(S[key], rel=1e-4)
        assert lt[key]["error"]["holdout"]["max"] < 1e-5
    # Keys not asked for keep no refill, whatever their records.
    assert all(lt[k]["r"] == 0.0 and lt[k]["s"] == 0.0 for k in lt if k not in R)
    priced = Profile(dict(prof, layer_terms=lt))
    net = spec_mod.NetSpec("m", 28, 1, 5, ((16, 2), (32, 2)), (128, 10))    # no record came from it
    want, got = _truth_aged(prof, net, 8), _priced(priced, net, 8)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5)
    rows = model.compute_gradient_terms(net, 8, priced)
    assert {r[:2] for r in rows if r[2] in (REFILL_LABEL, REFILL_CALL_LABEL)} == \
        {("fc1", "fwd"), ("fc1", "bwd"), ("fc2", "fwd")}


def test_gapped_records_are_aged_by_their_gap():
    """A gapped record's step is its passes and the gap: read as a plain
    step the fit cannot reproduce the gapped passes."""
    prof = _prof()
    recs = _records(prof)
    lt = fit.fit_layer_terms(prof, recs, refill_keys=tuple(R))
    assert lt["fc_bwd"]["error"]["fit"]["max"] < 1e-5
    blind = [{k: v for k, v in r.items() if k != "gap" or r["kind"] != "layer_pass"} for r in recs]
    assert fit.fit_layer_terms(prof, blind, refill_keys=tuple(R))["fc_bwd"]["error"]["fit"]["max"] > 1e-3


def test_refill_only_for_the_default_keys():
    """By default only ``REFILL_KEYS`` get r or s; with no keys no term gets
    them and no pass is priced a refill row (the profiles fitted before
    price as they did). Gapped records (aged) are left out of the terms
    without the columns that price their age."""
    prof = _prof()
    plain = _records(prof, gaps=(0.0,))
    lt = fit.fit_layer_terms(prof, plain, refill_keys=())
    assert all(v["r"] == 0.0 and v["s"] == 0.0 for v in lt.values())
    rows = model.compute_gradient_terms(spec_mod.get_spec("digits"), 8, Profile(dict(prof, layer_terms=lt)))
    assert not [r for r in rows if r[2] in (REFILL_LABEL, REFILL_CALL_LABEL)]
    assert l2_weight_bytes(spec_mod.layers(spec_mod.get_spec("digits"))[0], None) == 0.0
    dflt = fit.fit_layer_terms(prof, plain)
    assert set(REFILL_KEYS) <= set(R)            # the records' truth has refills for them
    assert all(dflt[k]["s"] > 0 for k in REFILL_KEYS)
    assert all(v["r"] == 0.0 and v["s"] == 0.0 for k, v in dflt.items() if k not in REFILL_KEYS)
    for keys, plain_fit in (((), lt), (REFILL_KEYS, dflt)):
        aged = fit.fit_layer_terms(prof, _records(prof), refill_keys=keys)
        assert {k: (v["f"], v["b"]) for k, v in aged.items() if k not in keys} == \
            {k: (v["f"], v["b"]) for k, v in plain_fit.items() if k not in keys}


def test_gapped_layer_pass_sweep_records(monkeypatch):
    """The gapped sweep writes layer_pass records of its own source, gap
    and held-out middle batch (a merge re-runs them apart from the plain
    sweep's)."""
    from engine.perf import sweep_layer_passes as slp
    from engine.perf.sweep import merge_key
    monkeypatch.setattr(slp, "GAP_SECONDS", 0.001)
    monkeypatch.setattr(slp, "GAP_BATCHES", (1, 2, 3))
    monkeypatch.setattr(slp, "GAP_REPEATS", 1)
    recs = slp.sweep_gapped_layer_passes({"nets": ["tiny"], "layer_pass_nets": ["tiny"], "net_batches": (1,), "repeats": 1})
    assert recs and {r["n_subbatch"] for r in recs} == {1, 2, 3}
    assert all(r["kind"] == "layer_pass" and r["gap"] == 0.001 and r["holdout"] == (r["n_subbatch"] == 2)
               for r in recs)
    from engine.perf.sweep import OPT_IN, SWEEPS
    assert "gapped layer passes" in SWEEPS and "gapped layer passes" in OPT_IN      # run only when named
    plain = slp.sweep_layer_passes({"nets": ["tiny"], "layer_pass_nets": ["tiny"], "net_batches": (1,), "repeats": 1})
    assert {merge_key(r) for r in recs}.isdisjoint({merge_key(r) for r in plain})
