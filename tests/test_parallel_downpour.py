"""Downpour SGD (engine.parallel.downpour) on a sharded parameter server.

Units: shard geometry, message headers, the shard optimizers against float64
formulas. Under ``mpiexec -n 2..4`` (tests/mpi/): one replica with fetch and
push every step equals the sequential optimizer step for step; a stress run
loses and duplicates no push; the digits net reaches >= 95 %; resume; a killed
or failing server or replica ends the job naming it."""
import json
import re
import shutil

import numpy as np
import pytest

from engine.parallel import ps, ps_optim
from test_parallel_mpi import run_mpi

needs_mpi = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")


def test_shard_bounds_are_contiguous_balanced_and_cover_the_vector():
    for n, s in [(10, 1), (10, 3), (151306, 4), (7, 7)]:
        b = ps.shard_bounds(n, s)
        assert b[0][0] == 0 and b[-1][1] == n
        assert all(b[i][1] == b[i + 1][0] for i in range(s - 1))
        sizes = [hi - lo for lo, hi in b]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="cannot be split"):
        ps.shard_bounds(3, 4)


def test_packed_header_is_exact_float64():
    buf = ps.packed(5)
    ps.header(buf)[:3] = [2 ** 40 + 1, 0.1, -3]
    ps.body(buf)[:] = np.arange(5)
    assert ps.header(buf)[0] == 2 ** 40 + 1 and ps.header(buf)[1] == 0.1
    assert np.array_equal(ps.body(buf), np.arange(5, dtype=np.float32))


@pytest.mark.parametrize("k", [1, 3])
def test_shard_sgd_and_adagrad_match_float64_formulas(k):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=50).astype(np.float32)
    g = rng.normal(size=(4, 50)).astype(np.float32)
    lr, mom, wd = 0.1, 0.9, 1e-2
    w, opt = w0.copy(), ps_optim.ShardSGD(50, mom, wd)
    wr, v = w0.astype(np.float64), np.zeros(50)
    for gi in g:
        opt.apply(w, gi, lr, k)
        v = mom * v - lr * (gi + k * wd * wr)
        wr = wr + v
    assert np.abs(w - wr).max() < 1e-5
    w, opt = w0.copy(), ps_optim.ShardAdagrad(50, wd)
    wr, h = w0.astype(np.float64), np.full(50, 0.1)
    for gi in g:
        opt.apply(w, gi, lr, k)
        gg = gi + k * wd * wr
        h += gg * gg
        wr = wr - lr * gg / np.sqrt(h)
    assert np.abs(w - wr).max() < 1e-5
    with pytest.raises(ValueError, match="--server-opt"):
        ps_optim.make_server_opt("rmsprop", 3)


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
@pytest.mark.parametrize("n", [2, 3])
def test_one_replica_equals_sequential_step_for_step(opt, n):
    rc, out, _ = run_mpi(n, "downpour_equiv.py", "--opt", opt)
    assert rc == 0 and "DOWNPOUR EQUIV OK" in out, out[-3000:]


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,servers", [(3, 1), (4, 2)])
def test_stress_no_push_lost_or_applied_twice(n, servers):
    rc, out, _ = run_mpi(n, "downpour_stress.py", "--servers", servers)
    assert rc == 0 and "DOWNPOUR STRESS OK" in out, out[-3000:]


def _train(n, cfg, timeout=90):
    rc, out, _ = run_mpi(n, "ps_train.py", "downpour", json.dumps(cfg), timeout=timeout)
    assert rc == 0, out[-3000:]
    return json.loads(out.split("RESULT ", 1)[1].splitlines()[0]), out


@pytest.mark.mpi
@needs_mpi
def test_digits_reaches_95_percent_with_one_server_two_replicas(tmp_path):
    res, _ = _train(3, {"epochs": 5, "lr": 0.05, "momentum": 0.0, "progress": False, "out": str(tmp_path),
                        "extra": {"servers": 1, "server_opt": "adagrad"}})
    assert res["test_acc"] >= 0.95, res
    st = json.loads((tmp_path / "downpour_stats.json").read_text())
    assert st["pushes_sent"] == st["pushes_applied"] > 0
    assert len(st["staleness"]) == st["pushes_applied"] and st["samples"] >= 5 * st["n_file"]
    from engine.parallel.report import load_stats, summary_table
    table = summary_table(load_stats(tmp_path))
    assert "staleness" in table and "replica" in table and "apply ms" in table


@pytest.mark.mpi
@needs_mpi
def test_resume_continues_the_run(tmp_path):
    cfg = {"epochs": 3, "stop_after": 1, "lr": 0.05, "momentum": 0.9, "progress": False, "out": str(tmp_path),
           "extra": {"servers": 2, "server_opt": "sgd", "push_every": 2}}
    first, _ = _train(4, cfg)
    assert first["epochs"] == 1
    from engine import checkpoint
    st = checkpoint.load(tmp_path)
    assert st["mode"] == "downpour" and st["opt"]["kind"] == "sgd" and np.abs(st["opt"]["velocity"]).max() > 0
    res, _ = _train(4, {**cfg, "stop_after": None, "resume": str(tmp_path)})
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2, 3], lines
    assert res["epochs"] >= 3 and res["history"][0]["epoch"] == 2


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("role,index,mode", [("server", 0, "kill"), ("replica", 1, "kill"),
                                             ("replica", 0, "raise"), ("server", 1, "raise")])
