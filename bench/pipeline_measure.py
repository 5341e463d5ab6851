"""Pipelines measured against the cost model (bench/pipeline_bench.py
--part probe|measure; bench/RESULTS.md, "Pipelines").

probe   -- the executor's costs beyond the kernels (engine.perf.pipeline.
           Executor) fitted on FIT_RUNS: digits on 2 ranks, gpipe and 1f1b;
           written to bench/results/pipeline_executor.json.
measure -- FIT_RUNS again and the held-out HELD_OUT_RUNS (digits on 4 ranks,
           tests/cifar_like.py's 4-layer CIFAR-format net on 2 and 4 ranks):
           per-stage forward/backward means, idle share and images/s against
           four predictions (evaluate), errors split fitted / held out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.perf import pipeline as P  # noqa: E402
from engine.perf import pipeline_sim as PS  # noqa: E402
from engine.perf.profile import Profile  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
           MPIEXEC_TIMEOUT="600")


def _mpi_train(n, cfg, out):
    job = json.dumps({"cfg": dict(cfg, out=str(out))})
    cmd = ["mpiexec", "-n", str(n), sys.executable, "-m", "mpi4py", str(ROOT / "tests/mpi/pipeline_train.py"), job]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=900)
    if p.returncode:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
    return json.loads((Path(out) / "pipeline_stats.json").read_text()), \
        [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines()]


PING_FLOATS = (64, 256, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 8192, 16384, 32768, 65536)
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


def measure_p2p(floats=PING_FLOATS):
    """One-way times of the executor's messages (P2P, the same polling) by
    size, from a ping-pong: engine.perf.pipeline.p2p_time's table, with the
    eager size read off it (the largest message under 1.5x the smallest's
    time: above it MPI's rendezvous handshake needs both sides' polls)."""
    cmd = ["mpiexec", "-n", "2", sys.executable, "-c", _PING, *map(str, floats)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    times = [float(v) for v in p.stdout.split()]
    nbytes = [4 * n for n in floats]
    eager = max(b for b, t in zip(nbytes, times) if t < 1.5 * times[0])
    return {"bytes": nbytes, "times": times, "eager_bytes": eager}


def probe_stage_costs(parts, model="digits", micro=8, reps=200):
    """Each stage's forward and backward (the loss on the last stage) timed
    in this one process, one thread, on micro-batches of ``micro``: the
    costs the stages have on this machine now, measured apart from the
    pipeline run (medians)."""
    import time
    from engine.parallel.stage import Stage
    rng = np.random.default_rng(0)
    out = []
    for lo, hi in parts:
        st = Stage(model, lo, hi)
        x = rng.random((micro,) + st.in_shape).astype(np.float32)
        y = np.arange(micro) % 10
        tf, tb = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            o, c = st.forward(x, None)
            t1 = time.perf_counter()
            dy = st.loss_grad(o, y, 1.0)[2] if st.last else np.ones_like(o)
            st.backward(c, dy)
            tb.append(time.perf_counter() - t1)
            tf.append(t1 - t0)
        out.append((float(np.median(tf)), float(np.median(tb))))
    return out


# (net, K, schedule): the probe fits the executor's costs on the first two; every
# other configuration is held out (another partition, another net)
FIT_RUNS = (("digits", 2, "gpipe"), ("digits", 2, "1f1b"))
# ... and the slowdown when ranks outnumber cores on another net (the 28x28 LeNet-style net)
SHARED_RUNS = (("mnist", 4, "gpipe"), ("mnist", 4, "1f1b"))
HELD_OUT_RUNS = (("digits", 4, "gpipe"), ("digits", 4, "1f1b"), ("cifar-small", 2, "gpipe"),
                 ("cifar-small", 2, "1f1b"), ("cifar-small", 4, "gpipe"), ("cifar-small", 4, "1f1b"))
EXECUTOR_JSON = ROOT / "bench/results/pipeline_executor.json"


def _net(net, tmp):
    """(the net for engine.spec: a preset's name or a spec dict, the run's
    data options) of a bench net; cifar-small is tests/cifar_like.py's
    4-layer net on its CIFAR-format digits."""
    if net == "digits":
        return "digits", {"lr": 0.02}
    sys.path.insert(0, str(ROOT / "tests"))
    if net == "mnist":
        from mnist_like import digits_as_mnist
        data = Path(tmp) / "mnist"
        if not data.exists():
            digits_as_mnist(data)
        return "mnist", {"model": "mnist", "data": str(data), "lr": 0.02}
    from cifar_like import SMALL_SPEC, digits_as_cifar
    spec, data = Path(tmp) / "cifar-small.json", Path(tmp) / "cifar"
    if not spec.exists():
        digits_as_cifar(data)
        spec.write_text(json.dumps(SMALL_SPEC))
    return SMALL_SPEC, {"model": str(spec), "data": str(data), "fmt": "cifar", "lr": 0.01}


def measure_run(net, K, sched, tmp, prof, epochs=1, M=4, batch=32):
    """One pipeline run (mpiexec, one epoch) with its stages probed alone just
    before: the raw per-stage timers the evaluation prices against."""
    model, opts = _net(net, tmp)
    parts = P.balanced_partition(model, K, batch, M, prof)
    probed = probe_stage_costs(parts, model)
    cfg = dict(opts, epochs=epochs, batch=batch,
               extra={"schedule": sched, "microbatches": M, "stages": K,
                      "partition": ",".join(f"{a}:{b}" for a, b in parts)})
    st, _ = _mpi_train(K, cfg, Path(tmp) / f"{net}-k{K}{sched}")
    stages = []
    for s in st["per_stage"]:
        T = s["timers"]
        stages.append({"layers": s["layers"], "bubble": s["bubble"], "wall_s": s["wall_s"],
                       **{f"{n}_{q}": T.get(n, {}).get(q, 0.0) for n in ("fwd", "bwd", "update", "wait")
                          for q in ("mean", "total", "count")}})
    return {"net": net, "model": model, "K": K, "schedule": sched, "M": M, "batch": batch, "epochs": epochs,
            "partition": [list(p) for p in parts], "probed": probed, "n_mb": len(st["per_stage"][0]["trace"]),
            "samples": st["samples"], "wall_s": st["wall_s"], "stages": stages}


def untimed_per_instruction(run) -> list:
    """Each stage's stream time outside its timers (passes, updates, waits),
    per instruction: the executor's own work around them."""
    out = []
    for s in run["stages"]:
        timed = sum(s[f"{n}_total"] for n in ("fwd", "bwd", "update", "wait"))
        n = s["fwd_count"] + s["bwd_count"] + s["update_count"]
        out.append(max(0.0, s["wall_s"] - timed) / max(1, n))
    return out


