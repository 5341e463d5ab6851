"""sprint profile | predict | tune | simulate, and the tuner's choice."""
import json

import numpy as np
import pytest

from engine import cli
from engine.perf import fit, model, tune
from engine.perf.profile import Profile

PROF = Profile.synthetic()


@pytest.fixture()
def prof_file(tmp_path):
    p = tmp_path / "p.json"
    PROF.save(p)
    return str(p)


def _short_calibrations(monkeypatch, seconds=0.3):
    """``sprint profile``'s calibrations (3 s before and after the sweeps, 1 s
    marks between them) run for real, each ``seconds`` long: what these tests
    check does not depend on their length (two profile runs took 14 s)."""
    from engine.perf import calibrate
    real = calibrate.calibration_step
    monkeypatch.setattr(calibrate, "calibration_step",
                        lambda s=None, blocks=5, compute=True: real(seconds, blocks=3, compute=compute))


def test_predict_prints_every_term(prof_file, capsys):
    rc = cli.main(["predict", "--model", "cnn-a", "--nodes", "16", "--workers", "4", "--subbatch", "8",
                   "--profile", prof_file])
    out = capsys.readouterr().out
    assert rc == 0
    for word in ("T_GPU", "T_Update", "T_Barrier", "N_Minibatch_avg", "T_Epoch", "WaitGradient",
                 "ComputeGradient", "conv8", "fc3", "P(fetch)"):
        assert word in out


def test_predict_json_matches_the_library(prof_file, capsys):
    cli.main(["predict", "--model", "cifar", "--nodes", "4", "--workers", "2", "--subbatch", "8",
              "--profile", prof_file, "--json", "--impl", "seed"])
    got = json.loads(capsys.readouterr().out)
    want = model.predict("cifar", 4, 2, 8, PROF, impl=model.SEED_IMPL)
    assert got["t_epoch"] == pytest.approx(want.t_epoch)
    assert got["n_minibatch_avg"] == pytest.approx(want.n_minibatch_avg)


def test_default_profile_ships_and_predicts(capsys):
    assert cli.main(["predict", "--model", "tiny", "--nodes", "2", "--workers", "2", "--subbatch", "8"]) == 0
    assert "T_Epoch" in capsys.readouterr().out
    prof = Profile.load()
    assert prof.data["machine"] and prof.data["date"]


