"""The engine trained in parallel under mpiexec: convergence on digits
(ASGD and sync, 2 ranks x 2 workers), distributed resume, option mismatch,
the `sprint train --parallel` CLI, and the stats file feeding `sprint report`."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]

BASE = {"model": "digits", "batch": 16, "threads": 1, "progress": False, "verbose": False}
# ASGD sums every gradient that arrived since the last update and stale
# gradients shrink the stable step (much more so with momentum), so it runs
# with nu = 0 and a smaller eta than sync; see the report.
ASGD = {**BASE, "parallel": "asgd", "workers": 2, "batch": 32, "lr": 0.02, "momentum": 0.0,
        "schedule": "cosine"}
SYNC = {**BASE, "parallel": "sync", "workers": 2, "lr": 0.05, "momentum": 0.9}


def mpi(n, *argv, timeout=180):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT=str(timeout))
    cmd = ["mpiexec", "-n", str(n), sys.executable, "-m", "mpi4py", *map(str, argv)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 15, env=env, cwd=ROOT)
    return p.returncode, p.stdout + p.stderr


def train(n, cfg, *extra, timeout=180):
    rc, out = mpi(n, ROOT / "tests" / "mpi" / "train_run.py", json.dumps(cfg), *extra, timeout=timeout)
    res = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    return rc, out, res


def read_metrics(d):
    return [json.loads(x) for x in (Path(d) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_asgd_2_ranks_x_2_workers_reaches_95_percent(tmp_path):
    # max_pending=2: on this loaded 2-core machine the updater is sometimes
    # descheduled for 100+ ms and the seed's unbounded accumulation then
    # applies 800-sample updates (measured); two pending gradients per
    # worker bound that at 224 samples and keep the run asynchronous.
    rc, out, res = train(2, {**ASGD, "epochs": 12, "out": str(tmp_path), "extra": {"max_pending": 2}})
    assert rc == 0 and res, out[-3000:]
    assert res["test_acc"] >= 0.95, res
    st = json.loads((tmp_path / "asgd_stats.json").read_text())
    assert st["n_node"] == 2 and st["n_gpu"] == 2 and st["n_subbatch"] == 32 and st["model"] == "digits"
    assert st["updates"] == len(st["minibatch"]) > 0
    assert sum(st["minibatch"]) == st["samples"] >= 12 * st["n_file"]
    assert len(st["staleness"]) == st["gradients_produced"] - st["gradients_discarded_at_stop"]
    for name in ("FetchWeights", "LoadImage", "DeformImage", "ComputeGradient", "ComputeUpdateVal",
                 "LockGradient", "UpdateGradient", "SumGradient", "AddMomentum", "Allreduce", "UpdateWeights"):
        assert st["timers"][name]["count"] > 0 and st["timers"][name]["mean"] >= 0, name
    assert st["T_GPU"] > 0 and st["T_Update"] > 0
    assert max(st["minibatch"]) <= 2 * 2 * 2 * 32
    recs = read_metrics(tmp_path)
    assert [r["epoch"] for r in recs] == list(range(1, 13))
    assert recs[-1]["test_acc"] == pytest.approx(res["test_acc"])
    p = subprocess.run([sys.executable, "-m", "engine.cli", "report", str(tmp_path)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and "N_Minibatch_avg measured" in p.stdout, p.stderr
    assert (tmp_path / "parallel_report.png").exists()


def test_sync_2_ranks_x_2_workers_reaches_95_percent(tmp_path):
    rc, out, res = train(2, {**SYNC, "epochs": 5, "out": str(tmp_path)})
    assert rc == 0 and res, out[-3000:]
    assert res["test_acc"] >= 0.95, res
    st = json.loads((tmp_path / "sync_stats.json").read_text())
    assert st["mode"] == "sync" and st["n_node"] == 2 and st["steps"] > 0


@pytest.mark.parametrize("cfg", [ASGD, SYNC], ids=["asgd", "sync"])
def test_distributed_run_resumes_from_its_checkpoint(tmp_path, cfg):
    first = {**cfg, "epochs": 2, "stop_after": 1, "out": str(tmp_path)}
    rc, out, res = train(2, first)
    assert rc == 0 and res, out[-3000:]
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1]
    from engine.checkpoint import load
    st1 = load(tmp_path / "checkpoint.npz")
    assert st1["epoch"] == 1 and st1["mode"] == cfg["parallel"] and st1["n_node"] == 2
    assert st1["momentum"].shape == st1["params"].shape
    # Resumed with nothing left to train, the run evaluates exactly the
    # checkpoint's weights: the same test accuracy as epoch 1 reported.
    rc, out, res = train(2, {**cfg, "epochs": 2, "resume": str(tmp_path), "out": str(tmp_path),
                             "extra": {"max_samples": 0}})
    assert rc == 0 and res, out[-3000:]
    assert res["test_acc"] == pytest.approx(read_metrics(tmp_path)[0]["test_acc"], abs=1e-9)
    rc, out, res = train(2, {**cfg, "epochs": 2, "resume": str(tmp_path), "out": str(tmp_path)})
    assert rc == 0 and res, out[-3000:]
    recs = read_metrics(tmp_path)
    assert [r["epoch"] for r in recs] == [1, 2]
    st2 = load(tmp_path / "checkpoint.npz")
    assert st2["epoch"] == 2 and st2["samples"] >= 2 * res["stats"]["n_file"]
    assert st2["step"] > st1["step"] and st2["samples"] > st1["samples"]
    assert recs[1]["test_acc"] > 0.15   # better than chance after the resume


def test_ranks_with_different_options_refuse_to_start(tmp_path):
    rc, out, res = train(2, {**ASGD, "epochs": 1}, "--override-rank", 1, "--override", '{"lr": 0.03}')
    assert rc != 0 and res is None
    assert "ranks disagree on options: lr: rank 0 0.02, rank 1 0.03; refusing to start" in out, out[-3000:]


def test_sprint_train_cli_under_mpiexec(tmp_path):
    rc, out = mpi(2, "-m", "engine.cli", "train", "--parallel", "asgd", "--workers", 1, "--epochs", 1,
                  "--batch", 16, "--lr", 0.01, "--momentum", 0, "--threads", 1, "--no-progress",
                  "--out", tmp_path / "run")
    assert rc == 0, out[-3000:]
    assert "2 nodes x 1 worker," in out
    assert (tmp_path / "run" / "asgd_stats.json").exists() and len(read_metrics(tmp_path / "run")) == 1
