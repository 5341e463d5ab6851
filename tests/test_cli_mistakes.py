"""A newcomer's plausible mistakes with `sprint`: each is refused with one
`sprint: error: <what> (<option or file>)` line and exit 2 before any work,
instead of being taken for "unset", trained on silently or left to hang."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("SPRINT_DEBUG", raising=False)     # tracebacks would join the one line


def one_line(capsys, argv, *fragments):
    assert cli.main([str(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sprint: error: "), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv,fragments", [
    (["train", "--seed", "-1"], ["must be an integer >= 0, got -1 (--seed)"]),
    (["train", "--threads", "0"], ["must be an integer >= 1, got 0 (--threads)"]),
    (["train", "--threads", "-3"], ["(--threads)"]),
    (["train", "--crop-pad", "-1"], ["(--crop-pad)"]),
    (["train", "--parallel", "pipeline", "--microbatches", "0"], ["got 0 (--microbatches)"]),
    (["train", "--parallel", "pipeline", "--stages", "0"], ["(--stages)"]),
    (["train", "--parallel", "pipeline", "--replicas", "0"], ["(--replicas)"]),
    (["train", "--parallel", "downpour", "--servers", "0"], ["(--servers)"]),
    (["train", "--parallel", "downpour", "--fetch-every", "0"], ["(--fetch-every)"]),
    (["train", "--parallel", "downpour", "--push-every", "-1"], ["(--push-every)"]),
    (["train", "--parallel", "sandblaster", "--slice", "0"], ["(--slice)"]),
    (["train", "--parallel", "sandblaster", "--history", "0"], ["(--history)"]),
    (["train", "--parallel", "sandblaster", "--slow-rank", "-1"], ["got -1 (--slow-rank)"]),
    (["train", "--timeout", "0.01"], ["timeout must be finite and >= 1 (seconds), got 0.01 (--timeout)"]),
    (["info", "tiny", "--batch", "0"], ["got 0 (--batch)"]),
    (["eval", "nowhere", "--batch", "0"], ["got 0 (--batch)"]),
])
def test_counts_of_zero_or_below_are_refused_naming_the_option(capsys, tmp_path, argv, fragments):
    one_line(capsys, [*argv, "--out", tmp_path / "run"] if argv[0] == "train" else argv, *fragments)
    assert not (tmp_path / "run").exists()


def test_info_of_an_unknown_model_names_its_positional_not_model_option(capsys):
    """`sprint info nonet` said '(--model)', an option info does not have."""
    one_line(capsys, ["info", "nonet"], "model 'nonet' is neither a preset", "(sprint info MODEL)")


_PREDICT = ["--model", "tiny", "--nodes", "2", "--workers", "1", "--subbatch", "4", "--no-calibrate"]


@pytest.mark.parametrize("argv,fragments", [
    (["plan", "--model", "tiny", "--gpus", "2", "--batch", "0"], ["got 0 (--batch)"]),
    (["plan", "--model", "tiny", "--gpus", "-2"], ["got -2 (--gpus)"]),
    (["plan", "--model", "tiny", "--gpus", "2", "--calibrate-seconds", "0"], ["(--calibrate-seconds)"]),
    *[([cmd, *_PREDICT, flag, "0"], [f"got 0 ({flag})"])
      for cmd in ("predict", "simulate")
      for flag in ("--nodes", "--workers", "--subbatch", "--threads", "--ranks-per-host", "--n-file")],
    (["predict", *_PREDICT, "--host-load", "0"], ["(--host-load)"]),
    (["predict", *_PREDICT, "--host-load", "nan"], ["(--host-load)"]),
    (["predict", *_PREDICT, "--calibrate-seconds", "-1"], ["(--calibrate-seconds)"]),
    (["predict", *_PREDICT, "--model", "nonet"], ["neither a preset", "(--model)"]),
    (["predict", *_PREDICT, "--parallel", "pipeline", "--microbatches", "0"], ["(--microbatches)"]),
    (["predict", *_PREDICT, "--parallel", "downpour", "--servers", "0"], ["(--servers)"]),
    (["predict", *_PREDICT, "--parallel", "downpour", "--fetch-every", "0"], ["(--fetch-every)"]),
    (["predict", *_PREDICT, "--parallel", "sandblaster", "--history", "0"], ["(--history)"]),
    (["predict", *_PREDICT, "--parallel", "sandblaster", "--slow-rank", "-1"], ["(--slow-rank)"]),
    (["simulate", *_PREDICT, "--seed", "-1"], ["got -1 (--seed)"]),
    *[(["tune", "--model", "tiny", "--target-minibatch", "8", "--no-calibrate", flag, "0"], [f"got 0 ({flag})"])
      for flag in ("--max-nodes", "--max-subbatch", "--max-workers", "--workers", "--top")],
    (["tune", "--model", "tiny", "--target-minibatch", "0", "--no-calibrate"], ["(--target-minibatch)"]),
    (["tune", "--model", "tiny", "--target-minibatch", "8", "--tolerance", "-0.1", "--no-calibrate"],
     ["(--tolerance)"]),
    (["profile", "--threads", "0", "--from-records", "nowhere.json"], ["got 0 (--threads)"]),
])
def test_the_perf_commands_refuse_counts_of_zero_naming_the_option(capsys, argv, fragments):
    """`sprint plan --batch 0` used to plan for a batch of 0 and print a table."""
    one_line(capsys, argv, *fragments)


def test_values_this_net_or_data_cannot_use_are_refused_before_training(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    # a crop padding of the 8x8 input's size shows the net mostly padding (10 % accuracy)
    one_line(capsys, ["train", "--crop-pad", "8", "--out", run], "smaller than the network's 8x8 input (--crop-pad)")
    (tmp_path / "notes.txt").write_text("hello")
    one_line(capsys, ["train", "--data", tmp_path / "notes.txt", "--out", run],
             "name it with --format", f"({tmp_path / 'notes.txt'})")
    assert not run.exists()


def test_a_batch_past_the_training_set_is_said_not_done_silently(capsys, tmp_path, monkeypatch):
    from engine.session import setup
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    # the one batch of 1,438 images needs ~0.14 GiB, the nominal 100,000 ~9.6 GiB: on a host with
    # less free than that the run was refused for memory it would never use
    monkeypatch.setattr(setup, "available_memory", lambda backend: 1 << 30)
    assert cli.main(["train", "--batch", "100000", "--epochs", "1", "--out", str(tmp_path / "run"),
                     "--no-progress", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.strip() == ("sprint: warning: batch 100000 is larger than the training set (1438 images in "
                           "digits/train): every epoch is a single, smaller batch (--batch)"), err
    monkeypatch.setattr(setup, "available_memory", lambda backend: 1 << 20)      # and a real shortage is said
    one_line(capsys, ["train", "--batch", "100000", "--out", tmp_path / "run2"],
             "model digits with batch 1438 needs at least", "of host memory is free", "(--model)")


def test_the_python_api_refuses_the_same_values():
    from engine.parallel.pipeline_run import options
    from engine.session import TrainConfig
    for bad in (dict(seed=-1), dict(threads=0), dict(crop_pad=-2), dict(parallel="asgd", extra={"max_pending": -1})):
        with pytest.raises(ValueError, match="must be an integer >= "):
            TrainConfig(**bad)
    for key in ("microbatches", "stages", "replicas"):      # 0 was taken for "unset"
        with pytest.raises(ValueError, match="must be"):
            options(TrainConfig(parallel="pipeline", extra={key: 0}), 2)
    assert TrainConfig(parallel="sandblaster", batch=10**6).batch == 10**6   # L-BFGS: the whole set
    from engine.parallel.asgd import ASGD, ASGDConfig
    with pytest.raises(ValueError, match="max_pending must be >= 0, got -1"):   # its workers waited forever
        ASGD(None, np.zeros(4, np.float32), [object()], ASGDConfig(max_pending=-1))


def test_a_negative_max_pending_is_refused_not_a_hang(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")
    p = subprocess.run([sys.executable, "-m", "engine.cli", "train", "--parallel", "asgd", "--max-pending", "-1",
                        "--epochs", "1", "--out", str(tmp_path / "run"), "--no-progress"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.strip() == "sprint: error: must be an integer >= 0, got -1 (--max-pending)"


def test_a_run_saved_with_threads_0_resumes_on_the_automatic_count(tmp_path):
    from engine.session import TrainConfig, resume_config
    from engine.train import train
    run = tmp_path / "run"
    train(TrainConfig(epochs=1, out=str(run), progress=False, verbose=False, device="cpu"))
    conf = json.loads((run / "config.json").read_text())
    conf["train"]["threads"] = 0              # what --threads 0 saved before it was refused
    (run / "config.json").write_text(json.dumps(conf))
    assert resume_config(run, epochs=2).threads is None


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch, capsys):
    """`for s in 1 2; do sprint train --seed $s & done`: both named runs/digits-TIMESTAMP
    and wrote one folder together (or the second was refused)."""
    import time
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20261201-000000")
    for seed in ("1", "2"):
        assert cli.main(["train", "--epochs", "1", "--seed", seed, "--quiet", "--no-progress"]) == 0, capsys.readouterr()
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["digits-20261201-000000", "digits-20261201-000000-2"]
    seeds = [json.loads((tmp_path / "runs" / r / "config.json").read_text())["train"]["seed"] for r in runs]
    assert seeds == [1, 2]


def test_resume_with_another_out_is_refused_not_ignored(tmp_path, monkeypatch, capsys):
    from engine.session import TrainConfig
    from engine.train import train
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    train(TrainConfig(epochs=1, out=str(run), progress=False, verbose=False))
    one_line(capsys, ["train", "--resume", run, "--out", tmp_path / "other", "--epochs", "2"],
             f"--resume continues the run in its own folder ({run}); --out names another (--out)")
    assert not (tmp_path / "other").exists()
    assert cli.main(["train", "--resume", str(run), "--out", str(run), "--epochs", "2", "--quiet", "--no-progress"]) == 0


def test_resume_given_the_checkpoint_file_names_its_run_folder(tmp_path, monkeypatch, capsys):
    """`sprint eval` takes a checkpoint file or its folder; `train --resume
    RUN/checkpoint.npz` said "no such run directory" of a file that is there."""
    from engine.session import TrainConfig
    from engine.train import train
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    train(TrainConfig(epochs=1, out=str(run), progress=False, verbose=False))
    ck = run / "checkpoint.npz"
    line = one_line(capsys, ["train", "--resume", ck, "--epochs", "2"])
    assert line == f"sprint: error: --resume takes a run directory, not a file; resume its run with --resume {run} ({ck})"
    (tmp_path / "notes.txt").write_text("x")
    line = one_line(capsys, ["train", "--resume", tmp_path / "notes.txt"])
    assert line == f"sprint: error: --resume takes a run directory, not a file ({tmp_path / 'notes.txt'})"


def test_a_run_on_a_relative_data_path_is_named_as_the_runs_from_another_folder(tmp_path, monkeypatch, capsys):
    """config.json keeps --data as given: `sprint eval RUN` or `--resume RUN`
    from another folder said "no such file or folder for --data (d.npz)", an
    option the user had not given."""
    rng = np.random.default_rng(0)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    np.savez(a / "d.npz", x=rng.random((40, 8, 8)).astype(np.float32), y=np.arange(40) % 10)
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    monkeypatch.chdir(a)
    assert cli.main(["train", "--data", "d.npz", "--epochs", "1", "--out", "run", "--quiet", "--no-progress"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(b)
    conf = a / "run" / "config.json"
    said = f"sprint: error: the run's data d.npz, a relative path in its config.json, is not found from {b}: "
    assert one_line(capsys, ["eval", a / "run"]) == \
        said + f"give --data, or run from the folder the run was started in ({conf})"
    assert one_line(capsys, ["eval", a / "run" / "checkpoint.npz"]) == \
        said + f"give --data, or run from the folder the run was started in ({conf})"
    assert one_line(capsys, ["train", "--resume", a / "run", "--epochs", "2"]) == \
        said + f"resume from the folder the run was started in ({conf})"
    assert cli.main(["eval", a / "run", "--data", a / "d.npz"]) == 0
    monkeypatch.chdir(a)
    assert cli.main(["eval", "run"]) == 0


def test_a_bad_mpi_poll_setting_names_the_variable(monkeypatch):
    from engine.errors import RunError
    from engine.parallel.comm import _env_seconds
    for bad in ("abc", "-1", "nan", "inf"):
        monkeypatch.setenv("SPRINT_MPI_POLL", bad)
        with pytest.raises(RunError, match=r"must be a number of seconds >= 0, got .* \(SPRINT_MPI_POLL\)"):
            _env_seconds("SPRINT_MPI_POLL")
    monkeypatch.setenv("SPRINT_MPI_POLL", "0.002")
    assert _env_seconds("SPRINT_MPI_POLL") == 0.002


@pytest.mark.parametrize("argv,said", [
    (["--epochs", "0"], "epochs must be an integer >= 1, got 0 (--epochs)"),
    (["--timeout", "-1"], "timeout must be finite and >= 1 (seconds), got -1.0 (--timeout)"),
])
def test_a_bad_value_given_with_resume_names_its_option_not_the_saved_config(tmp_path, monkeypatch, capsys,
                                                                             argv, said):
    """`--resume RUN --epochs 0` said 'saved options are invalid: ... (RUN/config.json)',
    blaming the run for the value just typed."""
    from engine.session import TrainConfig
    from engine.train import train
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    train(TrainConfig(epochs=1, out=str(run), progress=False, verbose=False))
    assert one_line(capsys, ["train", "--resume", run, *argv]) == f"sprint: error: {said}"
    conf = json.loads((run / "config.json").read_text())
    conf["train"]["epochs"] = 0           # a config edited by hand is still the run's
    (run / "config.json").write_text(json.dumps(conf))
    one_line(capsys, ["train", "--resume", run], "saved options are invalid: epochs must be", "config.json)")


def test_data_the_net_does_not_take_names_the_preset_that_does(tmp_path, capsys):
    """CIFAR-sized data given to the default digits net said only 'pass
    --resize', which would scale it to 8x8: the --model was forgotten."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", x=rng.random((40, 3, 32, 32)).astype(np.float32), y=np.arange(40) % 10)
    np.savez(tmp_path / "odd.npz", x=rng.random((40, 3, 20, 20)).astype(np.float32), y=np.arange(40) % 10)
    out = ["--epochs", "1", "--out", tmp_path / "run"]
    assert one_line(capsys, ["train", "--data", tmp_path / "c.npz", *out]).endswith(
        "images are 32x32 but the network takes 8x8; give --model cifar (the preset for 32x32x3 images of 10 "
        "classes), or pass --resize to scale them")
    assert one_line(capsys, ["train", "--model", "tiny", *out]) == (
        "sprint: error: model tiny takes 2 channels but digits/train has 1; give --model digits (the preset for "
        "8x8x1 images of 10 classes)")
    one_line(capsys, ["train", "--data", tmp_path / "odd.npz", *out],
             "give a --model that takes 20x20x3 images of 10 classes (a spec file; no preset does), or pass --resize")
    assert not (tmp_path / "run").exists()


