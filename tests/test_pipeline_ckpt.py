"""Per-stage checkpoint files of a pipeline run: each stage saves its own
file beside a manifest, a resumed run equals the uninterrupted one, and a
mismatched, missing or corrupt stage file is a clear error naming it."""
import json
import shutil

import numpy as np
import pytest

from engine.errors import RunError
from engine.parallel import pipeline_ckpt as ck
from engine.parallel.pipeline_run import run as run_pipeline
from engine.train import TrainConfig

from test_parallel_mpi import run_mpi
from test_pipeline_mpi import _train

mpi = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not on PATH")
# 1f1b + SpecTrain: velocity, per-stage update counts and the version step all matter
CFG = {"epochs": 2, "lr": 0.02, "extra": {"schedule": "1f1b", "microbatches": 2, "predict": "spectrain"}}


def _local(**kw):
    kw = dict(CFG, progress=False, verbose=False, **kw)
    return run_pipeline(TrainConfig(**kw))


@mpi
@pytest.mark.mpi
def test_resume_from_stage_files_equals_the_uninterrupted_run(tmp_path):
    run, whole, spare = tmp_path / "run", tmp_path / "whole", tmp_path / "spare"
    _train(2, {"cfg": dict(CFG, out=str(run), stop_after=1)})
    m = json.loads((run / ck.MANIFEST).read_text())
    part = m["partition"]                      # the balanced one (it depends on the shipped profile)
    assert m["stages"] == 2 and len(part.split(",")) == 2 and m["schedule"] == "1f1b"
    assert [e["epoch"] for e in m["entries"]] == [1] and m["entries"][0]["step"] > 0
    assert sorted(p.name for p in run.glob("stage*")) == ["stage0-e1.npz", "stage1-e1.npz"]
    shutil.copytree(run, spare)

    res = _train(2, {"cfg": dict(CFG, resume=str(run)), "save": str(tmp_path / "resumed.npy")})
    ref = _train(2, {"cfg": dict(CFG, out=str(whole)), "save": str(tmp_path / "whole.npy")})
    a, b = np.load(tmp_path / "resumed.npy"), np.load(tmp_path / "whole.npy")
    assert res["epochs"] == 2 and ref["epochs"] == 2 and len(res["history"]) == 1
    assert np.abs(a - b).max() <= 1e-6, np.abs(a - b).max()
    assert res["history"][-1] == ref["history"][-1]
    # two epochs' files stay (a kill before checkpoint.npz commits epoch 2 still finds epoch 1's)
    m = json.loads((run / ck.MANIFEST).read_text())
    assert [e["epoch"] for e in m["entries"]] == [1, 2]
    assert sorted(p.name for p in run.glob("stage*")) == ["stage0-e1.npz", "stage0-e2.npz",
                                                          "stage1-e1.npz", "stage1-e2.npz"]

    # one rank's file missing: every rank stops, the error names the file once
    (spare / "stage1-e1.npz").unlink()
    rc, out, _ = run_mpi(2, "pipeline_train.py", json.dumps({"cfg": dict(CFG, resume=str(spare))}), timeout=60)
    assert rc != 0 and "PIPE RUN" not in out
    line = f"sprint: error: stage 1's checkpoint file is missing ({spare / 'stage1-e1.npz'})"
    assert out.count(line) == 1, out[-3000:]
    # resuming two stages' files with one stage is refused, naming both
    with pytest.raises(RunError) as e:
        _local(resume=str(spare))
    assert f"saved as 2 stages (partition {part}, 2 ranks), and this job asks for 1 stage (partition 0:4, " \
        f"1 rank)" in str(e.value) and e.value.where == str(spare / ck.MANIFEST)
    assert f"mpiexec -n 2 sprint train --resume {spare};" in str(e.value)


