"""bench/validate_model.py fails loudly and reports mean and median |error|
per group (fitted grid vs held-out nets)."""
import itertools
import os
from pathlib import Path

import pytest

from bench_scripts import load as load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vm():
    return load_bench("validate_model")


def test_missing_mpiexec_is_an_error_before_any_run(vm, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vm.main(["--nets", "tiny", "--nodes", "1", "--workers", "1", "--subbatch", "1",
                    "--out", str(tmp_path / "v.json")]) == 2
    assert "mpiexec is not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "v.json").exists()


def test_failed_runs_exit_nonzero_after_the_report(vm, monkeypatch, capsys, tmp_path):
    if not vm.shutil.which("mpiexec"):
        monkeypatch.setattr(vm.shutil, "which", lambda name: "/usr/bin/" + name)

    def boom(*a, **k):
        raise RuntimeError("rank 1 died")
    monkeypatch.setattr(vm, "run_config", boom)
    monkeypatch.setitem(vm.N_TRAIN, "tiny", 256)
    rc = vm.main(["--nets", "tiny", "--nodes", "1,2", "--workers", "1", "--subbatch", "2", "--no-sim",
                  "--out", str(tmp_path / "v.json"), "--plot", str(tmp_path / "v.png")])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.count("FAILED tiny") == 2 and "2 of 2 runs failed" in err and "rank 1 died" in err
    assert (tmp_path / "v.json").exists() and vm.main(["--rescore", str(tmp_path / "v.json")]) == 1


def _row(model, group, errs):
    meas = {k: 1.0 for k in ("T_GPU", "T_Update", "T_Epoch", "N_Minibatch_avg", "staleness")}
    pred = {k: 1.0 + e for k, e in zip(meas, errs)}
    return {"model": model, "n_node": 1, "n_gpu": 1, "n_subbatch": 1, "group": group,
            "measured": dict(meas, steps={}), "predicted": dict(pred, steps={}), "runs": [meas]}


def test_report_gives_mean_and_median_per_group(vm):
    rows = [_row("tiny", "fitted grid", [0.1] * 5), _row("digits", "held-out nets", [0.1] * 5),
            _row("digits", "held-out nets", [0.2] * 5), _row("digits", "held-out nets", [-0.6] * 5)]
    med, mean, mx, n = vm.summarize(rows[1:], "T_GPU")
    assert (med, mean, mx, n) == pytest.approx((0.2, 0.3, 0.6, 3))
    text = vm.format_report(rows, [])
    fitted, held = text.split("fitted grid (1 configurations)")[1].split("held-out nets (3 configurations)")
    t_gpu = [l for l in held.splitlines() if l.startswith("T_GPU")][0].split()
    assert t_gpu[1:4] == ["30.0%", "20.0%", "60.0%"]
    assert [l for l in fitted.splitlines() if l.startswith("T_GPU")][0].split()[1] == "10.0%"


def test_nets_the_sweeps_never_saw_are_held_out(vm):
    from engine.perf.profile import Profile
    prof = Profile.synthetic(backend="cpu")
    prof.data["sweep"] = {"nets": ["tiny", "cifar"], "layer_nets": ["tiny", "cifar", "cnn-a"]}
    prof.data["contention"] = {"entries": [{"model": "tiny", "ranks": 1, "workers": 1}]}
    assert vm.group_of("tiny", prof) == "fitted grid"
    assert vm.group_of("digits", prof) == "held-out nets"
    spec = ROOT / "bench" / "specs" / "mnist_heldout.json"
    assert vm.group_of(str(spec), prof) == "held-out nets"
    assert os.path.exists(spec)


def test_parts_of_a_grid_are_reported_together(vm, tmp_path, capsys):
    import json
    a = {"rows": [_row("digits", "held-out nets", [0.1] * 5)], "layers": [], "failed": [],
         "calibrations": [{"ratio": 1.0}]}
    b = {"rows": [dict(_row("digits", "held-out nets", [0.3] * 5), n_node=3)], "layers": [], "failed": [],
         "calibrations": [{"ratio": 1.2}]}
    for name, d in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    both = f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}"
    assert vm.main(["--rescore", both]) == 0
    out = capsys.readouterr().out
    t_gpu = [l for l in out.split("held-out nets (2 configurations)")[1].splitlines() if l.startswith("T_GPU")][0]
    assert t_gpu.split()[1:3] == ["20.0%", "20.0%"]
    assert "N_Node 1 (1), mean / median |err|: T_GPU 10.0 / 10.0 %" in out
    assert "N_Node 3 (1)" in out and "x1.100" in out
    b["failed"] = [[["digits", 3, 1, 1], "rank died"]]
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert vm.main(["--rescore", both]) == 1         # a failure in any part fails the whole