def test_data_and_option_mistakes_name_the_cli_options_not_the_python_api(tmp_path, capsys, monkeypatch):
    """`--data notes.txt` said 'name it with --format (fmt=)', NaN images 'pass
    --skip-bad (skip_bad=True)', odd-sized images '--resize (resize=True)' and
    `--weight-decay -1` 'weight_decay must be': the Python spellings of the options."""
    from PIL import Image
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    x = np.random.default_rng(0).random((20, 1, 8, 8)).astype(np.float32)
    x[3, 0, 1, 1] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=np.arange(20) % 10)
    for i in range(2):
        (tmp_path / "tree" / str(i)).mkdir(parents=True)
        Image.fromarray(np.zeros((12, 12), np.uint8)).save(tmp_path / "tree" / str(i) / "a.png")
    (tmp_path / "cifar").mkdir()
    for name in ("data_batch_1.bin", "test_batch.bin"):
        (tmp_path / "cifar" / name).write_bytes(b"\0" * 100)      # not a whole CIFAR-10 record
    run = ["--epochs", "1", "--out", tmp_path / "run"]
    said = [one_line(capsys, ["train", "--data", tmp_path / "notes.txt", *run], "name it with --format, one of"),
            one_line(capsys, ["train", "--data", tmp_path / "empty", *run], "name it with --format, one of"),
            one_line(capsys, ["train", "--data", tmp_path / "nan.npz", *run], "pass --skip-bad to leave them out"),
            one_line(capsys, ["train", "--data", tmp_path / "tree", *run], "pass --resize to scale the images"),
            one_line(capsys, ["train", "--data", tmp_path / "cifar", *run], "pass --skip-bad to leave the file out"),
            one_line(capsys, ["train", "--weight-decay", "-1", *run],
                     "weight decay must be finite and >= 0, got -1.0 (--weight-decay)"),
            one_line(capsys, ["train", "--scale-jitter", "1", *run],
                     "scale jitter must be in [0, 1), got 1.0 (--scale-jitter)"),
            one_line(capsys, ["train", "--crop-pad", "8", *run], "a crop padding of 8 pixels must be smaller")]
    for line in said:
        assert not re.search(r"\w=|(?<![-\w])(fmt|skip_bad|resize|weight_decay|scale_jitter|crop_pad)\b", line), line
    assert not (tmp_path / "run").exists()