def test_a_missing_or_corrupt_stage_file_is_an_error_naming_it(tmp_path):
    run = tmp_path / "run"
    _local(out=str(run), epochs=1)
    f = run / "stage0-e1.npz"
    assert f.exists() and json.loads((run / ck.MANIFEST).read_text())["stages"] == 1
    good = f.read_bytes()
    f.write_bytes(good[: len(good) // 2])
    with pytest.raises(RunError) as e:
        _local(resume=str(run), epochs=2)
    assert "corrupt or truncated checkpoint" in str(e.value) and e.value.where == str(f)
    f.unlink()
    with pytest.raises(RunError) as e:
        _local(resume=str(run), epochs=2)
    assert str(e.value) == f"stage 0's checkpoint file is missing ({f})"
    # another stage's file in its place
    f.write_bytes(good)
    state = ck._ckpt.load(f)
    ck._ckpt.save(f, dict(state, stage=3))
    with pytest.raises(RunError, match="holds stage 3") as e:
        _local(resume=str(run), epochs=2)
    assert e.value.where == str(f)
    (run / ck.MANIFEST).unlink()
    with pytest.raises(RunError, match="no pipeline manifest"):
        _local(resume=str(run), epochs=2)


class _Run:
    def __init__(self, path):
        self.path = path

    def file(self, name):
        return self.path / name


def test_a_resume_on_another_stage_count_says_how_to_proceed(tmp_path):
    # what was saved, what is asked, and the two commands that go on from it
    m = {"stages": 2, "partition": "0:2,2:4", "entries": [{"epoch": 1, "files": ["stage0-e1.npz", "stage1-e1.npz"]}]}
    with pytest.raises(RunError) as e:
        ck.check_manifest(_Run(tmp_path), m, 3, "0:1,1:2,2:4", 1, replicas=2)
    msg = str(e.value)
    assert "saved as 2 stages (partition 0:2,2:4, 4 ranks)" in msg
    assert "asks for 3 stages (partition 0:1,1:2,2:4, 6 ranks)" in msg
    assert f"mpiexec -n 4 sprint train --resume {tmp_path};" in msg
    assert f"mpiexec -n 6 sprint train --parallel pipeline --init-from {tmp_path} --out NEW_DIR" in msg
    assert e.value.where == str(tmp_path / ck.MANIFEST)
    assert ck.check_manifest(_Run(tmp_path), m, 2, "0:2,2:4", 1, replicas=2) is m["entries"][0]
    # saved --stages 2 (given at the start) on 3 ranks is refused before the manifest, saying the same
    from engine.parallel.pipeline_run import options
    cfg = TrainConfig(parallel="pipeline", resume=str(tmp_path), out=str(tmp_path), extra={"stages": 2})
    with pytest.raises(ValueError) as e:
        options(cfg, 3)
    assert "--stages 2 x --replicas 1 needs mpiexec -n 2, not 3 ranks (the run's saved options" in str(e.value)
    assert f"mpiexec -n 2 sprint train --resume {tmp_path};" in str(e.value)
    with pytest.raises(ValueError) as e:       # a new run is told only the count (no resume to point to)
        options(TrainConfig(parallel="pipeline", extra={"stages": 2}), 3)
    assert str(e.value) == "--stages 2 x --replicas 1 needs mpiexec -n 2, not 3 ranks"


def test_resume_with_another_stages_option_points_to_init_from(tmp_path, capsys):
    # --stages given to the resume of a pipeline run was told "apply to
    # --parallel pipeline only", though the run is one
    from engine import cli
    run = tmp_path / "run"
    assert cli.main(["train", "--parallel", "pipeline", "--epochs", "1", "--out", str(run), "--no-progress",
                     "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--stages", "2", "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sprint: error: --resume continues with the run's saved options")
    assert f"start a new run from its weights: --init-from {run}) (--stages)" in err[0], err
    assert "to --parallel pipeline only" not in err[0]
    assert cli.main(["train", "--resume", str(run), "--max-pending", "2"]) == 2
    assert "(--max-pending)" in capsys.readouterr().err


@mpi
@pytest.mark.mpi
def test_replicas_share_their_stage_file_and_resume_exactly(tmp_path):
    # 2 stages x 2 replicas on 4 ranks (--stages defaults to ranks / replicas)
    cfg = dict(CFG, extra=dict(CFG["extra"], replicas=2))
    run, whole = tmp_path / "run", tmp_path / "whole"
    _train(4, {"cfg": dict(cfg, out=str(run), stop_after=1)})
    assert sorted(p.name for p in run.glob("stage*")) == ["stage0-e1.npz", "stage1-e1.npz"]
    _train(4, {"cfg": dict(cfg, resume=str(run)), "save": str(tmp_path / "resumed.npy")})
    _train(4, {"cfg": dict(cfg, out=str(whole)), "save": str(tmp_path / "whole.npy")})
    a, b = np.load(tmp_path / "resumed.npy"), np.load(tmp_path / "whole.npy")
    assert np.abs(a - b).max() <= 1e-6, np.abs(a - b).max()
