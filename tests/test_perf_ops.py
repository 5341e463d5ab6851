"""The whole-op terms of the performance model (engine.perf.sweep_ops,
fit.fit_op_terms): fitted on synthetic records with known coefficients,
held-out shapes predicted, and the model pricing the convolution and FC
layers by them when the profile was swept on the path in force."""
import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import fit, model
from engine.perf.profile import Profile
from engine.perf.sweep import QUICK
from engine.perf.sweep_ops import (OP_FEATURES, OP_KINDS, conv_op_shapes, fc_op_shapes, op_features, op_path)

# Known costs: a per-call Python cost, GEMM flops, packing and the extra dX terms.
# Beyond WIDE taps (9x9 and 11x11 kernels) packing costs more per element;
# up to them the forward's packer costs per column and tap for its tap table.
WIDE = 49
TRUE = {"conv_fwd": {"1": 20e-6, "mnk": 2e-11, "nk": 1e-9, "nk_wide": 4e-10, "tap_table": 3e-9},
        "conv_bwd_dw": {"1": 30e-6, "mnk": 2.5e-11, "nk": 1.2e-9, "m": 1e-7},
        "conv_bwd": {"1": 40e-6, "mnk": 5e-11, "nk": 1.2e-9, "pack_dy": 8e-10, "dx_out": 5e-10,
                     "pack_dy_wide": 1.5e-9},
        "fc_fwd": {"1": 8e-6, "mnk": 3e-11, "nk": 4e-10},
        "fc_bwd_dw": {"1": 15e-6, "mnk": 3e-11, "nk": 5e-10},
        "fc_bwd": {"1": 22e-6, "mnk": 6e-11, "nk": 9e-10, "mn": 1e-9}}


def true_time(kind, m, n, k, c):
    return sum(TRUE[kind].get(f, 0.0) * v for f, v in zip(OP_FEATURES, op_features(m, n, k, c, WIDE)))