def test_a_resume_that_trains_nothing_keeps_the_saved_epochs(tmp_path, capsys, monkeypatch):
    """`train --resume R --epochs 1` of a 2-epoch run trained nothing but saved
    epochs 1, and the next plain `--resume R` said "(--epochs 1)", an option not given."""
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    quiet = ["--no-progress", "--quiet"]
    assert cli.main(["train", "--epochs", "2", "--out", str(run), *quiet]) == 0
    assert cli.main(["train", "--resume", str(run), "--epochs", "1", *quiet]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["epochs"] == 2
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    assert "the run already has 2 epochs (--epochs 2): nothing to train" in capsys.readouterr().out


def test_a_run_whose_spec_file_is_gone_resumes_on_the_net_it_saved(tmp_path, capsys, monkeypatch):
    """`--resume` of a run trained on net.json, moved since, said "model 'net.json' is neither
    a preset nor a spec file (--model)", an option not given; config.json holds the net."""
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    monkeypatch.chdir(tmp_path)
    Path("net.json").write_text(json.dumps({"x0": 8, "m0": 1, "c": 3, "convs": [[6, 2]], "fcs": [10]}))
    quiet = ["--no-progress", "--quiet"]
    assert cli.main(["train", "--model", "net.json", "--epochs", "1", "--out", "run", *quiet]) == 0
    Path("net.json").rename("moved.json")
    assert cli.main(["train", "--resume", "run", "--epochs", "2", *quiet]) == 0
    assert "done: 2 epochs" in capsys.readouterr().out
    assert json.loads(Path("run/config.json").read_text())["train"]["model"]["convs"] == [[6, 2]]
    assert cli.main(["eval", "run"]) == 0 and capsys.readouterr().out.startswith("net epoch 2 ")


def test_an_image_tree_for_a_net_of_2_channels_says_what_a_tree_gives(tmp_path, capsys, monkeypatch):
    """`--model tiny --data TREE` said "channels must be 1 or 3 for an image tree, got 2", naming no file or option."""
    from PIL import Image
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    for c in ("a", "b"):
        (tmp_path / "tree" / c).mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "tree" / c / "0.png")
    assert one_line(capsys, ["train", "--model", "tiny", "--data", tmp_path / "tree", "--out", tmp_path / "run"]) == (
        "sprint: error: an image tree is decoded to 1 channel (grey) or 3 (RGB), and the network takes 2: give a "
        f"--model of 1 or 3 channels ({tmp_path / 'tree'})")
    assert not (tmp_path / "run").exists()


