"""Validate the performance model against real SPRINT ASGD runs on this machine.

For every (net, N_Node, N_GPU, N_Subbatch) of the grid this script runs the
distributed runner (``engine.parallel.run``: N_Node MPI ranks under mpiexec,
N_GPU worker threads each, one BLAS/OpenMP thread per worker) for a fixed
wall time on a synthetic data set (timing does not depend on pixel values),
reads ``asgd_stats.json`` and compares with the closed-form prediction and
the simulation for the same configuration (``ranks_per_host = N_Node``: all
ranks share this machine's cores):

    T_GPU and every worker step, T_Update, T_Epoch, N_Minibatch_avg, staleness.

It also times each layer's forward and backward in-process and compares them
with the model's per-layer ComputeGradient terms.

This machine is shared with other jobs, and its speed drifts from minute
to minute. With ``--probe`` a one-second probe before each run (one thread
stepping the same net, never the ASGD run itself) measures how much slower
it steps now than when the profile was swept, and the prediction is scaled
by that; the summary gives the unprobed error too.

    python bench/validate_model.py --profile bench/profiles/cpu.json \
        [--nets tiny,cifar] [--nodes 1,2,4] [--workers 1,2] [--subbatch 1,8,32] [--seconds 8]

Prints the tables, writes bench/results/validation.json and a PNG. Every
summary gives the mean and the median |error|, separately for the nets the
profile's sweeps saw ("fitted grid") and the nets none of them saw ("held-out
nets"; a net may be a spec file). Targets (issue 15, mean |error| on the
held-out nets): T_GPU, T_Epoch and N_Minibatch_avg <= 5 %, staleness <= 10 %;
per-layer forward/backward median <= 10 %.

Before each run a one-second reading of the host's speed (a tiny SGEMM's
per-call time in 0.1-s windows, bench/host_states.py; ``--host-reading``)
is kept beside the run, and the report says whether the host kept one
speed through the runs and how the single runs' errors differ after its
fast and slow readings: on a VM whose cores change speed (bench/RESULTS.md
section 4, sets 23-26) a run's error holds the state it ran in.

A run that fails is reported and the script exits with status 1 after the
report (status 2 before any run when mpiexec is missing): a table of nothing
is never a result.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_report import (LAYER_TARGET, QTY, TARGETS, _row_line, format_report, host_lines,  # noqa: E402,F401
                             rel, summarize)
from validate_runs import (DEFAULT_SUB, LAYER_CAL_BEFORE, LAYER_CAL_FIRST, N_TRAIN,  # noqa: E402,F401
                           calibrate_layers, calibrated, calibrated_by_part, group_of, layer_calibration,
                           layer_predictions, layer_times, make_data, measured, measured_mode, median_runs,
                           merge_runs, predicted, repredict, run_config, safe_name, saved_calibrated,
                           swept_nets)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=str(ROOT / "bench" / "profiles" / "cpu.json"))
    ap.add_argument("--nets", default="tiny,cifar")
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--subbatch", default=None, help="comma list (default per net: tiny 1,8,32; cifar 1,4,16)")
    ap.add_argument("--seconds", type=float, default=8.0, help="wall time of each run")
    ap.add_argument("--repeats", type=int, default=1,
                    help="passes over the grid (interleaved, so drift spreads over all configurations); "
                         "each configuration is scored by the median of its runs")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--probe", action="store_true",
                    help="probe the machine's load before each run instead of using the sweep-time factor")
    ap.add_argument("--host-reading", type=float, default=1.0, metavar="S",
                    help="seconds of a tiny-SGEMM reading of the host's speed before each run "
                         "(bench/host_states.py; 0: none): the report says whether the host kept one "
                         "speed through the runs")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "validation.json"))
    # Beside --out by default: a run into its own file no longer rewrote the tracked validation.png.
    ap.add_argument("--plot", default=None, help="PNG of measured against predicted (default: --out with .png)")
    ap.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="skip the calibration before each pass (engine.perf.calibrate, as sprint predict "
                         "runs it); its ratio to the profile's is reported beside the errors, never applied "
                         "to the primary numbers")
    ap.add_argument("--rescore", default=None,
                    help="print the report of a saved validation JSON (a comma list: of their union, e.g. "
                         "one grid run in parts, each short enough to hold the machine alone)")
    ap.add_argument("--repredict", action="store_true",
                    help="with --rescore: predict its measured runs again from --profile (a changed model "
                         "scored on runs already seen: a development set, not a held-out one)")
    a = ap.parse_args(argv)
    from engine.perf.profile import Profile
    if a.rescore:
        ds = [json.loads(Path(f).read_text()) for f in a.rescore.split(",")]
        for d in ds:
            # Each file's layer passes by its own calibration, against the profile they are priced by now.
            lp, lc = a.profile if a.repredict else d.get("profile"), layer_calibration(d)
            if lp and Path(lp).exists():
                calibrate_layers(d["layers"], Profile.load(lp), *(lc or (None,)))
        d = merge_runs(ds)
        for r in d["rows"]:
            m = r["measured"]
            if "T_Epoch_wall" not in m:      # written before T_Epoch followed eq. (10)
                m["T_Epoch_wall"] = m["T_Epoch"]
                m["T_Epoch"] = N_TRAIN[r["model"]] * m["T_Update"] / m["N_Minibatch_avg"]
        if a.repredict:
            repredict(d, a.profile, sim=not a.no_sim)
        # Without --repredict the saved runs' own calibrated predictions (what sprint predict gave then).
        got = calibrated_by_part(ds, Profile.load(a.profile)) if a.repredict else saved_calibrated(d)
        # The measured-layers mode prices the rest by the run's own profile unless re-predicted.
        run_prof = a.profile if a.repredict else (d.get("profile") or (d.get("parts") or [{}])[0].get("profile"))
        # Files saved before the anchors' passes were kept time them now (the line then moves a little).
        meas = measured_mode(d["rows"], d["layers"], Profile.load(run_prof), dict(d.get("anchor_passes") or {})) \
            if run_prof else None
        print(format_report(d["rows"], d["layers"], d.get("calibration_scale"), got, meas))
        return 1 if d.get("failed") or not d["rows"] else 0
    from engine.perf.plots import plot_validation
    from engine.perf.sweep import probe_host
    if shutil.which("mpiexec") is None:
        print("validate_model: error: mpiexec is not on PATH: no run can start (install mpich)", file=sys.stderr)
        return 2
    prof = Profile.load(a.profile)
    nets = a.nets.split(",")
    if a.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    cal = []

    def calibrate(what="calibration"):
        """This machine now against the profile's: what sprint predict would rescale by."""
        if not a.calibrate:
            return None
        from engine.perf.calibrate import check
        from engine.perf.profile import Profile as P
        chk = check(P(prof.data, prof.source), apply=False)
        got = {"ratio": chk.ratio, "noise": chk.noise, "scale": chk.scale, "call_scale": chk.call_scale,
               "parts": chk.parts, "messages": chk.messages, "now": chk.now}
        parts = ", ".join(f"{k} x{v:.3f}" for k, v in chk.parts.items())
        print(f"{what}: x{chk.ratio if chk.ratio is not None else float('nan'):.3f} the profile's "
              f"(noise +-{100 * chk.noise:.0f} %{'; ' + parts if parts else ''})"
              + ("" if chk.ok else f": {'; '.join(chk.messages)}"), flush=True)
        return got
    if a.host_reading < 0:
        raise SystemExit("--host-reading must be >= 0 seconds")
    from host_states import short_reading
    rows, layers, grid, runs, failed, readings = [], [], [], {}, [], {}
    Path(str(a.out) + ".runs.jsonl").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="sprint-validate-") as tmp:
        datasets, subs = {}, {}
        for net in nets:
            npz = Path(tmp) / f"{safe_name(net)}.npz"
            datasets[net] = (npz, make_data(net, npz))
            subs[net] = [int(s) for s in a.subbatch.split(",")] if a.subbatch else DEFAULT_SUB.get(net, (1, 8, 32))
            grid += [(net, int(n), int(g), sub) for n in a.nodes.split(",") for g in a.workers.split(",")
                     for sub in subs[net]]
        # The layer passes' own calibration, just before they are timed (a pass's comes after them).
        layer_cal = calibrate("calibration before the layer passes")
        for net in nets:
            for sub in subs[net]:
                layers += layer_times(net, sub, prof)
        calibrate_layers(layers, prof, layer_cal)
        for rep in range(a.repeats):
            got = calibrate()
            if got:
                cal.append(got)
            for key in grid:
                net, n_node, n_gpu, sub = key
                data, n_file = datasets[net]
                host = probe_host(net, seconds=1.0, profile=prof) if a.probe else None
                hr = short_reading(a.host_reading) if a.host_reading > 0 else None
                try:
                    st = run_config(net, data, n_node, n_gpu, sub, a.seconds, tmp, a.timeout, rep)
                except Exception as e:   # keep the grid going, report the failure, exit 1 at the end
                    print(f"FAILED {net} {n_node}x{n_gpu}x{sub}: {e}", file=sys.stderr, flush=True)
                    failed.append((key, str(e)[-300:]))
                    continue
                runs.setdefault(key, []).append((measured(st, n_file), host))
                readings.setdefault(key, []).append(hr)
                # Every run is kept on disk as it comes: a grid stopped early still has its data.
                with open(str(a.out) + ".runs.jsonl", "a") as f:
                    f.write(json.dumps({"pass": rep, "key": list(key), "measured": runs[key][-1][0],
                                        "host_reading": hr},
                                       default=str) + "\n")
                print(f"pass {rep + 1}/{a.repeats} {net} {n_node}x{n_gpu}x{sub}: T_GPU "
                      f"{runs[key][-1][0]['T_GPU']:.4g} s" + (f", probe {host:.3f}" if host else "")
                      + (f", host {hr['us']:.2f} us x{hr['spread']:.2f}" if hr else ""), flush=True)
        for key in grid:
            if key not in runs:
                continue
            net, n_node, n_gpu, sub = key
            n_file = datasets[net][1]
            ms = [m for m, _ in runs[key]]
            probes = [h for _, h in runs[key] if h is not None]
            host = float(np.median(probes)) if probes else None
            p = predicted(net, n_node, n_gpu, sub, prof, n_file, sim=not a.no_sim, host=host)
            row = {"model": net, "n_node": n_node, "n_gpu": n_gpu, "n_subbatch": sub, "n_file": n_file,
                   "group": group_of(net, prof),
                   "measured": median_runs(ms), "predicted": p, "runs": [{k: m.get(k) for k in QTY} for m in ms],
                   "probes": probes, "host_readings": readings.get(key, [])}
            if host is not None:
                q = predicted(net, n_node, n_gpu, sub, prof, n_file, sim=False, host=None)
                row["predicted_sweep_load"] = {k: q[k] for k in QTY}
            if "sim" in p:
                row["simulated"] = p.pop("sim")
            rows.append(row)
            print(_row_line(row), flush=True)
    for l in layers:
        l["group"] = group_of(l["model"], prof)
    ratios = [c["ratio"] for c in cal if c["ratio"]]
    scale = float(np.median(ratios)) if ratios else None
    got = calibrated(rows, prof, cal, sim=False)
    if got:
        # Kept with the rows: a later --rescore of several parts reports them without re-predicting.
        for r, c in zip(rows, got[0]):
            r["calibrated"] = {k: c["predicted"][k] for k in QTY}
    anchors = {}      # the anchor nets' passes the measured-layers mode times, kept for --rescore
    report = format_report(rows, layers, scale, got, measured_mode(rows, layers, prof, anchors))
    print(report)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    tmp_out = Path(a.out).with_suffix(".tmp")
    tmp_out.write_text(json.dumps({"profile": a.profile, "rows": rows, "layers": layers, "failed": failed,
                                   "calibration_scale": scale, "calibrations": cal,
                                   "layer_calibration": layer_cal,
                                   "calibrated_scales": list(got[1:]) if got else None,
                                   "anchor_passes": anchors,
                                   "argv": sys.argv[1:],
                                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                  indent=1, default=str))
    tmp_out.replace(a.out)
    if rows:
        plot_validation(rows, a.plot or str(Path(a.out).with_suffix(".png")))
    total = len(grid) * a.repeats
    if failed or not rows:
        print(f"validate_model: error: {len(failed)} of {total} runs failed"
              + (f" (first: {failed[0][0]}: {failed[0][1]})" if failed else "; no configuration was measured"),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
