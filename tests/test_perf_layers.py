"""Per-layer and per-call terms recover known coefficients from synthetic
records, and a whole net held out of the fit is priced by them."""
import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import fit, model
from engine.perf.layer_cost import fc_input_floats, in_step_factor, layer_term_keys, streams_in_sweep
from engine.perf.profile import Profile

# Each kind and pass, and a net's first convolution and output layer apart.
F = {"conv_fwd": 1.3, "conv_bwd": 1.1, "fc_fwd": 2.0, "fc_bwd": 1.5,
     "conv1_fwd": 1.8, "conv1_bwd": 1.25, "fcout_fwd": 2.6, "fcout_bwd": 1.35}
B = {"conv_fwd": 20e-6, "conv_bwd": 35e-6, "fc_fwd": 8e-6, "fc_bwd": 12e-6,
     "conv1_fwd": 3e-6, "conv1_bwd": 15e-6, "fcout_fwd": 11e-6, "fcout_bwd": 6e-6}


def _truth(prof, net, n, terms=None, x=None):
    """{(layer, pass): seconds} of the generating model (``terms``: the keys
    it knows, the most specific of a layer's ``layer_term_keys`` used); an
    FC pass whose op sweep overflowed the profile's L2 at its swept price
    (``streams_in_sweep``); ``x``: seconds per input float of the keys it
    names."""
    terms = terms or F
    sums = fit._kernel_sums(Profile(prof), net, n)
    geoms = spec_mod.layers(spec_mod.get_spec(net))
    at = {g.name: i for i, g in enumerate(geoms)}
    l2 = (prof.get("cache") or {}).get("l2_bytes")
    out = {}
    for k, (ks, kind) in sums.items():
        key = next(c for c in layer_term_keys(kind, at[k[0]], len(geoms), k[1]) if c in terms)
        streams = streams_in_sweep(geoms[at[k[0]]], l2)
        out[k] = (1.0 if streams else F[key]) * ks + B[key] \
            + (x or {}).get(key, 0.0) * fc_input_floats(geoms[at[k[0]]], n)
    return out


def _records(prof, nets=("tiny", "cifar"), batches=(1, 4, 16), held=4, noise=0.0, rng=None):
    recs = []
    for net in nets:
        kinds = {g.name: g.kind for g in spec_mod.layers(spec_mod.get_spec(net))}
        for n in batches:
            for (layer, pas), t in _truth(prof, net, n).items():
                t *= 1 + noise * (rng.standard_normal() if rng is not None else 0)
                recs.append({"kind": "layer_pass", "model": net, "n_subbatch": n, "layer": layer, "pass": pas,
                             "layer_kind": kinds[layer], "t": t, "holdout": n == held})
    return recs


def test_softmax_is_the_loss_not_a_layer_pass():
    rows = model.compute_gradient_terms(spec_mod.get_spec("digits"), 4, Profile.synthetic())
    assert [r[:3] for r in rows if r[2] == "softmax"] == [("fc2", "loss", "softmax")]


def test_layer_terms_recovered_exactly_and_price_a_held_out_net():
    prof = Profile.synthetic(backend="cpu").data
    lt = fit.fit_layer_terms(prof, _records(prof))
    assert set(lt) == set(F)
    for key in F:
        assert lt[key]["f"] == pytest.approx(F[key], rel=1e-6)
        assert lt[key]["b"] == pytest.approx(B[key], rel=1e-5)
        assert lt[key]["error"]["holdout"]["n"] > 0 and lt[key]["error"]["holdout"]["max"] < 1e-6
    # A whole net no record came from (digits, and a 5x5 MNIST-sized spec),
    # at a batch size never fitted: the fitted terms reproduce each pass.
    priced = Profile(dict(prof, layer_terms=lt))
    for net in ("digits", spec_mod.NetSpec("m", 28, 1, 5, ((16, 2), (32, 2)), (128, 10))):
        want = _truth(prof, net, 8)
        got = {}
        for layer, pas, _, _, t in model.compute_gradient_terms(spec_mod.get_spec(net), 8, priced):
            if pas != "loss":
                got[(layer, pas)] = got.get((layer, pas), 0.0) + t
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-6)


