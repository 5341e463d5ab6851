"""Odd values a newcomer types, each one error line naming its option or
file, found probing README's commands: a profile output under a folder no
file can be made in (root passes os.access there) was found out only after
the sweep's minutes; a negative selfcheck seed came out of numpy as
'expected non-negative integer', naming no option."""
import os

import pytest

from engine import cli


def _one_error(capsys, *fragments):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sprint: error: "), err
    for f in fragments:
        assert f in err[0], err[0]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_profile_that_cannot_be_written_is_refused_before_the_sweep(capsys, monkeypatch):
    from engine.perf import sweep

    def swept(*a, **kw):
        raise AssertionError("the sweep started")
    monkeypatch.setattr(sweep, "run_all", swept)
    assert cli.main(["profile", "--quick", "--out", "/proc/sprint-profile.json"]) == 2
    _one_error(capsys, "cannot write into this folder", "(/proc)")
    assert cli.main(["profile", "--quick", "--records", "/proc/self/sprint-records.json"]) == 2
    _one_error(capsys, "cannot write into this folder", "(/proc/self)")


def test_profile_without_mpiexec_says_so_once_before_the_sweep_and_how_to_skip_its_sweeps(capsys, monkeypatch,
                                                                                          tmp_path):
    """Without mpiexec on PATH each of its sweeps said a raw FileNotFoundError
    at its turn (three lines each), after the others' minutes."""
    from engine.errors import RunError
    from engine.perf import cli_profile, sweep
    real_which = cli_profile.shutil.which
    monkeypatch.setattr(cli_profile.shutil, "which", lambda c: None if c == "mpiexec" else real_which(c))

    def swept(*a, **kw):
        raise RunError("the sweep started")
    monkeypatch.setattr(sweep, "run_all", swept)
    assert cli.main(["profile", "--quick"]) == 2
    _one_error(capsys, "mpiexec is not on PATH, and the sweeps allreduce, contention, runner contention,",
               "runner contention long, pipeline run under it: ",
               "install an MPI (MPICH or Open MPI), or skip them with --no-allreduce --no-contention (PATH)")
    assert cli.main(["profile", "--quick", "--only", "sgemm,allreduce"]) == 2
    _one_error(capsys, "the sweep allreduce runs under it", "or leave it out of --only (PATH)")
    shipped = os.path.join(os.path.dirname(cli.__file__), "perf", "default_profile.json")
    assert cli.main(["profile", "--update", shipped, "--out", str(tmp_path / "p.json")]) == 2
    _one_error(capsys, "the sweep pipeline runs under it", "refit the section from saved records with --from-records")
    # what the message says to do is enough (--no-contention also skips the long runner sweep)
    for argv in (["--no-allreduce", "--no-contention"], ["--only", "sgemm,loop overhead"]):
        assert cli.main(["profile", "--quick", *argv]) == 2
        _one_error(capsys, "the sweep started")


def test_a_negative_selfcheck_seed_names_its_option(capsys):
    assert cli.main(["selfcheck", "--seed", "-1"]) == 2
    _one_error(capsys, "must be an integer >= 0, got -1", "(--seed)")


def test_report_of_a_parallel_run_stopped_early_says_why_it_has_no_statistics(tmp_path, capsys):
    # a Ctrl-C'd `mpiexec -n 2 ... train --parallel asgd`: its folder, without the statistics of its end
    import json
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": {"parallel": "asgd", "epochs": 100}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e}) + "\n" for e in (1, 2, 3)))
    assert cli.main(["report", str(run)]) == 2
    _one_error(capsys, "no statistics yet: a run of --parallel asgd writes them when it ends, and this one stopped "
               f"after 3 epochs of 100; run it to its end with sprint train --resume {run}", f"({run})")
    (run / "config.json").write_text(json.dumps({"train": {"parallel": None, "epochs": 100}}))
    assert cli.main(["report", str(run)]) == 2
    _one_error(capsys, "a one-process run writes none")


def test_report_of_a_finished_one_process_run_says_it_writes_none(tmp_path, capsys):
    # `sprint train` then `sprint report` of its folder: it said 'this one stopped after 10 epochs of 10;
    # run it to its end with sprint train --resume' (config.json names the mode "none", not None)
    import json
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": {"parallel": "none", "epochs": 10}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e}) + "\n" for e in range(1, 11)))
    assert cli.main(["report", str(run)]) == 2
    _one_error(capsys, "a one-process run writes none", f"({run})")