def test_rescore_reports_the_calibrated_predictions_the_parts_saved(vm, tmp_path, capsys):
    """Merged parts report what sprint predict gave each part after its own
    calibration (kept with the rows), not one ratio on every time; a part
    saved before the rows kept them leaves only the one-ratio line, said to
    be that."""
    import json
    parts = []
    for name, err, cerr, scales in (("a", 0.1, 0.02, [1.05, 1.2]), ("b", 0.3, -0.04, [1.07, 1.4])):
        row = _row("digits", "held-out nets", [err] * 5)
        row["calibrated"] = {k: 1.0 + cerr for k in row["measured"] if k != "steps"}
        parts.append({"rows": [row], "layers": [], "failed": [], "calibrations": [{"ratio": 1.2}],
                      "calibrated_scales": scales})
        (tmp_path / f"{name}.json").write_text(json.dumps(parts[-1]))
    both = f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}"
    assert vm.main(["--rescore", both]) == 0
    out = capsys.readouterr().out
    line = [l for l in out.splitlines() if "calibrated (" in l][0]
    assert "per-unit x1.060, per-call x1.300, median of each part's passes" in line
    assert "T_GPU 3.0 / 3.0 %" in line and "every time x" not in out
    del parts[1]["rows"][0]["calibrated"]
    (tmp_path / "b.json").write_text(json.dumps(parts[1]))
    assert vm.main(["--rescore", both]) == 0
    out = capsys.readouterr().out
    assert "calibrated (" not in out and "every time x1.200" in out and "--repredict" in out


def test_calibrated_rows_rescale_kernels_and_per_call_costs_apart(vm):
    from engine.perf import model as M
    from engine.perf.profile import Profile
    prof = Profile.synthetic(backend="cpu", launch=1e-4)
    row = _row("tiny", "fitted grid", [0.0] * 5)
    row["measured"].update(T_Epoch=2.0, N_Minibatch_avg=4.0, T_Update=1.0)     # N_File 8
    # Each pass applied its parts beyond their noise: median kernel x1, per-call x2.
    cals = [{"scale": 1.0, "call_scale": 2.0}, {"scale": 1.0, "call_scale": 2.2}, {"scale": 1.0, "call_scale": 1.9}]
    rows, k, kc = vm.calibrated([row], prof, cals)
    assert (k, kc) == (1.0, 2.0)
    ref = Profile.synthetic(backend="cpu", launch=2e-4)     # the same profile, its per-call launch doubled
    want = M.predict("tiny", 1, 1, 1, ref, n_file=8, ranks_per_host=1, impl=M.RUNNER_SWEEP_IMPL)
    assert rows[0]["predicted"]["T_GPU"] == pytest.approx(want.t_gpu, rel=1e-9)
    assert prof.time_scale == 1.0 and prof.call_scale == 1.0          # the caller's profile untouched
    text = vm.format_report([row], [], None, (rows, k, kc))
    assert "calibrated (per-unit x1.000, per-call x2.000" in text
    # Calibrations of a profile without parts, or that applied nothing: no re-prediction.
    assert vm.calibrated([row], prof, [{"scale": 1.3, "call_scale": None}]) is None
    assert vm.calibrated([row], prof, [{"scale": 1.0, "call_scale": 1.0}]) is None


