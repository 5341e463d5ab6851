"""Parallel-mode benchmarks on this machine (numbers for the lead's RESULTS.md).

    python bench/parallel_bench.py cifar   [--seconds 24] [--rounds 4] [--batch 16]
        ASGD throughput on the cifar net: 1 worker (all cores) vs 2 workers
        (cores/2 BLAS threads each), baseline = the plain single-process
        SGD step loop measured in the same run; share of worker time waiting
        on locks and fetches.
    python bench/parallel_bench.py digits  [--epochs 3]
        sync vs ASGD (1 node x 2 workers) after the same number of samples:
        throughput and test accuracy.
    mpiexec -n N python -m mpi4py bench/parallel_allreduce.py   (N = 1..4)
        the updater's allreduce time for the cifar parameter vector.
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def synthetic_cifar(n, seed=0):
    from engine.data import Dataset
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    x = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    return Dataset(x, y.astype(np.int64), 10, "synthetic-cifar")


def plain_sgd_rate(ds, batch, seconds, threads):
    """Baseline: the single-process loop (no ASGD machinery), images/s, run in
    a fresh thread like an ASGD worker so both see the same thread settings."""
    import threading
    box = []
    th = threading.Thread(target=lambda: box.append(_plain_sgd_rate(ds, batch, seconds, threads)))
    th.start()
    th.join()
    return box[0]


def _plain_sgd_rate(ds, batch, seconds, threads):
    from engine.data import DeformConfig, Loader
    from engine.net import Net
    from engine.optim import SGD
    from engine.parallel.threads import limit_this_thread
    limit_this_thread(threads)
    net = Net("cifar", seed=0)
    opt = SGD(net, lr=0.001, momentum=0.9)
    loader = Loader(ds, batch, shuffle=True, deform=DeformConfig(out_hw=(32, 32)).with_stats(ds), prefetch=0)
    seen, t0, c0, warm = 0, None, None, 2
    while True:
        for x, y in loader:
            net.loss_and_grad(x, y)
            opt.step(0.0)
            warm -= 1
            if warm == 0:
                t0, c0 = time.perf_counter(), time.thread_time()
            elif warm < 0:
                seen += len(y)
            if t0 is not None and time.perf_counter() - t0 > seconds:
                cpu = time.thread_time() - c0
                return {"images_per_s": seen / (time.perf_counter() - t0),
                        "images_per_cpu_s": seen / cpu if cpu > 0 else 0.0}


def asgd_rate(ds, batch, seconds, workers, threads):
    from engine.data import DeformConfig, Loader
    from engine.net import Net
    from engine.parallel.asgd import ASGD, ASGDConfig
    from engine.parallel.runner import NetSource
    deform = DeformConfig(out_hw=(32, 32)).with_stats(ds)
    nets = [Net("cifar", seed=0) for _ in range(workers)]
    srcs = [NetSource(n, Loader(ds, batch, deform=deform, prefetch=0, rank=t, world=workers), threads=threads)
            for t, n in enumerate(nets)]
    a = ASGD(None, nets[0].params, srcs, ASGDConfig(lr=0.001, momentum=0.9, max_seconds=seconds)).run()
    st = a.stats({"n_subbatch": batch})
    return {"workers": workers, "threads_per_worker": threads, "images_per_s": st["samples"] / st["wall_s"],
            "T_GPU_s": st["T_GPU"], "T_Update_s": st["T_Update"], "N_Minibatch_avg": st["N_Minibatch_avg"],
            "staleness_mean": st["staleness_mean"], "worker_wait_share": st["worker_wait_share"],
            "lock_wait_share": st["lock_wait_share"],
            "fetch_share": st["timers"]["FetchWeights"]["total"] / (st["T_GPU"] * st["timers"]["ComputeGradient"]["count"]),
            "updates": st["updates"], "samples": st["samples"],
            # images per CPU-second of the worker threads (1 BLAS/OpenMP thread each):
            # what the work costs, independent of how much CPU the machine's load left us
            "images_per_cpu_s": st["samples"] / st["worker_cpu_s"] if st["worker_cpu_s"] else 0.0,
            "cpu_share_of_wall": st["worker_cpu_s"] / (st["wall_s"] * workers)}


def bench_cifar(args):
    """Configurations are run round-robin in short slices (--rounds) and the
    medians compared, so a change in machine load hits all of them alike."""
    import statistics
    from engine.parallel.threads import usable_cores
    cores = usable_cores()
    ds = synthetic_cifar(2048)
    half = max(1, cores // 2)
    configs = {
        "plain_sgd_1t": lambda sec: plain_sgd_rate(ds, args.batch, sec, 1),
        "plain_sgd": lambda sec: plain_sgd_rate(ds, args.batch, sec, cores),
        "asgd_1w_1t": lambda sec: asgd_rate(ds, args.batch, sec, 1, 1),
        "asgd_1w": lambda sec: asgd_rate(ds, args.batch, sec, 1, cores),
        "asgd_2w": lambda sec: asgd_rate(ds, args.batch, sec, 2, half),
    }
    runs = {k: [] for k in configs}
    slice_s = args.seconds / args.rounds
    for _ in range(args.rounds):
        for k, f in configs.items():
            runs[k].append(f(slice_s))
    out = {"bench": "asgd_cifar", "cores": cores, "batch": args.batch, "seconds_per_config": args.seconds,
           "rounds": args.rounds}
    for k, rs in runs.items():
        row = {key: statistics.median(r[key] for r in rs) for key in rs[0] if isinstance(rs[0][key], (int, float))}
        row["images_per_s_all_rounds"] = [r["images_per_s"] for r in rs]
        out[k] = row
    rate = {k: out[k]["images_per_s"] for k in configs}
    best_1w = max(rate["asgd_1w"], rate["asgd_1w_1t"])
    out["speedup_2w_vs_best_1w"] = rate["asgd_2w"] / best_1w
    out["speedup_2w_vs_best_plain"] = rate["asgd_2w"] / max(rate["plain_sgd"], rate["plain_sgd_1t"])
    out["asgd_overhead_1w_vs_plain_1t"] = rate["asgd_1w_1t"] / rate["plain_sgd_1t"]
    out["asgd_cpu_efficiency_1w_vs_plain_1t"] = (out["asgd_1w_1t"]["images_per_cpu_s"]
                                                 / out["plain_sgd_1t"]["images_per_cpu_s"])
    # On a machine where each worker gets its core, throughput = workers x
    # images per CPU-second; the ratio below is that projection for 2 vs 1.
    eff = {k: out[k]["images_per_cpu_s"] for k in ("asgd_1w_1t", "asgd_2w")}
    out["cpu_efficiency_2w_vs_1w"] = eff["asgd_2w"] / eff["asgd_1w_1t"]
    out["projected_speedup_2w_vs_1w_dedicated_cores"] = min(2, cores) * out["cpu_efficiency_2w_vs_1w"]
    out["load_avg_1min"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


def bench_digits(args):
    from engine.train import TrainConfig, train
    rows = []
    # each mode with the learning rate it converges with (ASGD sums stale
    # gradients, so no momentum and a smaller eta; see tests/test_parallel_train.py)
    settings = {"sync": dict(lr=0.05, momentum=0.9, batch=16),
                "asgd": dict(lr=0.02, momentum=0.0, batch=32)}
    for mode in ("sync", "asgd"):
        cfg = TrainConfig(model="digits", data="digits", epochs=args.epochs, threads=1, schedule="cosine",
                          parallel=mode, workers=2, progress=False, verbose=False, seed=0, **settings[mode])
        t0 = time.perf_counter()
        r = train(cfg)
        st = r["stats"]
        rows.append({"mode": mode, **settings[mode], "test_acc": r["test_acc"], "samples": st["samples"],
                     "wall_s": time.perf_counter() - t0, "images_per_s": st["samples"] / st["wall_s"],
                     "N_Minibatch_avg": st.get("N_Minibatch_avg"), "staleness_mean": st.get("staleness_mean")})
    print(json.dumps({"bench": "sync_vs_asgd_digits", "epochs": args.epochs, "rows": rows}, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["cifar", "digits"])
    ap.add_argument("--seconds", type=float, default=24, help="per configuration, all rounds together")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    sys.exit(bench_cifar(a) if a.what == "cifar" else bench_digits(a))
