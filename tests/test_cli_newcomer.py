"""What a newcomer met in the first hour (session 19): errors that named no
option or gave no way on, one option checked in three places with three
texts, and a thread budget counted from cores the process may not use."""
import json
import os

import pytest

from engine import cli


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("SPRINT_DEBUG", raising=False)     # tracebacks would join the one line
    monkeypatch.setenv("SPRINT_DEVICE", "cpu")


def one_line(capsys, argv, code=2):
    assert cli.main([str(a) for a in argv]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sprint: error: "), lines
    return lines[0]


def test_a_profile_name_that_is_no_file_lists_what_profile_takes(capsys):
    """`sprint plan --profile h100` said "profile does not exist (h100)": not
    which names it takes (the h200 datasheet) nor where the profiles are."""
    line = one_line(capsys, ["plan", "--model", "digits", "--gpus", "2", "--profile", "h100", "--no-calibrate"])
    assert line.startswith("sprint: error: no profile file or datasheet named h100; --profile takes a datasheet "
                           "by name (h200), a profile file (the "), line
    assert "bench/profiles/), or nothing for the shipped default_profile.json (--profile)" in line, line
    # a checkout's profile named without its folder: that file is offered
    line = one_line(capsys, ["plan", "--model", "digits", "--gpus", "2", "--profile", "cpu_test17"])
    assert "a profile file such as bench/profiles/cpu_test17.json" in line, line
    # predict takes files only: the same list without the datasheets, the path as given
    line = one_line(capsys, ["predict", "--model", "tiny", "--nodes", "1", "--subbatch", "1", "--profile", "h100"])
    assert line.startswith("sprint: error: profile does not exist; --profile takes a profile file (the "), line
    assert line.endswith("default_profile.json (h100)") and "datasheet" not in line, line


@pytest.mark.parametrize("command", [["train"], ["predict", "--nodes", "1", "--subbatch", "1"],
                                     ["plan", "--gpus", "2"]])
def test_a_spec_path_that_is_a_folder_names_the_option(capsys, tmp_path, command):
    """`sprint train --model runs/` said "spec file runs: is a directory, not a spec file", no option."""
    line = one_line(capsys, [command[0], "--model", tmp_path, *command[1:]])
    assert line == f"sprint: error: spec file {tmp_path}: is a directory, not a spec file (--model)"
    bad = tmp_path / "net.json"
    bad.write_text('{"x0": 8,')
    assert one_line(capsys, [command[0], "--model", bad, *command[1:]]).endswith("(--model)")


def test_info_names_its_positional_for_a_spec_folder(capsys, tmp_path):
    assert one_line(capsys, ["info", tmp_path]).endswith("is a directory, not a spec file (sprint info MODEL)")


@pytest.mark.parametrize("value", [0, 1, 1.5, -0.2, float("nan"), "0.3", True])
def test_a_bad_test_fraction_is_refused_when_set_naming_key_and_value(value):
    """test_fraction=0 was taken, and refused ("test_fraction must be in (0, 1), got 0")
    only once a source without a test set was read; one with a test set ignored it."""
    from engine.session.config import TrainConfig
    with pytest.raises(ValueError, match=r"^test_fraction must be (a number )?in \(0, 1\), got "):
        TrainConfig(test_fraction=value)
    from engine.data.readers import split_indices
    with pytest.raises(ValueError, match=r"^test_fraction must be a number in \(0, 1\), got "):
        split_indices(10, value, 0, "x")


def test_a_runs_saved_test_fraction_is_named_in_its_config(tmp_path, capsys):
    """`sprint eval RUN` of a run whose config.json holds test_fraction 2 said
    "test_fraction must be in (0, 1), got 2" naming no file; --resume likewise."""
    run = tmp_path / "run"
    assert cli.main(["train", "--epochs", "1", "--out", str(run), "--no-progress", "--quiet"]) == 0
    capsys.readouterr()
    cfg = json.loads((run / "config.json").read_text())
    cfg["train"]["test_fraction"] = 2
    (run / "config.json").write_text(json.dumps(cfg))
    assert one_line(capsys, ["eval", run]) == \
        f"sprint: error: the run's test_fraction must be a number in (0, 1), got 2 ({run / 'config.json'})"
    line = one_line(capsys, ["train", "--resume", run, "--epochs", "2", "--no-progress", "--quiet"])
    assert line == ("sprint: error: saved options are invalid: test_fraction must be in (0, 1), got 2 "
                    f"({run / 'config.json'})")


def test_threads_per_worker_counts_the_cores_this_process_may_use(monkeypatch):
    """It split os.cpu_count, the host's cores, where the rest of the engine
    (the profile's cores, sprint train's --threads warning) counts the affinity mask."""
    from engine.parallel.threads import threads_per_worker, usable_cores
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert usable_cores() == 4
    assert threads_per_worker(2) == 2 and threads_per_worker(8) == 1
    assert threads_per_worker(2, cores=16) == 8            # a budget given (--threads) is the budget


@pytest.mark.parametrize("argv", [
    ["train", "--parallel", "pipeline"],
    ["predict", "--model", "digits", "--parallel", "pipeline", "--subbatch", "8", "--no-calibrate"],
    ["simulate", "--model", "digits", "--parallel", "pipeline", "--subbatch", "8", "--no-calibrate"],
    ["info", "digits"],
])
def test_partition_and_stages_are_checked_in_one_place_with_one_text(capsys, argv):
    """--partition of the wrong length said "--partition 0:2,2:4 has 2 stages, --stages
    says 3" (train), "has 2 stages, --stages says 3 (--partition)" (predict, simulate)
    and "--partition has 2 stages, --stages says 3" (info), from three copies of the check."""
    assert one_line(capsys, [*argv, "--stages", "3", "--partition", "0:2,2:4"]) == \
        "sprint: error: --partition 0:2,2:4 has 2 stages, --stages says 3 (--partition)"
    assert one_line(capsys, [*argv, "--stages", "9"]) == \
        "sprint: error: --stages must be between 1 and the 4 layers of digits, got 9 (--stages)"
    assert one_line(capsys, [*argv, "--stages", "2", "--partition", "0:2,2:5"]) == \
        "sprint: error: --partition 0:2,2:5 must end at layer 4 (the network has 4 layers)"