def test_repredicted_parts_are_each_rescaled_by_their_own_calibrations(vm):
    """--rescore --repredict of a grid run in parts rescales each part's rows
    by that part's calibrations, as the runs were when made (set 28 with its
    own profile: 10.3 %, as judged; one median over all parts gave 11.0 %)."""
    from engine.perf import model as M
    from engine.perf.profile import Profile
    prof = Profile.synthetic(backend="cpu", launch=1e-4)
    parts = []
    for call_scale in (2.0, 4.0):
        row = _row("tiny", "fitted grid", [0.0] * 5)
        row["measured"].update(T_Epoch=2.0, N_Minibatch_avg=4.0, T_Update=1.0)
        parts.append({"rows": [row], "calibrations": [{"scale": 1.0, "call_scale": call_scale}]})
    rows, k, kc, how = vm.calibrated_by_part(parts, prof)
    assert (k, kc) == (1.0, 3.0) and "median of each part's passes" in how
    for r, launch in zip(rows, (2e-4, 4e-4)):
        want = M.predict("tiny", 1, 1, 1, Profile.synthetic(backend="cpu", launch=launch), n_file=8,
                         ranks_per_host=1, impl=M.RUNNER_SWEEP_IMPL)
        assert r["predicted"]["T_GPU"] == pytest.approx(want.t_gpu, rel=1e-9)
    # One median over both parts (x3) would price both rows alike: not what the runs saw.
    assert rows[0]["predicted"]["T_GPU"] < rows[1]["predicted"]["T_GPU"]
    # A part whose calibrations applied nothing: no calibrated line at all.
    parts[1]["calibrations"] = [{"scale": 1.0, "call_scale": 1.0}]
    assert vm.calibrated_by_part(parts, prof) is None
    assert len(vm.calibrated_by_part(parts[:1], prof)) == 3          # one part: no note


def test_a_calibration_is_judged_against_the_profile_it_repredicts_with(vm):
    """--repredict swaps the profile: a saved calibration's scales are against
    the run's profile, so its measurement is compared with the new one's."""
    from engine.perf.profile import Profile
    cal = lambda k, p: {"wall_s": k + p, "cpu_s": k + p, "u": 0.0, "kernel_s": k, "python_s": p,
                        "u_kernel": 0.0, "u_python": 0.0}
    prof = Profile.synthetic(backend="cpu", launch=1e-4)
    prof.data["fingerprint"] = {"calibration": cal(1e-3, 1e-3)}
    row = _row("tiny", "fitted grid", [0.0] * 5)
    row["measured"].update(T_Epoch=2.0, N_Minibatch_avg=4.0, T_Update=1.0)
    # Saved against another profile (scales x1, x1); measured: kernels x1.5, Python x2 of this one's
    # (the whole workload x1.75, which rescales per-unit costs).
    cals = [{"scale": 1.0, "call_scale": 1.0, "now": cal(1.5e-3, 2e-3)}]
    rows, k, kc = vm.calibrated([row], prof, cals)
    assert (k, kc) == (pytest.approx(1.75), pytest.approx(2.0))
    # A calibration saved without its measurement keeps its scales.
    assert vm.calibrated([row], prof, [{"scale": 1.0, "call_scale": 2.0}])[1:] == (1.0, 2.0)