def synthetic_records(noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    cfg = dict(QUICK)
    recs = []
    for i, (b, C, H, c, M) in enumerate(conv_op_shapes(cfg)):
        for kind in ("conv_fwd", "conv_bwd_dw", "conv_bwd"):
            m, n, k = M, b * H * H, C * c * c
            t = true_time(kind, m, n, k, c) * (1 + noise * rng.standard_normal())
            recs.append(dict(kind=kind, m=m, n=n, k=k, c=c, t=t, std=0.0, holdout=i % 4 == 3,
                             path=op_path()["conv"]))
    for i, (N, fin, fout) in enumerate(fc_op_shapes(cfg)):
        for kind in ("fc_fwd", "fc_bwd_dw", "fc_bwd"):
            t = true_time(kind, N, fout, fin, 1) * (1 + noise * rng.standard_normal())
            recs.append(dict(kind=kind, m=N, n=fout, k=fin, c=1, t=t, std=0.0, holdout=i % 4 == 3,
                             path=op_path()["fc"]))
    return recs


def test_shapes_hold_out_whole_shapes_and_stay_in_bounds():
    cfg = dict(QUICK)
    conv = conv_op_shapes(cfg)
    assert len(conv) >= cfg["op_shapes"] and all(b * C * H * H * c * c * M <= 16 * cfg["op_max"]
                                                  for b, C, H, c, M in conv)
    assert sum(b * C * H * H * c * c * M <= cfg["op_max"] for b, C, H, c, M in conv) >= cfg["op_shapes"]
    # the swept nets' own layers are on the grid (cifar conv2 at batch 16 included)
    assert (16, 64, 32, 3, 64) in conv
    assert all(H >= c for _, _, H, c, _ in conv)
    fc = fc_op_shapes(cfg)
    assert len(fc) >= cfg["op_shapes"] and all(fin * fout <= 1 << 22 for _, fin, fout in fc)


def test_fit_recovers_known_costs_on_held_out_shapes():
    recs = synthetic_records()
    ops = fit.fit_op_terms(recs)
    assert set(ops) == set(OP_KINDS)
    p = Profile({"ops": ops})
    for kind, o in ops.items():
        assert o["error"]["holdout"]["n"] > 5
        assert o["error"]["holdout"]["max"] < 1e-3, (kind, o["error"])
        held = [r for r in recs if r["kind"] == kind and r["holdout"]]
        for r in held[:5]:
            assert p.op(kind, r["m"], r["n"], r["k"], r["c"]) == pytest.approx(r["t"], rel=1e-3)


def test_fit_finds_where_the_packing_leaves_its_tap_table():
    """The threshold is found in the records: the ops whose truth has wide
    terms get WIDE, dW (none) gets no threshold; an op swept on 3x3 to 7x7
    only cannot have one."""
    cfg = dict(QUICK)
    assert {c for _, _, _, c, _ in conv_op_shapes(cfg)} >= {3, 5, 7, 9, 11}
    ops = fit.fit_op_terms(synthetic_records())
    assert ops["conv_fwd"]["wide_taps"] == WIDE and ops["conv_bwd"]["wide_taps"] == WIDE
    assert ops["conv_bwd_dw"]["wide_taps"] is None and ops["fc_fwd"]["wide_taps"] is None
    narrow = [r for r in synthetic_records() if r["c"] <= 7]
    assert fit.wide_taps([r for r in narrow if r["kind"] == "conv_fwd"]) is None
    # a 9x9 layer priced by the fit carries the wide term (4e-10 per packed element here)
    p = Profile({"ops": ops})
    m, n, k = 24, 980, 12 * 81
    assert p.op("conv_fwd", m, n, k, 9) == pytest.approx(true_time("conv_fwd", m, n, k, 9), rel=1e-3)
    assert p.op("conv_fwd", m, n, k, 9) > p.op("conv_fwd", m, n, k, 3) + 0.9 * 4e-10 * n * k


def test_tap_table_term_is_per_column_and_tap_up_to_the_table_size():
    """n c^2 for convolutions of up to ``wide`` taps (TABLE_TAPS without a
    threshold), whatever the channels; zero for FC ops and wide kernels."""
    col = OP_FEATURES.index("tap_table")
    assert op_features(10, 1000, 25, 5, WIDE)[col] == 1000 * 25
    assert op_features(10, 1000, 64 * 25, 5, WIDE)[col] == 1000 * 25     # 64 channels: the same table
    assert op_features(10, 1000, 81, 9, WIDE)[col] == 0.0                 # beyond the table: general path
    assert op_features(10, 1000, 81, 9, None)[col] == 0.0 and op_features(10, 1000, 49, 7, None)[col] == 49000
    assert op_features(10, 1000, 300, 1, WIDE)[col] == 0.0                # FC


def test_fit_prices_few_channel_convolutions_by_their_tap_table(monkeypatch):
    """A 5x5 forward over one channel spends as much on its tap table as on
    packing: the fit with the term prices it (held out), the features
    without it cannot, and an op priced without the table (dW) gets no
    coefficient for it even where its times had one."""
    from engine.perf import sweep_ops
    recs = synthetic_records()
    m, n, k = 10, 16 * 36 * 36, 25                         # 16 images of 36 x 36 x 1, 10 filters 5x5
    table = TRUE["conv_fwd"]["tap_table"] * n * 25
    assert table > 0.5 * true_time("conv_fwd", m, n, k, 5)
    p = Profile({"ops": fit.fit_op_terms(recs)})
    assert p.op("conv_fwd", m, n, k, 5) == pytest.approx(true_time("conv_fwd", m, n, k, 5), rel=1e-3)
    one = [r for r in recs if r["kind"] == "conv_fwd" and r["holdout"] and r["k"] == r["c"] ** 2 <= WIDE]
    assert len(one) >= 3
    worst = lambda prof: max(abs(prof.op("conv_fwd", r["m"], r["n"], r["k"], r["c"]) / r["t"] - 1) for r in one)
    assert worst(p) < 1e-3
    monkeypatch.setattr(sweep_ops, "TABLE_OPS", ())
    assert worst(Profile({"ops": fit.fit_op_terms(recs)})) > 0.05
    monkeypatch.undo()
    # dW priced from times that have a table cost: its coefficient stays 0
    dw = [dict(r, kind="conv_bwd_dw") for r in recs if r["kind"] == "conv_fwd"]
    got = fit.fit_op_terms(dw)["conv_bwd_dw"]
    assert all(reg["coef"]["tap_table"] == 0.0 for reg in got["regimes"])


def test_fit_with_noise_stays_near_the_truth():
    recs = synthetic_records(noise=0.03, seed=1)
    ops = fit.fit_op_terms(recs)
    for kind, o in ops.items():
        # 3 % noise: the held-out error is the noise's, not a misfit's
        assert o["error"]["holdout"]["median"] < 0.05, (kind, o["error"])


def _profile_with_ops(path=None):
    p = Profile.synthetic(backend="cpu")
    data = dict(p.data, ops=fit.fit_op_terms(synthetic_records()))
    if path is not None:
        for o in data["ops"].values():
            o["path"] = path
    return Profile(data)


def test_model_prices_conv_and_fc_by_the_ops_on_their_path():
    p = _profile_with_ops()
    sp = spec_mod.get_spec("digits")
    rows = model.compute_gradient_terms(sp, 4, p)
    kerns = {(r[0], r[1], r[2]) for r in rows}
    assert ("conv1", "fwd", "conv_fwd") in kerns and ("conv1", "bwd", "conv_bwd_dw") in kerns
    assert ("conv2", "bwd", "conv_bwd") in kerns and ("fc1", "bwd", "fc_bwd") in kerns
    assert not any(r[2] in ("im2col", "col2im", "to_nchw", "to_cnhw", "relu_fwd") and r[0].startswith("conv")
                   for r in rows)
    g = spec_mod.layers(sp, 4)[1]
    want = true_time("conv_bwd", *g.gemm_fwd, sp.c)
    got = [r[4] for r in rows if r[:3] == ("conv2", "bwd", "conv_bwd")][0]
    assert got == pytest.approx(want, rel=1e-3)


def test_ops_of_another_path_are_not_used():
    p = _profile_with_ops(path="im2col/blas")
    rows = model.compute_gradient_terms(spec_mod.get_spec("digits"), 4, p)
    assert not any(r[2] in OP_KINDS for r in rows)
    assert any(r[2] == "im2col" for r in rows)


def test_per_step_work_is_a_constant_plus_a_per_parameter_cost():
    """fit_overhead recovers c + d N_Param from net steps that are their
    layers plus that (one constant, the median, gave every net cifar's)."""
    from engine.perf.fit_steps import fit_overhead
    prof = dict(Profile.synthetic(backend="cpu").data)
    prof["layer_terms"] = {f"{k}_{p}": {"f": 1.0, "b": 0.0} for k in ("conv", "fc") for p in ("fwd", "bwd")}
    p = Profile(prof)
    c, d = 40e-6, 1.5e-9
    steps = []
    for i, net in enumerate(("tiny", "digits", "cifar")):
        sp = spec_mod.get_spec(net)
        for n in (1, 4, 16):
            kern = sum(r[4] for r in model.compute_gradient_terms(sp, n, p))
            steps.append({"kind": "net_step", "model": net, "n_subbatch": n,
                          "t": kern + c + d * spec_mod.n_params(sp), "holdout": n == 4})
    got = fit_overhead(prof, [s for s in steps if not s["holdout"]], [s for s in steps if s["holdout"]])
    assert got["per_step"] == pytest.approx(c, rel=1e-6)
    assert got["per_step_param"] == pytest.approx(d, rel=1e-6)
    assert got["error"]["holdout"]["max"] < 1e-9
    p2 = Profile(dict(prof, overhead=got))
    assert p2.per_step(1000) == pytest.approx(c + 1000 * d)


def test_layer_passes_of_spec_nets_hold_out_a_whole_net():
    from engine.perf.sweep_layer_passes import LAYER_PASS_HELDOUT, sweep_layer_passes
    held = {"name": LAYER_PASS_HELDOUT[0], "x0": 8, "m0": 1, "c": 3, "convs": [[2, 2]], "fcs": [4, 3]}
    recs = sweep_layer_passes({"net_batches": (7,), "layer_pass_batches": (1, 2, 3), "layer_pass_repeats": 2,
                               "repeats": 1, "nets": ("tiny",), "layer_pass_nets": ("tiny", held)})
    by = {(r["model"], r["n_subbatch"]): r["holdout"] for r in recs}
    assert by[("tiny", 1)] is False and by[("tiny", 2)] is True           # the middle batch size
    assert all(by[(held["name"], n)] for n in (1, 2, 3))                 # the whole net
    r = next(r for r in recs if r["model"] == held["name"])
    assert spec_mod.get_spec(r["spec"]).name == held["name"]            # a fit can rebuild it


def _assert_in_no_sweep(files, shared_fcs=()):
    """The nets of ``files`` (under bench/specs) are in no sweep: not the op,
    layer-pass, net-step or runner sweeps, nor the conv and FC shapes they time
    (but the FC layers ``(inputs, outputs)`` in ``shared_fcs``)."""
    from pathlib import Path
    from engine.perf.sweep import mode_config
    from engine.perf.sweep_kernels import LAYER_NETS, SWEPT_NETS
    from engine.perf.sweep_layer_passes import LAYER_PASS_NETS
    from engine.perf.sweep_ops import conv_op_shapes, fc_op_shapes
    from engine.perf.sweep_runner import CONTENTION_WORKLOADS, LONG_WORKLOADS, MID_WORKLOADS
    specs = Path(__file__).resolve().parents[1] / "bench" / "specs"
    held = [spec_mod.get_spec(specs / f) for f in files]
    swept = {spec_mod.get_spec(n).name for n in LAYER_PASS_NETS + LAYER_NETS + SWEPT_NETS}
    swept |= {spec_mod.get_spec(n).name for n, _ in CONTENTION_WORKLOADS + MID_WORKLOADS}
    swept |= {spec_mod.get_spec(specs.parents[1] / f).name for f, _ in LONG_WORKLOADS}
    assert not {sp.name for sp in held} & swept
    from engine.perf.pool_cost import pool_shapes
    for quick in (True, False):
        cfg = mode_config(quick)
        convs, fcs = set(conv_op_shapes(cfg)), set(fc_op_shapes(cfg))
        pools = {(n * m, side, p) for n, m, side, p in pool_shapes(cfg)}
        for sp in held:
            for g in spec_mod.layers(sp, 1):
                for b in set(cfg["batches"]) | set(cfg["net_batches"]):
                    if g.kind == "conv":
                        assert (b, g.in_shape[0], g.in_shape[1], sp.c, g.w_shape[0]) not in convs
                        m, side, _ = g.extra["conv_out"]
                        assert g.pool == 1 or (b * m, side, g.pool) not in pools
                    elif (g.w_shape[1], g.w_shape[0]) not in shared_fcs:
                        assert (b, g.w_shape[1], g.w_shape[0]) not in fcs


def test_no_sweep_uses_test_set_8():
    """Test set 8's nets (bench/specs/heldout_k11, heldout_five; RESULTS
    section 4) are in no sweep."""
    _assert_in_no_sweep(("heldout_k11.json", "heldout_five.json"))


def test_no_sweep_uses_test_set_9():
    """Test set 9's nets (bench/specs/heldout_w3, heldout_shallow; RESULTS
    section 4, registered 2026-12-01 12:25 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_w3.json", "heldout_shallow.json"))


def test_no_sweep_uses_test_set_10():
    """Test set 10's nets (bench/specs/heldout_d8, heldout_k5w; RESULTS
    section 4, registered 2026-12-01 15:10 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_d8.json", "heldout_k5w.json"))


def test_no_sweep_uses_test_set_11():
    """Test set 11's nets (bench/specs/heldout_bigfc, heldout_d4; RESULTS
    section 4, registered 2026-12-01 17:45 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_bigfc.json", "heldout_d4.json"))


def test_no_sweep_uses_test_set_12():
    """Test set 12's nets (bench/specs/heldout_fc3, heldout_k5d; RESULTS
    section 4, registered 2026-12-01 20:32 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_fc3.json", "heldout_k5d.json"))


def test_no_sweep_uses_test_set_13():
    """Test set 13's nets (bench/specs/heldout_m3, heldout_fc2; RESULTS
    section 4, registered 2026-12-01 23:19 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_m3.json", "heldout_fc2.json"))


def test_no_sweep_uses_test_set_14():
    """Test set 14's nets (bench/specs/heldout_c3x, heldout_k7f; RESULTS
    section 4, registered 2026-12-02 02:28 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_c3x.json", "heldout_k7f.json"))


def test_no_sweep_uses_test_set_15():
    """Test set 15's nets (bench/specs/heldout_k5p, heldout_c3w; RESULTS
    section 4, registered 2026-12-02 05:34 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5p.json", "heldout_c3w.json"))


def test_no_sweep_uses_test_set_16():
    """Test set 16's nets (bench/specs/heldout_k5q, heldout_c3t; RESULTS
    section 4, registered 2026-12-02 08:26 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5q.json", "heldout_c3t.json"))


def test_no_sweep_uses_test_set_17():
    """Test set 17's nets (bench/specs/heldout_k5r, heldout_c3s; RESULTS
    section 4, registered 2026-12-02 11:45 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5r.json", "heldout_c3s.json"))


def test_no_sweep_uses_test_set_18():
    """Test set 18's nets (bench/specs/heldout_k5m, heldout_c3v; RESULTS
    section 4, registered 2026-12-02 14:40 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5m.json", "heldout_c3v.json"))


def test_no_sweep_uses_test_set_19():
    """Test set 19's nets (bench/specs/heldout_k5s, heldout_c3u; RESULTS
    section 4, registered 2026-12-02 18:23 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5s.json", "heldout_c3u.json"))


def test_no_sweep_uses_test_set_20():
    """Test set 20's nets (bench/specs/heldout_k5t, heldout_c3r; RESULTS
    section 4, registered 2026-12-02 19:50 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5t.json", "heldout_c3r.json"))


def test_no_sweep_uses_test_set_21():
    """Test set 21's nets (bench/specs/heldout_k5u, heldout_c3y; RESULTS
    section 4, registered 2026-12-02 21:01 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5u.json", "heldout_c3y.json"))


def test_no_sweep_uses_test_set_22():
    """Test set 22's nets (bench/specs/heldout_k5v, heldout_c3z; RESULTS
    section 4, registered 2026-12-02 22:09 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5v.json", "heldout_c3z.json"))


def test_no_sweep_uses_test_set_23():
    """Test set 23's nets (bench/specs/heldout_k5x, heldout_c3a; RESULTS
    section 4, registered 2026-12-02 22:53 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5x.json", "heldout_c3a.json"))


def test_no_sweep_uses_test_set_24():
    """Test set 24's nets (bench/specs/heldout_k5y, heldout_c3b; RESULTS
    section 4, registered 2026-12-06 06:08 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5y.json", "heldout_c3b.json"))


def test_no_sweep_uses_test_set_25():
    """Test set 25's nets (bench/specs/heldout_k5z, heldout_c3c; RESULTS
    section 4, registered 2026-12-06 10:58 UTC) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5z.json", "heldout_c3c.json"))


def test_no_sweep_uses_test_set_26():
    """Test set 26's nets (bench/specs/heldout_k5e, heldout_c3d; RESULTS
    section 4, registered 2026-12-06 after 6395c60) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5e.json", "heldout_c3d.json"))


