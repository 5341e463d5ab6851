"""Sandblaster L-BFGS (engine.parallel.sandblaster, lbfgs, sandblaster_replica).

Units: the vector-free two-loop recursion on a Gram matrix equals the
textbook recursion on vectors; sharded Gram matrices and directions equal
the unsharded ones; the backtracking step. Under mpiexec: softmax
regression on digits reaches scipy's L-BFGS-B optimum of the same objective
(float64 numpy reference, cross-checked against the engine's loss) to 1e-4;
a slowed replica gets fewer slices and late slices are re-issued with their
duplicates dropped; the digits net reaches >= 95 %; resume; a killed replica
or server ends the job."""
import json
import re
import shutil

import numpy as np
import pytest

from engine.parallel import lbfgs
from test_parallel_mpi import run_mpi

needs_mpi = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")
SOFTREG = {"name": "softreg", "x0": 8, "m0": 1, "c": 3, "convs": [], "fcs": [10]}


def _textbook(S, Y, g):
    q, al = g.copy(), []
    for s, y in zip(reversed(S), reversed(Y)):
        a = (s @ q) / (s @ y)
        al.append(a)
        q -= a * y
    q *= (S[-1] @ Y[-1]) / (Y[-1] @ Y[-1])
    for (s, y), a in zip(zip(S, Y), reversed(al)):
        q += s * (a - (y @ q) / (s @ y))
    return -q


def _pairs(rng, n=40, k=5):
    A = rng.normal(size=(n, n))
    A = A @ A.T + n * np.eye(n)
    S = [rng.normal(size=n) for _ in range(k)]
    return S, [A @ s for s in S], rng.normal(size=n)


def test_two_loop_on_gram_matrix_equals_textbook_recursion():
    rng = np.random.default_rng(0)
    S, Y, g = _pairs(rng)
    B = np.stack(S + Y + [g])
    d = lbfgs.two_loop_coeffs(B @ B.T, len(S)) @ B
    assert np.abs(d - _textbook(S, Y, g)).max() < 1e-10
    assert np.array_equal(lbfgs.two_loop_coeffs(np.array([[4.0]]), 0), [-1.0])   # no history: d = -g
    # selecting pairs 1 and 3 of the Gram matrix == the recursion on those pairs
    keep = [1, 3]
    d2 = lbfgs.two_loop_coeffs(lbfgs.select(B @ B.T, len(S), keep), 2) @ np.stack(
        [S[1], S[3], Y[1], Y[3], g])
    assert np.abs(d2 - _textbook([S[1], S[3]], [Y[1], Y[3]], g)).max() < 1e-10


def test_sharded_gram_and_direction_equal_the_whole_vector():
    rng = np.random.default_rng(1)
    S, Y, g = _pairs(rng, n=30, k=3)
    cut = [0, 11, 30]
    shards = [lbfgs.ShardLBFGS(np.zeros(b - a), m=3) for a, b in zip(cut[:-1], cut[1:])]
    for sh, a, b in zip(shards, cut[:-1], cut[1:]):
        sh.S = [s[a:b].astype(np.float32) for s in S]
        sh.Y = [y[a:b].astype(np.float32) for y in Y]
        sh.g = g[a:b].astype(np.float32)
    G = sum(sh.gram() for sh in shards)
    B = np.stack([v.astype(np.float32).astype(np.float64) for v in S + Y + [g]])
    assert np.abs(G - B @ B.T).max() < 1e-9 * np.abs(G).max()
    assert np.array_equal(G, sum(sh.gram() for sh in shards))      # cached products stay right
    keep = lbfgs.choose_pairs(G, 3, 3)
    c = lbfgs.two_loop_coeffs(lbfgs.select(G, 3, keep), len(keep))
    for sh in shards:
        sh.set_direction(c, keep)
    d = np.concatenate([sh.d for sh in shards])
    assert np.abs(d - _textbook(S, Y, g)).max() < 1e-4 * np.abs(d).max()
    bad = G.copy()
    bad[1, 4] = bad[4, 1] = -1.0                                     # s_1 . y_1 < 0
    assert lbfgs.choose_pairs(bad, 3, 3) == [0, 2] and lbfgs.choose_pairs(G, 3, 2) == [1, 2]


