"""The run folder under faults: a SIGKILL at every write point of an epoch,
a file-size limit, stale temporaries, another run's checkpoint, --init-from,
and the metrics that the checkpoint carries."""
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import checkpoint
from engine.errors import RunError
from engine.session import TrainConfig, resume_config
from engine.train import train
from test_train import _blobs

ROOT = Path(__file__).resolve().parents[1]


def _cfg(data, out, **kw):
    d = dict(model="tiny", data=str(data), epochs=3, batch=16, progress=False, verbose=False, out=str(out),
             prefetch=1)
    d.update(kw)
    return d


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in ("time", "images_per_s")} for r in recs]


def _metrics(run):
    return [json.loads(l) for l in (Path(run) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("ref")
    data = _blobs(base / "blobs.npz", n=96)
    res = train(TrainConfig(**_cfg(data, base / "run")))
    return data, res, _strip(_metrics(base / "run"))


# write passages of a 3-epoch run: 1 config, 2 metrics at start; 3/4 checkpoint and
# metrics of epoch 1; 5/6 of epoch 2; 7/8 of epoch 3
@pytest.mark.parametrize("point", ["replace", "fsync_dir"])
@pytest.mark.parametrize("nth", [5, 6])
def test_a_kill_at_any_write_point_of_an_epoch_loses_no_metrics_line(tmp_path, reference, point, nth):
    data, ref, ref_lines = reference
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "kill_run.py"), json.dumps(_cfg(data, run)),
                        point, str(nth)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert p.returncode == -9, p.stderr[-2000:]
    # whatever the moment, every file is whole
    cfg = json.loads((run / "config.json").read_text())
    state = checkpoint.load(run)
    assert state["run_id"] == cfg["run_id"]
    # the checkpoint carries every epoch it holds, even when metrics.jsonl lags behind
    assert [r["epoch"] for r in state["history"]] == list(range(1, state["epoch"] + 1))
    on_disk = [r["epoch"] for r in _metrics(run)]
    assert on_disk in (list(range(1, state["epoch"] + 1)), list(range(1, state["epoch"])))
    res = train(resume_config(run))
    assert res["epochs"] == 3 and not list(run.glob("*.tmp"))
    assert _strip(_metrics(run)) == ref_lines
    assert checkpoint.load(run)["params"].tobytes() == ref["net"].params.tobytes()


def _limited(nbytes):
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return pre


def test_file_size_limit_fails_in_one_line_and_the_run_stays_resumable(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")
    cmd = [sys.executable, "-m", "engine.cli", "train", "--out", str(run), "--epochs", "1", "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120, env=env, cwd=ROOT)
    before = {n: (run / n).read_bytes() for n in ("config.json", "checkpoint.npz", "metrics.jsonl")}
    # 64 KiB: config.json and metrics.jsonl fit, the 1.8 MB checkpoint does not; 1 KiB: nothing fits
    for limit, where in ((64 << 10, "checkpoint.npz"), (1 << 10, "config.json")):
        p = subprocess.run([sys.executable, "-m", "engine.cli", "train", "--resume", str(run), "--epochs", "2",
                            "--no-progress"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
                           preexec_fn=_limited(limit))
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1, p.stderr
        assert lines[0].startswith("sprint: error: file too large")
        # a checkpoint that did not fit says what the run keeps and how to go on
        kept = f"; epoch 1 is saved: resume with: sprint train --resume {run}" if where == "checkpoint.npz" else ""
        assert lines[0].endswith(f"{run / where}){kept}"), lines[0]
        assert not list(run.glob("*.tmp"))
        assert (run / "checkpoint.npz").read_bytes() == before["checkpoint.npz"]
        assert json.loads((run / "config.json").read_text())["run_id"]
    res = train(resume_config(run, epochs=2, progress=False, verbose=False))
    assert res["epochs"] == 2 and [r["epoch"] for r in _metrics(run)] == [1, 2]


def test_stale_temporaries_go_and_another_runs_checkpoint_is_refused(tmp_path, reference):
    data = reference[0]
    a, b = tmp_path / "a", tmp_path / "b"
    train(TrainConfig(**_cfg(data, a, epochs=1)))
    train(TrainConfig(**_cfg(data, b, epochs=1, seed=1)))
    (a / "checkpoint.npz.x1y2.tmp").write_bytes(b"\0" * 100)
    (a / "metrics.jsonl.abc.tmp").write_text("half")
    (a / "notes.tmp").write_text("not ours")
    (a / "checkpoint.npz").write_bytes((b / "checkpoint.npz").read_bytes())
    with pytest.raises(RunError, match="belongs to run .* use --init-from"):
        train(resume_config(a, epochs=2))
    assert not list(a.glob("*.npz.*.tmp")) and not list(a.glob("*.jsonl.*.tmp")) and (a / "notes.tmp").exists()
    # --init-from takes another run's weights into a new run, from epoch 0
    res = train(TrainConfig(**_cfg(data, tmp_path / "c", epochs=1, init_from=str(b))))
    first = _metrics(tmp_path / "c")[0]
    assert res["epochs"] == 1 and first["epoch"] == 1
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"x0": 8, "m0": 2, "c": 3, "convs": [[4, 2]], "fcs": [3]}))
    with pytest.raises(RunError, match="model 'tiny', not 'other'"):
        train(TrainConfig(**_cfg(data, tmp_path / "d", model=str(other), init_from=str(b))))
    with pytest.raises(ValueError, match="give one of them"):
        TrainConfig(resume=str(a), init_from=str(b))


def test_metrics_are_rebuilt_from_the_checkpoint(tmp_path, reference):
    data = reference[0]
    run = tmp_path / "r"
    train(TrainConfig(**_cfg(data, run, stop_after=2)))
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n')       # lost a line, one left mangled
    train(resume_config(run))
    assert _strip(_metrics(run)) == reference[2]


def test_corrupt_checkpoints_name_the_file(tmp_path, reference):
    data = reference[0]
    run = tmp_path / "r"
    train(TrainConfig(**_cfg(data, run, epochs=1)))
    good = (run / "checkpoint.npz").read_bytes()
    (run / "checkpoint.npz").write_bytes(good[:len(good) // 2])
    with pytest.raises(checkpoint.CheckpointError, match="corrupt or truncated") as e:
        train(resume_config(run, epochs=2))
    assert e.value.where == str(run / "checkpoint.npz")
    # metadata naming an array the file lacks
    meta = json.dumps({"params": {"__array__": "params"}, "momentum": {"__array__": "momentum"}}).encode()
    np.savez(run / "checkpoint.npz", params=np.zeros(3, np.float32),
             **{"__meta__.json": np.frombuffer(meta, np.uint8)})
    with pytest.raises(checkpoint.CheckpointError, match="missing array 'momentum'"):
        checkpoint.load(run)
    (run / "config.json").write_text('{"train": {"model": "tiny",')
    with pytest.raises(RunError, match="not valid JSON") as e:
        resume_config(run)
    assert e.value.where == str(run / "config.json")


def test_os_errors_name_the_target_file_not_the_temporary(tmp_path, monkeypatch):
    import errno
    from engine.cli import describe
    target = tmp_path / "run" / "config.json"
    target.parent.mkdir()
    target.write_text("old")
    for code, words in ((errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"),
                        (errno.ENOSPC, "no space left on the device")):
        def refuse(*a, **kw):
            raise OSError(code, os.strerror(code), str(a[0]))
        monkeypatch.setattr(checkpoint.os, "replace", refuse)
        with pytest.raises(OSError) as e:
            checkpoint.atomic_write(target, "new")
        assert describe(e.value) == f"{words} ({target})"
        assert target.read_text() == "old" and sorted(p.name for p in target.parent.iterdir()) == ["config.json"]
    monkeypatch.undo()
    (tmp_path / "run" / "metrics.jsonl").mkdir()
    with pytest.raises(OSError) as e:
        checkpoint.atomic_write(tmp_path / "run" / "metrics.jsonl", "x")
    assert describe(e.value).endswith(f"({tmp_path / 'run' / 'metrics.jsonl'})")


def test_a_new_run_into_a_trained_runs_folder_is_refused_and_leaves_it_whole(tmp_path, reference):
    data = reference[0]
    run = tmp_path / "run"
    train(TrainConfig(**_cfg(data, run, epochs=2)))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for kw in ({}, {"init_from": str(run)}, {"epochs": 1, "seed": 3}):
        with pytest.raises(RunError, match=r"already holds a trained run .*--resume") as e:
            train(TrainConfig(**_cfg(data, run, **kw)))
        assert e.value.where == str(run)
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPRINT_DEVICE="cpu")
    p = subprocess.run([sys.executable, "-m", "engine.cli", "train", "--model", "tiny", "--data", str(data),
                        "--epochs", "1", "--out", str(run)], capture_output=True, text=True, timeout=120,
                       env=env, cwd=ROOT)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("sprint: error: already holds"), p.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # a folder with a config alone (a run stopped before its first epoch) holds nothing to lose
    (run / "checkpoint.npz").unlink()
    assert train(TrainConfig(**_cfg(data, run, epochs=1)))["epochs"] == 1
    # and resuming stays what continues a run
    assert train(resume_config(run, epochs=2))["epochs"] == 2


def test_a_new_run_into_a_folder_of_other_files_named_like_a_runs_is_refused(tmp_path, reference):
    # `--out .` in a project folder replaced the project's own config.json
    data = reference[0]
    for name, text in (("config.json", '{"name": "my project"}'), ("config.json", "not json"),
                       ("metrics.jsonl", '{"loss": 1}\n')):
        run = tmp_path / f"proj-{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        (run / name).write_text(text)
        (run / "notes.txt").write_text("mine")
        with pytest.raises(RunError, match=f"holds {name} of something other than a sprint run") as e:
            train(TrainConfig(**_cfg(data, run, epochs=1)))
        assert e.value.where == str(run)
        assert (run / name).read_text() == text and sorted(p.name for p in run.iterdir()) == [name, "notes.txt"]
    # a folder of other files only takes a run beside them
    run = tmp_path / "other"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    assert train(TrainConfig(**_cfg(data, run, epochs=1)))["epochs"] == 1
    assert (run / "notes.txt").read_text() == "mine"


def test_resuming_a_finished_run_says_there_is_nothing_to_train(tmp_path, reference, capsys):
    data = reference[0]
    run = tmp_path / "run"
    first = train(TrainConfig(**_cfg(data, run, epochs=2)))
    ckpt = (run / "checkpoint.npz").read_bytes()
    for epochs in (1, 2):
        res = train(resume_config(run, epochs=epochs, verbose=True))
        out = capsys.readouterr().out
        assert f"the run already has 2 epochs (--epochs {epochs}): nothing to train" in out
        assert res["epochs"] == 2 and res["history"] == []
        assert res["test_acc"] == first["test_acc"] is not None
        assert (run / "checkpoint.npz").read_bytes() == ckpt


def test_a_finished_one_epoch_run_says_one_epoch_not_1_epochs(tmp_path, reference, capsys):
    data = reference[0]
    run = tmp_path / "run"
    train(TrainConfig(**_cfg(data, run, epochs=1)))
    capsys.readouterr()
    train(resume_config(run, epochs=1, verbose=True))
    out = capsys.readouterr().out
    assert "the run already has 1 epoch (--epochs 1): nothing to train" in out


def test_a_trained_runs_folder_refused_under_mpiexec_names_the_mpiexec_resume(tmp_path, monkeypatch):
    # `mpiexec -n 2 ... train --out runs/s` again was told "sprint train --resume runs/s", one rank's
    from engine.parallel import launcher
    from engine.session.rundir import RunDir
    (tmp_path / "checkpoint.npz").write_bytes(b"")
    for ranks, said in ((1, f"resume with: sprint train --resume {tmp_path}, or choose another --out"),
                        (2, f"resume with: mpiexec -n 2 sprint train --resume {tmp_path}, or choose another --out")):
        monkeypatch.setattr(launcher, "launcher_world_size", lambda: ranks)
        with pytest.raises(RunError) as e:
            RunDir(tmp_path).refuse_a_run()
        assert str(e.value) == f"already holds a trained run (checkpoint.npz); {said} ({tmp_path})"
