"""Oversubscribed host sharings: the model prices those the contention sweeps
measured (time-slice waits read between the swept nets) and refuses the
rest, and the CLI and tune say so."""
import copy

import pytest

from engine import cli
from engine import spec as spec_mod
from engine.perf import model, tune
from engine.perf.profile import Profile


def _cpu_profile(pairs):
    prof = Profile.synthetic(backend="cpu", cores=2)
    prof.data["contention"] = {"entries": [
        {"source": "runner", "model": "tiny", "n_subbatch": 8, "ranks": r, "workers": w, "rel": 1.0 + 0.4 * (r * w - 1),
         "host": 1.0, "ratio": 1.0 + 0.4 * (r * w - 1), "t": 1e-3} for r, w in pairs]}
    return prof


def test_measured_oversubscription_is_priced_and_said():
    prof = _cpu_profile([(1, 1), (2, 1), (2, 2)])
    p = model.predict("tiny", 2, 2, 8, prof, ranks_per_host=2)
    assert "2x2 run" in p.extra["oversubscribed"]
    assert p.slowdown > 1.5
    # Within the cores: nothing to say.
    assert model.predict("tiny", 2, 1, 8, prof, ranks_per_host=2).extra["oversubscribed"] is None


def test_unmeasured_oversubscription_is_refused():
    prof = _cpu_profile([(1, 1), (2, 1), (2, 2)])
    with pytest.raises(model.Oversubscribed, match=r"3 ranks x 2 workers x 1 thread = 6 busy threads on 2 cores"
                                                   r".*measured ranks x workers: 1x1, 2x1, 2x2"):
        model.predict("tiny", 3, 2, 8, prof, ranks_per_host=3)
    with pytest.raises(model.Oversubscribed, match=r"2 ranks x 1 worker x 2 threads = 4 busy threads"):
        model.predict("tiny", 2, 1, 8, prof, ranks_per_host=2, threads=2)
    # As many busy threads as a measured sharing: priced from it, and said.
    p = model.predict("tiny", 1, 4, 8, prof, ranks_per_host=1)
    assert "as many busy threads (2x2)" in p.extra["oversubscribed"] and "1x4x1" in p.extra["oversubscribed"]
    # On GPUs each worker owns its device: no core sharing to price.
    gpu = Profile.synthetic(backend="gpu", cores=2)
    assert model.predict("tiny", 3, 2, 8, gpu, ranks_per_host=3).extra["oversubscribed"] is None


def _sliced_profile(c=3e-3, d=2e-9):
    """Runner entries of tiny (580 parameters) and cifar (3.2 M) whose
    measured wait per cycle beyond the model is c + d N_Param at 3 x 1."""
    prof = _cpu_profile([(1, 1), (2, 1), (3, 1)])
    es = prof.data["contention"]["entries"]
    for e in list(es):
        e["n_param"] = 580
        es.append(dict(e, model="cifar", n_param=3_237_834))
    for e in es:
        if e["ranks"] == 3:
            e["slice_wait"] = c + d * e["n_param"]
            e["updater_excess"] = 1e-4 + 1e-10 * e["n_param"]
    return prof


def test_time_slice_wait_is_read_between_the_swept_nets():
    c, d = 3e-3, 2e-9
    prof = _sliced_profile(c, d)
    n = spec_mod.n_params(spec_mod.get_spec("mnist"))
    assert prof.sharing_excess("slice_wait", 3, 1, "mnist", n) == pytest.approx(c + d * n, rel=1e-6)
    assert prof.sharing_excess("slice_wait", 3, 1, "tiny", 0) == pytest.approx(c + d * 580)   # its own entry
    assert prof.sharing_excess("updater_excess", 3, 1, "mnist", n) == pytest.approx(1e-4 + 1e-10 * n, rel=1e-6)
    assert prof.sharing_excess("slice_wait", 2, 1, "mnist", n) == 0.0                        # never measured
    # Priced in the collective, where the sharing was measured.
    base = _cpu_profile([(1, 1), (2, 1), (3, 1)])
    ar = lambda p, r: model.step_costs("mnist", r, 1, 8, p, ranks_per_host=r, slowdown=1.0)["allreduce_bw"][0]
    assert ar(prof, 3) - ar(base, 3) == pytest.approx(c + d * n, rel=1e-6)
    assert ar(prof, 2) == ar(base, 2)
    with_wait = model.predict("mnist", 3, 1, 8, prof, ranks_per_host=3)
    without = model.predict("mnist", 3, 1, 8, base, ranks_per_host=3)
    assert with_wait.updater["Allreduce"] > without.updater["Allreduce"] + 0.5 * c
    assert "priced from the runner contention sweep's wait per cycle" in with_wait.extra["oversubscribed"]
    assert "does not price" in without.extra["oversubscribed"]