def test_an_npz_of_one_image_says_it_cannot_be_split(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    np.savez(tmp_path / "one.npz", x=np.zeros((1, 1, 8, 8), np.float32), y=np.zeros(1, np.int64))
    one_line(capsys, ["train", "--data", tmp_path / "one.npz", "--out", tmp_path / "run"],
             "1 sample cannot be split into train and test")      # was "1 samples"


def test_eval_on_data_the_checkpoint_net_does_not_take_suggests_no_model_option(tmp_path, capsys, monkeypatch):
    """`sprint eval RUN --data c.npz` said 'give --model cifar', an option eval does not have (the
    checkpoint fixes the net), and with --resize '(1 channels, 10 classes) does not fit', naming nothing."""
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    assert cli.main(["train", "--epochs", "1", "--out", str(run), "--no-progress", "--quiet"]) == 0
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).random((20, 3, 32, 32)).astype(np.float32),
             y=np.arange(20) % 10)
    said = []
    for extra in ([], ["--resize"]):
        assert cli.main(["eval", str(run), "--data", str(tmp_path / "c.npz"), *extra]) == 2
        note, error = capsys.readouterr().err.strip().splitlines()     # the note that it is not the run's data
        assert note.startswith("note: evaluating on ") and error.startswith("sprint: error: ")
        said.append(error)
    assert said[0].endswith("images are 32x32 but the network takes 8x8; pass --resize to scale them")
    assert said[1] == ("sprint: error: the checkpoint's model digits takes 1 channel and has 10 outputs, c/test has "
                       "3 channels and 10 classes (--data)")


