"""The profile's ``pipeline`` section: what the pipeline executor costs on
this machine beyond its kernels (engine.perf.pipeline.Executor) and what a
point-to-point message of each size takes, measured by ``sprint profile``
(its ``pipeline`` sweep; ``sprint profile --update PROFILE`` adds the
section to an existing profile without re-sweeping anything else).

The sweep (:func:`sweep_pipeline`) times real ``sprint train --parallel
pipeline`` runs under mpiexec, one epoch of the embedded digits each: K = 2
with gpipe and 1f1b (the executor's per-pass and per-instruction costs) and,
when 4 ranks outnumber the cores, K = 4 with gpipe (the ``shared`` slowdown),
plus a ping-pong of the executor's own sends by size. Its records are raw
timers; :func:`fit_section` prices them against the profile they go into, so
the section always matches that profile's kernel prices.

Calibration: the records carry a calibration step (engine.perf.calibrate)
taken just before the runs; the fit prices the kernels at that speed (the
profile's times x the calibration ratio) and stores the executor's seconds
and the message table divided by the ratio, i.e. in the profile's own time
base, so ``Profile.time_scale`` (set by the calibration every ``sprint
predict`` runs) rescales them with everything else.

``FIT_CONFIGS`` and ``SHARED_CONFIGS`` are the only configurations the fit
sees; bench/pipeline_measure.py judges the model on others.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.parallel.threads import usable_cores
from .sweep_runner import mpiexec_env

# (net, K, schedule), one epoch of the embedded digits, batch 32, M = 4
FIT_CONFIGS = (("digits", 2, "gpipe"), ("digits", 2, "1f1b"))
SHARED_CONFIGS = (("digits", 4, "gpipe"),)
BATCH, MICRO = 32, 4
PING_FLOATS = (64, 256, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 8192, 16384, 32768, 65536)


def child_env() -> dict:
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return mpiexec_env(600, PYTHONPATH=root + (os.pathsep + path if path else ""))


_PING = r"""
import sys, time, numpy as np
from mpi4py import MPI
from engine.parallel.pipeline import P2P
c = MPI.COMM_WORLD; r = c.Get_rank(); p = P2P(c); out = []
for n in map(int, sys.argv[1:]):
    a = np.zeros(n, np.float32); ts = []
    for it in range(200):
        t = time.perf_counter()
        if r == 0:
            p.isend(a, 1, 0, it); q, b = p.irecv((n,), np.float32, 1, 1, it); p.wait(q)
        else:
            q, b = p.irecv((n,), np.float32, 0, 0, it); p.wait(q); p.isend(b, 0, 1, it)
        ts.append(time.perf_counter() - t)
    p.flush(); out.append(float(np.median(ts)) / 2)