def test_no_sweep_uses_test_set_27():
    """Test set 27's nets (bench/specs/heldout_k5f, heldout_c3e; RESULTS
    section 4, registered 2026-12-06 for a steady host) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5f.json", "heldout_c3e.json"))


def test_no_sweep_uses_test_set_28():
    """Test set 28's nets (bench/specs/heldout_k5g, heldout_c3f; RESULTS
    section 4, registered 2026-12-06 for a steady host) are in no sweep but
    for one layer shape: c3f's output layer, 84 -> 10, is heldout-lenet's,
    which the FC op sweep times. The registration said "in no sweep" with
    this test, which was not committed then (added after the set was judged;
    RESULTS says so)."""
    _assert_in_no_sweep(("heldout_k5g.json",))
    _assert_in_no_sweep(("heldout_c3f.json",), shared_fcs={(84, 10)})
    with pytest.raises(AssertionError):
        _assert_in_no_sweep(("heldout_c3f.json",))


def test_no_sweep_uses_test_set_29():
    """Test set 29's nets (bench/specs/heldout_k5h, heldout_c3g; RESULTS
    section 4, registered 2026-12-06 for a steady host) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5h.json", "heldout_c3g.json"))


def test_no_sweep_uses_test_set_30():
    """Test set 30's nets (bench/specs/heldout_k5i, heldout_c3h; RESULTS
    section 4, registered 2026-12-06 for the two-state host) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5i.json", "heldout_c3h.json"))


def test_no_sweep_uses_test_set_31():
    """Test set 31's nets (bench/specs/heldout_k5j, heldout_c3i; RESULTS
    section 4, registered 2026-12-07 on the AMD EPYC VM) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5j.json", "heldout_c3i.json"))


