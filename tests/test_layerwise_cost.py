"""Layer-wise cost model: configurations, t_c / t_x / t_s against hand
counts and the existing per-layer model, the search on real cost tables
against brute force, plans as files and the refusals of bad plans."""
import math

import numpy as np
import pytest

from engine import spec as spec_mod
from engine.perf import layerwise as L
from engine.perf.layerwise_search import brute_force, search
from engine.perf.model import compute_gradient_terms
from engine.perf.profile import Profile

PROF = Profile.synthetic(sgemm_flop_s=1e12, vec_bytes_s=1e11, launch=5e-6, allreduce_bw=1e10)
PROF.data["p2p"] = {"latency": 1e-5, "per_byte": 1e-10}


def _node(spec, name):
    return next(v for v in L.graph_nodes(spec) if v.name == name)


def test_configs_divide_shape_and_devices():
    for v in L.graph_nodes("cifar"):
        cs = L.configs(v, 8, 64)
        assert cs and len(set(cs)) == len(cs)
        for n, c, h, w in cs:
            assert 8 % (n * c * h * w) == 0 and 64 % n == 0 and v.out[0] % c == 0
            assert v.out[1] % h == 0 and v.out[2] % w == 0
            if v.kind != "conv":
                assert (h, w) == (1, 1)
            if v.kind == "softmax":
                assert c == 1


def test_single_device_compute_equals_the_existing_model():
    for model in ("digits", "cifar"):
        sp = spec_mod.get_spec(model)
        ours = sum(L.t_compute(v, (1, 1, 1, 1), 16, PROF) for v in L.graph_nodes(sp))
        ref = sum(r[4] for r in compute_gradient_terms(sp, 16, PROF))
        assert ours == pytest.approx(ref, rel=1e-12)


def test_sample_split_divides_the_gemm_work():
    v = _node("cifar", "conv3")
    # SGEMM flops scale by 1/n; launches do not: t(1) - n t(n) = (n - 1) * fixed costs
    t1, t4 = L.t_compute(v, (1, 1, 1, 1), 64, PROF), L.t_compute(v, (4, 1, 1, 1), 64, PROF)
    assert t4 < t1 / 3 and t4 > t1 / 4


def _tx(spec, a, ca, b, cb, batch, n_dev):
    A, B = _node(spec, a), _node(spec, b)
    t, by = L.edge_costs(A, [ca], B, [cb], batch, n_dev, PROF)
    return float(t[0, 0]), float(by[0, 0])


def test_transfer_volumes_by_hand():
    sp = spec_mod.get_spec("cifar")
    lat, per = 1e-5, 4e-10                     # per element (4 bytes)
    # same data-parallel layout: nothing moves
    assert _tx(sp, "conv1", (4, 1, 1, 1), "conv2", (4, 1, 1, 1), 32, 4) == (0.0, 0.0)
    # data-parallel conv6 -> FC split over features: every device gathers the whole batch
    act = 32 * 256 * 4 * 4
    t, by = _tx(sp, "conv6", (4, 1, 1, 1), "fc1", (1, 4, 1, 1), 32, 4)
    assert by == pytest.approx(4 * 2 * 4 * act * 3 / 4 + 4 * 4 * act * 3 / 4)   # fwd+bwd gather, grad reduce
    assert t == pytest.approx(2 * (lat + per * act * 3 / 4) + lat + per * act * 3 / 4)
    # height split in two, 3x3 kernel, no pooling: one halo row each way
    row = 32 * 64 * 32
    t, by = _tx(sp, "conv1", (1, 1, 2, 1), "conv2", (1, 1, 2, 1), 32, 2)
    assert by == pytest.approx(4 * 2 * 2 * row)
    assert t == pytest.approx(2 * (lat + per * row))