if r == 0: print(*out)
"""


def measure_p2p(floats=PING_FLOATS) -> dict:
    """One-way times of the executor's messages (P2P, the same polling) by
    size, from a ping-pong: engine.perf.pipeline.p2p_time's table, with the
    eager size read off it (the largest message under 1.5x the smallest's
    time: above it MPI's rendezvous handshake needs both sides' polls)."""
    cmd = ["mpiexec", "-n", "2", sys.executable, "-c", _PING, *map(str, floats)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=120)
    if p.returncode:
        raise RuntimeError(f"ping-pong failed: {(p.stdout + p.stderr)[-500:]}")
    times = [float(v) for v in p.stdout.split()]
    nbytes = [4 * n for n in floats]
    eager = max(b for b, t in zip(nbytes, times) if t < 1.5 * times[0])
    return {"bytes": nbytes, "times": times, "eager_bytes": eager}


def run_timers(model, K, schedule, parts, out, train_args=(), epochs=1, M=MICRO, batch=BATCH) -> dict:
    """One ``sprint train --parallel pipeline`` run under mpiexec: the raw
    per-stage timers the fit and the bench price (pipeline_stats.json)."""
    model_arg = model if isinstance(model, str) else str(model)
    cmd = ["mpiexec", "-n", str(K), sys.executable, "-m", "engine.cli", "train", "--parallel", "pipeline",
           "--model", model_arg, "--stages", str(K), "--pipe-schedule", schedule, "--microbatches", str(M),
           "--partition", ",".join(f"{a}:{b}" for a, b in parts), "--epochs", str(epochs), "--batch", str(batch),
           "--out", str(out), "--no-progress", "--quiet", *train_args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=900)
    if p.returncode:
        raise RuntimeError(f"pipeline run failed: {(p.stdout + p.stderr)[-800:]}")
    st = json.loads((Path(out) / "pipeline_stats.json").read_text())
    stages = []
    for s in st["per_stage"]:
        T = s["timers"]
        stages.append({"layers": s["layers"], "bubble": s["bubble"], "wall_s": s["wall_s"],
                       **{f"{n}_{q}": T.get(n, {}).get(q, 0.0) for n in ("fwd", "bwd", "update", "wait")
                          for q in ("mean", "total", "count")}})
    return {"K": K, "schedule": schedule, "M": M, "batch": batch, "epochs": epochs,
            "partition": [list(p) for p in parts], "n_mb": len(st["per_stage"][0]["trace"]),
            "samples": st["samples"], "wall_s": st["wall_s"], "stages": stages}


def sweep_pipeline(cfg=None, profile=None, cores=None, log=None) -> list:
    """The section's records: the ping-pong table and each configuration's
    timers, with a calibration step taken just before them."""
    from engine.perf import pipeline as P
    from .calibrate import calibration_step
    if shutil.which("mpiexec") is None:
        raise RuntimeError("mpiexec is not on PATH")
    cores = cores or usable_cores()
    recs = [dict(measure_p2p(), kind="pipeline_p2p")]
    cal = calibration_step(2.0)
    configs = FIT_CONFIGS + (SHARED_CONFIGS if max(k for _, k, _ in SHARED_CONFIGS) > cores else ())
    with tempfile.TemporaryDirectory(prefix="sprint-pipeline-") as tmp:
        for net, K, sched in configs:
            parts = P.balanced_partition(net, K, BATCH, MICRO, profile)
            r = run_timers(net, K, sched, parts, Path(tmp) / f"{net}-{K}-{sched}")
            recs.append(dict(r, kind="pipeline_run", net=net, model=net, calibration=cal,
                             shared=K > cores))
            if log:
                log(f"pipeline {net} K={K} {sched}: {r['samples'] / r['wall_s']:.0f} img/s")
    return recs


def untimed_per_instruction(run) -> list:
    """Each stage's stream time outside its timers (passes, updates, waits),
    per instruction: the executor's own work around them."""
    out = []
    for s in run["stages"]:
        timed = sum(s[f"{n}_total"] for n in ("fwd", "bwd", "update", "wait"))
        n = s["fwd_count"] + s["bwd_count"] + s["update_count"]
        out.append(max(0.0, s["wall_s"] - timed) / max(1, n))
    return out