def fit_executor(runs, prof) -> P.Executor:
    """P.fit_executor on runs' timed passes (kernels priced by the profile,
    the executor's copies by its "copy"); runs on no more ranks than cores,
    so no core sharing blurs them."""
    passes = []
    vec = lambda n: prof.term("copy", n) if prof.has("copy") else 0.0
    for r in runs:
        costs = P.stage_costs(r["model"], r["partition"], r["batch"], r["M"], prof)
        n_f, n_b = P.executor_copies(r["schedule"])
        for c, s in zip(costs, r["stages"]):
            passes += [(c.t_f, n_f * vec(c.params), s["fwd_mean"]), (c.t_b, n_b * vec(c.params), s["bwd_mean"])]
    return P.fit_executor(passes, [u for r in runs for u in untimed_per_instruction(r)])


def evaluate(run, prof, executor, ncpu):
    """Rows of one run against four predictions: profile (the model on the
    profile alone), model (the profile plus the executor's costs), probe
    (the stages timed alone), run (the run's own mean passes: the schedule
    alone left to predict)."""
    K, sched, M = run["K"], run["schedule"], run["M"]
    cores = None if K <= ncpu else ncpu
    base = P.stage_costs(run["model"], run["partition"], run["batch"], M, prof, schedule=sched)
    withx = P.stage_costs(run["model"], run["partition"], run["batch"], M, prof, executor=executor,
                          schedule=sched, oversubscribed=cores is not None)
    meas = run["stages"]
    rows = []
    for source in ("profile", "model", "probe", "run"):
        if source == "profile":
            costs = base
        elif source == "model":
            costs = withx
        elif source == "probe":
            costs = [replace(c, t_f=f, t_b=b) for c, (f, b) in zip(base, run["probed"])]
        else:
            costs = [replace(c, t_f=s["fwd_mean"], t_b=s["bwd_mean"], t_u=s["update_mean"], t_x=u)
                     for c, s, u in zip(base, meas, untimed_per_instruction(run))]
        sim = PS.play(costs, sched, M, run["n_mb"], cores=None if source == "run" else cores)
        for k, s in enumerate(meas):
            w, n = sim["wall"][k], sim["passes"][k]
            timed = sum(v for kind, v in w.items() if kind != "X")
            rows.append({"net": run["net"], "K": K, "schedule": sched, "source": source, "stage": k,
                         "cores": cores, "layers": s["layers"],
                         "fwd_ms": 1e3 * s["fwd_mean"], "fwd_pred_ms": 1e3 * w.get("F", 0) / max(1, n.get("F", 0)),
                         "bwd_ms": 1e3 * s["bwd_mean"], "bwd_pred_ms": 1e3 * w.get("B", 0) / max(1, n.get("B", 0)),
                         "bubble": s["bubble"], "bubble_pred": 1.0 - timed / sim["makespan"],
                         "bubble_gpipe": (K - 1) / (M + K - 1),
                         # the measured idle share split: receives waited for, and the rest
                         "wait_share": s["wait_total"] / s["wall_s"],
                         "img_s": run["samples"] / run["wall_s"],
                         "img_s_pred": run["samples"] / run["epochs"] / sim["makespan"]})
    return rows