def test_sync_is_the_replicas_allreduce():
    v = _node("cifar", "conv4")
    p = v.geom.n_params
    upd = sum(PROF.term(k, p) for k in ("scale", "sub", "add"))
    assert L.t_sync(v, (1, 1, 1, 1), PROF)[0] == pytest.approx(upd)
    assert L.t_sync(v, (4, 1, 1, 1), PROF)[0] == pytest.approx(upd + PROF.allreduce_bw(4, p))
    upd2 = sum(PROF.term(k, p // 2) for k in ("scale", "sub", "add"))
    assert L.t_sync(v, (2, 2, 1, 1), PROF)[0] == pytest.approx(upd2 + PROF.allreduce_bw(2, p // 2))


@pytest.mark.parametrize("model,n_dev,batch", [("tiny", 2, 4), ("tiny", 4, 8), ("digits", 2, 8)])
def test_search_on_real_costs_equals_brute_force(model, n_dev, batch):
    g, nodes, cfgs, _ = L.cost_graph(model, n_dev, batch, PROF)
    if math.prod(len(c) for c in cfgs.values()) > 300_000:
        pytest.skip("too many combinations to enumerate")
    res = search(g)
    ref, _ = brute_force(g)
    assert res.cost == pytest.approx(ref, rel=1e-12)
    plan = L.optimize(model, n_dev, batch, PROF)
    assert plan.predicted["step_s"] == pytest.approx(ref, rel=1e-9)     # evaluate() agrees with the table
    for kind in ("data", "model", "owt"):
        assert L.evaluate(model, L.named_plan(kind, model, n_dev, batch).layers, n_dev, batch,
                          PROF).step_s >= ref * (1 - 1e-12)


def test_plan_round_trip_and_refusals(tmp_path):
    plan = L.optimize("digits", 4, 32, PROF)
    f = tmp_path / "p.json"
    plan.save(f)
    back = L.Plan.load(f)
    assert back.layers == plan.layers and back.batch == 32
    L.check_plan(back, "digits", ranks=4, batch=32)
    with pytest.raises(ValueError, match="not 'tiny'"):
        L.check_plan(back, "tiny", ranks=4)
    with pytest.raises(ValueError, match="job has 2 rank"):
        L.check_plan(L.named_plan("data", "digits", 4, 32), "digits", ranks=2)
    with pytest.raises(ValueError, match="batch 32"):
        L.check_plan(back, "digits", ranks=4, batch=30)
    bad = L.named_plan("data", "digits", 4, 32)
    bad.layers["conv1"] = (1, 3, 1, 1)          # 32 channels are not divisible by 3
    with pytest.raises(ValueError, match="conv1.*does not divide"):
        L.check_plan(bad, "digits", ranks=4)
    bad.layers["conv1"] = (1, 1, 1, 1)
    bad.layers["fc1"] = (1, 1, 2, 1)            # FC layers have no height
    with pytest.raises(ValueError, match="fc1"):
        L.check_plan(bad, "digits", ranks=4)
    ok = L.named_plan("data", "cifar", 4, 32)
    ok.layers["conv1"] = (1, 1, 4, 1)           # not the squarest grid the search keeps, still valid
    L.check_plan(ok, "cifar", ranks=4)
    f.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a layer-wise plan"):
        L.Plan.load(f)
    f.write_text('{"format": "sprint-layerwise-plan", "layers": [{"name": "conv1", "n": 2.0}]}')
    with pytest.raises(ValueError, match=str(f)):
        L.Plan.load(f)


def test_one_weird_trick_is_data_parallel_convs_model_parallel_fcs():
    p = L.named_plan("owt", "cifar", 4, 64)
    assert all(p.layers[n] == (4, 1, 1, 1) for n in p.layers if n.startswith("conv"))
    assert p.layers["fc1"] == (1, 4, 1, 1) and p.layers["softmax"] == (4, 1, 1, 1)


def test_measured_t_c_times_each_block_shape_once_and_prices_the_plan(monkeypatch):
    """OptCNN's measured t_c: every configuration's block of digits on 4
    devices (spatial halos included) runs forward and backward at its
    sub-shape; blocks of the same sub-shape are timed once; the plan's t_c
    is what was timed times the one step factor of the batch, t_x and t_s
    stay the profile's."""
    from engine.perf.layerwise_measure import MeasuredCompute
    m = MeasuredCompute(PROF, "digits", reps=1)
    timed = []
    real = MeasuredCompute._time
    monkeypatch.setattr(MeasuredCompute, "_time", lambda self, node, *a: timed.append((node.name,) + a) or real(self, node, *a))
    plan = L.optimize("digits", 4, 8, m)
    n_cfg = sum(len(L.configs(v, 4, 8)) for v in L.graph_nodes("digits"))
    assert 0 < len(timed) == len(set(timed)) == len(m.cache) <= n_cfg
    assert all(t > 0 for t in m.cache.values()) and m.factors[8] > 0 and list(m.factors) == [8]
    ev, ev_prof = L.evaluate("digits", plan.layers, 4, 8, m), L.evaluate("digits", plan.layers, 4, 8, PROF)
    for v, r, rp in zip(L.graph_nodes("digits"), ev.rows, ev_prof.rows):
        n, c, h, w = plan.layers[v.name]
        assert r["t_c"] == m.cache[(v.name, 8 // n, c, h, w)] * m.factors[8]
        assert (r["t_x"], r["t_s"]) == (rp["t_x"], rp["t_s"])
    assert m.source.endswith("+ measured t_c") and len(timed) == len(m.cache)    # evaluate timed nothing new