def test_first_conv_and_output_layer_fitted_apart_and_older_profiles_keep_one_term_per_kind():
    """Roles come back with their own (f, b); a role seen in too few fitted
    passes (one net) is fitted into its kind; a profile with kind keys only
    prices every layer of a kind by them."""
    prof = Profile.synthetic(backend="cpu").data
    one_net = fit.fit_layer_terms(prof, _records(prof, nets=("cifar",), batches=(1, 4, 16)))
    assert set(one_net) == {"conv_fwd", "conv_bwd", "fc_fwd", "fc_bwd"}     # 2 fitted passes per role: merged
    kinds = {k: F[k] for k in ("conv_fwd", "conv_bwd", "fc_fwd", "fc_bwd")}
    lt = fit.fit_layer_terms(prof, _records(prof, nets=("tiny", "cifar", "mnist"), batches=(1, 4, 16)))
    assert set(lt) == set(F)
    old = Profile(dict(prof, layer_terms={k: {"f": lt[k]["f"], "b": lt[k]["b"]} for k in kinds}))
    want = _truth(prof, "digits", 8, terms=kinds)
    got = {}
    for layer, pas, _, _, t in model.compute_gradient_terms(spec_mod.get_spec("digits"), 8, old):
        if pas != "loss":
            got[(layer, pas)] = got.get((layer, pas), 0.0) + t
    assert got == pytest.approx(want, rel=1e-6)
    assert layer_term_keys("fc", 0, 1, "fwd") == ("fcout_fwd", "fc_fwd")    # a one-layer net: its output layer
    assert layer_term_keys("conv", 1, 4, "bwd") == ("conv_bwd",)


def test_layer_terms_with_noise_and_the_per_call_cost_matters():
    rng = np.random.default_rng(0)
    prof = Profile.synthetic(backend="cpu").data
    lt = fit.fit_layer_terms(prof, _records(prof, batches=(1, 2, 4, 8, 16, 32), noise=0.02, rng=rng))
    for key in F:
        assert lt[key]["f"] == pytest.approx(F[key], rel=0.1)
        held = lt[key]["error"]["holdout"]["median"]
        assert held < 0.05
        # The swept kernels alone miss the factor and the per-call cost.
        assert lt[key]["error"]["kernels_only_holdout"]["median"] > max(0.1, 3 * held)


def test_per_step_cost_fitted_beside_layer_terms():
    prof = Profile.synthetic(backend="cpu").data
    prof["layer_terms"] = fit.fit_layer_terms(prof, _records(prof))
    p = Profile(prof)
    steps = []
    for net in ("tiny", "cifar"):
        for i, n in enumerate((1, 4, 16)):
            cg = sum(r[4] for r in model.compute_gradient_terms(spec_mod.get_spec(net), n, p))
            steps.append({"kind": "net_step", "model": net, "n_subbatch": n, "t": cg + 50e-6, "holdout": i == 1})
    ov = fit.fit_overhead(prof, [s for s in steps if not s["holdout"]], [s for s in steps if s["holdout"]])
    assert ov["per_step"] == pytest.approx(50e-6, rel=1e-6) and ov["per_layer"] == 0.0
    assert ov["error"]["holdout"]["max"] < 1e-6