def fit_passes(runs, prof):
    """engine.perf.pipeline.fit_executor on runs' timed passes (kernels priced
    by the profile, the executor's copies by its "copy"), then each layer
    kind's factor (fit_kind_factors) on the stages holding one kind only."""
    from engine import spec as spec_mod
    from engine.perf import pipeline as P
    passes, kinds = [], []
    vec = lambda n: prof.term("copy", n) if prof.has("copy") else 0.0
    for r in runs:
        costs = P.stage_costs(r["model"], r["partition"], r["batch"], r["M"], prof)
        sp = spec_mod.get_spec(r["model"])
        geoms, lt = spec_mod.layers(sp), P.layer_times(sp, max(1, -(-r["batch"] // r["M"])), prof)
        n_f, n_b = P.executor_copies(r["schedule"])
        for c, s, (lo, hi) in zip(costs, r["stages"], r["partition"]):
            f, b = (c.t_f, n_f * vec(c.params), s["fwd_mean"]), (c.t_b, n_b * vec(c.params), s["bwd_mean"])
            passes += [f, b]
            kf, kb = P.kind_split(geoms, lt, lo, hi)
            for (conv, other), d, row in ((kf, "f", f), (kb, "b", b)):
                if not (conv and other):           # one kind only: its factor's evidence
                    kinds.append((f"{'conv' if conv else 'other'}_{d}", *row))
    ex = P.fit_executor(passes, [u for r in runs for u in untimed_per_instruction(r)])
    return P.fit_kind_factors(ex, kinds)


def predicted_passes(run, prof, executor, cores) -> list:
    """(forward, backward) seconds per pass of each stage of ``run`` as the
    model predicts them (the simulator's pass walls: core sharing included)."""
    from engine.perf import pipeline as P
    from engine.perf import pipeline_sim as PS
    K, sched = run["K"], run["schedule"]
    over = K > cores
    costs = P.stage_costs(run["model"], run["partition"], run["batch"], run["M"], prof, executor=executor,
                          schedule=sched, oversubscribed=over)
    sim = PS.play(costs, sched, run["M"], run["n_mb"], cores=cores if over else None)
    return [(w.get("F", 0.0) / max(1, n.get("F", 0)), w.get("B", 0.0) / max(1, n.get("B", 0)))
            for w, n in zip(sim["wall"], sim["passes"])]


def fit_shared(runs, prof, executor, cores, rounds=3) -> float:
    """The executor's ``shared`` slowdown from runs with more ranks than
    cores: the median measured / predicted pass time, the prediction
    (processor sharing included) redone with each round's value."""
    shared = 0.0
    for _ in range(rounds):
        ex = replace(executor, shared=shared)
        ratio = np.median([m / p for r in runs for s, (pf, pb) in zip(r["stages"], predicted_passes(r, prof, ex, cores))
                           for m, p in ((s["fwd_mean"], pf), (s["bwd_mean"], pb))])
        shared = max(0.0, (1.0 + shared) * float(ratio) - 1.0)
    return shared


def calibration_ratio(profile, records) -> float:
    """This host's speed during the records' runs against the profile's
    (calibration wall time now / then); 1 when either is missing."""
    then = (profile.data.get("fingerprint") or {}).get("calibration") or {}
    now = [r["calibration"]["wall_s"] for r in records if r.get("calibration", {}).get("wall_s")]
    if not then.get("wall_s") or not now:
        return 1.0
    return float(np.median(now)) / float(then["wall_s"])


def fit_section(profile, records, cores=None) -> dict:
    """The ``pipeline`` section of ``profile`` (a Profile) from the sweep's
    records, in the profile's time base (the module docstring)."""
    from .profile import Profile
    runs = [r for r in records if r.get("kind") == "pipeline_run"]
    ping = [r for r in records if r.get("kind") == "pipeline_p2p"]
    if not runs:
        raise ValueError("no pipeline runs among the records")
    ratio = calibration_ratio(profile, runs)
    cores = cores or profile.cores
    prof = Profile(dict(profile.data), profile.source)
    prof.data.pop("pipeline", None)
    prof.time_scale = ratio
    p2p = {k: ping[-1][k] for k in ("bytes", "times", "eager_bytes")} if ping else None
    if p2p:
        prof.data["p2p"] = p2p
    # fitted in the host's seconds; stored (and priced by stage_costs) in the profile's
    base = fit_passes([r for r in runs if not r.get("shared")], prof).scaled(1.0 / ratio)
    shared_runs = [r for r in runs if r.get("shared")]
    if shared_runs:
        base = replace(base, shared=fit_shared(shared_runs, prof, base, cores))
    out = {"executor": vars(base), "calibration_ratio": ratio,
           "fitted_on": [[r["net"], r["K"], r["schedule"]] for r in runs],
           "shared_fitted": bool(shared_runs)}
    if p2p:
        out["p2p"] = dict(p2p, times=[t / ratio for t in p2p["times"]])
    return out