def test_saved_state_restores_the_same_basis_pending_pair_included():
    """A checkpoint taken after an accepted step (its pair not yet judged)
    must give a resumed shard the same basis, hence the same Gram matrix and
    direction, as the shard that kept running."""
    rng = np.random.default_rng(4)
    live = lbfgs.ShardLBFGS(rng.standard_normal(50), m=3)
    for _ in range(4):
        live.g = rng.standard_normal(50).astype(np.float32)
        G = live.gram()
        k = (G.shape[0] - 1) // 2
        keep = lbfgs.choose_pairs(G, k, live.m)
        live.set_direction(lbfgs.two_loop_coeffs(lbfgs.select(G, k, keep), len(keep)), keep)
        live.accept(0.5, rng.standard_normal(50).astype(np.float32))
    assert live.pending is not None
    st = live.state()
    resumed = lbfgs.ShardLBFGS(st["x"], m=3)
    resumed.S, resumed.Y = list(st["s"]), list(st["y"])
    g = rng.standard_normal(50).astype(np.float32)
    live.g, resumed.g = g, g.copy()
    np.testing.assert_array_equal(resumed.gram(), live.gram())


def test_backtracking_step_is_the_clamped_quadratic_minimiser():
    # f(t) = (t - 0.3)^2: f0 = 0.09, slope -0.6, f(1) = 0.49 -> minimiser 0.3
    assert lbfgs.backtrack(1.0, 0.09, -0.6, 0.49) == pytest.approx(0.3)
    assert lbfgs.backtrack(1.0, 0.0, -1.0, 1e9) == pytest.approx(0.1)
    assert lbfgs.backtrack(1.0, 0.0, -1.0, float("nan")) == 0.5


def test_sandblaster_has_its_own_default_batch():
    from engine.train import TrainConfig
    assert TrainConfig(parallel="sandblaster").batch == 256          # the L-BFGS batch
    assert TrainConfig().batch == TrainConfig(parallel="downpour").batch == 32
    assert TrainConfig(parallel="sandblaster", batch=64).batch == 64
    with pytest.raises(ValueError, match="batch"):
        TrainConfig(parallel="sandblaster", batch=0)


def _train(n, cfg, timeout=120, env=None):
    rc, out, _ = run_mpi(n, "ps_train.py", "sandblaster", json.dumps(cfg), timeout=timeout, env=env)
    assert rc == 0, out[-3000:]
    return json.loads(out.split("RESULT ", 1)[1].splitlines()[0]), out


def _objective(wd):
    """Full-batch softmax regression objective on the normalised digits, float64."""
    from engine.data import Loader
    from engine.spec import NetSpec
    from engine.train import TrainConfig, prepare_data
    spec = NetSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in SOFTREG.items()})
    tr, _, deform = prepare_data(TrainConfig(crop_pad=0), spec)
    ld = Loader(tr, len(tr), shuffle=False, deform=deform, prefetch=0)
    x, y = ld.deform(*ld.load(np.arange(len(tr))), np.random.default_rng(0))
    X, Y = np.asarray(x, np.float64).reshape(len(y), -1), np.asarray(y)
    k, d = 10, X.shape[1]

    def f(w):
        z = X @ w[:k * d].reshape(k, d).T + w[k * d:]
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        loss = -np.log(p[np.arange(len(Y)), Y]).mean()
        p[np.arange(len(Y)), Y] -= 1
        p /= len(Y)
        return loss + 0.5 * wd * w @ w, np.concatenate([(p.T @ X).ravel(), p.sum(0)]) + wd * w
    return f, spec, (x, y)