def summarize_rows(rows) -> dict:
    out = {}
    for source in ("profile", "model", "probe", "run"):
        fit = FIT_RUNS + SHARED_RUNS
        for group, keep in (("fitted", lambda r: (r["net"], r["K"], r["schedule"]) in fit),
                            ("held_out", lambda r: (r["net"], r["K"], r["schedule"]) not in fit)):
            rs = [r for r in rows if r["source"] == source and keep(r)]
            if not rs:
                continue
            errs = [abs(r[a] - r[b]) / r[a] for r in rs for a, b in (("fwd_ms", "fwd_pred_ms"), ("bwd_ms", "bwd_pred_ms"))]
            out[f"{source} {group}"] = {
                "median_time_error": float(np.median(errs)),
                "median_bubble_abs_error": float(np.median([abs(r["bubble"] - r["bubble_pred"]) for r in rs])),
                "median_img_s_error": float(np.median([abs(r["img_s"] - r["img_s_pred"]) / r["img_s"]
                                                       for r in rs if r["stage"] == 0])),
                "n_times": len(errs)}
    return out


def _setup_profile():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prof = Profile.load()
    prof.data["p2p"] = measure_p2p()
    return prof


def fit_shared(runs, prof, executor, ncpu, rounds=3) -> float:
    """The executor's ``shared`` slowdown from runs with more ranks than
    cores: the median measured / predicted pass time, the prediction
    (processor sharing included) redone with each round's value."""
    shared = 0.0
    for _ in range(rounds):
        ex = replace(executor, shared=shared)
        rows = [r for run in runs for r in evaluate(run, prof, ex, ncpu) if r["source"] == "model"]
        ratio = np.median([r[a] / r[b] for r in rows for a, b in (("fwd_ms", "fwd_pred_ms"), ("bwd_ms", "bwd_pred_ms"))])
        shared = max(0.0, (1.0 + shared) * float(ratio) - 1.0)
    return shared


def part_probe():
    """The executor's costs, fitted on FIT_RUNS (digits, 2 ranks): written to
    EXECUTOR_JSON for part_measure and ``sprint predict --executor``."""
    prof = _setup_profile()
    ncpu = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure_run(net, K, sched, tmp, prof) for net, K, sched in FIT_RUNS]
        shared_runs = [measure_run(net, K, sched, tmp, prof) for net, K, sched in SHARED_RUNS]
    ex = fit_executor(runs, prof)
    ex = replace(ex, shared=fit_shared(shared_runs, prof, ex, ncpu))
    import datetime
    out = {"executor": vars(ex), "fitted_on": [list(r) for r in FIT_RUNS + SHARED_RUNS], "p2p": prof.data["p2p"],
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "runs": runs + shared_runs}
    EXECUTOR_JSON.write_text(json.dumps(out, indent=1))
    return out


def part_measure(configs=None):
    """Every configuration's run (FIT_RUNS again, measured anew, and the held
    out ones) priced with the executor's costs the probe wrote."""
    prof = _setup_profile()
    executor = P.Executor.load(EXECUTOR_JSON) if EXECUTOR_JSON.exists() else P.Executor()
    ncpu = os.cpu_count() or 1
    configs = configs or FIT_RUNS + SHARED_RUNS + HELD_OUT_RUNS
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure_run(net, K, sched, tmp, prof) for net, K, sched in configs]
    rows = [row for r in runs for row in evaluate(r, prof, executor, ncpu)]
    return {"p2p": prof.data["p2p"], "cpus": ncpu, "executor": vars(executor), "runs": runs, "rows": rows,
            "errors": summarize_rows(rows)}


def print_rows(rows):
    for r in rows:
        print(f"{r['net']:>11} {r['schedule']:>5} K={r['K']} {r['source']:<7} stage {r['stage']} "
              f"{','.join(r['layers']):<12} fwd {r['fwd_ms']:.3f}/{r['fwd_pred_ms']:.3f} "
              f"bwd {r['bwd_ms']:.3f}/{r['bwd_pred_ms']:.3f} ms idle {r['bubble']:.2f}/{r['bubble_pred']:.2f} "
              f"(wait {r['wait_share']:.2f}) gpipe {r['bubble_gpipe']:.2f} img/s {r['img_s']:.0f}/{r['img_s_pred']:.0f}")
