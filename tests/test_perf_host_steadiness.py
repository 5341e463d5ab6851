"""host_steadiness: a calibration's calls read in short windows, and the note
predict and plan print when the host's speed flips between states."""
import numpy as np
import pytest

from engine import cli
from engine.perf import calibrate, host_steadiness as hs
from engine.perf.profile import Profile

from bench_scripts import load as load_bench


def _calls(states, per_window=25, call=2e-3, seed=0):
    """Call starts and lengths over consecutive windows, each window at the
    speed factor ``states[i]`` (1: fast), with 3 % scatter."""
    rng = np.random.default_rng(seed)
    starts, times = [], []
    for i, f in enumerate(states):
        for j in range(per_window):
            starts.append(i * hs.WINDOW + j * hs.WINDOW / per_window)
            times.append(call * f * (1 + 0.03 * rng.standard_normal()))
    return starts, times


def test_two_states_read_as_their_ratio_and_share():
    states = [1.0] * 12 + [1.65] * 28           # 30 % fast, in runs as on the AMD VM
    got = hs.window_spread(*_calls(states))
    assert got["windows"] == 40 and got["spread"] == pytest.approx(1.65, rel=0.04)
    assert got["fast"] == pytest.approx(0.3)
    said = hs.note({"steadiness": got})
    assert "not steady" in said and "x1.6" in said and "30 %" in said


def test_a_steady_host_and_a_short_calibration_say_nothing():
    steady = hs.window_spread(*_calls([1.0] * 40))
    assert steady["spread"] < 1.1 and hs.note({"steadiness": steady}) is None
    assert hs.window_spread(*_calls([1.0, 1.65] * 4)) == {}       # 8 windows: too few to tell
    assert hs.window_spread([], []) == {} and hs.note(None) is None and hs.note({}) is None


def test_calibration_records_its_windows():
    cal = calibrate.calibration_step(seconds=1.2, blocks=3, compute=False)
    s = cal["steadiness"]
    assert s["windows"] >= hs.MIN_WINDOWS and s["spread"] >= 1.0 and 0.0 <= s["fast"] <= 1.0
    # a 0.3-s calibration (the tests') has too few windows to say anything
    assert "steadiness" not in calibrate.calibration_step(seconds=0.3, blocks=3, compute=False)


def test_an_unsteady_calibration_is_a_note_not_a_warning(tmp_path, capsys, monkeypatch):
    prof = Profile.load()
    then = prof.data["fingerprint"]["calibration"]
    now = {k: then[k] for k in ("wall_s", "cpu_s", "kernel_s", "python_s", "compute_s") if k in then}
    now.update(u=0.01, u_kernel=0.01, u_python=0.01, u_compute=0.01, n=100,
               steadiness={"spread": 1.65, "fast": 0.2, "windows": 40})
    chk = calibrate.compare(prof.data["fingerprint"], calibrate.fingerprint(), now)
    assert len(chk.notes) == 1 and not any("steady" in m for m in chk.messages)
    assert calibrate.compare(prof.data["fingerprint"], None, dict(now, steadiness={})).notes == []
    monkeypatch.setattr(calibrate, "calibration_step", lambda *a, **k: dict(now))
    path = tmp_path / "p.json"
    prof.data["fingerprint"] = dict(prof.data["fingerprint"], **{k: v for k, v in calibrate.fingerprint().items()
                                                                  if k != "host"})
    prof.save(path)
    args = ["--model", "tiny", "--nodes", "1", "--subbatch", "4", "--profile", str(path), "--json"]
    assert cli.main(["predict"] + args) == 0
    err = capsys.readouterr().err
    assert "sprint predict: note: this host's speed is not steady" in err and "warning:" not in err
    assert cli.main(["predict"] + args + ["--no-calibrate"]) == 0
    assert capsys.readouterr().err == ""