def test_measured_layers_mode_repredicts_from_the_passes_timed_in_the_run(vm):
    """The rows as `sprint predict --measure-layers` would price them, from
    the in-process passes of the validation; reported apart, and only when
    every row's net and batch size has its passes."""
    from engine import spec as spec_mod
    from engine.perf import model as M
    from engine.perf.measure_layers import LayerMeasure
    from engine.perf.profile import Profile
    prof = Profile.synthetic(backend="cpu")
    row = _row("tiny", "fitted grid", [0.0] * 5)
    row["n_subbatch"], row["n_file"] = 4, 64
    passes = {(g.name, pas): 1e-4 * (i + 1) + (3e-5 if pas == "bwd" else 0.0)
              for i, g in enumerate(spec_mod.layers(spec_mod.get_spec("tiny"), 4)) for pas in ("fwd", "bwd")}
    layers = [{"model": "tiny", "n_subbatch": 4, "layer": l, "pass": "forward" if p == "fwd" else "backward",
               "measured": t, "predicted": 0.0} for (l, p), t in passes.items()]
    got = vm.measured_mode([row], layers, prof)
    ref = Profile.synthetic(backend="cpu")
    ref.layer_measure = LayerMeasure()
    ref.layer_measure.put("tiny", 4, passes)
    want = M.predict("tiny", 1, 1, 4, ref, n_file=64, ranks_per_host=1, impl=M.RUNNER_SWEEP_IMPL)
    assert got[0]["predicted"]["T_GPU"] == pytest.approx(want.t_gpu, rel=1e-12)
    assert got[0]["predicted"]["T_GPU"] != pytest.approx(
        M.predict("tiny", 1, 1, 4, prof, n_file=64, ranks_per_host=1, impl=M.RUNNER_SWEEP_IMPL).t_gpu, rel=1e-3)
    assert prof.layer_measure is None                      # the caller's profile untouched
    assert "measured layer passes (--measure-layers" in vm.format_report([row], layers, None, None, got)
    assert vm.measured_mode([dict(row, n_subbatch=8)], layers, prof) is None


def test_measured_layers_mode_keeps_the_anchor_nets_passes_for_a_rescore(vm, monkeypatch):
    """The model times, on first use, the passes of nets no row runs (the
    contention fit's anchors in the shipped profile): the run's report adds
    them to ``anchors`` (saved with the runs) and a rescore prices by those,
    timing nothing again; ``merge_runs`` keeps each pass's median."""
    from engine import spec as spec_mod
    from engine.perf import measure_layers
    from engine.perf.profile import Profile
    timed, count = [], itertools.count(1)

    def fake(spec, n, *a, **k):       # each timing slower than the last, as a host that slows
        sp = spec_mod.get_spec(spec)
        timed.append((sp.name, n))
        t = 1e-4 * next(count)
        return {(g.name, p): t for g in spec_mod.layers(sp, n) for p in ("fwd", "bwd")}
    monkeypatch.setattr(measure_layers, "measure_passes", fake)
    prof = Profile.load(Path(__file__).resolve().parents[1] / "engine" / "perf" / "default_profile.json")
    # A compute-bound step (5 ms a pass) at 3 ranks x 2 workers on 2 cores: priced by the long-step anchors.
    net = "bench/specs/heldout_k5x.json"
    row = _row(net, "held-out nets", [0.0] * 5)
    row.update(n_node=3, n_gpu=2, n_subbatch=13, n_file=640)
    layers = [{"model": net, "n_subbatch": 13, "layer": g.name, "pass": "forward" if p == "fwd" else "backward",
               "measured": 5e-3} for g in spec_mod.layers(spec_mod.get_spec(net), 13) for p in ("fwd", "bwd")]
    anchors = {}
    first = vm.measured_mode([row], layers, prof, anchors)
    assert timed and len(anchors) == len(timed)          # every net timed is kept, the rows' own net is not
    assert spec_mod.get_spec(net).hash() + " 13" not in anchors
    timed.clear()
    again = vm.measured_mode([row], layers, prof, dict(anchors))
    assert timed == []
    assert again[0]["predicted"]["T_GPU"] == first[0]["predicted"]["T_GPU"]
    # Without the saved passes they are timed again (here: other times), and the prediction moves.
    moved = vm.measured_mode([row], layers, prof, {})
    assert timed and moved[0]["predicted"]["T_GPU"] != first[0]["predicted"]["T_GPU"]
    key = next(iter(anchors))
    pas = next(iter(anchors[key]))
    other = {key: {pas: 3 * anchors[key][pas]}}
    merged = vm.merge_runs([{"anchor_passes": anchors}, {"anchor_passes": other}, {"anchor_passes": other}])
    assert merged["anchor_passes"][key][pas] == pytest.approx(3 * anchors[key][pas])


