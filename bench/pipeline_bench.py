"""Pipelines: measured against the cost model, predicted at scale, and
convergence on digits (bench/RESULTS.md, "Pipelines").

    PYTHONPATH=$PWD python bench/pipeline_bench.py [--part measure|scale|converge|spectrain|all] [--out FILE]

measure  -- digits on 2 and 4 ranks of this machine (mpiexec, gpipe and 1f1b,
            M=4, batch 32, one epoch each): per-stage forward/backward means
            and the idle share from pipeline_stats.json against
            engine.perf.pipeline on the shipped profile, as it is and with one
            host factor per run; point-to-point latency is measured by a
            ping-pong; more ranks than cores share them (processor sharing in
            the simulator).
scale    -- predicted throughput of cnn-a/b/c on 4, 8, 16 stages (x replicas)
            against synchronous data parallelism and SPRINT ASGD on the same
            number of devices, on the shipped CPU profile and on an H200
            profile made from datasheet figures (Profile.synthetic).
converge -- test accuracy per epoch on digits for every schedule and
            --predict mode against single-process SGD, and the samples each
            needs to reach 95 %.
spectrain -- SpecTrain's prediction error per stage on digits and on
            CIFAR-format batches (tests/cifar_like.py), 1f1b and dualpipe.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.perf import pipeline as P  # noqa: E402
from engine.perf import pipeline_sim as PS  # noqa: E402
from engine.perf.profile import Profile  # noqa: E402
from engine.spec import get_spec, layers  # noqa: E402

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


_PING = r"""
import time, numpy as np
from mpi4py import MPI
from engine.parallel.pipeline import P2P
c = MPI.COMM_WORLD; r = c.Get_rank(); p = P2P(c); out = {}
for n in (64, 65536):
    a = np.zeros(n, np.float32); ts = []
    for it in range(300):
        t = time.perf_counter()
        if r == 0:
            p.isend(a, 1, 0, it); q, b = p.irecv((n,), np.float32, 1, 1, it); p.wait(q)
        else:
            q, b = p.irecv((n,), np.float32, 0, 0, it); p.wait(q); p.isend(b, 0, 1, it)
        ts.append(time.perf_counter() - t)
    p.flush(); out[n] = float(np.median(ts)) / 2
if r == 0: print(out[64], (out[65536] - out[64]) / (4 * (65536 - 64)))
"""


def measure_p2p():
    cmd = ["mpiexec", "-n", "2", sys.executable, "-c", _PING]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    lat, per_byte = map(float, p.stdout.split())
    return {"latency": lat, "per_byte": max(per_byte, 0.0)}


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


def part_measure(runs=((2, "gpipe"), (4, "gpipe"), (2, "1f1b"), (4, "1f1b")), epochs=1):
    """Each run's per-stage forward/backward means and idle share against
    two predictions: the profile's (engine.perf.pipeline on the shipped
    profile, as it is) and the simulator's on the stage costs probed in one
    process just before the run (probe_stage_costs). Point-to-point latency
    comes from a ping-pong; more ranks than cores share them (processor
    sharing in the simulator, whose per-pass wall time is what a rank's
    timers measure)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prof = Profile.load()
    prof.data["p2p"] = measure_p2p()
    ncpu = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for K, sched in runs:
            parts = P.balanced_partition("digits", K, 32, 4)
            pred = P.predict("digits", stages=K, n_subbatch=32, profile=prof, schedule=sched,
                             microbatches=4, partition=parts)
            probed = probe_stage_costs(parts)
            cfg = {"epochs": epochs, "batch": 32, "lr": 0.02,
                   "extra": {"schedule": sched, "microbatches": 4, "stages": K,
                             "partition": ",".join(f"{a}:{b}" for a, b in parts)}}
            st, _ = _mpi_train(K, cfg, Path(tmp) / f"k{K}{sched}")
            cores = None if K <= ncpu else ncpu
            n_mb = len(st["per_stage"][0]["trace"])
            meas = [(s["timers"]["fwd"]["mean"], s["timers"]["bwd"]["mean"], s["bubble"]) for s in st["per_stage"]]
            upd = [s["timers"].get("update", {}).get("mean", 0.0) for s in st["per_stage"]]
            for source in ("profile", "probe", "run"):
                if source == "profile":
                    costs = pred.costs
                elif source == "probe":
                    costs = [P.StageCost(c.layers, c.params, f, b, c.t_u, c.t_c) for c, (f, b) in zip(pred.costs, probed)]
                else:
                    # the run's own mean passes (their wall time, core sharing included): what is
                    # left to predict is the schedule's idle time and the throughput
                    costs = [P.StageCost(c.layers, c.params, f, b, u, c.t_c)
                             for c, (f, b, _), u in zip(pred.costs, meas, upd)]
                sim = PS.play(costs, sched, 4, n_mb, cores=None if source == "run" else cores)
                for k, (mf, mb, bub) in enumerate(meas):
                    w, n = sim["wall"][k], sim["passes"][k]
                    rows.append({"K": K, "schedule": sched, "source": source, "stage": k, "cores": cores,
                                 "layers": st["per_stage"][k]["layers"],
                                 "fwd_ms": 1e3 * mf, "fwd_pred_ms": 1e3 * w.get("F", 0) / max(1, n.get("F", 0)),
                                 "bwd_ms": 1e3 * mb, "bwd_pred_ms": 1e3 * w.get("B", 0) / max(1, n.get("B", 0)),
                                 "bubble": bub, "bubble_pred": 1.0 - sum(w.values()) / sim["makespan"],
                                 "bubble_gpipe": (K - 1) / (4 + K - 1),
                                 # the measured idle share split: receives waited for, and the rest
                                 # (untimed executor work: posting receives, host copies of sends, the loop)
                                 "wait_share": st["per_stage"][k]["timers"].get("wait", {}).get("total", 0.0)
                                 / st["per_stage"][k]["wall_s"],
                                 "img_s": st["samples"] / st["wall_s"],
                                 "img_s_pred": st["samples"] / epochs / sim["makespan"]})
    out = {"p2p": prof.data["p2p"], "rows": rows, "cpus": ncpu}
    for source in ("profile", "probe", "run"):
        rs = [r for r in rows if r["source"] == source]
        errs = [abs(r[a] - r[b]) / r[a] for r in rs for a, b in (("fwd_ms", "fwd_pred_ms"), ("bwd_ms", "bwd_pred_ms"))]
        out[f"median_time_error_{source}"] = float(np.median(errs))
        out[f"median_bubble_abs_error_{source}"] = float(np.median([abs(r["bubble"] - r["bubble_pred"]) for r in rs]))
        out[f"median_img_s_error_{source}"] = float(np.median([abs(r["img_s"] - r["img_s_pred"]) / r["img_s"]
                                                               for r in rs if r["stage"] == 0]))
    return out


