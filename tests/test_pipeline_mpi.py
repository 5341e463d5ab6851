"""The pipeline executor under mpiexec: gpipe equals one process (K = 2, 3, 4
stages, and 2 stages x 2 replicas); 1f1b and dualpipe follow the version
trace their schedules imply under each --predict."""
import shutil

import pytest

from test_parallel_mpi import run_mpi

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")]


@pytest.mark.parametrize("n,replicas", [(2, 1), (3, 1), (4, 1), (4, 2)])
def test_gpipe_gradients_and_weights_equal_one_process(n, replicas):
    rc, out, _ = run_mpi(n, "pipeline_equiv.py", "--replicas", replicas)
    assert rc == 0 and "PIPE GPIPE OK" in out, out[-3000:]


@pytest.mark.parametrize("schedule,predict,n", [("1f1b", "none", 3), ("1f1b", "stash", 4),
                                                ("1f1b", "spectrain", 3), ("dualpipe", "none", 3),
                                                ("dualpipe", "stash", 2), ("dualpipe", "spectrain", 4)])
def test_version_trace_matches_the_schedule(schedule, predict, n):
    rc, out, _ = run_mpi(n, "pipeline_equiv.py", "--schedule", schedule, "--predict", predict)
    assert rc == 0 and "PIPE TRACE OK" in out, out[-3000:]


@pytest.mark.parametrize("fault", ["raise", "freeze", "kill"])
def test_a_failed_or_frozen_stage_ends_the_job_naming_it(fault):
    import re
    rc, out, dt = run_mpi(3, "pipeline_equiv.py", "--schedule", "1f1b", "--fault", fault, "--timeout", 3)
    assert rc != 0 and dt < 40, out[-3000:]
    assert "UNEXPECTED" not in out
    if fault == "raise":
        assert "rank 1 of 3 failed: RuntimeError: injected failure in stage 1" in out, out[-3000:]
    elif fault == "freeze":
        # its neighbours time out waiting for it and say whom they waited for
        assert re.search(r"rank [02] of 3 failed: StageTimeout: waited 3 s for the \w+ of micro-batch \d+ "
                         r"from rank 1", out), out[-3000:]
    else:
        pid = re.search(r"PID (\d+) RUNNING", out)
        assert pid and re.search(rf"rank [0-2] pid {pid.group(1)}\b", out), out[-3000:]


def _train(n, job, timeout=90):
    import json
    rc, out, _ = run_mpi(n, "pipeline_train.py", json.dumps(job), timeout=timeout)
    assert rc == 0 and "PIPE RUN " in out, out[-3000:]
    return json.loads(out.split("PIPE RUN ", 1)[1].splitlines()[0])


def test_gpipe_on_digits_is_sgd_and_resumes_exactly(tmp_path):
    run = tmp_path / "run"
    cfg = {"epochs": 2, "out": str(run), "extra": {"schedule": "gpipe", "microbatches": 3}}
    first = _train(2, {"cfg": dict(cfg, stop_after=1)})
    assert first["epochs"] == 1 and (run / "checkpoint.npz").exists()
    res = _train(2, {"cfg": dict(cfg, resume=str(run)), "ref": True})
    assert res["epochs"] == 2
    from engine.ops.gemm import gemm_impl
    if gemm_impl() == "engine":
        # its sums continue micro-batch after micro-batch (csrc/gemm.h): bit for bit
        assert res["ref_max_diff"] == 0.0, res
        assert res["test_acc"] == res["ref_test_acc"], res
    else:
        # OpenBLAS sums a micro-batch differently from the whole batch; two
        # epochs can amplify that rounding through one flipped ReLU (~0.02)
        assert res["ref_max_diff"] < 0.05, res
        assert abs(res["test_acc"] - res["ref_test_acc"]) < 0.01, res