def test_runner_step_excess_is_per_call_plus_a_share_of_the_kernel():
    # Known coefficients: excess = c + r * kernel, per call, one thread.
    c = {"LoadImage": (40e-6, 0.0), "ComputeUpdateVal": (10e-6, 0.4)}

    def entry(net, ranks, w, kern, slow):
        meas = {k: slow * (kern[k] + c[k][0] + c[k][1] * kern[k]) for k in c}
        meas["DeformImage"] = slow * 2e-4                              # faster than its kernel
        return {"source": "runner", "model": net, "ranks": ranks, "workers": w, "worker_slowdown": slow,
                "worker": meas, "worker_model": {k: slow * v for k, v in dict(kern, DeformImage=2.5e-4).items()}}
    es = [entry("tiny", 1, 1, {"LoadImage": 1e-5, "ComputeUpdateVal": 2e-6}, 1.2),
          entry("cifar", 1, 1, {"LoadImage": 3e-5, "ComputeUpdateVal": 4e-3}, 1.0),
          entry("tiny", 2, 2, {"LoadImage": 1.0, "ComputeUpdateVal": 1.0}, 3.0)]   # only the 1 x 1 runs count
    exc = fit.runner_step_excess(es)
    for k, (c0, r0) in c.items():
        assert exc[k]["c"] == pytest.approx(c0, rel=1e-6, abs=1e-12) and exc[k]["r"] == pytest.approx(r0, abs=1e-9)
    assert exc["DeformImage"] == {"c": 0.0, "r": 0.0}                  # no negative cost
    # The model adds c per call times the host slowdown, and r of the step's priced kernel.
    prof = Profile.synthetic(backend="cpu")
    base = model.step_costs("tiny", 1, 1, 4, prof)
    prof.data["overhead"] = {"runner_steps": exc}
    got = model.step_costs("tiny", 1, 1, 4, prof)
    slow = got["_slowdown"][0]
    assert got["load"][0] - base["load"][0] == pytest.approx(slow * 40e-6)
    assert got["update_val"][0] - base["update_val"][0] == pytest.approx(slow * 10e-6 + 0.4 * base["update_val"][0])
    # Profiles written before kept the constant alone.
    prof.data["overhead"] = {"runner_steps": {"LoadImage": 40e-6}}
    assert model.step_costs("tiny", 1, 1, 4, prof)["load"][0] - base["load"][0] == pytest.approx(slow * 40e-6)
    gpu = Profile.synthetic(backend="gpu")
    gpu.data["overhead"] = {"runner_steps": exc}
    assert model.step_costs("tiny", 1, 1, 4, gpu)["load"][0] == pytest.approx(
        model.step_costs("tiny", 1, 1, 4, Profile.synthetic(backend="gpu"))["load"][0])


def test_weights_beyond_the_l2_are_priced_per_byte():
    """Records whose passes pay w per byte of weights beyond the L2 (cifar's
    fc1 and its widest convs): f, b and w come back, a held-out net with
    large weights is priced with them, and small weights pay nothing."""
    prof = Profile.synthetic(backend="cpu").data
    l2 = 1 << 20
    prof["cache"] = {"l2_bytes": l2}
    W = {"conv_fwd": 1e-10, "conv_bwd": 2e-10, "fc_fwd": 3e-10, "fc_bwd": 5e-10}

    def truth(net, n):
        base = _truth(prof, net, n)
        geoms = {g.name: g for g in spec_mod.layers(spec_mod.get_spec(net))}
        kinds = {g.name: g.kind for g in geoms.values()}
        return {k: t + W[f"{kinds[k[0]]}_{k[1]}"] * max(4 * spec_mod._prod(geoms[k[0]].w_shape) - l2, 0)
                for k, t in base.items()}
    recs = []
    for net in ("tiny", "cifar", "mnist"):
        for n in (1, 4, 16):
            for (layer, pas), t in truth(net, n).items():
                recs.append({"kind": "layer_pass", "model": net, "n_subbatch": n, "layer": layer, "pass": pas,
                             "t": t, "holdout": n == 4})
    lt = fit.fit_layer_terms(prof, recs)
    for key in W:
        assert lt[key]["f"] == pytest.approx(F[key], rel=1e-5)
        assert lt[key]["w"] == pytest.approx(W[key], rel=1e-4)
        assert lt[key]["error"]["holdout"]["max"] < 1e-5
    priced = Profile(dict(prof, layer_terms=lt))
    big = spec_mod.NetSpec("big", 16, 3, 3, ((64, 2), (128, 2)), (1024, 10))   # fc1: 8 MiB of weights
    for net, n in ((big, 8), ("digits", 8)):
        want, got = truth(net, n), {}
        for layer, pas, kern, _, t in model.compute_gradient_terms(spec_mod.get_spec(net), n, priced):
            if pas != "loss":
                got[(layer, pas)] = got.get((layer, pas), 0.0) + t
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-5)
    rows = model.compute_gradient_terms(spec_mod.get_spec("digits"), 8, priced)
    assert not [r for r in rows if r[2] == "cold-weights"]       # digits' weights fit the L2
    # A profile without the L2 size (older ones) prices no such row.
    old = Profile(dict(prof, layer_terms=lt, cache={}))
    assert not [r for r in model.compute_gradient_terms(big, 8, old) if r[2] == "cold-weights"]


