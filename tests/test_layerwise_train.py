"""``sprint train --parallel layerwise --plan PLAN.json``: bad plans are
refused with one message before any data is read; a 2-rank run writes a
checkpoint that ``sprint eval`` scores as the run did."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main
from engine.perf import layerwise as L

ROOT = Path(__file__).resolve().parents[1]


def _plan(tmp_path, kind, model, n, batch, name="plan.json"):
    f = tmp_path / name
    L.named_plan(kind, model, n, batch).save(f)
    return f


@pytest.mark.parametrize("case,msg", [
    ("ranks", "the plan is for 2 devices, the job has 1 rank: run it with mpiexec -n 2, as sprint plan printed"),
    ("model", "is for model 'tiny'"),
    ("batch", "made for batch 16, the run uses --batch 32"),
    ("missing", "needs --plan PLAN.json"),
    ("notlayerwise", "applies to --parallel layerwise only (--plan)"),
])
def test_bad_plans_are_refused_before_anything_runs(tmp_path, capsys, case, msg):
    args = ["train", "--model", "digits", "--batch", "32", "--epochs", "1", "--no-progress",
            "--out", str(tmp_path / "run"), "--data", str(tmp_path / "no-such-data")]
    plan = {"ranks": ("owt", "digits", 2, 32), "model": ("data", "tiny", 1, 32), "batch": ("data", "digits", 1, 16),
            "missing": None, "notlayerwise": ("data", "digits", 1, 32)}[case]
    if plan:
        args += ["--plan", str(_plan(tmp_path, *plan))]
    if case != "notlayerwise":
        args += ["--parallel", "layerwise"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("error:") == 1, err
    assert "no-such-data" not in err and not (tmp_path / "run").exists()   # refused before the data


def test_a_plan_for_another_batch_says_the_batch_to_give(tmp_path):
    """`sprint plan --gpus 2` plans 32 per device (64), `sprint train` defaults
    to --batch 32: the plan was refused without the batch it needs."""
    from engine.parallel.layerwise_run import load_checked_plan
    from engine.train import TrainConfig
    plan = _plan(tmp_path, "data", "digits", 2, 64)
    cfg = TrainConfig(model="digits", parallel="layerwise", extra={"plan": str(plan)})
    with pytest.raises(ValueError) as e:
        load_checked_plan(cfg, 2)
    assert str(e.value) == f"plan {plan}: the plan was made for batch 64, the run uses --batch 32; give --batch 64"
    assert load_checked_plan(TrainConfig(model="digits", batch=64, parallel="layerwise",
                                         extra={"plan": str(plan)}), 2).batch == 64


def test_a_plan_for_fewer_devices_than_ranks_is_refused_and_idle_ranks_are_said(tmp_path):
    """`mpiexec -n 3` with a plan for 2 devices trained with rank 2 holding
    nothing, said only as 'plan on 3 rank(s)'."""
    from engine.parallel.layerwise_run import idle_ranks_note, load_checked_plan
    from engine.train import TrainConfig
    plan = _plan(tmp_path, "owt", "digits", 2, 32)
    cfg = TrainConfig(model="digits", batch=32, parallel="layerwise", extra={"plan": str(plan)})
    assert load_checked_plan(cfg, 2).devices == 2
    with pytest.raises(ValueError, match=r"the plan is for 2 devices, the job has 3 ranks: rank 2 would hold no "
                                         r"layer; run it with mpiexec -n 2, or plan for 3 \(sprint plan --gpus 3\)"):
        load_checked_plan(cfg, 3)
    p = L.named_plan("data", "digits", 4, 32)
    assert idle_ranks_note(p, 4) == ""
    p.layers = {k: (2, 1, 1, 1) for k in p.layers}      # an optimum that leaves two of the 4 devices out
    assert idle_ranks_note(p, 4) == "; ranks 2..3 hold no layer (no layer of the plan splits more than 2 ways) " \
                                    "and only wait"


def test_two_ranks_train_and_the_checkpoint_evaluates_the_same(tmp_path):
    plan = _plan(tmp_path, "owt", "digits", 2, 32)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPIEXEC_TIMEOUT="150", OMP_NUM_THREADS="1")
    run = tmp_path / "run"
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "engine.cli", "train", "--model", "digits",
                        "--batch", "32", "--epochs", "1", "--parallel", "layerwise", "--plan", str(plan),
                        "--out", str(run), "--no-progress"], capture_output=True, text=True, env=env, timeout=170)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 1 and recs[-1]["test_acc"] > 0.5
    stats = json.loads((run / "layerwise_stats.json").read_text())
    assert stats["ranks"] == 2 and stats["steps"] == recs[-1]["step"] > 0
    e = subprocess.run([sys.executable, "-m", "engine.cli", "eval", str(run)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert e.returncode == 0, e.stderr
    assert f"{100 * recs[-1]['test_acc']:.2f} %" in e.stdout, (e.stdout, recs[-1])
    # sprint report read the other strategies' statistics only: "no statistics of a parallel run"
    r = subprocess.run([sys.executable, "-m", "engine.cli", "report", str(run), "--png", str(tmp_path / "r.png")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "mode layerwise   model digits   2 ranks, plan for 2 devices   batch 32" in r.stdout, r.stdout
    held = [int(line.split()[1].replace(",", "")) for line in r.stdout.splitlines()
            if line[:4].strip() in ("0", "1") and len(line.split()) == 3]
    assert len(held) == 2 and sum(held) >= stats["n_params"], r.stdout     # replicated slices count twice
    assert (tmp_path / "r.png").stat().st_size > 0


def _lw_run(n, job, timeout=120):
    from test_parallel_mpi import run_mpi
    rc, out, dt = run_mpi(n, "layerwise_train.py", json.dumps(job), timeout=timeout)
    return rc, out, dt


def test_a_resumed_two_rank_run_is_the_uninterrupted_one(tmp_path):
    import numpy as np
    plan = _plan(tmp_path, "owt", "digits", 2, 32)
    cfg = {"model": "digits", "batch": 32, "epochs": 2, "seed": 5, "extra": {"plan": str(plan)}}
    runs = {}
    for name, more in (("whole", {"out": str(tmp_path / "whole")}),
                       ("first", {"out": str(tmp_path / "cut"), "stop_after": 1}),
                       ("resumed", {"resume": str(tmp_path / "cut"), "out": str(tmp_path / "cut")})):
        save = tmp_path / f"{name}.npy"
        rc, out, _ = _lw_run(2, {"cfg": dict(cfg, **more), "save": str(save)})
        assert rc == 0 and "LW RUN " in out, out[-3000:]
        runs[name] = (json.loads(out.split("LW RUN ", 1)[1].splitlines()[0]), np.load(save))
    assert runs["first"][0]["epochs"] == 1 and runs["resumed"][0]["epochs"] == 2
    # weights and velocity after the resumed second epoch are the uninterrupted run's, bit for bit
    assert np.array_equal(runs["resumed"][1], runs["whole"][1])
    assert runs["resumed"][0]["history"][-1]["test_acc"] == runs["whole"][0]["history"][-1]["test_acc"]
    recs = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in recs] == [1, 2]
    # the checkpoint is a one-process one: a rank held only its slices (the FC layers are split)
    stats = runs["whole"][0]["stats"]
    assert max(stats["params_held"]) < stats["n_params"], stats


@pytest.mark.parametrize("fault", ["raise", "kill", "freeze"])
def test_a_failed_killed_or_frozen_rank_ends_the_job_naming_it(tmp_path, fault):
    import re
    plan = _plan(tmp_path, "owt", "digits", 2, 32)
    cfg = {"model": "digits", "batch": 32, "epochs": 1, "timeout": 3, "extra": {"plan": str(plan)}}
    rc, out, dt = _lw_run(2, {"cfg": cfg, "fault": fault}, timeout=60)
    assert rc != 0 and dt < 45, (dt, out[-3000:])
    assert "UNEXPECTED" not in out and "LW RUN" not in out, out[-3000:]
    if fault == "raise":
        assert "rank 1 of 2 failed: RuntimeError: injected failure in layer-wise step 3" in out, out[-3000:]
    elif fault == "freeze":
        assert re.search(r"sprint: error: rank 1 of 2 stopped answering \(no heartbeat for \d+ s; --timeout 3\)",
                         out), out[-3000:]
    else:
        # a SIGKILLed rank cannot speak: the launcher names its pid, the rank map printed at start its rank
        pid = re.search(r"PID (\d+) RUNNING", out)
        assert pid and re.search(rf"rank [01] pid {pid.group(1)}\b", out), out[-3000:]


def test_a_run_on_a_relative_plan_resumes_from_another_folder(tmp_path, monkeypatch, capsys):
    """config.json kept --plan as given: resumed from another folder, the run
    read 'plan.json' from there ('cannot read plan plan.json')."""
    start = tmp_path / "start"
    start.mkdir()
    _plan(start, "data", "digits", 1, 32)
    monkeypatch.chdir(start)
    train = ["train", "--model", "digits", "--batch", "32", "--parallel", "layerwise", "--no-progress"]
    assert main(train + ["--epochs", "1", "--plan", "plan.json", "--out", "run"]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "start/run", "--epochs", "2", "--no-progress"]) == 0, capsys.readouterr().err
    assert [json.loads(line)["epoch"] for line in (start / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    # a run saved with the plan as given (before it was stored resolved) names its config and the folder
    config = start / "run" / "config.json"
    saved = json.loads(config.read_text())
    saved["train"]["extra"]["plan"] = "plan.json"
    config.write_text(json.dumps(saved))
    capsys.readouterr()
    assert main(["train", "--resume", "start/run", "--epochs", "3"]) == 2
    err = capsys.readouterr().err
    assert err == (f"sprint: error: the run's plan plan.json, a relative path in its config.json, is not found "
                   f"from {tmp_path}: resume from the folder the run was started in (start/run/config.json)\n"), err


def test_a_missing_plan_file_is_named_with_its_option(tmp_path, capsys):
    assert main(["train", "--model", "digits", "--parallel", "layerwise", "--plan", str(tmp_path / "nope.json"),
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == f"sprint: error: no such file for --plan; write one with sprint plan --out ({tmp_path}/nope.json)\n"