def test_spectrain_predicts_the_weights_better_than_the_stale_version_on_digits(tmp_path, capsys):
    res = _train(3, {"cfg": {"epochs": 1, "lr": 0.02, "out": str(tmp_path),
                             "extra": {"schedule": "1f1b", "microbatches": 4, "predict": "spectrain"}}})
    stages = res["per_stage"]
    for s in stages[:-1]:      # the last stage has s = 0: nothing to predict
        assert s["err_hat_mean"] < s["err_stale_mean"], stages
        assert s["err_ratio"] < 0.9, stages
    assert stages[-1]["err_stale_mean"] == 0.0 and stages[-1]["err_hat_mean"] == 0.0

    # sprint report reads the same statistics
    from engine.cli import main
    assert main(["report", str(tmp_path), "--no-png"]) == 0
    out = capsys.readouterr().out
    assert "schedule 1f1b   predict spectrain" in out and "partition 0:1,1:2,2:4" in out
    ratios = [float(line.split()[-1]) for line in out.splitlines() if line.strip()[:1] in "01"
              and "conv" in line]
    assert len(ratios) == 2 and all(r < 0.9 for r in ratios), out


def test_spectrain_predicts_better_than_the_stale_version_on_cifar_format_data(tmp_path):
    import json
    from cifar_like import SMALL_SPEC, digits_as_cifar
    digits_as_cifar(tmp_path / "data", n_train=640)
    (tmp_path / "spec.json").write_text(json.dumps(SMALL_SPEC))
    res = _train(3, {"cfg": {"epochs": 1, "lr": 0.02, "model": str(tmp_path / "spec.json"),
                             "data": str(tmp_path / "data"), "fmt": "cifar",
                             "extra": {"schedule": "1f1b", "microbatches": 4, "predict": "spectrain"}}})
    stages = res["per_stage"]
    assert res["test_acc"] > 0.3, res          # it learns: the errors come from real training
    for s in stages[:-1]:
        assert s["err_hat_mean"] < s["err_stale_mean"] and s["err_ratio"] < 0.9, stages
    assert stages[-1]["err_stale_mean"] == 0.0


def test_dualpipe_trains_on_digits_at_its_default_rate():
    """At the mini-batch's 0.05, applied after every micro-batch, dualpipe
    on digits (30 epochs: the cosine keeps the rate high for long) fell to
    chance by epoch 3 (10.9 %) and stayed there; its default is 0.05 / M."""
    res = _train(2, {"cfg": {"parallel": "pipeline", "epochs": 30, "stop_after": 3, "extra": {"schedule": "dualpipe"}}})
    # 0.8, not 0.9: epochs 2-3 ranged 0.855-0.975 over seeds 0-5 with either
    # conv algorithm (implicit 0.861-0.972, Winograd 0.855-0.975; 12:50 UTC,
    # 2026-12-01), so 0.9 held for implicit's seed 0 only by chance; far
    # from the 10.9 % of the failure
    assert res["epochs"] == 3 and min(res["history"][1:]) > 0.8, res


@pytest.mark.parametrize("rank1", [{"extra": {"microbatches": 2}}, {"extra": {"partition": "0:1,1:4"}},
                                   {"lr": 0.03}])
def test_ranks_with_different_options_refuse_to_start(rank1):
    import json
    job = {"cfg": {"epochs": 1, "extra": {"microbatches": 4}}, "rank1": rank1}
    rc, out, _ = run_mpi(2, "pipeline_train.py", json.dumps(job), timeout=60)
    assert rc != 0 and "PIPE RUN" not in out, out[-3000:]
    assert "ranks disagree on options" in out and "refusing to start" in out, out[-3000:]


def test_sprint_train_parallel_pipeline_cli(tmp_path):
    import os
    import subprocess
    import sys
    from test_parallel_mpi import ROOT
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="90", OMP_NUM_THREADS="1")
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "mpi4py", "-m", "engine.cli", "train", "--parallel",
           "pipeline", "--schedule", "1f1b", "--predict", "stash", "--microbatches", "2", "--epochs", "1",
           "--no-progress", "--out", str(run)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "done: 1 epoch" in out, out[-3000:]
    assert "schedule 1f1b" in out and (run / "pipeline_stats.json").exists()
    # --schedule 1f1b is the pipeline's schedule; the learning rate keeps its default one
    import json
    train = json.loads((run / "config.json").read_text())["train"]
    assert train["extra"]["schedule"] == "1f1b" and train["schedule"] == "cosine"
    # 1f1b updates after each of the 2 micro-batches: the default lr is 0.05 / 2
    assert train["lr"] == 0.025 and "lr 0.025," in out
    from engine.cli import main
    assert main(["report", str(run), "--no-png"]) == 0

