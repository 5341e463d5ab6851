"""sweep_drift and the sweeps on a host whose speed moves: the marks between
sweeps, kept with the records, the warning when they moved beyond the
calibration's noise, and the runner sweep's one-thread step timed beside each run."""
import numpy as np
import pytest

from engine import cli
from engine.perf import calibrate, sweep, sweep_drift


def _part(a, b):
    return {"before": {"wall_s": a, "u": 0.01, "date": "d"}, "after": {"wall_s": b, "u": 0.01, "date": "d"}}


def test_warning_names_the_spread_of_the_marks_beyond_the_noise():
    moved = {"part_calibrations": {"sgemm": _part(1.57e-3, 2.0e-3), "layers": _part(2.0e-3, 2.61e-3)}}
    assert sweep_drift.spread(moved) == (1.57e-3, 2.61e-3)
    w = sweep_drift.warning(moved)
    assert "1.57-2.61 ms (x1.66)" in w and "bench/host_states.py" in w
    steady = {"part_calibrations": {"sgemm": _part(2.0e-3, 2.1e-3), "layers": _part(2.1e-3, 2.2e-3)}}
    assert sweep_drift.warning(steady) is None
    assert sweep_drift.spread({}) is None and sweep_drift.warning({}) is None
    assert sweep_drift.spread({"part_calibrations": {"x": {"before": {}, "after": {}}}}) is None


def _fake_host(monkeypatch, walls):
    it = iter(walls)
    monkeypatch.setattr(calibrate, "calibration_step",
                        lambda *a, **k: {"wall_s": next(it), "cpu_s": 1e-3, "u": 0.01, "n": 3, "date": "d"})
    monkeypatch.setattr(calibrate, "record", lambda *a, **k: {"calibration": {"wall_s": 1e-3, "u": 0.01, "n": 3,
                                                                               "cpu_s": 1e-3, "date": "d"}})


def test_run_all_marks_the_host_between_sweeps_and_tags_records(monkeypatch):
    _fake_host(monkeypatch, [1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3])
    monkeypatch.setattr(sweep, "_steps", lambda cfg, skipped, be: {
        "sgemm": lambda: [{"kind": "sgemm", "t": 1.0}], "layers": lambda: [{"kind": "im2col", "t": 2.0}]})
    got = sweep.run_all(only=["sgemm", "layers"], log=None)
    assert [r["sweep"] for r in got["records"]] == ["sgemm", "layers"]
    parts = got["meta"]["part_calibrations"]
    assert [parts["sgemm"]["before"]["wall_s"], parts["sgemm"]["after"]["wall_s"],
            parts["layers"]["after"]["wall_s"]] == [1e-3, 1e-3, 1.5e-3]
    assert [r["t"] for r in got["records"]] == [1.0, 2.0]            # the times are kept as measured
    # re-running one sweep keeps the other's marks
    again = sweep.run_all(only=["layers"], merge=got, log=None)
    assert set(again["meta"]["part_calibrations"]) == {"sgemm", "layers"}
    assert again["meta"]["part_calibrations"]["sgemm"] == parts["sgemm"]