def test_no_sweep_uses_test_set_32():
    """Test set 32's nets (bench/specs/heldout_k5k, heldout_c3j; RESULTS
    section 4, registered 2026-12-07 before the per-algorithm conv op fits
    it judges) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5k.json", "heldout_c3j.json"))


def test_no_sweep_uses_test_set_33():
    """Test set 33's nets (bench/specs/heldout_k5l, heldout_c3k; RESULTS
    section 4, registered 2026-12-07 for the refitted profile cpu_test29k)
    are in no sweep."""
    _assert_in_no_sweep(("heldout_k5l.json", "heldout_c3k.json"))


def test_no_sweep_uses_test_set_34():
    """Test set 34's nets (bench/specs/heldout_k5m34, heldout_c3l; RESULTS
    section 4, registered 2026-12-07 for the long steps swept within the
    cores and the wake wait read by size) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5m34.json", "heldout_c3l.json"))


def test_no_sweep_uses_test_set_35():
    """Test set 35's nets (bench/specs/heldout_k5n, heldout_c3m; RESULTS
    section 4, registered 2026-12-07 for the part-drift mend and the wake
    wait by size) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5n.json", "heldout_c3m.json"))


def test_no_sweep_uses_test_set_36():
    """Test set 36's nets (bench/specs/heldout_k5o, heldout_c3n; RESULTS
    section 4, registered 2026-12-07 on a fresh profile, cpu_test36, with
    vectors of 0.37 M and 0.12 M parameters, either side of the sets
    before) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5o.json", "heldout_c3n.json"))