def test_report_of_a_folder_that_is_no_run_says_so(tmp_path, capsys):
    # an MNIST data folder given to report was told "a one-process run writes none"
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"")
    assert cli.main(["report", str(tmp_path)]) == 2
    _one_error(capsys, "not a run folder (no config.json, no statistics file: asgd_stats.json, ", "): sprint report "
               "takes the --out folder of a parallel run", f"({tmp_path})")


def test_info_with_a_bad_stage_count_prints_no_table_before_its_error(capsys):
    assert cli.main(["info", "cifar", "--stages", "99"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == \
        "sprint: error: --stages must be between 1 and the 8 layers of cifar, got 99 (--stages)"
    assert cli.main(["info", "cifar", "--stages", "2"]) == 0
    out = capsys.readouterr().out
    assert out.index("N_Param = 3,248,202") < out.index("stage")


@pytest.mark.parametrize("argv, said", [
    (["digits", "--microbatches", "4"], "--microbatches applies to the pipeline table: add --stages K (e.g. sprint "
                                        "info digits --stages 2 --microbatches 4) (--microbatches)"),
    (["digits", "--schedule", "1f1b"], "--schedule applies to the pipeline table: add --stages K"),
    (["digits", "--profile", "p.json"], "--profile applies to the pipeline table: add --stages K"),
    (["--stages", "2"], "--stages needs a model to split into stages (sprint info MODEL)"),
    (["digits", "--stages", "3", "--partition", "0:2,2:4"], "--partition 0:2,2:4 has 2 stages, --stages says 3"),
])
def test_info_pipeline_options_without_stages_are_refused_not_ignored(capsys, argv, said):
    """`sprint info digits --microbatches 4` printed the plain layer table, the option silently ignored."""
    assert cli.main(["info", *argv]) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert out.out == "" and len(err) == 1 and err[0].startswith("sprint: error: " + said), out.err


def test_info_partition_alone_shows_its_stages(capsys):
    """--partition without --stages was ignored too: its ranges say how many stages."""
    assert cli.main(["info", "digits", "--partition", "0:1,1:4"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = out[out.index(next(l for l in out if l.startswith("stage "))) + 1:]
    assert [l.split()[0] for l in table[:2]] == ["0", "1"] and not table[2].split()[0].isdigit()


@pytest.mark.parametrize("argv", [["--epochs", "0"], ["--model", "nosuch"], ["--data", "missing-data"],
                                  ["--lr", "-1"]])
def test_a_refused_train_leaves_no_empty_run_folder(tmp_path, monkeypatch, capsys, argv):
    """Each mistyped `sprint train` left an empty runs/MODEL-TIMESTAMP behind."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "kept").mkdir()            # another run's folder stays
    assert cli.main(["train", *argv, "--no-progress"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["kept"]


def _cut(path, key, n=7):
    import numpy as np
    arrays = dict(np.load(path))
    arrays[key] = arrays[key][:n]
    np.savez(path, **arrays)


@pytest.mark.parametrize("key, what", [("params", "parameter"), ("optim.velocity", "momentum")])
def test_a_checkpoint_cut_by_hand_is_named(tmp_path, capsys, key, what):
    """A parameter or momentum vector of another length than the net's: the
    net said 'set_flat: v must have shape (151306,), got (7,)' and the
    optimizer 'velocity shape (7,) does not match', neither naming the file."""
    run = tmp_path / "run"
    assert cli.main(["train", "--epochs", "1", "--out", str(run), "--no-progress", "--quiet"]) == 0
    capsys.readouterr()
    _cut(run / "checkpoint.npz", key)
    line = (f"corrupt checkpoint: its {what} vector has shape (7,), network 'digits' has 151,306 parameters "
            f"({run / 'checkpoint.npz'})")
    assert cli.main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) != 0
    _one_error(capsys, line)
    if key == "params":
        for argv in (["eval", str(run)], ["train", "--init-from", str(run), "--out", str(tmp_path / "b")]):
            assert cli.main(argv) != 0
            _one_error(capsys, f"corrupt checkpoint: its parameter vector has shape (7,)", f"({run})")


def test_more_threads_than_cores_is_warned_of(tmp_path, capsys, monkeypatch):
    """--threads 64 on 2 cores trained digits 5x slower than 1 thread, in silence."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert cli.main(["train", "--epochs", "1", "--threads", "2", "--out", str(tmp_path / "r"), "--no-progress",
                     "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sprint: warning: --threads 2 is more than the 1 core this process may run on: the threads take "
                   "turns on them, which is slower, not faster (--threads)"], err
    assert cli.main(["train", "--epochs", "1", "--threads", "1", "--out", str(tmp_path / "s"), "--no-progress",
                     "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_resume_of_a_run_stopped_before_its_first_epoch_says_so(tmp_path, capsys):
    """Ctrl-C before the first epoch ended says 'nothing to resume in DIR';
    --resume DIR then said 'no such checkpoint file or run folder'."""
    run = tmp_path / "run"
    assert cli.main(["train", "--epochs", "1", "--out", str(run), "--no-progress", "--quiet"]) == 0
    (run / "checkpoint.npz").unlink()               # as a run stopped in its first epoch leaves it
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 2
    _one_error(capsys, "holds no checkpoint (checkpoint.npz), so nothing to resume (a run stopped before its first "
               "epoch ended saves none)",
               f"start it anew with sprint train --out {run} ({run})")


@pytest.mark.parametrize("content, said", [
    (b"\x1f\x8b\x08\x00 binary", "not a text file, as a run's metrics are"),
    (b'{"epoch": 1, "train_loss": "x"}\n', "line 1 is not an epoch's record"),
    (b'{"epoch": 1}\n[1, 2]\n', "line 2 is not an epoch's record"),
    (b'{"epoch": 1}\n{"epoch": 2\n', "line 2 is not JSON"),
])
def test_plot_of_a_damaged_metrics_file_names_it(tmp_path, capsys, content, said):
    """A binary, list or string-valued metrics.jsonl said "'utf-8' codec can't
    decode", "list indices must be integers" or "can't multiply sequence"."""
    (tmp_path / "metrics.jsonl").write_bytes(content)
    assert cli.main(["plot", str(tmp_path)]) == 2
    _one_error(capsys, said, f"({tmp_path / 'metrics.jsonl'})")
    assert not (tmp_path / "loss.png").exists()


def test_plot_given_a_file_of_the_run(tmp_path, capsys):
    """`sprint plot runs/a/metrics.jsonl` said 'not a folder (runs/a/metrics.jsonl/loss.png)'."""
    from engine import metrics
    metrics.write(tmp_path / "metrics.jsonl", [{"epoch": 1, "train_loss": 1.0, "test_loss": 1.1, "train_acc": 0.5,
                                                "test_acc": 0.4}])
    assert cli.main(["plot", str(tmp_path / "metrics.jsonl")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "loss.png"), str(tmp_path / "accuracy.png")]
    (tmp_path / "config.json").write_text("{}")
    assert cli.main(["plot", str(tmp_path / "config.json")]) == 2
    _one_error(capsys, "sprint plot takes a run folder (or its metrics.jsonl), not this file",
               f"({tmp_path / 'config.json'})")


def test_ctrl_c_in_the_profile_sweeps_keeps_the_sweeps_done_and_says_how_to_run_the_rest(tmp_path, capsys,
                                                                                        monkeypatch):
    """Ctrl-C in `sprint profile` (up to half an hour of sweeps) said 'interrupted' and lost every sweep done."""
    import json
    import shlex
    from engine.perf import calibrate, sweep
    monkeypatch.setattr(calibrate, "record", lambda: {"calibration": {}})
    monkeypatch.setattr(calibrate, "calibration_step", lambda *a, **k: {})
    monkeypatch.setattr(calibrate, "merge_calibrations", lambda cs: {})
    ctrl_c = {"on": True}

    def layers():
        if ctrl_c["on"]:
            raise KeyboardInterrupt
        return [{"kind": "layer", "t": 2.0}]
    monkeypatch.setattr(sweep, "_steps", lambda cfg, skipped, be: {
        "sgemm": lambda: [{"kind": "sgemm", "t": 1.0}], "layers": layers,
        "pooling": lambda: [{"kind": "pool", "t": 3.0}]})
    out = tmp_path / "p.json"
    assert cli.main(["profile", "--quick", "--only", "sgemm,layers,pooling", "--out", str(out)]) == 130
    keep = tmp_path / "p.records.json"
    rest = shlex.join(["sprint", "profile", "--quick", "--from-records", str(keep), "--only", "layers,pooling",
                       "--records", str(keep), "--out", str(out)])
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"interrupted in sweep layers; the sweeps done are kept in {keep}: run the rest with {rest}"
    saved = json.loads(keep.read_text())
    assert [r["kind"] for r in saved["records"]] == ["sgemm"] and saved["meta"]["quick"] and not out.exists()
    # the rest, merged with them (what that command sweeps before it fits)
    ctrl_c["on"] = False
    done = sweep.run_all(only=["layers", "pooling"], merge=saved, log=None)
    assert sorted(r["kind"] for r in done["records"]) == ["layer", "pool", "sgemm"]


def test_report_png_that_cannot_be_written_is_said_as_plot_out_is(tmp_path, capsys, monkeypatch):
    """`report RUN --png runs/a/loss.png/x.png` said 'not a folder (.../x.png)', the file in the way unnamed."""
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")
    run = tmp_path / "run"
    assert cli.main(["train", "--parallel", "asgd", "--epochs", "1", "--out", str(run), "--no-progress",
                     "--quiet"]) == 0
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    assert cli.main(["report", str(run), "--png", str(tmp_path / "afile" / "r.png")]) == 2
    _one_error(capsys, "cannot create the folder for the plot (--png): not a folder", f"({tmp_path / 'afile'})")
    assert cli.main(["report", str(run), "--png", str(tmp_path)]) == 2
    _one_error(capsys, "is a folder, not a file; --png takes the plot's file name", f"({tmp_path})")
    assert cli.main(["report", str(run), "--png", str(tmp_path / "new" / "r.png")]) == 0
    assert (tmp_path / "new" / "r.png").stat().st_size > 0


def test_a_refused_profile_leaves_no_folder_behind(tmp_path, capsys):
    """`sprint profile --out new/dir/p.json --only nosuch` made new/dir before
    it refused the sweep's name; the outputs' check now tries the nearest
    folder that exists and makes nothing."""
    out = tmp_path / "new" / "dir" / "p.json"
    assert cli.main(["profile", "--quick", "--only", "nosuch", "--out", str(out),
                     "--records", str(tmp_path / "other" / "r.json")]) == 2
    _one_error(capsys, "unknown sweep 'nosuch'", "(--only)")
    assert cli.main(["profile", "--from-records", str(tmp_path / "none.json"), "--out", str(out)]) == 2
    _one_error(capsys, "no such file for --from-records")
    assert sorted(f.name for f in tmp_path.iterdir()) == []
    (tmp_path / "afile").write_text("x")
    assert cli.main(["profile", "--quick", "--out", str(tmp_path / "afile" / "x" / "p.json")]) == 2
    _one_error(capsys, f"not a folder ({tmp_path / 'afile'})")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["afile"]


def test_profile_options_name_themselves(tmp_path, capsys, monkeypatch):
    """`--only nosuch` said "unknown sweep(s) ['nosuch']" naming no option, `--only "handover,"` refused
    a sweep '', a missing --from-records said "no such file or folder", --plots FILE "not a folder"."""
    from engine.errors import RunError
    from engine.perf import sweep
    asked = {}

    def swept(**kw):
        asked.update(kw)
        raise RunError("the sweep started")
    monkeypatch.setattr(sweep, "run_all", swept)
    assert cli.main(["profile", "--quick", "--only", "nosuch,handover"]) == 2
    _one_error(capsys, "unknown sweep 'nosuch'; choose from sgemm, layers,", "(--only)")
    assert cli.main(["profile", "--quick", "--only", "handover,", "--out", str(tmp_path / "p.json")]) == 2
    _one_error(capsys, "the sweep started")
    assert asked["only"] == ["handover"]
    assert cli.main(["profile", "--from-records", str(tmp_path / "none.json")]) == 2
    _one_error(capsys, "no such file for --from-records (`sprint profile --records FILE` writes one)")
    (tmp_path / "f").write_text("x")
    assert cli.main(["profile", "--quick", "--plots", str(tmp_path / "f")]) == 2
    _one_error(capsys, f"--plots takes a folder for the PNGs, not a file ({tmp_path / 'f'})")
