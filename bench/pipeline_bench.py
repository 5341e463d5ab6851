"""Pipelines: measured against the cost model, predicted at scale, and
convergence on digits (bench/RESULTS.md, "Pipelines").

    PYTHONPATH=$PWD python bench/pipeline_bench.py [--part measure|scale|converge|all] [--out FILE]

measure  -- digits on 1, 2 and 4 ranks of this machine (mpiexec, gpipe M=4,
            batch 32, one epoch each): per-stage forward/backward means and the
            bubble from pipeline_stats.json against engine.perf.pipeline. The
            host is shared, so the 1-rank run calibrates: the ratio of its
            measured to predicted stage time scales every prediction (stated);
            point-to-point latency is measured by a ping-pong; the 2 cores are
            shared by the running stages (processor sharing in the simulator).
scale    -- predicted throughput of cnn-a/b/c on 4, 8, 16 stages (x replicas)
            against synchronous data parallelism and SPRINT ASGD on the same
            number of devices, on the shipped CPU profile and on an H200
            profile made from datasheet figures (Profile.synthetic).
converge -- test accuracy per epoch on digits for every schedule and
            --predict mode against single-process SGD, and the samples each
            needs to reach 95 %.
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


def part_measure(epochs=1):
    """Per run, one host factor h = measured / predicted total stage time
    (fwd + bwd over all stages) rescales the profile's kernel times: this
    host is shared with other jobs, so only the split across stages and the
    schedule's idle time can be checked, not the absolute speed. Each stage
    is simulated on its own processor (the external load, not our ranks,
    decides each rank's share of the cores)."""
    prof = Profile.load()
    prof.data["p2p"] = measure_p2p()
    rows, factors = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for K, sched in ((2, "gpipe"), (4, "gpipe"), (4, "1f1b")):
            cfg = {"epochs": epochs, "batch": 32, "lr": 0.02,
                   "extra": {"schedule": sched, "microbatches": 4, "stages": K}}
            st, _ = _mpi_train(K, cfg, Path(tmp) / f"k{K}{sched}")
            parts = [tuple(map(int, p.split(":"))) for p in st["partition"].split(",")]
            pred = P.predict("digits", stages=K, n_subbatch=32, profile=prof, schedule=sched,
                             microbatches=4, partition=parts)
            meas = [(s["timers"]["fwd"]["mean"], s["timers"]["bwd"]["mean"], s["bubble"]) for s in st["per_stage"]]
            h = sum(f + b for f, b, _ in meas) / sum(c.t_f + c.t_b for c in pred.costs)
            factors[f"{K} {sched}"] = h
            costs = [P.StageCost(c.layers, c.params, h * c.t_f, h * c.t_b, h * c.t_u, c.t_c) for c in pred.costs]
            n_mb = len(st["per_stage"][0]["trace"])
            sim = P.simulate(costs, sched, 4, n_mb)
            for k, (mf, mb, bub) in enumerate(meas):
                rows.append({"K": K, "schedule": sched, "stage": k, "layers": st["per_stage"][k]["layers"],
                             "fwd_ms": 1e3 * mf, "fwd_pred_ms": 1e3 * costs[k].t_f,
                             "bwd_ms": 1e3 * mb, "bwd_pred_ms": 1e3 * costs[k].t_b,
                             "bubble": bub, "bubble_pred": sim["bubble"][k],
                             "bubble_gpipe": (K - 1) / (4 + K - 1),
                             "img_s": st["samples"] / st["wall_s"],
                             "img_s_pred": st["samples"] / epochs / sim["makespan"]})
    errs = [abs(r[a] - r[b]) / r[a] for r in rows for a, b in (("fwd_ms", "fwd_pred_ms"), ("bwd_ms", "bwd_pred_ms"))]
    berr = [abs(r["bubble"] - r["bubble_pred"]) for r in rows]
    return {"host_factors": factors, "p2p": prof.data["p2p"], "rows": rows,
            "median_time_error": float(np.median(errs)), "median_bubble_abs_error": float(np.median(berr))}


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


def samples_to(acc_list, n_file=1437, target=0.95):
    for e, a in enumerate(acc_list):
        if a >= target:
            return (e + 1) * n_file
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=["measure", "scale", "converge", "all"], default="all")
    ap.add_argument("--out", default=str(ROOT / "bench/results/pipeline_bench.json"))
    args = ap.parse_args()
    out = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if args.part in ("measure", "all"):
        out["measure"] = part_measure()
        print(json.dumps(out["measure"], indent=1))
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