def test_failed_server_or_replica_ends_the_job_naming_it(role, index, mode):
    servers = 2 if index == 1 and role == "server" else 1
    rc, out, dt = run_mpi(servers + 2, "ps_fault.py", "--role", role, "--index", index, "--mode", mode,
                          "--servers", servers, timeout=60)
    assert rc != 0 and dt < 40, out[-3000:]
    assert "UNEXPECTED" not in out
    rank = index if role == "server" else servers + index
    if mode == "kill":
        pid = re.search(r"PID (\d+) RUNNING", out)
        assert pid and "signal 9" in out, out[-3000:]
        dead = re.search(rf"rank (\d+) pid {pid.group(1)}\b", out)
        assert dead, out[-3000:]
        # the role map turns the launcher's pid into a server or a replica
        assert re.search(rf"rank {dead.group(1)}: (server|replica) \d", out), out[-3000:]
    else:
        assert f"rank {rank} of {servers + 2} failed" in out and f"injected fault in {role} {index}" in out, \
            out[-3000:]
        assert f"rank {rank}: {role} {index}" in out, out[-3000:]


# ---- the cost model (engine.perf.downpour) ---------------------------------------
def test_cost_model_staleness_gap_and_server_bound_regime():
    from engine.perf import downpour as model
    from engine.perf.profile import Profile
    assert model._gap(1, 1) == 1 and model._gap(1, 3) == 1 and model._gap(3, 3) == 3
    assert model._gap(2, 3) == pytest.approx((1 + 2) / 2)       # pushes at 3, 6: fetched at 2 and 4
    prof = Profile.synthetic(cores=64, backend="cpu")
    one = model.predict("digits", 1, 1, 32, prof)
    assert one.staleness == 0 and not one.server_bound
    few = model.predict("digits", 4, 1, 32, prof, servers=1)
    assert few.staleness == pytest.approx(3.0) and few.images_per_s == pytest.approx(4 * 32 / few.t_step)
    many = model.predict("digits", 4096, 1, 32, prof, servers=1)
    assert many.server_bound and many.rho >= 1
    # a server-bound job scales with servers, not replicas
    assert model.predict("digits", 8192, 1, 32, prof, servers=1).images_per_s == pytest.approx(many.images_per_s)
    assert model.predict("digits", 4096, 1, 32, prof, servers=4).images_per_s > 3 * many.images_per_s
    assert "server utilisation" in model.format_prediction(few)
    with pytest.raises(ValueError, match="--servers"):
        model.predict("digits", 2, 1, 32, prof, servers=0)


def test_sandblaster_model_closed_form_and_simulation_agree():
    from engine.perf.sandblaster import eval_time as sandblaster_eval_time, simulate_eval as simulate_sandblaster
    for f in (1, 2, 4):
        sim = simulate_sandblaster(60, 1.0, [1, 1, f])
        closed = sandblaster_eval_time(60, 1.0, [1, 1, f])
        assert abs(sim["time"] - closed) <= 1.0 + 1e-9, (f, sim, closed)
        assert simulate_sandblaster(60, 1.0, [1, 1, f], static=True)["time"] == \
            sandblaster_eval_time(60, 1.0, [1, 1, f], static=True) == 20 * f
    slow = simulate_sandblaster(60, 1.0, [1, 1, 4])
    assert slow["slices"][2] < slow["slices"][0] / 2          # the slow replica takes fewer slices
    assert slow["time"] < 0.5 * simulate_sandblaster(60, 1.0, [1, 1, 4], static=True)["time"]


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("strategy,override", [("downpour", {"lr": 0.07}),
                                               ("sandblaster", {"extra": {"servers": 1, "slice": 16}})])
def test_ranks_that_disagree_refuse_to_start(strategy, override):
    cfg = {"epochs": 1, "lr": 0.05, "batch": 64, "progress": False, "extra": {"servers": 1}}
    rc, out, dt = run_mpi(3, "ps_train.py", strategy, json.dumps(cfg), timeout=60,
                          env={"SPRINT_TEST_OVERRIDE": "2:" + json.dumps(override)})
    assert rc != 0 and dt < 50, out[-3000:]
    assert "ranks disagree" in out and "refusing to start" in out, out[-3000:]


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("argv", [["--parallel", "downpour", "--servers", "1", "--push-every", "2"],
                                  ["--parallel", "sandblaster", "--batch", "256", "--slice", "64", "--history", "5"]])
def test_sprint_train_runs_each_strategy_from_the_command_line(tmp_path, argv):
    import os
    import subprocess
    import sys
    from test_parallel_mpi import ROOT
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1")
    p = subprocess.run(["mpiexec", "-n", "3", sys.executable, "-m", "engine.cli", "train", *argv, "--epochs", "1",
                        "--out", str(tmp_path / "run"), "--no-progress"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=150)
    assert p.returncode == 0 and "done: 1 epoch" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert cfg["parallel"] == argv[1] and cfg["extra"]["servers"] == 1
    r = subprocess.run([sys.executable, "-m", "engine.cli", "report", str(tmp_path / "run"), "--no-png"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and f"mode {argv[1]}" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("argv,flag,owner", [(["--parallel", "asgd", "--servers", "2"], "--servers", "downpour"),
                                             (["--parallel", "downpour", "--slice", "8"], "--slice", "sandblaster"),
                                             (["--parallel", "sandblaster", "--push-every", "2"], "--push-every",
                                              "downpour")])
def test_an_option_of_another_strategy_is_refused_naming_it(argv, flag, owner, capsys):
    from engine.cli import main
    assert main(["train", *argv, "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert f"--parallel {owner}" in err and flag in err, err
