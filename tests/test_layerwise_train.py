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
    ("ranks", "needs 2 devices, the job has 1 rank"),
    ("model", "is for model 'tiny'"),
    ("batch", "made for batch 16, the run uses --batch 32"),
    ("missing", "needs --plan PLAN.json"),
    ("notlayerwise", "apply to --parallel layerwise only (--plan)"),
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