def test_host_states_waits_for_a_steady_reading_then_runs_the_command(tmp_path, capsys, monkeypatch):
    """bench/host_states.py --until: readings until every phase's p90/p10 is
    at most --steady, then the command (its exit status); exit 3, nothing
    run, when the deadline passes first."""
    import datetime
    import sys
    states = load_bench("host_states")
    t = [datetime.datetime(2026, 12, 6, 8, 0, tzinfo=datetime.timezone.utc)]
    clock = lambda: t[0]

    def sleep(s):
        t[0] += datetime.timedelta(seconds=s)
    two_state = [1e-6] * 8 + [1.8e-6] * 4            # p90/p10 x1.8
    steady = [1e-6, 1.02e-6, 1.05e-6] * 4            # x1.05
    seen = iter([[("alone", two_state)] * 3, [("alone", steady), ("spin", two_state), ("again", steady)],
                 [("alone", steady)] * 3])
    mark = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(mark)!r}, 'w').close(); raise SystemExit(7)"]
    a = states.argparse.Namespace(until="08:30", every=240.0, steady=1.10, seconds=6.0, lock=str(tmp_path / "l"),
                                  then=cmd, consecutive=1)
    assert states.wait_steady(a, read=lambda s: next(seen), sleep=sleep, clock=clock) == 7
    out = capsys.readouterr().out
    assert mark.exists() and out.count("worst phase") == 3 and "worst phase x1.80" in out
    assert "until 2026-12-06 08:30 UTC" in out
    assert t[0] == datetime.datetime(2026, 12, 6, 8, 8, tzinfo=datetime.timezone.utc)   # the third reading
    # Never steady: the deadline ends it and the command never runs.
    mark.unlink()
    t[0] = datetime.datetime(2026, 12, 6, 8, 0, tzinfo=datetime.timezone.utc)
    assert states.wait_steady(a, read=lambda s: [("alone", two_state)] * 3, sleep=sleep, clock=clock) == 3
    assert not mark.exists() and "not steady by 08:30 UTC: nothing run" in capsys.readouterr().out
    # --consecutive 2: a steady reading alone among unsteady ones runs nothing;
    # the second of two in a row runs the command.
    t[0] = datetime.datetime(2026, 12, 6, 8, 0, tzinfo=datetime.timezone.utc)
    seen = iter([[("alone", steady)] * 3, [("alone", two_state)] * 3, [("alone", steady)] * 3,
                 [("alone", steady)] * 3])
    a.consecutive = 2
    assert states.wait_steady(a, read=lambda s: next(seen), sleep=sleep, clock=clock) == 7
    out = capsys.readouterr().out
    assert mark.exists() and out.count("steady, 1 of 2 in a row") == 2 and "2 steady readings in a row" in out
    assert t[0] == datetime.datetime(2026, 12, 6, 8, 12, tzinfo=datetime.timezone.utc)   # the fourth reading
    a.consecutive = 1
    # A time already past today is tomorrow's, and said so before the first reading.
    t[0] = datetime.datetime(2026, 12, 6, 9, 0, tzinfo=datetime.timezone.utc)
    assert states.deadline("08:30", t[0]) == datetime.datetime(2026, 12, 7, 8, 30, tzinfo=datetime.timezone.utc)
    # The command keeps its own options (README: ... -- sprint profile --quick).
    got = []
    monkeypatch.setattr(states, "wait_steady", lambda a: got.append(a) or 0)
    assert states.main(["--until", "12:00", "--every", "60", "--", "sprint", "profile", "--quick"]) == 0
    assert got[0].then == ["sprint", "profile", "--quick"] and got[0].every == 60.0
    monkeypatch.undo()
    with pytest.raises(SystemExit):
        states.main(["--until", "8h30", "--", "true"])
    with pytest.raises(SystemExit):
        states.main(["--", "true"])                   # a command without a deadline
    with pytest.raises(SystemExit):
        states.main(["--until", "12:00", "--consecutive", "0", "--", "true"])