def h200_profile():
    """Datasheet figures of one H200 SXM (not measured here): engine.perf.plan.h200_datasheet."""
    from engine.perf.plan import h200_datasheet
    return h200_datasheet()


def sync_dp_throughput(model, n_dev, batch, prof):
    from engine.perf.model import compute_gradient_terms
    from engine.spec import n_params
    b = max(1, batch // n_dev)
    t = sum(r[4] for r in compute_gradient_terms(get_spec(model), b, prof))
    n_p = n_params(get_spec(model))
    t += (prof.allreduce_bw(n_dev, n_p) if n_dev > 1 else 0.0) + 3 * prof.term("add", n_p)
    return n_dev * b / t


def asgd_throughput(model, n_dev, batch, prof):
    from engine.perf.model import predict
    p = predict(model, n_dev, 1, max(1, batch // n_dev), prof)
    return p.n_file / p.t_epoch


def part_scale(batch=256):
    out = []
    for pname, prof in (("cpu (shipped profile)", Profile.load()), ("H200 datasheet", h200_profile())):
        gpu = prof.data.get("backend") == "gpu"
        for model in ("cnn-a", "cnn-b", "cnn-c"):
            n_layers = len(layers(get_spec(model)))
            for K, D in ((4, 1), (8, 1), (16, 1), (4, 2), (4, 4)):
                row = {"profile": pname, "model": model, "stages": K, "replicas": D, "devices": K * D}
                if K > n_layers:
                    row["note"] = f"{model} has {n_layers} layers: no {K}-stage partition"
                    out.append(row)
                    continue
                M = 2 * K
                for sched in ("gpipe", "1f1b", "dualpipe"):
                    p = P.predict(model, stages=K, replicas=D, n_subbatch=batch, profile=prof, schedule=sched,
                                  microbatches=M, overlap=0.5 if gpu else 0.0, n_mb=4 * M)
                    row[sched] = p.throughput
                    row[f"{sched}_bubble"] = float(max(p.bubble))
                row["sync_dp"] = sync_dp_throughput(model, K * D, batch * D, prof)
                try:
                    row["asgd"] = asgd_throughput(model, K * D, batch * D, prof)
                except Exception as e:       # the ASGD model refuses some CPU sharings
                    row["asgd"] = None
                    row["asgd_note"] = str(e)[:120]
                row["single"] = sync_dp_throughput(model, 1, batch, prof)
                out.append(row)
    return out


def part_converge(epochs=4, lr=0.02):
    from engine.train import train
    res = {}
    ref = train(epochs=epochs, batch=8, lr=lr, progress=False, verbose=False)
    res["sgd batch 8"] = [h["test_acc"] for h in ref["history"]]
    ref32 = train(epochs=epochs, batch=32, lr=lr, progress=False, verbose=False)
    res["sgd batch 32"] = [h["test_acc"] for h in ref32["history"]]
    with tempfile.TemporaryDirectory() as tmp:
        for sched, pred in (("gpipe", "none"), ("1f1b", "none"), ("1f1b", "stash"), ("1f1b", "spectrain"),
                            ("dualpipe", "none"), ("dualpipe", "stash"), ("dualpipe", "spectrain")):
            cfg = {"epochs": epochs, "batch": 32, "lr": lr,
                   "extra": {"schedule": sched, "microbatches": 4, "predict": pred}}
            st, hist = _mpi_train(4, cfg, Path(tmp) / f"{sched}-{pred}")
            res[f"{sched} {pred} (4 stages)"] = [h["test_acc"] for h in hist]
            ratios = [s.get("err_ratio") for s in st["per_stage"]]
            res[f"{sched} {pred} (4 stages) err_ratio"] = ratios
    return res


def part_spectrain(epochs=2, lr=0.02):
    """SpecTrain's prediction error per stage, mean ||W_hat - W_actual|| /
    mean ||W_stale - W_actual||, in real training on digits and on CIFAR-
    format batches (tests/cifar_like.py: the digits at 32x32x3 on class-
    coloured backgrounds, a 4-layer 32x32x3 net), 4 stages."""
    sys.path.insert(0, str(ROOT / "tests"))
    from cifar_like import SMALL_SPEC, digits_as_cifar
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        digits_as_cifar(Path(tmp) / "cifar")
        (Path(tmp) / "spec.json").write_text(json.dumps(SMALL_SPEC))
        # dualpipe on the CIFAR-format net diverged at --lr 0.02 (momentum 0.9): 0.01 there
        data = {"digits": {"lr": lr}, "cifar-format": {"model": str(Path(tmp) / "spec.json"), "lr": lr / 2,
                                                       "data": str(Path(tmp) / "cifar"), "fmt": "cifar"}}
        for name, d in data.items():
            for sched in ("1f1b", "dualpipe"):
                cfg = dict(d, epochs=epochs, batch=32,
                           extra={"schedule": sched, "microbatches": 4, "predict": "spectrain"})
                print(f"spectrain: {name} {sched} --lr {cfg['lr']}", file=sys.stderr, flush=True)
                st, hist = _mpi_train(4, cfg, Path(tmp) / f"{name}-{sched}")
                res[f"{name} {sched}"] = {
                    "lr": cfg["lr"], "test_acc": [h["test_acc"] for h in hist], "partition": st["partition"],
                    "err_ratio": [s.get("err_ratio") for s in st["per_stage"]],
                    "err_hat": [s.get("err_hat_mean") for s in st["per_stage"]],
                    "err_stale": [s.get("err_stale_mean") for s in st["per_stage"]]}
    return res


def samples_to(acc_list, n_file=1437, target=0.95):
    for e, a in enumerate(acc_list):
        if a >= target:
            return (e + 1) * n_file
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["measure", "scale", "converge", "spectrain", "all"], default="all")
    ap.add_argument("--out", default=str(ROOT / "bench/results/pipeline_bench.json"))
    args = ap.parse_args()
    out = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if args.part in ("measure", "all"):
        out["measure"] = m = part_measure()
        for r in m["rows"]:
            print(f"{r['schedule']:>5} K={r['K']} {r['source']:<7} stage {r['stage']} {','.join(r['layers']):<12} "
                  f"fwd {r['fwd_ms']:.3f}/{r['fwd_pred_ms']:.3f} bwd {r['bwd_ms']:.3f}/{r['bwd_pred_ms']:.3f} ms "
                  f"idle {r['bubble']:.2f}/{r['bubble_pred']:.2f} (wait {r['wait_share']:.2f}) gpipe {r['bubble_gpipe']:.2f} "
                  f"img/s {r['img_s']:.0f}/{r['img_s_pred']:.0f}")
        print(json.dumps({k: v for k, v in m.items() if k != "rows"}, indent=1))
    if args.part in ("spectrain", "all"):
        out["spectrain"] = part_spectrain()
        for k, v in out["spectrain"].items():
            print(f"{k:<22} lr {v['lr']} ratio per stage {[None if r is None else round(r, 3) for r in v['err_ratio']]}  "
                  f"acc {[round(100 * a, 2) for a in v['test_acc']]}  partition {v['partition']}")
    if args.part in ("scale", "all"):
        out["scale"] = part_scale()
        for r in out["scale"]:
            print(json.dumps(r))
    if args.part in ("converge", "all"):
        out["converge"] = part_converge()
        for k, v in out["converge"].items():
            if not k.endswith("err_ratio"):
                print(f"{k:<32} {[round(100 * a, 2) for a in v]}  samples to 95 %: {samples_to(v)}")
            else:
                print(f"{k:<32} {v}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
