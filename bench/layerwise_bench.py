"""Layer-wise parallelism (OptCNN): measured against the cost model, and
what ``sprint plan`` says for big nets on an H200 datasheet profile.

    python bench/layerwise_bench.py measure [--model cifar --batch 32 --ranks 2,4 --steps 6] [--tc measured]
    python bench/layerwise_bench.py plans       # cnn-a/b/c x 4/8/16/64 devices, H200 datasheet
    python bench/layerwise_bench.py search      # search time of cnn-c on 16 and 64 devices

``measure`` runs each plan (pure data parallel, one weird trick, channel
split, spatial split, and the searched optimum for this machine's shipped
CPU profile) under ``mpiexec -n N`` on random data, times every step after
the first on rank 0 and sets the median beside the prediction. The ranks
share this machine's cores (and other jobs): the prediction is given as the
model prices it (each device its own processor) and scaled by the core
sharing, N ranks / cores.
Results are written to bench/results/layerwise.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.perf import layerwise as L          # noqa: E402
from engine.perf.plan import h200_datasheet, make_plan   # noqa: E402
from engine.perf.profile import Profile          # noqa: E402

OUT = ROOT / "bench" / "results" / "layerwise.json"


def _plans(model, n, batch, prof):
    out = {k: L.named_plan(k, model, n, batch) for k in ("data", "owt")}
    ch = L.named_plan("data", model, n, batch)
    sp = L.named_plan("data", model, n, batch)
    for v in L.graph_nodes(model):
        c = L._largest_divisor(v.out[0], n)
        if v.kind in ("conv", "fc"):
            ch.layers[v.name] = (n // c, c, 1, 1)
        if v.kind == "conv":
            hh = L._largest_divisor(v.out[1], n)
            sp.layers[v.name] = (n // hh, 1, hh, 1)
    out["channel"], out["spatial"] = ch, sp
    out["optimum"] = L.optimize(model, n, batch, prof)
    return out


def worker(args):
    """Run under mpiexec: time --steps steps of one plan file on random data."""
    from mpi4py import MPI
    from engine.net import Net
    from engine.optim import SGD
    from engine.parallel.layerwise import LayerwiseExecutor
    comm = MPI.COMM_WORLD
    plan = L.Plan.load(args.plan_file)
    ex = LayerwiseExecutor(Net(args.model, seed=0), plan, comm)
    opt = SGD(ex.params, ex.grads, lr=0.01)
    rng = np.random.default_rng(0)
    sp = ex.spec
    x = rng.normal(size=(plan.batch, sp.m0, sp.x0, sp.x0)).astype(np.float32)
    y = rng.integers(0, sp.n_classes, plan.batch)
    times = []
    for _ in range(args.steps):
        comm.Barrier()
        t0 = time.perf_counter()
        ex.step(x, y)
        opt.step()
        comm.Barrier()
        times.append(time.perf_counter() - t0)
    if comm.Get_rank() == 0:
        print("TIMES " + json.dumps(times[1:]), flush=True)


def measure(args):
    prof = Profile.load()
    if args.tc == "measured":
        # time the blocks as the ranks run them: one thread each
        from engine.parallel.threads import limit_this_thread
        from engine.perf.layerwise_measure import MeasuredCompute
        limit_this_thread(1)
        prof = MeasuredCompute(prof, args.model)
    rows = []
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="layerwise_plans_"))
    for n in map(int, args.ranks.split(",")):
        for kind, plan in _plans(args.model, n, args.batch, prof).items():
            f = tmp / f"{kind}{n}.json"
            plan.save(f)
            env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="600")
            p = subprocess.run(["mpiexec", "-n", str(n), sys.executable, __file__, "worker", "--plan-file", str(f),
                                "--model", args.model, "--steps", str(args.steps)], capture_output=True, text=True,
                               env=env, cwd=ROOT)
            line = next((s for s in p.stdout.splitlines() if s.startswith("TIMES ")), None)
            if line is None:
                rows.append({"ranks": n, "plan": kind, "error": (p.stdout + p.stderr)[-500:]})
                continue
            meas = float(np.median(json.loads(line[6:])))
            ev = L.evaluate(args.model, plan.layers, n, args.batch, prof)
            pred = ev.step_s
            share = max(1.0, n / prof.cores)
            rows.append({"ranks": n, "plan": kind, "layers": {k: list(v) for k, v in plan.layers.items()},
                         "measured_s": meas, "predicted_s": pred, "predicted_shared_s": pred * share,
                         "error": (pred * share - meas) / meas,
                         **{k: sum(r[k] for r in ev.rows) for k in ("t_c", "t_x", "t_s")}})
            print(rows[-1]["ranks"], kind, f"measured {meas * 1e3:.1f} ms, predicted {pred * 1e3:.1f} ms "
                  f"(x{share:g} sharing: {pred * share * 1e3:.1f} ms)", flush=True)
    return {"model": args.model, "batch": args.batch, "profile": prof.source, "tc": args.tc, "load": os.getloadavg(),
            "step_factor": getattr(prof, "factors", {}).get(args.batch),
            "rows": rows}


def plans():
    prof = h200_datasheet()
    rows = []
    for model in ("cnn-a", "cnn-b", "cnn-c"):
        for n in (4, 8, 16, 64):
            plan, ev, base, ranked, _ = make_plan(model, n, None, prof)
            best_other = max((c for c in ranked if not c.strategy.startswith("layer-wise")),
                             key=lambda c: c.throughput)
            rows.append({"model": model, "devices": n, "batch": plan.batch, "step_s": ev.step_s,
                         "throughput": ev.throughput, "data_step_s": base["data"].step_s,
                         "model_step_s": base["model"].step_s, "speedup_vs_data": base["data"].step_s / ev.step_s,
                         "speedup_vs_model": base["model"].step_s / ev.step_s,
                         "comm_vs_data": base["data"].comm_bytes / ev.comm_bytes,
                         "best_other": best_other.strategy + " " + best_other.setup,
                         "best_other_throughput": best_other.throughput,
                         "layers": {k: list(v) for k, v in plan.layers.items()},
                         "search_total_s": plan.predicted["cost_table_s"] + plan.predicted["search_s"]})
            r = rows[-1]
            print(f"{model} {n:>2}: x{r['speedup_vs_data']:.2f} vs data, x{r['speedup_vs_model']:.2f} vs model, "
                  f"{r['comm_vs_data']:.1f}x less traffic than data; best other {r['best_other']} "
                  f"{r['best_other_throughput']:,.0f} vs {r['throughput']:,.0f} img/s", flush=True)
    return rows


def search():
    prof = h200_datasheet()
    out = {}
    for n in (16, 64):
        ts = []
        for _ in range(3):
            p = L.optimize("cnn-c", n, 32 * n, prof)
            ts.append((p.predicted["cost_table_s"], p.predicted["search_s"]))
        best = min(ts, key=sum)
        out[n] = {"cost_table_s": best[0], "search_s": best[1], "configurations": p.predicted["configurations"]}
        print(f"cnn-c on {n}: {p.predicted['configurations']} configurations, cost tables {best[0]:.3f} s, "
              f"search {best[1]:.3f} s (best of 3)", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["measure", "plans", "search", "worker", "all"])
    ap.add_argument("--model", default="cifar")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--plan-file", default=None)
    ap.add_argument("--tc", choices=["profile", "measured"], default="profile",
                    help="t_c from the profile's kernel fits or timed per block here (OptCNN)")
    args = ap.parse_args()
    if args.part == "worker":
        return worker(args)
    res = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.part in ("plans", "all"):
        res["plans"] = plans()
    if args.part in ("search", "all"):
        res["search"] = search()
    if args.part in ("measure", "all"):
        new = measure(args)
        key = "measure" if args.tc == "profile" else "measure_tc_measured"
        done = {(r["ranks"], r["plan"]) for r in new["rows"]}
        old = [r for r in res.get(key, {}).get("rows", []) if (r["ranks"], r["plan"]) not in done]
        new["rows"] = sorted(old + new["rows"], key=lambda r: r["ranks"])
        res[key] = new
    from engine.checkpoint import write_json
    write_json(OUT, res, indent=1)


if __name__ == "__main__":
    main()
