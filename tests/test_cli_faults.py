"""`sprint` as a user meets its failures: one `sprint: error:` line and a
non-zero exit for each, the traceback only with --debug, Ctrl-C that says
how to resume, and the small conveniences of the train/eval/info commands
(the same under mpiexec: test_cli_faults_mpi.py)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine import checkpoint

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")


def sprint(*args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=kw.get("cwd", ROOT))


def one_error_line(p, *fragments):
    lines = p.stderr.strip().splitlines()
    assert p.returncode not in (0, None) and len(lines) == 1 and lines[0].startswith("sprint: error: "), p.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_divergence_ends_in_one_line_within_30_s(tmp_path):
    t = time.monotonic()
    p = sprint("train", "--lr", "36", "--out", tmp_path / "run", "--no-progress", timeout=60)
    assert time.monotonic() - t < 30
    # the --lr given, not the schedule's rate at that step (in warmup: a fraction of it)
    one_error_line(p, "training diverged: the loss became", "at epoch 1, step", "lower learning rate (--lr, now 36)")


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from engine.errors import Diverged
    from engine.net import Net
    from engine.session import TrainConfig, resume_config
    from engine.train import train
    real = Net.loss_and_grad
    calls = {"n": 0}

    def poisoned(self, x, y):
        calls["n"] += 1
        loss, correct = real(self, x, y)
        return (float("inf") if calls["n"] == 50 else loss), correct   # in epoch 2 of 45 steps

    monkeypatch.setattr(Net, "loss_and_grad", poisoned)
    run = tmp_path / "run"
    with pytest.raises(Diverged, match=f"loss became inf at epoch 2, step 5; the checkpoint of epoch 1 stays in {run}"):
        train(TrainConfig(epochs=3, out=str(run), progress=False, verbose=False))
    assert checkpoint.load(run)["epoch"] == 1 and len((run / "metrics.jsonl").read_text().splitlines()) == 1
    assert resume_config(run).resume == str(run)


@pytest.mark.parametrize("delay", [0.0, 0.7, 1.9])
def test_ctrl_c_says_how_to_resume_and_exits_130(tmp_path, delay):
    run = tmp_path / "run"
    # A shell's background job starts with SIGINT ignored, and Python keeps
    # an inherited SIG_IGN (as it should: nohup). The suite may run that way
    # (`.ci/run &`): the child gets the terminal's default back.
    # 30 epochs: the default 10 of digits now end in about 2 s, before the
    # latest signal would arrive, and a signal after the run is no Ctrl-C test.
    p = subprocess.Popen([sys.executable, "-m", "engine.cli", "train", "--out", str(run), "--no-progress",
                          "--epochs", "30"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    p.stdout.readline()                  # the header: training has begun
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    last = err.strip().splitlines()[-1]
    m = re.fullmatch(rf"interrupted after epoch (\d+); resume with: sprint train --resume {re.escape(str(run))}", last)
    if m:
        epoch = int(m.group(1))
        state = checkpoint.load(run)
        assert state["epoch"] == epoch and len(state["history"]) == epoch
    else:
        assert last == f"interrupted before the first epoch ended; nothing to resume in {run}", err
    assert "Traceback" not in err


def test_the_resume_hint_of_an_mpi_job_names_its_launcher():
    from engine.errors import Interrupted
    assert str(Interrupted(3, "runs/a", ranks=4)) == "interrupted after epoch 3; resume with: mpiexec -n 4 sprint " \
                                                     "train --resume runs/a"
    assert str(Interrupted(3, "runs/a")) == "interrupted after epoch 3; resume with: sprint train --resume runs/a"


def test_ctrl_c_in_any_strategy_says_how_to_resume(tmp_path):
    """The pipelines, DistBelief and layer-wise runs let Ctrl-C through as a
    bare KeyboardInterrupt ('interrupted', no hint): the session adds it."""
    from engine.errors import Interrupted
    from engine.session import Session
    from engine.train import TrainConfig
    run = tmp_path / "run"
    got = None
    try:
        with Session(TrainConfig(epochs=1, out=str(run), progress=False, verbose=False)) as s:
            s.start(0)
            raise KeyboardInterrupt
    except BaseException as e:       # a bare KeyboardInterrupt must not end the test session
        got = e
    assert isinstance(got, Interrupted), repr(got)
    assert str(got) == f"interrupted before the first epoch ended; nothing to resume in {run}"


def test_a_loss_that_explodes_without_becoming_inf_is_said(capsys):
    """A resumed cifar run's epoch reached a training loss of 1.5e33 and
    chance accuracy without a word (only NaN/Inf stop a run)."""
    from engine.session import Session
    from engine.train import TrainConfig
    with Session(TrainConfig(epochs=2, lr=0.05, progress=False, verbose=False)) as s:
        s.end_epoch({"epoch": 1, "train_loss": 2.9, "test_acc": 0.2}, None)
        assert capsys.readouterr().err == ""
        s.end_epoch({"epoch": 2, "train_loss": 1.49e33, "test_acc": 0.1}, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sprint: warning: epoch 2: the training loss 1.49e+33 is over 10 "
                                               "times a blind guess's (2.30 for 10 classes)"), err
    assert "a lower --lr (now 0.05)" in err[0]


@pytest.mark.parametrize("losses,said", [
    ([30.0, 0.5], None),                                   # it came back: left alone
    ([2.98, 2.42, 2.34], None),                            # at chance, but never diverging
    ([243.0, 9.6, 2.8, 2.32], "the training loss reached 243 in epoch 1 (over 10 times a blind guess's 2.30) "
                              "and ended at 2.32 in epoch 4, no better than a blind guess"),
    ([14.5, 3.54e15], "the training loss was 3.54e+15 in the last epoch (2), over 10 times a blind guess's 2.30"),
    ([1.2, 0.3, 0.2, 45.0, 2.2], None),                    # a late spike it came back from
])
def test_a_run_that_diverged_without_a_nan_ends_in_an_error_unless_it_came_back(tmp_path, losses, said):
    """ASGD and Downpour at --lr 50 ran to their end with the loss far above
    a blind guess's (or back at it, the net dead) and exited 0, a warning per
    epoch the only sign. The run's end now judges it: a loss that went over
    10 x ln C and did not come back under ln C is a divergence."""
    from engine.errors import NotRecovered
    from engine.session import Session
    from engine.train import TrainConfig
    run = tmp_path / "run"
    with Session(TrainConfig(epochs=len(losses), lr=0.05, progress=False, verbose=False, out=str(run))) as s:
        s.start(0)
        for i, loss in enumerate(losses):
            s.end_epoch({"epoch": i + 1, "train_loss": loss, "test_acc": 0.1}, None)
        if said is None:
            assert s.result(type("N", (), {"n_params": 1})(), len(losses))["train_loss"] == losses[-1]
            return
        with pytest.raises(NotRecovered) as e:
            s.result(None, len(losses))
    assert str(e.value) == (f"training diverged: {said} (its epochs: {run}/metrics.jsonl); try a lower learning "
                            f"rate (--lr, now 0.05)")


def test_sandblasters_nan_training_loss_is_a_divergence_without_an_lr_to_lower(capsys):
    """Sandblaster's line search steps around a NaN/Inf point, so its run
    went on reporting a train_loss of inf and exited 0; it sets no --lr."""
    from engine.errors import NotRecovered
    from engine.session import Session
    from engine.train import TrainConfig
    with Session(TrainConfig(parallel="sandblaster", epochs=2, progress=False, verbose=False)) as s:
        for i, loss in enumerate([0.9, float("inf")]):
            s.end_epoch({"epoch": i + 1, "train_loss": loss, "test_acc": 0.6}, None)
        with pytest.raises(NotRecovered, match=r"^training diverged: the training loss was inf in the last epoch "
                                               r"\(2\), over 10 times a blind guess's 2.30$"):
            s.result(None, 2)


def test_pipeline_stages_past_the_net_are_said_before_the_ranks_they_would_need(tmp_path, capsys, monkeypatch):
    """`--stages 9` on the 4-layer digits net asked for mpiexec -n 9, which then
    said the net is too short; a --partition of the wrong length likewise."""
    from engine import cli
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    monkeypatch.delenv("SPRINT_DEBUG", raising=False)
    for argv, said in ((["--stages", "9"], "sprint: error: --stages must be between 1 and the 4 layers of digits, "
                                           "got 9 (--stages)"),
                       (["--stages", "3", "--partition", "0:2,2:4"],
                        "sprint: error: --partition 0:2,2:4 has 2 stages, --stages says 3 (--partition)")):
        assert cli.main(["train", "--parallel", "pipeline", *argv, "--out", str(tmp_path / "run")]) == 2
        assert capsys.readouterr().err.strip() == said
    # a net long enough: then the ranks
    assert cli.main(["train", "--parallel", "pipeline", "--stages", "4", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().endswith("needs mpiexec -n 4, not 1 rank")


def test_bad_options_and_files_are_one_line_each(tmp_path):
    one_error_line(sprint("train", "--lr", "inf"), "lr must be finite and > 0, got inf (--lr)")
    one_error_line(sprint("train", "--lr", "nan"), "got nan (--lr)")
    one_error_line(sprint("train", "--momentum", "1.5"), "momentum must be in [0, 1), got 1.5 (--momentum)")
    one_error_line(sprint("train", "--workers", "2"), "--parallel asgd | sync", "(--workers)")
    one_error_line(sprint("train", "--max-pending", "2"), "(--max-pending)")
    # argparse's own complaints too: one line, no usage dump
    one_error_line(sprint("train", "--epochs", "x"), "invalid int value: 'x' (--epochs)")
    one_error_line(sprint("train", "--format", "foo"), "invalid choice: 'foo'", "(--format)")
    one_error_line(sprint("train", "--bogus", "1"), "unrecognized arguments: --bogus 1", "`sprint train --help`")
    one_error_line(sprint("plan", "--gpus", "2"), "required: --model", "`sprint plan --help`")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"x0": 8, "m0": 1, "c": 3, "convs": [[32, 1]], "fcs": [200000000, 10]}))
    one_error_line(sprint("train", "--model", big), "fcs[0]'s weights", "32-bit", str(big))
    big.write_text(json.dumps({"x0": 8, "m0": 1, "c": 3, "convs": [[32, 1]], "fcs": [1000000, 10]}))
    one_error_line(sprint("train", "--model", big), "needs at least", "GiB", "(--model)")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    one_error_line(sprint("eval", bad), "corrupt or truncated checkpoint", f"({bad})")
    # a mistyped folder is not 'no checkpoint', as if the run were there without one
    one_error_line(sprint("eval", tmp_path / "none"), f"no such checkpoint file or run folder ({tmp_path / 'none'})")
    (tmp_path / "started").mkdir()
    one_error_line(sprint("eval", tmp_path / "started"), f"no checkpoint ({tmp_path / 'started' / 'checkpoint.npz'})")
    one_error_line(sprint("train", "--resume", tmp_path), f"not a run directory (no config.json) ({tmp_path})")
    p = sprint("--debug", "eval", bad)
    assert "Traceback" in p.stderr and p.stderr.strip().splitlines()[-1].startswith("sprint: error: ")


def test_version_info_and_eval_on_the_runs_own_data(tmp_path):
    p = sprint("--version")
    assert p.returncode == 0 and re.fullmatch(r"sprint \S+", p.stdout.strip())
    p = sprint("info")
    assert p.returncode == 0
    for name in ("tiny", "digits", "cifar", "cnn-c"):
        assert re.search(rf"^  {name} +\d+x\d+x\d+ input", p.stdout, re.M), p.stdout
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 60)
    x = rng.normal(0, 0.3, (60, 2, 8, 8)).astype(np.float32)
    x[np.arange(60), y % 2, :4, :4] += 2 * (y[:, None, None] + 1)
    np.savez(tmp_path / "blobs.npz", x=x, y=y)
    np.savez(tmp_path / "other.npz", x=x[:30], y=y[:30])
    run = tmp_path / "run"
    p = sprint("train", "--model", "tiny", "--data", tmp_path / "blobs.npz", "--epochs", "1", "--out", run,
               "--no-progress")
    assert p.returncode == 0 and "done: 1 epoch," in p.stdout and "time " in p.stdout, p.stderr
    acc = json.loads((run / "metrics.jsonl").read_text())["test_acc"]
    p = sprint("eval", run)
    assert p.returncode == 0 and f"accuracy {100 * acc:.2f} %" in p.stdout and "blobs" in p.stdout, p.stderr
    assert p.stderr == ""
    p = sprint("eval", run, "--data", tmp_path / "other.npz")
    assert p.returncode == 0 and "other" in p.stdout
    assert f"note: evaluating on {tmp_path / 'other.npz'}, not the run's own data" in p.stderr
    # more epochs for a finished cosine run: said, with the rate the next epoch starts at
    p = sprint("train", "--resume", run, "--epochs", "3", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "--epochs 3 (was 1): the cosine schedule is re-planned for 3 epochs" in p.stdout
    assert [r["epoch"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3]


def test_every_train_and_eval_option_has_help():
    import argparse
    from engine.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("train", "eval", "info", "plot"):
        for a in sub.choices[name]._actions:
            if not isinstance(a, argparse._HelpAction):
                assert a.help and a.help.strip(), f"sprint {name} {a.option_strings or a.dest} has no help"


def test_every_option_with_a_default_says_it_in_its_help():
    """sprint predict --help did not say --microbatches 4, --servers 1 or
    --history 10 (nor simulate, tune, plan, profile and info several of
    theirs); a strategy's option (engine.perf.strategies) each owner's."""
    import argparse
    from engine.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, p in sub.choices.items():
        owned = (p.get_default("strategy_options") or {}).get("default", {})
        for a in p._actions:
            if not a.option_strings or a.nargs == 0:
                continue
            defaults = ([d[a.dest] for d in owned.values() if a.dest in d] if a.default is argparse.SUPPRESS
                        else [a.default])
            for d in defaults:
                said = f"{d:g}" if isinstance(d, float) else str(d)
                if d is not None and not ("default" in (a.help or "") and said in a.help):
                    missing.append(f"sprint {name} {max(a.option_strings, key=len)} {said}")
    assert not missing, missing


def test_the_workers_help_names_the_strategies_that_take_worker_threads():
    """It said "parallel strategies only"; the pipelines, Downpour, Sandblaster
    and layer-wise refuse --workers."""
    import argparse
    from engine.cli import build_parser
    from engine.session import registry
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    workers = next(a for a in sub.choices["train"]._actions if "--workers" in a.option_strings)
    takes = [s.name for s in registry.STRATEGIES.values() if s.workers]
    assert takes == ["asgd", "sync"] and "(--parallel asgd | sync only; default 1)" in workers.help
    assert one_error_line(sprint("train", "--parallel", "pipeline", "--workers", "2")) == \
        "sprint: error: worker threads need --parallel asgd | sync, not pipeline (--workers)"
    assert one_error_line(sprint("train", "--workers", "2")) == \
        "sprint: error: worker threads need --parallel asgd | sync (--workers)"


def test_resume_accepts_options_repeated_with_the_runs_own_values(tmp_path):
    run = tmp_path / "run"
    assert sprint("train", "--out", run, "--epochs", "1", "--no-progress").returncode == 0
    # as under mpiexec, where --parallel is naturally repeated: the same values change nothing
    p = sprint("train", "--resume", run, "--epochs", "2", "--model", "digits", "--lr", "0.05", "--no-progress")
    assert p.returncode == 0, p.stderr
    assert [json.loads(l)["epoch"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    one_error_line(sprint("train", "--resume", run, "--epochs", "3", "--lr", "0.1", "--model", "digits"),
                   f"may change (to change the others, start a new run from its weights: --init-from {run}) (--lr)")
    # a strategy's own option was named "--extra", an option that does not exist
    assert one_error_line(sprint("train", "--resume", run, "--max-pending", "3")).endswith(") (--max-pending)")


_DROP_WHILE_LOADING = """
import os, signal, sys, time
import engine.cli as cli

class Dropped:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)          # the handler runs in here: Python drops its KeyboardInterrupt

real = cli.build_parser
def build_parser():              # a Ctrl-C while the subcommands' modules load
    Dropped()
    return real()
cli.build_parser = build_parser
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_ctrl_c_dropped_while_the_modules_load_still_stops_the_command(tmp_path):
    """Python drops a KeyboardInterrupt raised in a callback (an import lock's
    weakref while modules load): `sprint train` then trained to the end, with
    an 'Exception ignored' traceback on stderr."""
    # SIG_DFL in the child: a suite started in the background has SIGINT
    # ignored, which the CLI rightly keeps (test_ctrl_c_says_how_to_resume...)
    p = subprocess.run([sys.executable, "-c", _DROP_WHILE_LOADING, "train", "--epochs", "1", "--no-progress",
                        "--out", tmp_path / "run"], capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130 and p.stderr.splitlines() == ["interrupted"], p.stdout[-2000:] + p.stderr
    assert "epoch" not in p.stdout and not (tmp_path / "run").exists()