def _beyond_own_barrier(prof, ranks, workers, barrier=None):
    """Turn each entry's whole wait for the slowest node beyond the model's
    other waits into what a sweep records: its excess over the model of that
    run, which priced the barrier alone (``barrier``: {net: seconds}; None:
    the model's own barrier of the run, without any slice wait)."""
    for e in prof.data["contention"]["entries"]:
        if (e["ranks"], e["workers"]) != (ranks, workers) or e.get("slice_wait") is None:
            continue
        b = barrier[e["model"]] if barrier is not None else model._predict(
            e["model"], ranks, workers, int(e["n_subbatch"]), prof, ranks_per_host=ranks,
            impl=model.RUNNER_SWEEP_IMPL, slowdown=prof.slowdown(ranks, workers, e["model"]),
            slice_wait=(0.0, 0.0), wake=0.0).t_barrier
        e["slice_wait"] = model.with_slice_wait(b, e["slice_wait"]) - b


def test_time_slice_wait_is_fitted_through_the_whole_waits_of_the_swept_runs(monkeypatch):
    """A swept run whose updaters waited for deposits (a barrier the model
    prices) recorded only the slice wait's excess over that barrier; the
    line c + beta T_GPU is fitted through the whole waits the composition
    gives back (queueing.slice_from_excess), not through those excesses."""
    c, beta = 1.5e-3, 0.3
    prof = _sliced_profile()
    t = {"tiny": 1.2e-3, "cifar": 0.11}
    barrier = {"tiny": 0.2e-3, "cifar": 0.04}           # cifar's updaters wait for deposits
    for e in prof.data["contention"]["entries"]:
        e["cycle"] = {"T_GPU": t[e["model"]]}
        if e["ranks"] == 3:
            e["slice_wait"] = c + beta * t[e["model"]]
    _beyond_own_barrier(prof, 3, 1, barrier)
    real = model.per_swept_run
    monkeypatch.setattr(model, "per_swept_run", lambda p, R, w, kw, name, value, accept=None, **k:
                        dict(barrier) if name == "_bare_barriers" else real(p, R, w, kw, name, value, accept, **k))
    assert prof.slice_terms(3, 1, "mnist", 206_922) == pytest.approx((c, beta), rel=1e-6)
    # Read as excesses, cifar's 40 ms barrier would have hidden most of its wait.
    raw = prof._slice_line([e for e in prof.data["contention"]["entries"] if e["ranks"] == 3])
    assert raw[1] < 0.8 * beta


def test_time_slice_wait_grows_with_the_step_beyond_the_cores():
    """Entries that measured their T_GPU: the wait per cycle is fitted as
    c + beta T_GPU across nets (ranks > cores only), and the beta part
    lengthens the cycle after the deposit wait instead of replacing it."""
    c, beta = 1.5e-3, 0.3
    prof = _sliced_profile()
    for e in prof.data["contention"]["entries"]:
        t_gpu = 1.2e-3 if e["model"] == "tiny" else 0.11
        e["cycle"] = {"T_GPU": t_gpu}
        if e["ranks"] == 3:
            e["slice_wait"] = c + beta * t_gpu
    _beyond_own_barrier(prof, 3, 1)
    got = prof.slice_terms(3, 1, "mnist", 206_922)
    assert got == pytest.approx((c, beta), rel=1e-6)
    # Within the cores: read by N_Param, as before (no step-proportional part).
    es = prof.data["contention"]["entries"]
    for e in es:
        if e["ranks"] == 2:
            e["slice_wait"] = 2e-4
    assert prof.slice_terms(2, 1, "mnist", 206_922) == (pytest.approx(2e-4), 0.0)
    # In the prediction: T_Update exceeds T_GPU by about beta T_GPU (1 worker,
    # the updater's own work small), where without beta it equals T_GPU.
    base = copy.deepcopy(prof.data)
    for e in base["contention"]["entries"]:
        e.pop("cycle")        # an older profile: N_Param reading, no beta
    with_beta = model.predict("mnist", 3, 1, 8, prof, ranks_per_host=3)
    without = model.predict("mnist", 3, 1, 8, Profile(base), ranks_per_host=3)
    assert without.t_update == pytest.approx(without.t_gpu, rel=0.05)
    assert with_beta.t_update - with_beta.t_gpu == pytest.approx(beta * with_beta.t_gpu, rel=0.25)
    assert with_beta.n_minibatch_avg > without.n_minibatch_avg * (1 + 0.5 * beta)