@pytest.mark.parametrize("argv, said", [
    (["--stages", "2"], "applies to --parallel pipeline only (--stages)"),
    (["--stages", "2", "--microbatches", "2"], "apply to --parallel pipeline only (--microbatches, --stages)"),
    (["--parallel", "asgd", "--servers", "2"],
     "applies to --parallel downpour only, not to --parallel asgd (--servers)"),
])
def test_another_strategys_option_is_worded_as_predicts(capsys, tmp_path, argv, said):
    """train said "apply to --parallel pipeline only (--stages)" of one option and never which
    strategy was chosen; predict says "applies to ..., not to --parallel asgd"."""
    assert one_line(capsys, ["train", *argv, "--out", tmp_path / "run"]) == "sprint: error: " + said


def test_init_from_a_preset_run_of_another_model_names_the_model_to_give(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    quiet = ["--no-progress", "--quiet", "--epochs", "1"]
    assert cli.main(["train", "--model", "mnist", "--data", "digits", "--resize", "--out", str(tmp_path / "m"),
                     "--batch", "128", *quiet]) == 0
    one_line(capsys, ["train", "--init-from", tmp_path / "m", "--out", tmp_path / "run", *quiet],
             "the checkpoint was written for model 'mnist', not 'digits'; give --model mnist", f"({tmp_path / 'm'})")