def test_no_sweep_uses_test_set_37():
    """Test set 37's nets (bench/specs/heldout_k5_37, heldout_c3_37; RESULTS
    section 4, registered 2026-12-07 for the sweep's marks timing the
    calibration's compute part) are in no sweep."""
    _assert_in_no_sweep(("heldout_k5_37.json", "heldout_c3_37.json"))


def test_sweeps_see_the_seen_test_nets():
    """The op and layer-pass sweeps time the nets of test sets 1-7 (seen:
    7x7 and 9x9 kernels among them); set 8's are in none
    (``test_no_sweep_uses_test_set_8``)."""
    from pathlib import Path
    from engine.perf.sweep import mode_config
    from engine.perf.sweep_kernels import LAYER_NETS, SWEPT_NETS
    from engine.perf.sweep_layer_passes import LAYER_PASS_NETS, SEEN_NETS
    from engine.perf.sweep_ops import conv_op_shapes, fc_op_shapes
    from engine.perf.sweep_runner import CONTENTION_WORKLOADS, MID_WORKLOADS
    cfg = mode_config(True)
    convs, fcs = conv_op_shapes(cfg), fc_op_shapes(cfg)
    specs = Path(__file__).resolve().parents[1] / "bench" / "specs"
    name = lambda f: spec_mod.get_spec(specs / f).name
    swept = {spec_mod.get_spec(n).name for n in LAYER_PASS_NETS + LAYER_NETS + SWEPT_NETS}
    swept |= {spec_mod.get_spec(n).name for n, _ in CONTENTION_WORKLOADS + MID_WORKLOADS}
    assert "heldout-k7" in swept
    assert {name(f) for f in ("heldout_k5c3.json", "heldout_pool4.json", "heldout_lenet.json",
                              "heldout_allconv.json", "heldout_k9.json")} <= swept
    # the seen spec files and the sweeps' copies of them are the same nets
    for f in ("heldout_k9.json", "heldout_lenet.json", "heldout_allconv.json"):
        sp = spec_mod.get_spec(specs / f)
        assert sp.hash() == spec_mod.get_spec(next(n for n in SEEN_NETS if isinstance(n, dict)
                                                   and n["name"] == sp.name)).hash()
    # heldout-allconv's output layer reads its 4x4x64 map: that FC shape is swept.
    assert (cfg["net_batches"][0], 4 * 4 * 64, 10) in fcs
    k7 = spec_mod.get_spec(next(n for n in SEEN_NETS if isinstance(n, dict) and n["name"] == "heldout-k7"))
    for g in spec_mod.layers(k7, 1):
        if g.kind == "conv":
            assert (cfg["batches"][-1], g.in_shape[0], g.in_shape[1], 7, g.w_shape[0]) in convs
        else:
            assert (cfg["net_batches"][0], g.w_shape[1], g.w_shape[0]) in fcs
    assert sum(s[3] == 7 for s in convs) >= 0.1 * len(convs)