def test_runner_compute_excess_is_per_byte_beyond_the_l2():
    """The runner's ComputeGradient beyond the model's step, c + d x (bytes
    of the parameters beyond the L2): recovered from nets on both sides of
    the L2, and a net inside it pays c alone (per parameter it paid cifar's
    per-byte cost on every parameter)."""
    from engine.perf.fit_steps import runner_compute_excess
    prof = Profile.synthetic(backend="cpu").data
    l2 = 1 << 20
    prof["cache"] = {"l2_bytes": l2}
    p = Profile(prof)
    c, d = 300e-6, 7e-10
    by_net = {}
    for net, n in (("tiny", 8), ("cifar", 4), ("mnist", 4)):          # 580 and 207 K parameters, then 3.2 M
        sp = spec_mod.get_spec(net)
        cg = sum(r[4] for r in model.compute_gradient_terms(sp, n, p)) + p.per_step(spec_mod.n_params(sp))
        excess = c + d * max(4 * spec_mod.n_params(sp) - l2, 0)
        by_net[net] = [{"host": 1 + excess / cg, "n_subbatch": n, "rel": 1.0}]
    runner_compute_excess(prof, by_net, p)
    got = prof["overhead"]["runner_compute"]
    assert got["c"] == pytest.approx(c, rel=1e-6) and got["d"] == pytest.approx(d, rel=1e-6)
    assert got["l2_bytes"] == l2 and all(e["host"] == 1.0 for es in by_net.values() for e in es)
    fitted = Profile(prof)
    assert fitted.runner_compute(200_000) == pytest.approx(c)                # 0.8 MB: inside the L2
    assert fitted.runner_compute(3_000_000) == pytest.approx(c + d * (12e6 - l2))
    # Profiles fitted before: d per parameter.
    old = Profile(dict(prof, overhead={"runner_compute": {"c": c, "d": 1e-9}}))
    assert old.runner_compute(200_000) == pytest.approx(c + 2e-4)


def test_runner_excess_is_paired_with_the_step_timed_beside_it():
    """The runner's per-step excess is its (1, 1) ComputeGradient minus the
    one-thread step the same sweep timed (``solo_wall``), not minus the
    model's step: layer terms that price the swept nets 30 % slow (or fast)
    leave c and d as they are."""
    from engine.perf.fit_steps import anchor_contention
    c, d, l2 = 250e-6, 5e-10, 1 << 20
    for off in (0.7, 1.0, 1.3):                 # the layer terms' error on the swept nets
        prof = Profile.synthetic(backend="cpu").data
        prof["cache"] = {"l2_bytes": l2}
        p = Profile(prof)
        entries = []
        for net, n in (("tiny", 8), ("mnist", 4), ("cifar", 4)):
            sp = spec_mod.get_spec(net)
            solo = off * sum(r[4] for r in model.compute_gradient_terms(sp, n, p))
            base = solo + c + d * max(4 * spec_mod.n_params(sp) - l2, 0)
            for r, rel in ((1, 1.0), (2, 1.4), (3, 2.1)):
                entries.append({"kind": "contention", "source": "runner", "model": net, "n_subbatch": n,
                                "ranks": r, "workers": 1, "rel": rel, "t": rel * base, "host": base / solo,
                                "solo_cpu": solo, "solo_wall": solo})
        prof["contention"] = {"entries": entries}
        anchor_contention(prof)
        got = prof["overhead"]["runner_compute"]
        assert got["c"] == pytest.approx(c, rel=1e-6) and got["d"] == pytest.approx(d, rel=1e-6)
    # Records without the probe (older sweeps): the model's step, as before.
    old = [dict(e) for e in entries]
    for e in old:
        e.pop("solo_wall"), e.pop("excess_solo", None)
    prof = Profile.synthetic(backend="cpu").data
    prof["contention"] = {"entries": [e for e in old if e.get("ranks")]}
    anchor_contention(prof)
    assert "excess_solo" not in prof["contention"]["entries"][0]