def test_profile_warns_when_the_host_moved_during_the_sweeps(tmp_path, monkeypatch, capsys):
    _fake_host(monkeypatch, [1.8e-3, 1.8e-3])          # the mark after sgemm, the closing calibration
    monkeypatch.setattr(sweep, "_steps", lambda cfg, skipped, be: {
        "sgemm": lambda: [{"kind": "sgemm", "t": 1e-5 * (i + 1), "std": 1e-7, "m": 2 ** (i % 5), "n": 2 ** (i % 3),
                           "k": 2 ** (i % 4), "trans": "nn", "holdout": False} for i in range(40)]})
    out = tmp_path / "p.json"
    assert cli.main(["profile", "--quick", "--only", "sgemm", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "sprint profile: warning: the host's speed moved during the sweeps" in err and "(x1.80)" in err
    import json
    assert json.loads(out.read_text())["sweep"]["part_calibrations"]["sgemm"]["after"]["wall_s"] == 1.8e-3


def test_a_mark_keeps_the_parts_a_calibration_rescales_by(monkeypatch):
    full = {"wall_s": 2e-3, "cpu_s": 2e-3, "u": 0.01, "n": 9, "date": "d", "kernel_s": 9e-4, "u_kernel": 0.02,
            "python_s": 1.1e-3, "u_python": 0.03}
    seen = {}

    def step(seconds, blocks=5, compute=True):
        seen.update(seconds=seconds, compute=compute)
        return dict(full)
    monkeypatch.setattr(calibrate, "calibration_step", step)
    got = sweep_drift.mark()
    assert seen == {"seconds": sweep_drift.MARK_SECONDS, "compute": False}
    assert got == {k: full[k] for k in ("wall_s", "u", "kernel_s", "u_kernel", "python_s", "u_python", "date")}


def _reading(wall, kernel, python):
    return {"wall_s": wall, "kernel_s": kernel, "python_s": python, "u": 0.01, "date": "d"}


def test_sweep_reference_weights_the_closing_calibrations_and_the_marks_by_their_seconds():
    cal = dict(_reading(2.0e-3, 1.0e-3, 1.0e-3), compute_s=0.05, u_compute=0.02, drift=0.0,
               before=_reading(2.0e-3, 1.0e-3, 1.0e-3), after=_reading(2.0e-3, 1.0e-3, 1.0e-3))
    meta = {"part_calibrations": {"a": {"after": _reading(3.0e-3, 1.5e-3, 1.5e-3)},
                                  "b": {"after": _reading(3.0e-3, 1.5e-3, 1.5e-3)},
                                  "old": {"after": {"wall_s": 9e-3, "u": 0.01}}}}     # no parts: left out
    ref = sweep_drift.sweep_reference(cal, meta)
    # (3 x 2 + 3 x 2 + 1 x 3 + 1 x 3) / 8 = 2.25 ms; its parts the same way
    assert ref["wall_s"] == pytest.approx(2.25e-3) and ref["kernel_s"] == pytest.approx(1.125e-3)
    assert ref["python_s"] == pytest.approx(1.125e-3) and ref["marks"] == 2
    assert ref["compute_s"] == 0.05 and ref["u_compute"] == 0.02           # the marks do not time it
    assert ref["drift"] == pytest.approx(0.5e-3 / 2.25e-3)                 # half the readings' range
    sd = np.sqrt((6 * 0.25 ** 2 + 2 * 0.75 ** 2) / 8) * 1e-3              # weighted sd of the walls
    n_eff = 8 ** 2 / (9 + 9 + 1 + 1)
    assert ref["u"] == pytest.approx(sd / 2.25e-3 / np.sqrt(n_eff))
    assert sweep_drift.sweep_reference(cal, {}) is None
    assert sweep_drift.sweep_reference({"wall_s": 2e-3}, meta) is None     # no before/after to fold them into


def test_profile_stores_the_sweep_reference_as_its_calibration(tmp_path, monkeypatch, capsys):
    import json
    ends = _reading(2.0e-3, 1.0e-3, 1.0e-3)
    fp = dict(calibrate.fingerprint(), calibration=dict(ends, before=ends, after=ends, drift=0.0, n=9, cpu_s=2e-3))
    recs = {"records": [{"kind": "sgemm", "t": 1e-5 * (i + 1), "std": 1e-7, "m": 2 ** (i % 5), "n": 2 ** (i % 3),
                         "k": 2 ** (i % 4), "trans": "nn", "holdout": False} for i in range(40)],
            "meta": {"fingerprint": fp, "part_calibrations": {"sgemm": {"before": ends,
                                                                         "after": _reading(3e-3, 1.5e-3, 1.5e-3)}}}}
    src = tmp_path / "r.json"
    src.write_text(json.dumps(recs))
    out = tmp_path / "p.json"
    assert cli.main(["profile", "--from-records", str(src), "--out", str(out)]) == 0
    cal = json.loads(out.read_text())["fingerprint"]["calibration"]
    assert cal["wall_s"] == pytest.approx((6 * 2e-3 + 3e-3) / 7) and cal["marks"] == 1


def test_runner_sweep_times_the_one_thread_step_beside_each_one_by_one_run(monkeypatch):
    """On a host flipping between speed states, one solo step before all the
    runs was one state's sample in every pair's excess (cpu_test20)."""
    from engine.perf import sweep_runner as sr
    solos, order = iter([(1e-3, 1e-3), (2e-3, 2e-3), (3e-3, 3e-3)]), []

    def solo(model, n):
        order.append("solo")
        return next(solos)

    def job(model, data, n, r, w, seconds, out, timeout=300):
        order.append(f"run {r}x{w}")
        return {"timers": {}, "T_GPU": 1e-3, "T_Update": 1e-3, "N_Minibatch_avg": 1.0}
    monkeypatch.setattr(sr, "_solo", solo)
    monkeypatch.setattr(sr, "runner_job", job)
    monkeypatch.setattr(sr, "synthetic_npz", lambda *a: None)
    monkeypatch.setattr(sr, "runner_step_means", lambda timers: (
        {"ComputeGradient": 4e-3, **{k: 0.0 for k in sr.WORKER_SMALL}}, {k: 0.0 for k in sr.UPDATER_WORK}))
    recs = sr.sweep_contention_runner(sweep.mode_config(True), pairs=((1, 1), (2, 1), (3, 1)),
                                      workloads=(("tiny", 4),), seconds=0.1)
    assert order == ["solo", "run 1x1", "solo", "run 1x1", "run 2x1", "solo", "run 1x1", "run 3x1"]
    assert [r["solo_wall"] for r in recs] == [1e-3, 2e-3, 3e-3]
    assert [r["host"] for r in recs] == pytest.approx([4.0, 2.0, 4 / 3])


def test_a_profile_swept_on_a_moving_host_is_noted_at_every_use(tmp_path, monkeypatch, capsys):
    """predict (and tune, simulate, plan: the same check) says it whenever the
    profile is read, not only once when it was swept; a steady sweep says nothing."""
    from engine.perf.profile import Profile
    prof = Profile.load()
    then = prof.data["fingerprint"]["calibration"]
    monkeypatch.setattr(calibrate, "calibration_step", lambda *a, **k: dict(then, steadiness={}))
    prof.data["sweep"] = {"part_calibrations": {"sgemm": _part(1.01e-3, 1.2e-3), "layers": _part(1.3e-3, 1.70e-3)}}
    said = [n for n in calibrate.check(prof, apply=False).notes if "was swept while the host's speed moved" in n]
    assert len(said) == 1 and "1.01-1.70 ms, x1.68" in said[0] and prof.source in said[0]
    path = tmp_path / "moved.json"
    prof.save(path)
    assert cli.main(["predict", "--model", "tiny", "--nodes", "1", "--subbatch", "8", "--profile", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"sprint predict: note: {path} was swept while the host's speed moved" in err
    prof.data["sweep"] = {"part_calibrations": {"sgemm": _part(1.5e-3, 1.6e-3)}}
    assert not any("swept while" in n for n in calibrate.check(prof, apply=False).notes)
    assert sweep_drift.profile_note({}) is None


def test_a_moved_sweep_keeps_the_steady_profile_it_replaces(tmp_path, monkeypatch, capsys):
    """``sprint profile --out P`` whose sweeps saw the host move, where P holds
    a profile whose own sweep was steady: the old one is kept byte for byte
    as P's ``.steady.json`` and the note says so; nothing is kept when the
    new sweep was steady, when the old one had moved too, or had no marks.
    The fit is stubbed (the records are empty): what is tested is the file."""
    import json
    from engine.perf import cli_profile, fit
    from engine.perf.profile import Profile
    monkeypatch.setattr(fit, "fit_profile", lambda *a, **k: Profile.synthetic(backend="cpu").data)
    monkeypatch.setattr(fit, "format_errors", lambda prof: "")
    monkeypatch.setattr(cli_profile, "_fit_pipeline", lambda prof, records: None)
    moved = {"sgemm": _part(1.08e-3, 1.3e-3), "layers": _part(1.4e-3, 1.73e-3)}
    steady = {"sgemm": _part(0.74e-3, 0.76e-3), "layers": _part(0.75e-3, 0.77e-3)}

    def sweep_from(parts, out):
        recs = tmp_path / "r.json"
        recs.write_text(json.dumps({"meta": {"part_calibrations": parts}, "records": []}))
        assert cli.main(["profile", "--from-records", str(recs), "--out", str(out)]) == 0
        return capsys.readouterr().err

    out, kept = tmp_path / "profile.json", tmp_path / "profile.steady.json"
    sweep_from(steady, out)
    old = out.read_bytes()
    err = sweep_from(moved, out)
    assert "sprint profile: warning: the host's speed moved" in err
    assert f"note: {out} held a profile swept while the host was steady; kept as {kept}" in err
    assert kept.read_bytes() == old and json.loads(out.read_text())["sweep"]["part_calibrations"] == moved
    kept.unlink()
    assert "kept as" not in sweep_from(moved, out) and not kept.exists()      # the old one moved too
    assert "kept as" not in sweep_from(steady, out) and not kept.exists()     # a steady sweep replaces
    data = json.loads(out.read_text())
    del data["sweep"]
    out.write_text(json.dumps(data))                                         # a profile without marks
    assert "kept as" not in sweep_from(moved, out) and not kept.exists()