def test_long_step_contention_sweep_records_its_seen_spec_files_apart(monkeypatch, tmp_path):
    """``runner contention long``: each seen net's entries carry its spec and
    its name, under their own source, LONG_REPEATS runs per sharing; without
    the spec files (an install without bench/) the sweep says it skipped."""
    from pathlib import Path
    from engine.perf import sweep_runner as sr
    calls = []

    def job(model, data, n, r, w, seconds, out, timeout=300):
        calls.append((model, n, r, w))
        t = {k: {"mean": 1e-3 * (1 + (k == "ComputeGradient") * r * w), "count": 10}
             for k in sr.WORKER_TIMERS + sr.UPDATER_TIMERS}
        return {"timers": t, "T_GPU": 0.01, "T_Update": 0.01, "N_Minibatch_avg": 4.0}
    monkeypatch.setattr(sr, "runner_job", job)
    monkeypatch.setattr(sr, "_solo", lambda model, n: (1e-3, 1e-3))
    monkeypatch.setattr(sr, "synthetic_npz", lambda model, path, n: None)
    recs = sr.sweep_contention_long({"repeats": 3})
    assert len(recs) == sr.LONG_REPEATS * len(sr.LONG_WORKLOADS) * len(sr.LONG_PAIRS)
    for (f, n) in sr.LONG_WORKLOADS:
        sp = spec_mod.get_spec(Path(sr._ENGINE_ROOT) / f)
        mine = [r for r in recs if r["model"] == sp.name]
        assert len(mine) == sr.LONG_REPEATS * len(sr.LONG_PAIRS)
        for r in mine:
            assert r["source"] == sr.LONG_SOURCE and r["n_subbatch"] == n
            assert spec_mod.get_spec(r["spec"]).hash() == sp.hash()
            assert r["rel"] == pytest.approx((1 + r["ranks"] * r["workers"]) / 2)
    assert {(c[2], c[3]) for c in calls} == {(1, 1)} | set(sr.LONG_PAIRS)
    monkeypatch.setattr(sr, "_ENGINE_ROOT", str(tmp_path))
    skipped = []
    assert sr.sweep_contention_long({"repeats": 3}, skipped) == []
    assert len(skipped) == 1 and "runner contention long" in skipped[0]