def test_fc_passes_whose_sweep_streamed_are_not_scaled_by_f():
    """An FC pass whose weights overflow the L2 (its op sweep read them from
    beyond it) is priced at its swept kernels plus b and the cold-weight
    term: f, fitted on passes whose sweeps ran the weights from the L2,
    does not scale it. The weights alone count, whatever the batch and the
    pass. Profiles fitted before (no ``l2_only``) scale every pass."""
    l2 = 1 << 20
    big = spec_mod.layers(spec_mod.NetSpec("big", 16, 3, 3, ((64, 2), (128, 2)), (1024, 10)), 8)
    fc1, conv2 = big[2], big[1]          # fc1: 8192 x 1024, 32 MiB of weights
    assert streams_in_sweep(fc1, l2)
    assert not streams_in_sweep(conv2, l2)          # convolutions keep f
    assert not streams_in_sweep(fc1, None)          # no L2 size: as before
    small = spec_mod.layers(spec_mod.get_spec("digits"), 8)[2]  # 1024 x 128: 512 KiB
    assert not streams_in_sweep(small, l2)
    # by hand: 4 w bytes against the L2, for both passes and any batch (input
    # and output besides would overflow an L2 of 4 w + 1 at batch 64)
    w = 1024 * 128
    assert streams_in_sweep(small, 4 * w - 1)
    assert not streams_in_sweep(small, 4 * w)
    term = {"f": 1.7, "b": 0.0, "l2_only": True}
    assert in_step_factor(term, fc1, l2) == 1.0
    assert in_step_factor(term, small, l2) == 1.7
    assert in_step_factor({"f": 1.7, "b": 0.0}, fc1, l2) == 1.7
    assert in_step_factor(None, fc1, l2, default=1.2) == 1.2
    # fitted: f comes back from the passes that fit, and a streaming pass is
    # priced unscaled (cifar's fc1, 8 MiB, streams; tiny's and mnist's do not)
    prof = Profile.synthetic(backend="cpu").data
    prof["cache"] = {"l2_bytes": l2}
    recs = []
    for net in ("tiny", "cifar", "mnist"):
        for n in (1, 4, 16):
            for (layer, pas), t in _truth(prof, net, n).items():
                recs.append({"kind": "layer_pass", "model": net, "n_subbatch": n, "layer": layer, "pass": pas,
                             "t": t, "holdout": n == 4})
    lt = fit.fit_layer_terms(prof, recs)
    assert lt["fc_fwd"]["l2_only"] and lt["fc_fwd"]["f"] == pytest.approx(F["fc_fwd"], rel=1e-5)
    priced = Profile(dict(prof, layer_terms=lt))
    ks = fit._kernel_sums(Profile(prof), "cifar", 8)[("fc1", "bwd")][0]
    got = sum(r[4] for r in model.compute_gradient_terms(spec_mod.get_spec("cifar"), 8, priced)
              if r[:2] == ("fc1", "bwd"))
    assert got == pytest.approx(ks + B["fc_bwd"], rel=1e-5)


