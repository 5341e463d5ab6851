"""Cost models of the DistBelief strategies on synthetic numbers:
Sandblaster's batch time with a heterogeneous replica set (slices on request
against a static split, backup tasks, the server-bound floor) recomputed by
hand from its printed terms and played out by its simulator; Downpour's
closed form against its discrete-event simulator; the `sprint plan` row and
the command-line options both models add to one parser."""
import argparse

import pytest

from engine.perf import downpour as dp
from engine.perf import sandblaster as sb
from engine.perf.profile import Profile


@pytest.fixture(scope="module")
def prof():
    return Profile.synthetic(cores=64, backend="cpu")


@pytest.mark.parametrize("factors", [[1, 1, 1], [1, 1, 2], [1, 3, 4], [2, 1]])
@pytest.mark.parametrize("overhead", [0.0, 0.3])
def test_eval_time_closed_form_against_simulation(factors, overhead):
    for K in (5, 40, 97):
        closed = sb.eval_time(K, 1.0, factors, overhead=overhead)
        sim = sb.simulate_eval(K, 1.0, factors, overhead=overhead)
        # the closed form spreads the last R slices evenly: off by at most one slice
        assert abs(sim["time"] - closed) <= overhead + max(factors) + 1e-9, (K, sim, closed)
        assert sum(sim["slices"]) == K
        static = sb.eval_time(K, 1.0, factors, static=True, overhead=overhead)
        assert static == sb.simulate_eval(K, 1.0, factors, static=True, overhead=overhead)["time"]
        if K % len(factors) == 0:
            assert static == pytest.approx((overhead + max(factors)) * K // len(factors))


def test_backup_copy_cuts_the_slow_replicas_last_slice():
    # 4 slices on 2 replicas, one 10x slower: its slice would end the evaluation at 10
    with_backup = sb.simulate_eval(4, 1.0, [1, 10])
    without = sb.simulate_eval(4, 1.0, [1, 10], backup=False)
    assert without["time"] == 10 and with_backup["time"] < 10 and with_backup["duplicates"] == 1
    assert sb.eval_time(4, 1.0, [1, 10], backup=False) == pytest.approx(2 / 1.1 + 10)
    assert sb.eval_time(4, 1.0, [1, 10]) == pytest.approx(2 / 1.1 + 1)


def test_sandblaster_batch_time_is_its_printed_terms(prof):
    p = sb.predict("digits", 3, 1, 16, prof, batch=384, slow_rank=3, slow_factor=4.0)
    assert p.factors == [1.0, 1.0, 4.0] and p.n_slices == 24 and p.evaluations == 2
    grad = sum(p.replica[k] for k in ("LoadImage", "DeformImage", "ComputeGradient"))
    over = p.replica["Task"] + p.replica["Push"]
    assert p.t_slice == pytest.approx([over + grad, over + grad, over + 4 * grad])
    rate = sum(1 / t for t in p.t_slice)
    assert p.t_eval == pytest.approx(p.extra["fetch"] + 21 / rate + min(p.t_slice))
    assert p.images_per_s == pytest.approx(384 / p.t_batch)
    assert p.t_batch > 2 * p.t_eval
    # full batch: the accepted trial's gradient is the next iteration's
    full = sb.predict("digits", 3, 1, 16, prof, batch=384, full_batch=True, trials=1.5)
    assert full.evaluations == 1.5
    assert "T_batch" in sb.format_prediction(p) and "server utilisation" in sb.format_prediction(p)


def test_sandblaster_takes_the_measured_transport(prof):
    kw = dict(batch=384, slow_rank=3, slow_factor=2.0)
    p = sb.predict("digits", 3, 1, 16, prof, fetch_time=2e-3, push_time=3e-4, server_time=1e-3, **kw)
    assert p.extra["fetch"] == 2e-3 and p.replica["Push"] == 3e-4
    assert p.server == {"Measured": 1e-3, "Coordinate": 3 * sb.MSG}
    grad = sum(p.replica[k] for k in ("LoadImage", "DeformImage", "ComputeGradient"))
    over = p.replica["Task"] + 3e-4
    t_eval = max(2e-3 + sb.eval_time(24, grad, [1, 1, 2], overhead=over), 24 * (1e-3 + 3 * sb.MSG))
    assert p.t_eval == pytest.approx(t_eval)
    # a server that takes long enough for every slice sets the pace
    slow = sb.predict("digits", 3, 1, 16, prof, fetch_time=2e-3, push_time=3e-4, server_time=0.05, **kw)
    assert slow.server_bound and slow.t_eval == pytest.approx(24 * (0.05 + 3 * sb.MSG))


def test_slices_on_request_absorb_a_slow_replica_a_static_split_does_not(prof):
    t = {(f, st): sb.predict("digits", 3, 1, 16, prof, batch=384, slow_rank=3, slow_factor=f, static=st).t_batch
         for f in (1, 2, 4) for st in (False, True)}
    static = t[4, True] / t[1, True]
    onreq = t[4, False] / t[1, False]
    assert static > 3 and onreq < 1.6, t            # 4x slower third: 3 -> 2.25 replicas' worth
    assert t[2, False] / t[1, False] < t[2, True] / t[1, True]
    st = sb.predict("digits", 3, 1, 16, prof, batch=384, static=True)
    assert st.slice == 128 and st.n_slices == 3 and not st.backup


def test_many_replicas_on_tiny_slices_are_server_bound(prof):
    few = sb.predict("digits", 2, 1, 64, prof, batch=4096)
    many = sb.predict("digits", 512, 1, 1, prof, batch=4096)
    assert many.server_bound and many.t_eval == pytest.approx(4096 * sum(many.server.values()))
    assert not few.server_bound and few.rho < 1
    two = sb.predict("digits", 512, 1, 1, prof, batch=4096, servers=2)
    assert two.server["ReceiveSlice"] == pytest.approx(many.server["ReceiveSlice"] / 2, rel=0.2)


def test_sandblaster_options_are_checked(prof):
    with pytest.raises(ValueError, match="--slow-rank"):
        sb.predict("digits", 3, 1, 16, prof, slow_rank=0)
    with pytest.raises(ValueError, match="--slow-factor"):
        sb.predict("digits", 3, 1, 16, prof, slow_rank=1, slow_factor=0.5)
    with pytest.raises(ValueError, match="--slice"):
        sb.predict("digits", 3, 1, 16, prof, slice=0)


def test_sandblaster_simulation_matches_its_closed_form(prof):
    sim = sb.simulate("digits", 3, 1, 16, prof, batch=384, slow_rank=3, slow_factor=4.0)
    p = sim["prediction"]
    assert abs(sim["t_eval"] - p.t_eval) <= max(p.t_slice)
    assert sim["t_eval_static"] == pytest.approx(sim["static_prediction"].t_eval)
    assert sim["eval"]["slices"][2] < sim["eval"]["slices"][0] / 2
    assert "static split of 128" in sb.format_simulation(sim)


@pytest.mark.parametrize("kw", [{}, {"fetch_every": 3, "push_every": 2}, {"servers": 2}])
def test_downpour_simulation_matches_the_closed_form(prof, kw):
    sim = dp.simulate("digits", 4, 1, 32, prof, steps=60, **kw)
    p = sim["prediction"]
    assert sim["images_per_s"] == pytest.approx(p.images_per_s, rel=0.05), dp.format_simulation(sim)
    assert sim["staleness"] == pytest.approx(p.staleness, rel=0.15, abs=0.1)
    assert sim["utilisation"] == pytest.approx(p.rho, rel=0.1)


def test_measured_transport_replaces_the_priced_one(prof):
    kw = dict(fetch_time=2e-3, push_time=1e-4, server_time=1e-3)
    one = dp.predict("digits", 1, 1, 32, prof, **kw)
    grad = sum(one.replica[k] for k in ("LoadImage", "DeformImage", "ComputeGradient", "Accumulate"))
    assert one.t_step == pytest.approx(grad + 2e-3 + 1e-4)       # a single replica never queues
    assert one.server == {"Measured": 1e-3} and one.replica["Push"] == 1e-4
    four = dp.predict("digits", 4, 1, 32, prof, **kw)
    assert four.t_step > grad + 2e-3 + 1e-4 and four.rho == pytest.approx(4e-3 / four.t_step)
    sim = dp.simulate("digits", 4, 1, 32, prof, steps=60, **kw)
    assert sim["utilisation"] == pytest.approx(four.rho, rel=0.15)


def test_a_fetch_probed_under_contention_gets_no_second_queue(prof):
    # measured with the R replicas pushing beside each other, the fetch holds its
    # queue already: the step is the compute plus the measured transport exactly
    kw = dict(fetch_time=4e-3, push_time=1e-4, server_time=1e-3)
    grad = lambda p: sum(p.replica[k] for k in ("LoadImage", "DeformImage", "ComputeGradient", "Accumulate"))
    got = dp.predict("digits", 3, 1, 32, prof, fetch_contended=True, **kw)
    assert got.t_step == pytest.approx(grad(got) + 4e-3 + 1e-4, rel=1e-9)
    assert got.replica["Fetch"] == pytest.approx(4e-3) and got.extra["fetch_contended"]
    assert got.rho == pytest.approx(3e-3 / got.t_step)
    queued = dp.predict("digits", 3, 1, 32, prof, **kw)
    assert queued.t_step > got.t_step and queued.replica["Fetch"] > 4e-3
    # contended or not, a server that cannot keep up sets the pace
    bound = dp.predict("digits", 3, 1, 32, prof, fetch_contended=True, **dict(kw, server_time=1.0))
    assert bound.server_bound and bound.t_step == pytest.approx(3.0)


def test_the_epoch_end_stalls_every_replica_once_per_epoch(prof):
    kw = dict(fetch_time=2e-3, push_time=1e-4, server_time=1e-3, fetch_contended=True, n_file=1000)
    steady = dp.predict("digits", 2, 1, 32, prof, **kw)
    ended = dp.predict("digits", 2, 1, 32, prof, epoch_end=0.05, **kw)
    assert ended.t_step == steady.t_step
    assert ended.t_epoch == pytest.approx(1000 * steady.t_step / 64 + 0.05, rel=1e-12)
    assert ended.images_per_s == pytest.approx(1000 / ended.t_epoch, rel=1e-12)


def test_downpour_simulation_shows_the_server_bound_regime(prof):
    one = [dp.simulate("cifar", R, 1, 32, prof, steps=8) for R in (256, 512)]
    # one server saturated: twice the replicas, the same images/s
    assert one[0]["utilisation"] > 0.95 and one[1]["images_per_s"] == pytest.approx(one[0]["images_per_s"], rel=0.05)
    assert one[0]["prediction"].server_bound
    more = dp.simulate("cifar", 256, 1, 32, prof, steps=8, servers=16)
    assert more["images_per_s"] > 3 * one[0]["images_per_s"]


def test_plan_ranks_sandblaster_beside_the_others(prof):
    from engine.perf.plan import rank_strategies
    from engine.spec import get_spec
    rows = rank_strategies(get_spec("digits"), 4, 128, prof)
    names = {c.strategy for c in rows}
    assert {"sandblaster", "downpour"} <= names
    sand = next(c for c in rows if c.strategy == "sandblaster")
    assert sand.throughput > 0 and "evaluation" in sand.note and sand.comm_bytes > 0


def test_sprint_predict_and_simulate_take_each_models_options(capsys):
    import json
    from engine import cli
    from engine.perf.profile import Profile
    base = ["--model", "digits", "--nodes", "3", "--no-calibrate", "--json"]
    assert cli.main(["predict", "--parallel", "downpour", *base, "--subbatch", "32", "--servers", "2",
                     "--push-every", "2", "--round-trip", "0.001"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = dp.predict("digits", 3, 1, 32, Profile.load(), servers=2, push_every=2, round_trip=0.001)
    assert got["servers"] == 2 and got["push_every"] == 2 and got["images_per_s"] == pytest.approx(want.images_per_s)
    assert cli.main(["predict", "--parallel", "sandblaster", *base, "--subbatch", "16", "--batch", "384",
                     "--slow-rank", "3", "--slow-factor", "4", "--static"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["static"] and got["factors"] == [1.0, 1.0, 4.0] and got["slice"] == 128
    assert cli.main(["simulate", "--parallel", "sandblaster", *base[:-1], "--subbatch", "16", "--batch", "384",
                     "--slow-rank", "3", "--slow-factor", "4"]) == 0
    assert "static split of 128" in capsys.readouterr().out
    assert cli.main(["simulate", "--parallel", "downpour", *base, "--subbatch", "32", "--steps", "10"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["steps"] == 10 and got["prediction"]["replicas"] == 3
    # an option of the other model is refused, naming it
    assert cli.main(["predict", "--parallel", "downpour", *base, "--subbatch", "32", "--slice", "4"]) == 2
    err = capsys.readouterr().err
    assert "--slice" in err and "--parallel sandblaster" in err


def test_both_models_add_their_options_to_one_parser():
    p = argparse.ArgumentParser()
    dp.add_cli_arguments(p)
    sb.add_cli_arguments(p)             # --servers and --round-trip are shared, not added twice
    a = p.parse_args(["--servers", "2", "--push-every", "3", "--slice", "8", "--slow-rank", "3",
                      "--slow-factor", "4", "--round-trip", "0.001"])
    assert dp.cli_kwargs(a) == {"servers": 2, "fetch_every": 1, "push_every": 3, "server_opt": "adagrad",
                                "round_trip": 0.001}
    kw = sb.cli_kwargs(a)
    assert kw["slice"] == 8 and kw["slow_rank"] == 3 and kw["slow_factor"] == 4.0 and kw["backup"]