def test_time_slice_wait_is_read_apart_for_small_and_large_vectors():
    """Beyond the cores, nets whose vectors fit the L2 (tiny, mnist) give
    their own line c + beta T_GPU; one that overflows it (cifar) its own
    fraction of the step; a net between them reads both in log N_Param."""
    c, beta, frac = 1e-3, 0.4, 0.1
    prof = _sliced_profile()
    prof.data["cache"] = {"l2_bytes": 2 << 20}
    es = prof.data["contention"]["entries"]
    es += [dict(e, model="mnist", n_param=206_922) for e in es if e["model"] == "tiny"]
    t = {"tiny": 1.0e-3, "mnist": 4.0e-3, "cifar": 0.09}
    for e in es:
        e["cycle"] = {"T_GPU": t[e["model"]]}
        if e["ranks"] == 3:
            e["slice_wait"] = frac * t["cifar"] if e["model"] == "cifar" else c + beta * t[e["model"]]
    _beyond_own_barrier(prof, 3, 1)
    assert prof.slice_terms(3, 1, "heldout", 100_000) == pytest.approx((c, beta), rel=1e-6)
    assert prof.slice_terms(3, 1, "heldout", 5_000_000) == pytest.approx((0.0, frac), abs=1e-9)
    mid = int(round((206_922 * 3_237_834) ** 0.5))              # halfway in log N_Param
    assert prof.slice_terms(3, 1, "heldout", mid) == pytest.approx(((c + 0) / 2, (beta + frac) / 2), rel=1e-4)
    # One small-vector net (tiny alone): its 1 ms step gives no line; one through every net.
    one = Profile(copy.deepcopy(prof.data))
    one.data["contention"]["entries"] = [e for e in es if e["model"] != "mnist"]
    assert one.slice_terms(3, 1, "heldout", 100_000) == pytest.approx(
        one._slice_line(one._whole_slice_waits([e for e in one.data["contention"]["entries"] if e["ranks"] == 3],
                                               3, 1)), rel=1e-9)
    # Without the cache size (an older profile): one line through every net.
    del prof.data["cache"]
    got_c, got_beta = prof.slice_terms(3, 1, "heldout", 100_000)
    assert got_beta < beta


def test_cli_refuses_and_tune_skips_unmeasured_sharing(tmp_path, capsys):
    path = tmp_path / "p.json"
    _cpu_profile([(1, 1), (1, 2), (2, 1)]).save(path)
    base = ["--model", "tiny", "--profile", str(path), "--no-calibrate"]
    assert cli.main(["predict", *base, "--nodes", "3", "--workers", "1", "--subbatch", "8",
                     "--ranks-per-host", "3"]) == 2
    assert "oversubscribed" in capsys.readouterr().err
    refused = []
    cands = tune.search("tiny", Profile.load(path), 4, 0.5, max_nodes=3, workers=(1, 2), ranks_per_host=4,
                        subbatches=(2,), refused=refused)
    assert refused and all(r[0] * r[1] > 2 and (min(r[0], 4), r[1]) not in {(1, 1), (1, 2), (2, 1)}
                           for r in refused)
    assert cands and all(c.n_node * c.n_gpu <= 2 for c in cands)
    assert cli.main(["tune", *base, "--target-minibatch", "4", "--tolerance", "0.5", "--max-nodes", "3",
                     "--max-subbatch", "1", "--max-workers", "2", "--ranks-per-host", "4"]) in (0, 1)
    assert "not priced: oversubscribed" in capsys.readouterr().out