def test_hidden_fc_passes_pay_per_input_float_and_output_layers_do_not():
    """A hidden FC pass in a step runs beyond f times its op by an amount
    that grows with its input (``fc_input_floats``): the fit recovers that
    ``x`` beside f and b, leaves it 0 for the output layers and the
    convolutions (whose records carry none here: the fit must not invent
    one), and prices a net no record came from."""
    x = {"fc_fwd": 1.5e-9, "fc_bwd": 2.5e-9}
    prof = Profile.synthetic(backend="cpu").data
    recs = []
    for net in ("tiny", "cifar", "mnist", "digits"):
        for n in (1, 4, 16, 32):
            for (layer, pas), t in _truth(prof, net, n, x=x).items():
                recs.append({"kind": "layer_pass", "model": net, "n_subbatch": n, "layer": layer, "pass": pas,
                             "t": t, "holdout": n == 4})
    lt = fit.fit_layer_terms(prof, recs)
    for key in F:
        assert lt[key]["x"] == pytest.approx(x.get(key, 0.0), rel=1e-5, abs=1e-15), key
        assert lt[key]["f"] == pytest.approx(F[key], rel=1e-5)
        assert lt[key]["error"]["holdout"]["max"] < 1e-6
    net = spec_mod.NetSpec("m", 28, 1, 5, ((16, 2), (32, 2)), (256, 64, 10))
    priced = Profile(dict(prof, layer_terms=lt))
    want = _truth(prof, net, 8, x=x)
    got = {}
    for layer, pas, _, _, t in model.compute_gradient_terms(net, 8, priced):
        if pas != "loss":
            got[(layer, pas)] = got.get((layer, pas), 0.0) + t
    assert got == pytest.approx(want, rel=1e-6)
    # by hand: fc1 reads 32 x 7 x 7 floats a sample; a convolution none
    geoms = spec_mod.layers(net, 8)
    assert fc_input_floats(geoms[2], 8) == 8 * 32 * 7 * 7 and fc_input_floats(geoms[0], 8) == 0.0
    # without the term (x 0), fc1's forward is priced short by exactly it
    no_x = Profile(dict(prof, layer_terms={k: dict(v, x=0.0) for k, v in lt.items()}))
    short = sum(r[4] for r in model.compute_gradient_terms(net, 8, no_x) if r[:2] == ("fc1", "fwd"))
    assert want[("fc1", "fwd")] - short == pytest.approx(x["fc_fwd"] * 8 * 32 * 7 * 7, rel=1e-6)


def test_refill_tau_recovered_from_a_synthetic_decay():
    """``refill_decay`` records on a known curve t0 + a (1 - exp(-gap / tau))
    give back tau per pass (the grid's step is 3.4 %); too few gaps give none."""
    from engine.perf.cache_decay import DECAY_GAPS, fit_refill_tau
    tau = {"fwd": 0.012, "bwd": 0.005}
    recs = [{"kind": "refill_decay", "pass": pas, "gap": g, "t": 7e-4 + 6e-4 * (1 - np.exp(-g / tau[pas]))}
            for pas in tau for g in DECAY_GAPS]
    got = fit_refill_tau(recs)
    for pas in tau:
        assert got[pas] == pytest.approx(tau[pas], rel=0.02)
    assert fit_refill_tau([r for r in recs if r["gap"] < 0.002]) is None
    assert fit_refill_tau([]) is None


def test_refill_tau_stops_at_the_longest_gap():
    """A pass whose time climbs in a line over every gap (no bend: the decay
    goes on beyond them) fits the longest gap, not the grid's 300 ms, which
    priced the ages beyond the gaps by extrapolation (cpu_test22: cifar's
    shared configurations 43-55 % long); a curve that bends inside the gaps
    keeps its tau."""
    from engine.perf.cache_decay import DECAY_GAPS, TAU_GRID, fit_refill_tau
    line = [{"kind": "refill_decay", "pass": pas, "gap": g, "t": 1.5e-3 + 0.025 * g}
            for pas in ("fwd", "bwd") for g in DECAY_GAPS]
    assert fit_refill_tau(line) == {"fwd": max(DECAY_GAPS), "bwd": max(DECAY_GAPS)}
    assert TAU_GRID[-1] > 4 * max(DECAY_GAPS)          # the grid alone would have gone past them
    tau = float(TAU_GRID[np.argmin(abs(TAU_GRID - 0.02))])
    bent = [dict(r, t=7e-4 + 6e-4 * (1 - np.exp(-r["gap"] / tau))) for r in line]
    assert fit_refill_tau(bent) == {"fwd": tau, "bwd": tau}
    # sprint profile's fit table says which pass stopped there
    import engine.perf.fit  # noqa: F401  (fit_report imports fit_steps, which needs fit loaded first)
    from engine.perf.fit_report import _decay_lines
    terms = {"fc_fwd": {"tau": tau}, "fc_bwd": {"tau": max(DECAY_GAPS)}}
    line_out, = _decay_lines({"layer_terms": terms})
    assert "bwd capped at the longest gap swept, 64 ms" in line_out and "fwd 20" in line_out
    assert "capped" not in _decay_lines({"layer_terms": {"fc_bwd": {"tau": tau}}})[0]