def _layer_profile(launch, b):
    """A synthetic CPU profile with per-layer terms: its per-unit costs fixed,
    its per-call ones (kernel launches, the terms' ``b``) given."""
    from engine.perf.profile import Profile
    prof = Profile.synthetic(backend="cpu", launch=launch)
    prof.data["layer_terms"] = {k: {"f": 1.3, "b": b} for k in ("conv_fwd", "conv_bwd", "fc_fwd", "fc_bwd")}
    return prof


def _cal(k, p):
    return {"wall_s": k + p, "cpu_s": k + p, "u": 0.0, "kernel_s": k, "python_s": p, "u_kernel": 0.0,
            "u_python": 0.0}


def _layers(vm, prof, n=4):
    """Layer rows of tiny at batch ``n``, each measured 1.2x its price by ``prof``."""
    pred = vm.layer_predictions("tiny", n, prof)
    return [{"model": "tiny", "n_subbatch": n, "layer": l, "pass": p, "measured": 1.2 * t, "predicted": t,
             "group": "fitted grid"} for (l, p), t in pred.items()]


def test_calibrated_layer_passes_are_the_kernel_and_per_call_scales_applied(vm):
    """Each layer pass as sprint predict's per-layer table prices it after a
    calibration: per-unit costs by the whole workload's scale, per-call costs
    by the Python part's (a calibration that kept its measurement judged
    against the profile's stored one)."""
    prof = _layer_profile(1e-5, 4e-5)
    prof.data["fingerprint"] = {"calibration": _cal(1e-3, 1e-3)}
    unit = vm.layer_predictions("tiny", 4, _layer_profile(0.0, 0.0))
    full = vm.layer_predictions("tiny", 4, prof)
    layers = _layers(vm, prof)
    # Saved scales x1, x1 against another profile; measured kernels x1.5, Python x2 of this one's (whole x1.75).
    vm.calibrate_layers(layers, prof, {"scale": 1.0, "call_scale": 1.0, "now": _cal(1.5e-3, 2e-3)})
    for l in layers:
        key = (l["layer"], l["pass"])
        want = 1.75 * unit[key] + 2.0 * (full[key] - unit[key])
        assert full[key] - unit[key] > 0.1 * full[key]          # each pass has a per-call part to scale
        assert l["calibrated"] == pytest.approx(want, rel=1e-12)
        assert l["calibration"] == {"scale": pytest.approx(1.75), "call_scale": pytest.approx(2.0),
                                    "how": vm.LAYER_CAL_BEFORE}
    assert prof.time_scale == 1.0 and prof.call_scale == 1.0          # the caller's profile untouched
    text = vm.format_report([], layers)
    line = [x for x in text.splitlines() if x.strip().startswith("calibrated (what sprint predict prints")][0]
    errs = sorted(abs(l["calibrated"] / l["measured"] - 1) for l in layers)
    assert f"median |err| {100 * float(vm.np.median(errs)):.1f} %" in line and "per-unit x1.750, per-call x2.000" in line
    # by layer kind and pass: where in the net the error sits
    kinds = [x for x in text.splitlines() if x.strip().startswith("calibrated by layer kind and pass")][0]
    conv_bwd = [abs(l["calibrated"] / l["measured"] - 1) for l in layers
                if l["layer"].startswith("conv") and l["pass"] == "backward"]
    assert len(conv_bwd) == 2 and f"conv backward {100 * float(vm.np.median(conv_bwd)):.1f} % (2)" in kinds
    # A calibration that did not time its parts apart: no calibrated price.
    vm.calibrate_layers(layers, prof, {"scale": 1.3, "call_scale": None})
    assert not any("calibrated" in l for l in layers) and "calibrated (what" not in vm.format_report([], layers)
    assert "predicted by layer kind and pass" in vm.format_report([], layers)