def test_no_predicted_step_time_is_negative(capsys):
    """The shipped profile (cpu_test18's copy) priced UpdateMomentum of digits
    on 2 nodes at -12.3 us (a fitted piece of `sub` below zero in its gap,
    fit_linear_pieces); --json and the simulation carried it too."""
    from pathlib import Path
    prof = Path(__file__).resolve().parents[1] / "bench" / "profiles" / "cpu_test18.json"
    argv = ["--model", "digits", "--nodes", "2", "--workers", "2", "--subbatch", "16", "--no-calibrate",
            "--profile", str(prof)]
    assert cli.main(["predict", *argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    steps = {**got["worker"], **got["updater"]}
    assert steps and all(v >= 0 for v in steps.values()), steps
    assert cli.main(["predict", *argv]) == 0
    rows = [l.split() for l in capsys.readouterr().out.splitlines() if l.startswith("  Update")]
    assert rows and not any(r[1].startswith("-") for r in rows), rows


def test_tune_picks_the_fastest_feasible_configuration():
    # A target the grid can reach: the minibatch of one of its configurations.
    target, tol = model.predict("cifar", 16, 1, 8, PROF, impl=model.SEED_IMPL).n_minibatch_avg, 0.05
    cands = tune.search("cifar", PROF, target, tol, max_nodes=64, impl=model.SEED_IMPL)
    feas = [c for c in cands if c.feasible]
    assert feas, "no configuration reaches the target"
    best = feas[0]
    assert abs(best.n_minibatch_avg - target) <= tol * target
    assert best.t_epoch == min(c.t_epoch for c in feas)
    # Brute force over the same grid agrees.
    brute = []
    for n in tune.NODE_GRID:
        for s in tune.SUBBATCH_GRID:
            if n > 64:
                continue
            p = model.predict("cifar", n, 1, s, PROF, impl=model.SEED_IMPL)
            if abs(p.n_minibatch_avg - target) <= tol * target:
                brute.append(p.t_epoch)
    assert best.t_epoch == pytest.approx(min(brute))


def test_tune_cli_shows_runners_up(prof_file, capsys):
    rc = cli.main(["tune", "--model", "cifar", "--target-minibatch", "20", "--tolerance", "0.05",
                   "--max-nodes", "64", "--profile", prof_file, "--top", "4", "--impl", "seed"])
    out = capsys.readouterr().out
    assert "qualif" in out and rc in (0, 1)
    assert len([l for l in out.splitlines() if l[:3].strip() in ("*", "") and l.strip()[:1].isdigit()]) >= 2


def test_tune_rejects_bad_target(prof_file, capsys):
    assert cli.main(["tune", "--model", "tiny", "--target-minibatch", "-1", "--profile", prof_file]) == 2
    assert "target" in capsys.readouterr().err


def test_simulate_cli_compares_with_closed_form(prof_file, capsys):
    rc = cli.main(["simulate", "--model", "cifar", "--nodes", "8", "--workers", "4", "--subbatch", "4",
                   "--profile", prof_file, "--updates", "100", "--cv", "0.2"])
    out = capsys.readouterr().out
    assert rc == 0 and "closed form" in out and "simulated" in out and "32 simulated GPUs" in out


def test_the_profile_sprint_profile_wrote_here_is_read_without_profile(prof_file, tmp_path, monkeypatch, capsys):
    """`sprint profile` writes ./profile.json; predict (and tune, simulate,
    plan, info --stages) read it when no --profile is given and say so on
    stderr; a ./profile.json that is no machine profile is named and passed
    over for the shipped one; $SPRINT_PROFILE, where set, comes first."""
    argv = ["predict", "--model", "cifar", "--nodes", "4", "--workers", "2", "--subbatch", "8", "--json",
            "--no-calibrate"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPRINT_PROFILE")          # the suite's own setting (conftest)
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    shipped = json.loads(cap.out)["t_epoch"]
    assert "profile.json" not in cap.err
    PROF.save(tmp_path / "profile.json")
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    assert "sprint predict: note: predicting from ./profile.json" in cap.err
    here = json.loads(cap.out)["t_epoch"]
    assert cli.main(argv + ["--profile", prof_file]) == 0
    assert here == pytest.approx(json.loads(capsys.readouterr().out)["t_epoch"])
    assert here != pytest.approx(shipped, rel=0.05)
    for cmd in (["tune", "--model", "tiny", "--target-minibatch", "8", "--max-nodes", "2"],
                ["simulate", "--model", "tiny", "--nodes", "2", "--subbatch", "4", "--updates", "20"],
                ["plan", "--model", "tiny", "--gpus", "2"], ["info", "tiny", "--stages", "2"]):
        cli.main(cmd + ["--no-calibrate"] * (cmd[0] != "info"))
        assert f"sprint {cmd[0]}: note: predicting from ./profile.json" in capsys.readouterr().err, cmd
    (tmp_path / "profile.json").write_text(json.dumps({"name": "a run's settings"}))
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["t_epoch"] == pytest.approx(shipped)
    assert "sprint predict: warning: ./profile.json is passed over, not a machine profile" in cap.err
    # $SPRINT_PROFILE names the profile, or, empty, the shipped one, whatever the folder holds
    PROF.save(tmp_path / "profile.json")
    monkeypatch.setenv("SPRINT_PROFILE", "")
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["t_epoch"] == pytest.approx(shipped) and "profile.json" not in cap.err
    monkeypatch.setenv("SPRINT_PROFILE", prof_file)
    (tmp_path / "profile.json").unlink()
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["t_epoch"] == pytest.approx(here)


def test_missing_profile_is_a_clean_error(capsys, tmp_path):
    assert cli.main(["predict", "--model", "tiny", "--nodes", "1", "--subbatch", "1",
                     "--profile", str(tmp_path / "missing" / "p.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_profile_refits_saved_records(tmp_path, capsys):
    rng = np.random.default_rng(0)
    recs = []
    for m in (1, 4, 16, 64, 256):
        for n in (1, 8, 64, 512):
            for k in (4, 32, 256, 1024):
                for var in ("nn", "nt", "tn"):
                    recs.append({"kind": "sgemm", "trans": var, "m": m, "n": n, "k": k,
                                 "t": 2e-10 * m * n * k + 1e-6, "std": 1e-8})
    for name in fit.LINEAR_TERMS:
        for x in np.geomspace(10, 1e6, 10):
            recs.append({"kind": name, "x": float(x), "t": 1e-9 * x + 1e-6 * rng.uniform(0.9, 1.1)})
    src = tmp_path / "rec.json"
    src.write_text(json.dumps({"records": recs, "meta": {}}))
    # folders that do not exist yet: made when their files are written
    out, plots = tmp_path / "new" / "prof.json", tmp_path / "plots" / "fits"
    assert cli.main(["profile", "--from-records", str(src), "--out", str(out), "--plots", str(plots)]) == 0
    text = capsys.readouterr().out
    assert "sgemm_nn" in text and out.exists()
    assert (plots / "fit_sgemm.png").exists() and (plots / "fit_terms.png").exists()
    p = Profile.load(out)
    assert p.sgemm(100, 100, 100, "tn") == pytest.approx(2e-10 * 1e6 + 1e-6, rel=1e-3)


def test_profile_reruns_only_the_named_sweeps_and_keeps_the_rest(tmp_path, capsys, monkeypatch):
    _short_calibrations(monkeypatch)
    recs = [{"kind": "sgemm", "trans": "nn", "m": m, "n": n, "k": k, "t": 2e-10 * m * n * k + 1e-6}
            for m in (1, 16, 256) for n in (1, 16, 256) for k in (1, 16, 256)]
    recs += [{"kind": "handover", "x": 1, "t": 123.0}, {"kind": "handover", "x": 1, "t": 456.0}]
    src, merged = tmp_path / "old.json", tmp_path / "new.json"
    src.write_text(json.dumps({"records": recs, "meta": {"quick": True}}))
    assert cli.main(["profile", "--from-records", str(src), "--only", "handover", "--records", str(merged),
                     "--out", str(tmp_path / "p.json")]) == 0
    got = json.loads(merged.read_text())
    hand = [r for r in got["records"] if r["kind"] == "handover"]
    assert hand and all(r["t"] < 1.0 for r in hand)          # re-swept, the old ones replaced
    assert sum(r["kind"] == "sgemm" for r in got["records"]) == 27
    assert "resweep handover" in got["meta"] and got["meta"]["quick"] is True
    # The machine the new sweep ran on, with its calibration before and after.
    cal = got["meta"]["fingerprint"]["calibration"]
    assert cal["wall_s"] > 0 and cal["before"]["wall_s"] > 0 and cal["after"]["wall_s"] > 0
    assert json.loads((tmp_path / "p.json").read_text())["fingerprint"]["cores"] >= 1
    assert cli.main(["profile", "--from-records", str(src), "--only", "no-such-sweep"]) == 2
    assert "no-such-sweep" in capsys.readouterr().err


def test_rerun_runner_sweep_replaces_only_its_own_nets(monkeypatch):
    # "runner contention" (tiny, cifar) and "runner contention mid" (mnist,
    # digits) write records of one kind and source: re-running one must not
    # drop the other's nets.
    from engine.perf import calibrate, sweep
    run = lambda model, t: {"kind": "contention", "source": "runner", "model": model, "t": t}
    fresh = [run("mnist", 2.0), run("digits", 2.0)]
    monkeypatch.setattr(sweep, "_steps", lambda cfg, skipped, be: {"runner contention mid": lambda: fresh})
    fake_cal = {"wall_s": 1e-3, "cpu_s": 1e-3, "u": 0.01, "n": 5, "date": "now"}
    monkeypatch.setattr(calibrate, "calibration_step", lambda *a, **k: dict(fake_cal))
    monkeypatch.setattr(calibrate, "record", lambda *a, **k: {"cores": 2, "calibration": dict(fake_cal)})
    old = {"records": [run("tiny", 1.0), run("cifar", 1.0), run("mnist", 1.0),
                       {"kind": "contention", "source": None, "model": "tiny", "t": 1.0}], "meta": {}}
    got = sweep.run_all(only=["runner contention mid"], merge=old, log=None)["records"]
    by = sorted((r["model"], str(r.get("source")), r["t"]) for r in got)
    assert by == sorted([("tiny", "runner", 1.0), ("cifar", "runner", 1.0), ("mnist", "runner", 2.0),
                         ("digits", "runner", 2.0), ("tiny", "None", 1.0)])
    assert "runner contention mid" in sweep.SWEEPS


def test_strategy_table_dispatches_predict(prof_file, capsys):
    from engine.perf import strategies
    assert "asgd" in strategies.names()
    got = strategies.predict("asgd", "cifar", 2, 2, 4, PROF)
    assert got.t_epoch == pytest.approx(model.predict("cifar", 2, 2, 4, PROF).t_epoch)
    with pytest.raises(ValueError, match="no cost model for strategy 'nope'"):
        strategies.cost_model("nope")
    # Every registered cost model keeps the contract the CLI relies on.
    base = ["--model", "cifar", "--nodes", "2", "--subbatch", "8", "--profile", prof_file, "--no-calibrate"]
    for name in strategies.names():
        assert cli.main(["predict", "--strategy", name, *base, "--json"]) == 0, name
        got = json.loads(capsys.readouterr().out)
        assert got["t_epoch"] == pytest.approx(strategies.predict(name, "cifar", 2, 1, 8, PROF).t_epoch)
        assert cli.main(["predict", "--strategy", name, *base, "--explain"]) == 0, name
        assert "cifar" in capsys.readouterr().out


def test_python_predict_defaults_to_the_shipped_profile():
    want = model.predict("tiny", 2, 1, 4, Profile.load())
    assert model.predict("tiny", 2, 1, 4).t_epoch == pytest.approx(want.t_epoch)
    assert model.predict("tiny", 2, 1, 4, profile=None).t_gpu == pytest.approx(want.t_gpu)


def test_every_printed_term_is_explained(prof_file, capsys):
    from engine.perf.report import GLOSSARY
    assert cli.main(["predict", "--model", "cifar", "--nodes", "4", "--workers", "2", "--subbatch", "8",
                     "--profile", prof_file, "--explain", "--no-calibrate"]) == 0
    out = capsys.readouterr().out
    assert "host slowdown x" in out and ":" in out.split("host slowdown", 1)[1].splitlines()[0]
    gloss = out.split("what each term means:")[1]
    for term in ("N_Node", "T_GPU", "T_Update", "T_Barrier", "N_Minibatch_avg", "T_Epoch", "P(fetch)",
                 "P(GradBuf non-empty)", "staleness", "host slowdown", "fixed point", "share", "fwd / bwd"):
        assert f"  {term} " in gloss
    # every step row of the two tables has its line
    for k in list(model.WORKER_STEPS) + list(model.UPDATER_STEPS):
        assert k in GLOSSARY and f"  {k} " in gloss


def test_tune_count_agrees_with_rows(prof_file, capsys):
    target = model.predict("cifar", 4, 1, 8, PROF, impl=model.SEED_IMPL).n_minibatch_avg
    rc = cli.main(["tune", "--model", "cifar", "--target-minibatch", f"{target}", "--tolerance", "0.3",
                   "--max-nodes", "16", "--profile", prof_file, "--top", "2", "--impl", "seed", "--no-calibrate"])
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    n_ok = int(head.split(": ", 1)[1].split(" of ")[0])
    rows = [l for l in out.splitlines() if l[:3].strip() in ("*", "") and l[3:].strip()[:1].isdigit()]
    assert rc == 0 and n_ok > 2 and len(rows) == 2 and rows[0].startswith("*")
    assert "the 2 fastest shown (--top)" in head


def _one_line(capsys, *fragments):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sprint: error: "), err
    for f in fragments:
        assert f in err[0], err[0]


def test_a_file_that_is_not_a_profile_is_one_line_naming_it(tmp_path, capsys):
    bad_json, spec, binary = tmp_path / "bad.json", tmp_path / "spec.json", tmp_path / "bin.json"
    bad_json.write_text('{"terms": {')
    spec.write_text(json.dumps({"x0": 8, "m0": 1, "c": 3, "convs": [[16, 2]], "fcs": [64, 10]}))
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    for f in (bad_json, spec, binary):
        for cmd in (["predict", "--model", "tiny", "--nodes", "1", "--subbatch", "1"],
                    ["plan", "--model", "tiny", "--gpus", "2"]):
            assert cli.main([*cmd, "--profile", str(f), "--no-calibrate"]) == 2
            _one_line(capsys, "not a machine profile", f"({f})")


def test_a_profile_of_a_newer_format_is_refused_naming_it(prof_file, tmp_path, capsys):
    data = json.loads(open(prof_file).read())
    for version in (999, "2", None):
        f = tmp_path / f"v{version}.json"
        f.write_text(json.dumps(dict(data, version=version)))
        assert cli.main(["predict", "--model", "tiny", "--nodes", "1", "--subbatch", "1",
                         "--profile", str(f), "--no-calibrate"]) == 2
        _one_line(capsys, "profile format version", f"({f})")
    f = tmp_path / "v1.json"
    f.write_text(json.dumps(dict(data, version=1)))
    assert cli.main(["predict", "--model", "tiny", "--nodes", "1", "--subbatch", "1",
                     "--profile", str(f), "--no-calibrate"]) == 0


def test_simulation_counts_and_spreads_are_checked(prof_file, capsys):
    base = ["--model", "tiny", "--nodes", "2", "--subbatch", "4", "--profile", prof_file, "--no-calibrate"]
    for extra, flag in ((["--updates", "0"], "(--updates)"), (["--cv", "-1"], "(--cv)"), (["--cv", "nan"], "(--cv)"),
                        (["--parallel", "downpour", "--steps", "0"], "(--steps)"),
                        (["--parallel", "downpour", "--cv", "-0.5"], "(--cv)"),
                        (["--n-file", "0"], "(--n-file)")):
        assert cli.main(["simulate", *base, *extra]) == 2, extra
        _one_line(capsys, flag)
    assert cli.main(["predict", *base, "--n-file", "-5"]) == 2
    _one_line(capsys, "got -5 (--n-file)")
    assert cli.main(["tune", "--model", "tiny", "--target-minibatch", "8", "--n-file", "0", "--profile", prof_file,
                     "--no-calibrate"]) == 2
    _one_line(capsys, "(--n-file)")


def test_profile_refuses_outputs_and_records_before_it_sweeps(tmp_path, capsys, monkeypatch):
    from engine.perf import sweep
    ran = []
    monkeypatch.setattr(sweep, "run_all", lambda **kw: ran.append(kw) or {"records": []})
    assert cli.main(["profile", "--quick", "--out", str(tmp_path)]) == 2
    _one_line(capsys, "is a folder", f"({tmp_path})")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert cli.main(["profile", "--quick", "--records", str(blocker / "rec.json")]) == 2
    _one_line(capsys, f"({blocker})")
    assert not ran
    for text, what in (("{oops", "not valid JSON"), ('{"meta": {}}', 'no "records" list')):
        rec = tmp_path / "rec.json"
        rec.write_text(text)
        assert cli.main(["profile", "--from-records", str(rec), "--out", str(tmp_path / "p.json")]) == 2
        _one_line(capsys, what, f"({rec})")
    assert not (tmp_path / "p.json").exists()


def test_profile_says_a_sweep_that_cannot_run_and_refuses_when_none_of_only_ran(tmp_path, monkeypatch, capsys):
    # A sweep that cannot run here: it used to print "0 points" and write a
    # profile without that section, exit 0. (mpiexec missing is refused before
    # any sweep: test_cli_odd_values.py)
    from engine.perf import cli_profile, sweep
    _short_calibrations(monkeypatch)

    def broken(cfg):
        raise RuntimeError("mpiexec ended with rc 1")
    monkeypatch.setattr(sweep, "sweep_allreduce", broken)
    monkeypatch.setattr(cli_profile.shutil, "which", lambda c: "/usr/bin/" + c)
    recs = [{"kind": "handover", "x": 1, "t": 1e-6}]
    src = tmp_path / "old.json"
    src.write_text(json.dumps({"records": recs, "meta": {"quick": True}}))
    out = tmp_path / "p.json"
    assert cli.main(["profile", "--from-records", str(src), "--only", "allreduce", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "sweep allreduce: skipped" in err and "mpiexec ended with rc 1" in err
    assert "sprint: error:" in err and "none of the sweeps ran" in err and "--only" in err
    assert not out.exists()
    # One of two failing is a warning, and the profile is written.
    assert cli.main(["profile", "--from-records", str(src), "--only", "allreduce,handover", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "sprint profile: warning: sweep allreduce:" in err and out.exists()


def test_the_sweeps_mpiexec_jobs_set_hwloc_xmlfile(monkeypatch):
    # hydra's proxy leaves /tmp/hydra_hwloc_xmlfile_* behind every aborted job
    # unless HWLOC_XMLFILE is set; a user's own value is kept.
    from engine.perf import pipeline_probe, sweep_runner
    monkeypatch.delenv("HWLOC_XMLFILE", raising=False)
    env = sweep_runner.mpiexec_env(7, FOO="1")
    assert env["HWLOC_XMLFILE"] == "" and env["MPIEXEC_TIMEOUT"] == "7" and env["FOO"] == "1"
    assert env["OMP_NUM_THREADS"] == "1" and pipeline_probe.child_env()["HWLOC_XMLFILE"] == ""
    monkeypatch.setenv("HWLOC_XMLFILE", "/some/topo.xml")
    assert sweep_runner.mpiexec_env(7)["HWLOC_XMLFILE"] == "/some/topo.xml"


@pytest.mark.parametrize("argv", [["plan", "--gpus", "4"], ["predict", "--nodes", "2", "--subbatch", "4"],
                                  ["simulate", "--nodes", "2", "--subbatch", "4"]])
def test_a_bad_model_is_refused_before_the_calibration(argv, monkeypatch, capsys):
    from engine.perf import calibrate
    ran = []
    monkeypatch.setattr(calibrate, "check", lambda *a, **k: ran.append(1))
    assert cli.main(argv + ["--model", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "sprint: error: model 'nosuch'" in err and ran == []


@pytest.mark.parametrize("command", ["predict", "simulate"])
@pytest.mark.parametrize("name", ["sync", "layerwise"])
def test_a_strategy_only_plan_prices_points_to_sprint_plan(command, name, capsys):
    # sync and layerwise train, and `sprint plan` prices them, but predict and
    # simulate have no cost model of them: argparse said only "invalid choice"
    assert cli.main([command, "--parallel", name, "--nodes", "2", "--subbatch", "4", "--no-calibrate"]) == 2
    _one_line(capsys, f"sprint {command} has no cost model of {name} (it takes asgd, pipeline, downpour, "
                      f"sandblaster): `sprint plan --model MODEL --gpus N` prices {name}", "(--parallel/--strategy)")
    assert cli.main([command, "--strategy", "nosuch", "--no-calibrate"]) == 2
    _one_line(capsys, "invalid choice: 'nosuch'")


@pytest.mark.parametrize("name", ["sync", "layerwise", "pipeline"])
def test_tune_of_another_strategy_points_to_sprint_plan(name, capsys):
    # tune searches ASGD configurations only: `tune --parallel sync` was
    # refused as "unrecognized arguments"
    argv = ["tune", "--target-minibatch", "32", "--no-calibrate"]
    assert cli.main(argv + ["--parallel", name]) == 2
    _one_line(capsys, f"sprint tune searches asgd configurations only", f"`sprint plan --model MODEL --gpus N` "
                      f"ranks {name}")
    assert cli.main(argv + ["--strategy", "nosuch"]) == 2
    _one_line(capsys, "invalid choice: 'nosuch'")