def test_cold_weights_priced_by_their_age_in_the_step():
    """Passes that pay w per cold byte times the share the caches lost since
    the step last touched them (``refill_share`` of ``pass_ages``, steps back
    to back): f, b and w come back, a held-out net is priced exactly, its
    short step refilling part of its cold bytes; a profile without tau (older
    ones) prices them all."""
    from engine.perf.cache_decay import pass_ages, refill_share
    prof = Profile.synthetic(backend="cpu").data
    l2 = 1 << 20
    prof["cache"] = {"l2_bytes": l2}
    W = {"conv_fwd": 1e-10, "conv_bwd": 2e-10, "fc_fwd": 3e-10, "fc_bwd": 5e-10}
    grid = np.geomspace(1e-4, 0.3, 241)           # fit_refill_tau's grid: taus on it come back exactly
    tau = {"fwd": float(grid[np.argmin(abs(grid - 0.004))]), "bwd": float(grid[np.argmin(abs(grid - 0.002))])}

    def truth(net, n):
        base = _truth(prof, net, n)
        geoms = {g.name: g for g in spec_mod.layers(spec_mod.get_spec(net))}
        full = {k: W[f"{geoms[k[0]].kind}_{k[1]}"] * max(4 * spec_mod._prod(geoms[k[0]].w_shape) - l2, 0)
                for k in base}
        t = {k: base[k] + full[k] for k in base}
        for _ in range(200):      # the fixed point: the ages hold the cold costs
            step = sum(t.values())
            t = {k: base[k] + full[k] * refill_share(pass_ages(t[(k[0], "fwd")], t[(k[0], "bwd")], step)[k[1]],
                                                     tau[k[1]]) for k in base}
        return t, full
    recs = [{"kind": "refill_decay", "pass": pas, "gap": g, "t": 1e-3 + 1e-3 * (1 - np.exp(-g / tau[pas]))}
            for pas in tau for g in (0.0, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032)]
    for net in ("tiny", "cifar", "mnist"):
        for n in (1, 4, 16):
            for (layer, pas), t in truth(net, n)[0].items():
                recs.append({"kind": "layer_pass", "model": net, "n_subbatch": n, "layer": layer, "pass": pas,
                             "t": t, "holdout": n == 4})
    lt = fit.fit_layer_terms(prof, recs)
    for key in W:
        assert lt[key]["tau"] == pytest.approx(tau[key.split("_")[1]], rel=1e-9)
        assert lt[key]["f"] == pytest.approx(F[key], rel=1e-5)
        assert lt[key]["w"] == pytest.approx(W[key], rel=1e-4)
    priced = Profile(dict(prof, layer_terms=lt))
    big = spec_mod.NetSpec("big", 16, 1, 3, ((16, 2),), (1024, 10))    # fc1: 4 MiB of weights, a short step
    want, full = truth(big, 8)
    got = {}
    for layer, pas, kern, _, t in model.compute_gradient_terms(big, 8, priced):
        if pas != "loss":
            got[(layer, pas)] = got.get((layer, pas), 0.0) + t
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5)
    cold = {k: want[k] - _truth(prof, big, 8)[k] for k in want}
    assert 0.05 * full[("fc1", "bwd")] < cold[("fc1", "bwd")] < 0.95 * full[("fc1", "bwd")]
    old = Profile(dict(prof, layer_terms={k: {a: b for a, b in v.items() if a != "tau"} for k, v in lt.items()}))
    rows = [r for r in model.compute_gradient_terms(big, 8, old) if r[2] == "cold-weights"]
    assert {(r[0], r[1]): r[4] for r in rows} == pytest.approx({k: v for k, v in full.items() if v > 0})