def test_a_layer_calibration_round_trips_through_rescore(vm, tmp_path, capsys):
    """The layer passes' calibration a run saved gives the same calibrated
    prices in --rescore (re-predicted by the run's own profile or not); a
    file saved before runs kept one uses its first pass's calibration and
    says so; a file without calibrations prints no calibrated layers."""
    import json
    prof = _layer_profile(1e-5, 4e-5)
    prof.data["fingerprint"] = {"calibration": _cal(1e-3, 1e-3)}
    path = tmp_path / "p.json"
    prof.save(path)
    layers = _layers(vm, prof)
    cal = {"scale": 1.0, "call_scale": 1.0, "now": _cal(1.2e-3, 1.6e-3)}
    vm.calibrate_layers(layers, prof, cal)
    stored = [l["calibrated"] for l in layers]
    errs = [abs(c / l["measured"] - 1) for c, l in zip(stored, layers)]
    want = f"median |err| {100 * float(vm.np.median(errs)):.1f} %, mean {100 * float(vm.np.mean(errs)):.1f} %"
    row = _row("tiny", "fitted grid", [0.0] * 5)
    row["n_file"] = 8
    d = {"profile": str(path), "rows": [row], "layers": layers, "failed": [], "layer_calibration": cal,
         "calibrations": [{"scale": 1.0, "call_scale": 1.0, "now": _cal(3e-3, 3e-3)}]}
    f = tmp_path / "v.json"
    f.write_text(json.dumps(d))
    for extra in ([], ["--repredict", "--profile", str(path), "--no-sim"]):
        assert vm.main(["--rescore", str(f)] + extra) == 0
        line = [x for x in capsys.readouterr().out.splitlines() if "calibrated (what sprint predict" in x][0]
        assert want in line and vm.LAYER_CAL_BEFORE in line and "per-unit x1.400, per-call x1.600" in line
    # Saved before the layer passes had a calibration of their own: the first pass's (x3, x3), said.
    f.write_text(json.dumps(dict(d, layer_calibration=None)))
    assert vm.main(["--rescore", str(f)]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "calibrated (what sprint predict" in x][0]
    assert vm.LAYER_CAL_FIRST in line and "per-unit x3.000, per-call x3.000" in line
    f.write_text(json.dumps(dict(d, layer_calibration=None, calibrations=[])))
    assert vm.main(["--rescore", str(f)]) == 0
    assert "calibrated (what sprint predict" not in capsys.readouterr().out


def test_report_says_how_often_the_prediction_lies_within_the_runs(vm):
    """On a host that moves, a prediction among the runs is the most a model
    can be asked; the line counts those and the distance to the nearest run."""
    a = _row("digits", "held-out nets", [0.0] * 5)
    a["runs"] = [dict(a["measured"], T_GPU=t, T_Epoch=t) for t in (0.9, 1.0, 1.2)]
    b = _row("digits", "held-out nets", [0.5] * 5)          # predicted 1.5 against runs of 0.9-1.2
    b["runs"] = [dict(b["measured"], T_GPU=t, T_Epoch=t) for t in (0.9, 1.0, 1.2)]
    text = vm.format_report([a, b], [])
    line = [l for l in text.splitlines() if l.startswith("within the runs")][0]
    assert "T_GPU 1 of 2, 12.5 %" in line and "T_Epoch 1 of 2, 12.5 %" in line and "calibrated" not in line
    cal = [dict(r, predicted=dict(r["predicted"], T_GPU=1.1, T_Epoch=1.1)) for r in (a, b)]
    line = [l for l in vm.format_report([a, b], [], None, (cal, 1.0, 1.0)).splitlines()
            if l.startswith("within the runs")][0]
    assert "(calibrated 2 of 2, 8.3 %)" in line          # 1.1 against its nearest run, 1.2