@pytest.mark.mpi
@needs_mpi
def test_softmax_regression_reaches_the_lbfgsb_optimum(tmp_path):
    import scipy.optimize
    from engine import checkpoint
    from engine.net import Net
    wd = 1e-3
    f, spec, (x, y) = _objective(wd)
    net = Net(spec)
    w0 = np.asarray(net.params, np.float64)
    # the reference objective is the engine's loss (layout and normalisation agree)
    assert f(w0)[0] - 0.5 * wd * w0 @ w0 == pytest.approx(net.loss_and_grad(x, y)[0], abs=1e-5)
    best = scipy.optimize.minimize(f, w0, jac=True, method="L-BFGS-B",
                                   options=dict(maxiter=5000, ftol=1e-15, gtol=1e-10))
    (tmp_path / "softreg.json").write_text(json.dumps(SOFTREG))
    res, _ = _train(4, {"model": str(tmp_path / "softreg.json"), "epochs": 70, "batch": 2000, "crop_pad": 0,
                        "weight_decay": wd, "progress": False, "verbose": False, "out": str(tmp_path / "run"),
                        "extra": {"servers": 2, "slice": 128}})
    w = checkpoint.load(tmp_path / "run")["params"].astype(np.float64)
    gap = f(w)[0] - best.fun
    assert abs(gap) < 1e-4, (f(w)[0], best.fun)
    assert f(w0)[0] - best.fun > 1.0          # it had a long way to go
    st = json.loads((tmp_path / "run" / "sandblaster_stats.json").read_text())
    assert st["batches"] == 70 and st["slices"] >= 70 * 12


@pytest.mark.mpi
@needs_mpi
def test_slowed_replica_gets_fewer_slices_and_late_slices_are_reissued(tmp_path):
    (tmp_path / "softreg.json").write_text(json.dumps(SOFTREG))
    res, _ = _train(3, {"model": str(tmp_path / "softreg.json"), "epochs": 15, "batch": 2000, "crop_pad": 0,
                        "weight_decay": 1e-3, "progress": False, "verbose": False, "out": str(tmp_path),
                        "extra": {"servers": 1, "slice": 64, "slow_rank": 2, "slow_factor": 6.0}})
    st = json.loads((tmp_path / "sandblaster_stats.json").read_text())
    fast, slow = st["replicas"]
    assert slow["slow_factor"] == 6.0 and fast["slow_factor"] == 1.0
    assert fast["slices"] > 1.5 * slow["slices"], (fast["slices"], slow["slices"])
    assert st["reissued"] > 0 and st["duplicates"] + st["shard_duplicates"] > 0
    # every slice of every evaluation counted once: duplicates were dropped
    assert st["slices"] - st["duplicates"] - sum(r["stale_tasks"] for r in st["replicas"]) \
        == st["coordinator"]["evaluations"] * 23
    from engine.parallel.report import load_stats, summary_table
    assert "slices re-issued" in summary_table(load_stats(tmp_path))


@pytest.mark.mpi
@needs_mpi
def test_digits_net_reaches_95_percent_and_resumes(tmp_path):
    cfg = {"epochs": 8, "batch": 256, "progress": False, "out": str(tmp_path),
           "extra": {"servers": 1, "slice": 32}, "stop_after": 2}
    first, _ = _train(3, cfg, timeout=150)
    assert first["epochs"] == 2
    from engine import checkpoint
    st = checkpoint.load(tmp_path)
    assert st["mode"] == "sandblaster" and st["opt"]["kind"] == "lbfgs" and st["opt"]["s"].shape[0] > 0
    res, _ = _train(3, {**cfg, "stop_after": None, "resume": str(tmp_path)}, timeout=150)
    assert res["test_acc"] >= 0.95, res
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == list(range(1, 9))


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("rank", [0, 2])
def test_killed_server_or_replica_ends_the_job(tmp_path, rank):
    (tmp_path / "softreg.json").write_text(json.dumps(SOFTREG))
    rc, out, dt = run_mpi(3, "ps_train.py", "sandblaster", json.dumps(
        {"model": str(tmp_path / "softreg.json"), "epochs": 500, "batch": 2000, "crop_pad": 0, "progress": False,
         "verbose": False, "extra": {"servers": 1, "slice": 64}}), timeout=60,
        env={"SPRINT_TEST_FAULT": f"{rank}:40:kill"})
    assert rc != 0 and dt < 50, out[-3000:]
    pid = re.search(r"PID (\d+) RUNNING", out)
    assert pid and "signal 9" in out, out[-3000:]
    dead = re.search(rf"rank (\d+) pid {pid.group(1)}\b", out)
    assert dead and re.search(rf"rank {dead.group(1)}: (server|replica) \d", out), out[-3000:]
