"""DistBelief benchmarks (numbers for bench/RESULTS.md, section "DistBelief").

    python bench/distbelief_bench.py budget     [--seconds 20] [--ranks 3] [--data digits|mnist]
        Downpour, Sandblaster, SPRINT ASGD and sync on the same number of
        ranks with the same wall-time budget: test accuracy and images/s.
        Each strategy's epochs are planned from a one-epoch probe run so that
        its whole schedule fits the budget.
    python bench/distbelief_bench.py downpour   [--epochs 4]
        Downpour's measured throughput and staleness (1 server, 1-3 replicas)
        against engine.perf.downpour's prediction, the host's current load
        calibrated by a single-process step probe, the uncontended fetch,
        push and server step by bench/ps_probe.py (a real server and replica
        with a free gradient).
    python bench/distbelief_bench.py regime [--model cifar] [--steps 20]
        The server-bound regime for 16-256 replicas, simulated
        (engine.perf.downpour.simulate) against SPRINT ASGD's simulator.
    python bench/distbelief_bench.py sandblaster [--epochs 3]
        Sandblaster's batch time with one of 3 replicas slowed 1x/2x/4x:
        slices on request with backup tasks vs a static 1/R split, measured
        and simulated.

Everything runs under mpiexec on this machine, whose 2 cores are shared with
other jobs: numbers move with their load (the probe of the downpour section
measures it). Each command prints a markdown table and writes JSON to --out.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MPI = ROOT / "tests" / "mpi"


def mpirun(n, script, *args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MPIEXEC_TIMEOUT=str(timeout))
    cmd = ["mpiexec", "-n", str(n), sys.executable, "-m", "mpi4py", str(MPI / script), *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 30, cwd=ROOT)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{(p.stdout + p.stderr)[-3000:]}")
    res = json.loads(p.stdout.split("RESULT ", 1)[1].splitlines()[0])
    res["launch_wall"] = wall
    return res


def train(strategy, n, cfg):
    """Run one training job; its result with the full stats of the run folder."""
    with tempfile.TemporaryDirectory() as out:
        cfg = dict(cfg, progress=False, verbose=False, out=out)
        if strategy in ("downpour", "sandblaster"):
            res = mpirun(n, "ps_train.py", strategy, json.dumps(cfg))
        else:
            res = mpirun(n, "train_run.py", json.dumps(dict(cfg, parallel=strategy)))
        res["stats"] = json.loads((Path(out) / f"{strategy}_stats.json").read_text())
    return res


def _data(kind, tmp):
    if kind == "digits":
        return {"data": "digits"}
    sys.path.insert(0, str(ROOT / "tests"))
    from mnist_like import digits_as_mnist
    digits_as_mnist(Path(tmp) / "mnist")
    return {"data": str(Path(tmp) / "mnist"), "model": "mnist"}


# Each strategy's own options (its tuned defaults for the digits net).
STRATEGIES = {
    "downpour": lambda S: {"lr": 0.05, "momentum": 0.0, "extra": {"servers": 1, "server_opt": "adagrad"}},
    "sandblaster": lambda S: {"batch": 256, "extra": {"servers": 1, "slice": 32}},
    # worker_nice 0: the runner nices its worker threads (+10) so that they yield
    # to their own updater; on a host loaded by other jobs that starves them
    # against everybody else, which is not what this comparison is about
    "asgd": lambda S: {"lr": 0.02, "momentum": 0.0, "extra": {"max_pending": 2, "worker_nice": 0}},
    "sync": lambda S: {"extra": {"worker_nice": 0}},
}


def cmd_budget(args):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = _data(args.data, tmp)
        for name, opts in STRATEGIES.items():
            cfg = {**base, **opts(1)}
            probe = train(name, args.ranks, {**cfg, "epochs": 1})
            t1 = probe["time_s"]
            epochs = max(1, int(args.seconds // max(t1, 1e-3)))
            extra = {**cfg.get("extra", {}), "max_seconds": 1.2 * args.seconds} \
                if name != "sync" else cfg.get("extra", {})
            res = train(name, args.ranks, {**cfg, "epochs": epochs, "extra": extra})
            st = res["stats"]
            ips = st.get("samples", 0) / st["wall_s"] if st.get("wall_s") else float("nan")
            rows.append({"strategy": name, "epochs": res["epochs"], "time_s": res["time_s"],
                         "test_acc": res["test_acc"], "images_per_s": ips, "probe_epoch_s": t1})
            print(f"{name}: {rows[-1]}", file=sys.stderr, flush=True)
    print(f"\n{args.data}, {args.ranks} ranks, budget {args.seconds:g} s (epochs planned from a 1-epoch probe)\n")
    print("| strategy | epochs | wall s | test acc | images/s |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['strategy']} | {r['epochs']} | {r['time_s']:.1f} | {100 * r['test_acc']:.2f} % | "
              f"{r['images_per_s']:,.0f} |")
    return rows


def _probe_step(batch=32, steps=60):
    """Seconds per single-process digits step now (the host's current load)."""
    from engine.data import Loader, load_dataset, DeformConfig
    from engine.net import Net
    tr, _ = load_dataset("digits")
    ld = Loader(tr, batch, deform=DeformConfig(out_hw=(8, 8)).with_stats(tr), prefetch=0)
    net = Net("digits")
    it = iter(ld)
    xs = [next(it) for _ in range(5)]
    t0 = time.perf_counter()
    for i in range(steps):
        net.loss_and_grad(*xs[i % 5])
    return (time.perf_counter() - t0) / steps


def epoch_end_probe(reps=5):
    """Seconds server 0 spends at an epoch's end (engine.parallel.ps.PSJob.
    end_epoch): the test set's evaluation and the checkpoint and metrics
    written atomically, timed in this one process on a fresh digits net."""
    from engine.data import DeformConfig, load_dataset
    from engine.net import Net
    from engine.session.config import TrainConfig
    from engine.session.rundir import RunDir
    from engine.session.setup import evaluate
    tr, te = load_dataset("digits")
    deform = DeformConfig(out_hw=(8, 8)).with_stats(tr)
    net = Net("digits")
    w = np.asarray(net.params, np.float32)
    ts = []
    with tempfile.TemporaryDirectory() as d:
        run = RunDir(d)
        run.prepare()
        hist = []
        for e in range(reps):
            t0 = time.perf_counter()
            loss, acc = evaluate(net, te, TrainConfig().eval_batch, deform)
            hist.append({"epoch": e + 1, "test_loss": loss, "test_acc": acc, "time": 0.0})
            run.save_checkpoint({"params": w, "opt": {"kind": "adagrad", "accumulator": w.copy()},
                                 "epoch": e + 1, "history": list(hist)})
            run.write_metrics(hist)
            ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def cycle(busy, floats, steps=300, replicas=1, compute=False):
    """A Downpour fetch, push and server step measured by a real server and
    ``replicas`` replicas whose gradient is free (``compute``: each also
    computes a digits gradient per step, thrown away), with ``busy``
    processes computing beside them (bench/ps_probe.py)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run(["mpiexec", "-n", str(1 + replicas), sys.executable, "-m", "mpi4py",
                        str(ROOT / "bench" / "ps_probe.py"), "--steps", str(steps), "--floats", str(floats),
                        "--busy", str(busy)] + (["--compute"] if compute else []),
                       capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"ps_probe failed:\n{(p.stdout + p.stderr)[-2000:]}")
    return json.loads(p.stdout.split("CYCLE ", 1)[1].splitlines()[0])


def cmd_downpour(args):
    """Downpour's measured throughput against four predictions: priced from
    copies alone; the transport probed with one replica (busy processes for
    the others) and the M/D/1 queue; the transport probed with R replicas
    pushing and computing (its contention measured, no queue added), the
    compute's slowdown read off that probe too; and the same with the
    run's own ComputeGradient (a reference: the run's number, not a
    prediction)."""
    from engine.parallel.threads import limit_this_thread
    from engine.perf import downpour as model
    from engine.perf.profile import Profile
    limit_this_thread(1)
    prof = Profile.load()
    rows = []
    n_param = model.predict("digits", 1, 1, 32, prof).n_param
    quiet = model.predict("digits", 1, 1, 32, prof, ranks_per_host=1).replica["ComputeGradient"]
    t_end = epoch_end_probe()

    def pred(R, load, st, **kw):
        prof.host_factor = {"*": load}
        try:
            return model.predict("digits", R, 1, 32, prof, ranks_per_host=R, n_file=st["n_file"], **kw)
        finally:
            prof.host_factor = None

    for R in args.replicas:
        # a fetch goes through the polling loops while the other R - 1 replicas compute
        cyc = cycle(R - 1, n_param)
        # ... and while they push and fetch too: the contention a fetch meets
        cont = cycle(0, n_param, steps=args.probe_steps, replicas=R, compute=True)
        before = _probe_step()
        res = train("downpour", 1 + R, {"epochs": args.epochs, "lr": 0.05, "momentum": 0.0,
                                        "extra": {"servers": 1, "server_opt": "adagrad"}})
        after = _probe_step()
        st = res["stats"]
        load = 0.5 * (before + after) / quiet
        one = {k: cyc[k] for k in ("fetch_time", "push_time", "server_time")}
        many = dict({k: cont[k] for k in ("fetch_time", "push_time", "server_time")}, fetch_contended=True)
        # the compute's slowdown beside R - 1 computing replicas and a server, from the probe:
        # its digits gradient against the profile's, on this host now (the step probe)
        probe_cg = model.predict("digits", R, 1, 32, prof, ranks_per_host=R).replica["ComputeGradient"]
        contended_load = cont["compute_time"] / probe_cg if args.probe_compute else load
        compute = np.mean([r["timers"]["ComputeGradient"]["mean"] for r in st["replicas"]])
        run_load = compute / probe_cg
        preds = {"priced": pred(R, load, st), "probe1_queue": pred(R, load, st, **one),
                 "probeR": pred(R, contended_load, st, **many),
                 "probeR_end": pred(R, contended_load, st, epoch_end=t_end, **many),
                 "probeR_end_runcompute": pred(R, run_load, st, epoch_end=t_end, **many)}
        ips = st["samples"] / st["wall_s"]
        step = np.mean([sum(r["timers"][k]["total"] for k in ("Fetch", "Compute", "PushTotal")) / r["steps"]
                        for r in st["replicas"]])
        fetch = np.mean([r["timers"]["Fetch"]["total"] / r["steps"] for r in st["replicas"]])
        p = preds["probeR_end"]
        rows.append({"replicas": R, "epoch_end_ms": 1e3 * t_end, "host_load": load, "probe_load": contended_load, "run_load": run_load,
                     "probe1": cyc, "probeR": cont, "images_per_s": ips,
                     **{f"pred_{k}_images_per_s": v.images_per_s for k, v in preds.items()},
                     **{f"pred_{k}_fetch_ms": 1e3 * v.replica["Fetch"] for k, v in preds.items()},
                     "step_ms": 1e3 * step, "pred_step_ms": 1e3 * p.t_step, "fetch_ms": 1e3 * fetch,
                     "rho": p.rho, "staleness": st["staleness_mean"], "pred_staleness": p.staleness,
                     "compute_ms": 1e3 * compute, "pred_compute_ms": 1e3 * p.replica["ComputeGradient"]})
        print(rows[-1], file=sys.stderr, flush=True)
    err = lambda r, k: f"{100 * (r[f'pred_{k}_images_per_s'] / r['images_per_s'] - 1):+.1f} %"
    print(f"\nDownpour on digits, 1 server, fetch/push every step, Adagrad: measured vs engine.perf.downpour; "
          f"epoch end probed at {1e3 * t_end:.1f} ms\n")
    print("| replicas | host load (step probe / R-replica probe / run) | probe R=1 fetch / push / server ms | "
          "probe R fetch / push / server ms | images/s | priced err | R=1 probe + M/D/1 err | R probe err | "
          "R probe + epoch end err | same, run's compute | fetch ms | predicted | compute ms | predicted | "
          "staleness | predicted |\n|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c1, cr = r["probe1"], r["probeR"]
        print(f"| {r['replicas']} | {r['host_load']:.2f} / {r['probe_load']:.2f} / {r['run_load']:.2f} | "
              f"{1e3 * c1['fetch_time']:.2f} / {1e3 * c1['push_time']:.2f} / {1e3 * c1['server_time']:.2f} | "
              f"{1e3 * cr['fetch_time']:.2f} / {1e3 * cr['push_time']:.2f} / {1e3 * cr['server_time']:.2f} | "
              f"{r['images_per_s']:,.0f} | {err(r, 'priced')} | {err(r, 'probe1_queue')} | {err(r, 'probeR')} | "
              f"{err(r, 'probeR_end')} | {err(r, 'probeR_end_runcompute')} | {r['fetch_ms']:.2f} | "
              f"{r['pred_probeR_fetch_ms']:.2f} | {r['compute_ms']:.2f} | {r['pred_compute_ms']:.2f} | "
              f"{r['staleness']:.2f} | {r['pred_staleness']:.2f} |")
    return {"measured": rows}


def cmd_regime(args):
    """The server-bound regime, simulated: Downpour's replicas and shard
    queues (engine.perf.downpour.simulate) against SPRINT ASGD's simulator
    (engine.perf.simulate), one replica or node per host, shipped profile."""
    from engine.perf import downpour as model
    from engine.perf.model import predict as sprint_predict
    from engine.perf.profile import Profile
    from engine.perf.simulate import simulate as sprint_simulate
    prof = Profile.load()
    rows = []
    print(f"\nSimulated, {args.model} net, N_Subbatch 32, one replica per host, shipped profile: Downpour "
          "(simulated / closed form) against SPRINT ASGD (simulated / closed form)\n")
    print("| replicas | S=1 img/s | util | S=4 img/s | util | S=16 img/s | util | staleness | SPRINT img/s | "
          "SPRINT staleness |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for R in (16, 32, 64, 128, 256):
        sims = [model.simulate(args.model, R, 1, 32, prof, servers=S, steps=args.steps) for S in (1, 4, 16)]
        sp = sprint_predict(args.model, R, 1, 32, prof)
        ss = sprint_simulate(args.model, R, 1, 32, prof, n_updates=400, seed=0)
        s_ips = ss.worker_steps * 32 / ss.sim_time
        rows.append({"replicas": R, "downpour": [s["images_per_s"] for s in sims],
                     "downpour_closed": [s["prediction"].images_per_s for s in sims],
                     "util": [s["utilisation"] for s in sims], "staleness": sims[0]["staleness"],
                     "sprint": s_ips, "sprint_closed": R * 32 / sp.t_gpu, "sprint_staleness": sp.staleness})
        cell = lambda s: f"{s['images_per_s']:,.0f} / {s['prediction'].images_per_s:,.0f}"
        print(f"| {R} | {cell(sims[0])} | {sims[0]['utilisation']:.2f} | {cell(sims[1])} | "
              f"{sims[1]['utilisation']:.2f} | {cell(sims[2])} | {sims[2]['utilisation']:.2f} | "
              f"{sims[0]['staleness']:.1f} | {s_ips:,.0f} / {R * 32 / sp.t_gpu:,.0f} | {sp.staleness:.2f} |")
    return {"regime": rows}


def cmd_sandblaster(args):
    from engine.perf import sandblaster as model
    from engine.perf.profile import Profile
    prof = Profile.load()
    rows = []
    R, batch = 3, 384
    quiet = model.predict("digits", 1, 1, 32, prof).replica["ComputeGradient"]
    # the transport through the polling loops, as Downpour's probe measures it (one replica
    # pushing and fetching the whole vector, R - 1 processes computing beside it)
    cyc = cycle(R - 1, model.predict("digits", R, 1, 16, prof).n_param)
    probed = {k: cyc[k] for k in ("fetch_time", "push_time", "server_time")}
    for factor in (1, 2, 4):
        for mode in ("slices", "static"):
            extra = {"servers": 1, "slice": 16, "slow_rank": 1 + R - 1, "slow_factor": float(factor)} \
                if mode == "slices" else {"servers": 1, "slice": batch // R, "backup": False,
                                          "slow_rank": 1 + R - 1, "slow_factor": float(factor)}
            if factor == 1:
                extra.pop("slow_rank")
            load = _probe_step() / quiet
            res = train("sandblaster", 1 + R, {"epochs": args.epochs, "batch": batch, "extra": extra})
            st = res["stats"]
            trials = float(np.mean(st["coordinator"]["trials"]))
            prof.host_factor = {"*": load}
            kw = dict(batch=batch, static=mode == "static", trials=trials, slow_rank=R if factor > 1 else None,
                      slow_factor=float(factor), ranks_per_host=R, n_file=st["n_file"])
            priced = model.predict("digits", R, 1, 16, prof, **kw)
            p = model.predict("digits", R, 1, 16, prof, **kw, **probed)
            prof.host_factor = None
            per_slice = {k: float(np.mean([r["timers"][k]["total"] / max(r["slices"], 1) for r in st["replicas"]
                                           if k in r["timers"]])) for k in ("WaitTask", "Fetch", "Compute", "Push")}
            rows.append({"slow": factor, "mode": mode, "batch_ms": 1e3 * st["batch_time_median"],
                         "per_slice_ms": {k: 1e3 * v for k, v in per_slice.items()},
                         "pred_terms_ms": {k: 1e3 * v for k, v in p.replica.items()},
                         "pred_t_eval_ms": 1e3 * p.t_eval, "pred_server_ms": {k: 1e3 * v for k, v in p.server.items()},
                         "pred_priced_batch_ms": 1e3 * priced.t_batch, "probe": cyc,
                         "pred_batch_ms": 1e3 * p.t_batch, "host_load": load, "trials": trials,
                         "slices": [r["slices"] for r in st["replicas"]], "duplicates": st["duplicates"]})
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"\nSandblaster on digits, 1 server + {R} replicas, L-BFGS batch {batch}: median batch time with "
          f"replica {R - 1} slowed, against engine.perf.sandblaster (host load from a step probe, measured "
          f"line-search trials)\n")
    print("| slowed | slices of 16 + backup: batch ms | predicted (priced / probed transport) | x of 1x | "
          "predicted x | static 1/R split: batch ms | predicted (priced / probed) | x of 1x | predicted x | "
          "slices per replica |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    pick = lambda f, m: next(r for r in rows if r["slow"] == f and r["mode"] == m)
    for f in (1, 2, 4):
        a, b = pick(f, "slices"), pick(f, "static")
        a1, b1 = pick(1, "slices"), pick(1, "static")
        print(f"| {f}x | {a['batch_ms']:.0f} | {a['pred_priced_batch_ms']:.0f} / {a['pred_batch_ms']:.0f} | "
              f"{a['batch_ms'] / a1['batch_ms']:.2f} | {a['pred_batch_ms'] / a1['pred_batch_ms']:.2f} | "
              f"{b['batch_ms']:.0f} | {b['pred_priced_batch_ms']:.0f} / {b['pred_batch_ms']:.0f} | "
              f"{b['batch_ms'] / b1['batch_ms']:.2f} | {b['pred_batch_ms'] / b1['pred_batch_ms']:.2f} | "
              f"{a['slices']} |")
    print("\nper slice, measured (replicas' timers) / predicted ms: "
          + "; ".join(f"{r['slow']}x {r['mode']}: " + ", ".join(
              f"{k} {v:.2f}" for k, v in r["per_slice_ms"].items()) + " / " + ", ".join(
              f"{k} {v:.2f}" for k, v in r["pred_terms_ms"].items()) for r in rows))
    return {"rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["budget", "downpour", "regime", "sandblaster"])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--data", choices=["digits", "mnist"], default="digits")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3], help="downpour: replica counts")
    ap.add_argument("--probe-steps", type=int, default=150, help="downpour: steps of the R-replica probe")
    ap.add_argument("--no-probe-compute", dest="probe_compute", action="store_false",
                    help="downpour: price the compute with the step probe's load, not the R-replica probe's")
    ap.add_argument("--model", default="cifar", help="regime: the net")
    ap.add_argument("--steps", type=int, default=20, help="regime: simulated steps per replica")
    ap.add_argument("--out", default=None, help="JSON file for the numbers")
    args = ap.parse_args()
    out = {"budget": cmd_budget, "downpour": cmd_downpour, "regime": cmd_regime,
           "sandblaster": cmd_sandblaster}[args.what](args)
    if args.out:
        from engine.checkpoint import write_json
        write_json(args.out, out, indent=1, default=float)


if __name__ == "__main__":
    main()