def _read(us, spread):
    return {"us": us, "spread": spread, "windows": 10, "at": "00:00:00"}


def test_host_lines_say_nothing_without_readings_and_no_warning_on_a_steady_host(vm):
    row = _row("digits", "held-out nets", [0.1] * 5)
    assert vm.host_lines([row]) == []
    row["runs"], row["host_readings"] = [row["measured"]] * 3, [_read(1.0, 1.04), _read(1.05, 1.08), _read(1.02, 1.1)]
    lines = vm.host_lines([row])
    assert len(lines) == 2 and "1.00-1.05 us (x1.05)" in lines[1] and "3 of 3 steady" in lines[1]
    assert "host before each run" in vm.format_report([row], [])


def test_host_lines_split_single_runs_by_the_state_read_before_them(vm):
    """Two runs after fast steady readings (errors 10 %, 30 %: mean 20 %),
    one after a slow reading and one after an unsteady one (50 %, 10 %)."""
    row = _row("digits", "held-out nets", [0.0] * 5)
    row["runs"] = [{"T_GPU": 1 / 1.1}, {"T_GPU": 1 / 1.3}, {"T_GPU": 1 / 1.5}, {"T_GPU": 1 / 1.1}]
    row["host_readings"] = [_read(1.0, 1.05), _read(1.08, 1.02), _read(2.0, 1.03), _read(1.0, 1.8)]
    text = "\n".join(vm.host_lines([row]))
    assert "1.00-2.00 us (x2.00)" in text and "worst x1.80" in text and "2 of 4 steady" in text
    assert "did not keep one speed" in text
    assert "20.0 % after the 2 steady fast readings, 30.0 % after the other 2" in text


def test_a_validation_keeps_a_host_reading_beside_each_run(vm, monkeypatch, tmp_path, capsys):
    """Each run's reading, taken before it, is saved with the run (the rows
    and the .runs.jsonl) and summed up in the report; --host-reading 0
    takes none. The plot goes beside --out."""
    if not vm.shutil.which("mpiexec"):
        monkeypatch.setattr(vm.shutil, "which", lambda name: "/usr/bin/" + name)
    m = {"T_GPU": 1e-3, "T_Update": 1e-3, "T_Epoch": 1.0, "T_Epoch_wall": 1.0, "N_Minibatch_avg": 4.0,
         "staleness": 1.0, "steps": {}, "updater": {}, "updates": 10, "samples": 40}
    monkeypatch.setattr(vm, "run_config", lambda *a, **k: {})
    monkeypatch.setattr(vm, "measured", lambda st, n_file: dict(m))
    monkeypatch.setitem(vm.N_TRAIN, "tiny", 256)
    base = ["--nets", "tiny", "--nodes", "1", "--workers", "1", "--subbatch", "2", "--no-sim", "--repeats", "2",
            "--no-calibrate"]
    assert vm.main(base + ["--host-reading", "0.3", "--out", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    d = vm.json.loads((tmp_path / "v.json").read_text())
    hr = d["rows"][0]["host_readings"]
    assert len(hr) == 2 and all(h["us"] > 0 and h["spread"] >= 1.0 and h["windows"] >= 2 for h in hr)
    lines = (tmp_path / "v.json.runs.jsonl").read_text().splitlines()
    assert [vm.json.loads(l)["host_reading"]["us"] for l in lines] == [h["us"] for h in hr]
    assert "host before each run" in out and ", host " in out
    assert vm.main(base + ["--host-reading", "0", "--out", str(tmp_path / "w.json")]) == 0
    assert vm.json.loads((tmp_path / "w.json").read_text())["rows"][0]["host_readings"] == [None, None]
    assert "host before each run" not in capsys.readouterr().out
    # each validation's plot beside its own file (the default rewrote a tracked bench/results PNG)
    assert (tmp_path / "v.png").stat().st_size > 0 and (tmp_path / "w.png").stat().st_size > 0
