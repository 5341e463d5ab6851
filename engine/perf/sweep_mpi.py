"""Host sweeps under mpiexec: the allreduce with the runner's polling, and
the contention child (workers stepping a net while the main thread runs an
updater's cycle and the allreduce). Their child entry points are run as
``python -m engine.perf.sweep --allreduce-child|--contention-child``."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from engine import spec as spec_mod

from .timing import _rand, _xp, set_threads
from .sweep_runner import CONTENTION_WORKLOADS, mpiexec_env

# -- allreduce under mpiexec ---------------------------------------------------

def _host_scheduling():
    """(MPI poll interval, worker niceness) the runner uses on this backend."""
    from engine import backend
    from engine.parallel.runner import CPU_MPI_POLL, CPU_WORKER_NICE
    if backend.get_backend().name == "cpu":
        return CPU_MPI_POLL, CPU_WORKER_NICE
    return 0.0, 0


def _allreduce_child(sizes, repeats, min_time, poll=0.0):
    from engine.parallel import comm as comm_mod
    comm = comm_mod.get_comm()
    # The runner's way of waiting: on CPU it polls with sleeps, and each
    # round of the collective then costs about one poll interval.
    comm.poll_interval = float(poll)
    out = []
    for n in sizes:
        buf = np.ones(n, np.float32)
        comm.barrier()
        # All ranks must run the same number of calls: agree on one count.
        comm.allreduce_(buf)
        t0 = time.perf_counter()
        comm.allreduce_(buf)
        one = comm.allreduce_scalars([time.perf_counter() - t0], op="max")[0]
        inner = max(1, int(math.ceil(min_time / max(one, 1e-7))))
        samples = []
        for _ in range(repeats):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(inner):
                comm.allreduce_(buf)
            samples.append((time.perf_counter() - t0) / inner)
        # The slowest rank's time is the collective's time.
        med = comm.allreduce_scalars([float(np.median(samples))], op="max")[0]
        out.append({"kind": "allreduce", "n_node": comm.size, "n_param": n, "t": med,
                    "std": float(np.std(samples)), "poll": float(poll)})
    if comm.rank == 0:
        print("SPRINT_SWEEP_JSON " + json.dumps(out), flush=True)


def sweep_allreduce(cfg, ranks=None, timeout=300):
    """Allreduce over message size x rank count, one mpiexec job per rank count."""
    recs = []
    sizes = [2 ** e for e in cfg["allreduce_exp"]]
    poll = _host_scheduling()[0]
    for i, r in enumerate(ranks or cfg["ranks"]):
        cmd = ["mpiexec", "-n", str(r), sys.executable, "-m", "mpi4py", "-m", "engine.perf.sweep",
               "--allreduce-child", json.dumps(sizes), "--repeats", str(cfg["repeats"]),
               "--min-time", str(cfg["min_time"]), "--poll", str(poll)]
        env = mpiexec_env(timeout)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=env)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("SPRINT_SWEEP_JSON ")]
        if res.returncode or not line:
            raise RuntimeError(f"allreduce sweep with {r} ranks failed (rc {res.returncode}): "
                               f"{res.stderr.strip()[-800:]}")
        got = json.loads(line[0].split(" ", 1)[1])
        for j, rec in enumerate(got):
            rec["holdout"] = (i + j) % 4 == 3
        recs += got
    return recs



def _contention_child(args):
    """One rank of the contention sweep (under mpiexec): ``workers`` threads
    stepping a net while the main thread allreduces the net's parameter
    vector back to back, as the ASGD updater would."""
    import threading
    from engine.net import Net
    from engine.parallel import comm as comm_mod
    comm = comm_mod.get_comm()
    set_threads(1)
    poll, nice = _host_scheduling()
    comm.poll_interval = poll
    sp = spec_mod.get_spec(args["model"])
    n = args["n"]
    nets = [Net(sp, seed=0) for _ in range(args["workers"])]
    x = _rand((n,) + sp.input_shape, 9)
    y = _xp().asarray(np.random.default_rng(0).integers(0, sp.n_classes, n))
    for net in nets:
        net.loss_and_grad(x, y)
    # CPU time of an undisturbed step (what the CPU-clock sweeps price).
    solo = []
    for _ in range(5):
        c0 = time.thread_time()
        nets[0].loss_and_grad(x, y)
        solo.append(time.thread_time() - c0)
    times = [[] for _ in nets]
    cpu = [[] for _ in nets]
    stop = threading.Event()
    deposit = threading.Event()

    def loop(i):
        set_threads(1)
        if nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        while not stop.is_set():
            t0, c0 = time.perf_counter(), time.thread_time()
            nets[i].loss_and_grad(x, y)
            deposit.set()
            if not stop.is_set():
                times[i].append(time.perf_counter() - t0)
                cpu[i].append(time.thread_time() - c0)
    buf = np.zeros(spec_mod.n_params(sp) + 1, np.float32)
    # The updater's flat-vector work of one cycle (SumGradient, AddMomentum,
    # UpdateMomentum): it runs beside the workers and competes with them for
    # the memory bandwidth, the caches and the GIL.
    npar = spec_mod.n_params(sp)
    lo, hi = comm.rank * npar // comm.size, (comm.rank + 1) * npar // comm.size
    grad, old, delta, tmp = (np.full(npar, 0.5, np.float32) for _ in range(4))

    def updater_work():
        np.copyto(buf[:npar], grad)
        s, o, d, t = buf[lo:hi], old[lo:hi], delta[lo:hi], tmp[lo:hi]
        s += o
        np.multiply(d, 0.9, out=t)
        s += t
        return s, o, d
    comm.barrier()
    th = [threading.Thread(target=loop, args=(i,)) for i in range(len(nets))]
    for t in th:
        t.start()
    t_end = time.perf_counter() + args["seconds"]
    ar = []
    while True:
        # Like the updater: wait for a local gradient, then allreduce.
        got_one = deposit.wait(0.05)
        deposit.clear()
        if got_one:
            s_, o_, d_ = updater_work()
        buf[-1] = 1.0 if (comm.rank == 0 and time.perf_counter() > t_end) else 0.0
        t0 = time.perf_counter()
        if comm.size > 1:
            comm.allreduce_(buf)
        ar.append((t0, time.perf_counter()))
        if got_one:
            np.subtract(s_, o_, out=d_)
        if buf[-1] > 0 or (comm.size == 1 and time.perf_counter() > t_end):
            break
    stop.set()
    for t in th:
        t.join()
    got = comm.allgather_obj({"steps": [v for t in times for v in t], "cpu": [v for t in cpu for v in t],
                              "allreduce": ar[1:], "solo_cpu": solo})
    if comm.rank == 0:
        print("SPRINT_SWEEP_JSON " + json.dumps(got), flush=True)


def _allreduce_after_last(got):
    """Allreduce times from the last rank's arrival on (the barrier wait
    before it is the model's T_Barrier, not the collective's cost). The
    ranks share this host's monotonic clock; older records hold plain
    durations and are returned as they are."""
    if not got or not got[0]["allreduce"] or not isinstance(got[0]["allreduce"][0], (list, tuple)):
        return [v for g in got for v in g["allreduce"]]
    out = []
    for calls in zip(*(g["allreduce"] for g in got)):
        last = max(t0 for t0, _ in calls)
        out += [t1 - last for _, t1 in calls]
    return out



def sweep_contention(cfg, pairs=((1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2)),
                     workloads=CONTENTION_WORKLOADS, seconds=None, timeout=300):
    """Host sharing: r ranks x w worker threads (1 BLAS thread each) on this
    machine, each rank's main thread running an updater's cycle after every
    deposit (its flat-vector work on N_Param, then the allreduce).

    ``ratio``: mean wall-clock step time over the median CPU time of an
    undisturbed step (what the CPU-clock kernel sweeps price), so it
    carries the updater's competition for memory bandwidth, caches and GIL,
    the oversubscribed cores, other jobs' load and the
    scheduling tail; ``allreduce``: the median allreduce time of N_Param
    floats under that load, from the last rank's arrival on
    (``Profile.allreduce_load``). The model takes the workers' slowdown
    from ``sweep_contention_runner`` where the profile has it (this child
    runs a bare loss-and-gradient loop, not the runner's).
    """
    seconds = seconds or (3.0 if cfg["repeats"] < 9 else 6.0)
    env = mpiexec_env(timeout)

    def one(model, n, r, w):
        arg = json.dumps({"model": model, "n": n, "workers": w, "seconds": seconds})
        res = subprocess.run(["mpiexec", "-n", str(r), sys.executable, "-m", "mpi4py", "-m",
                              "engine.perf.sweep", "--contention-child", arg],
                             capture_output=True, text=True, timeout=timeout + 30, env=env)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("SPRINT_SWEEP_JSON ")]
        if res.returncode or not line:
            raise RuntimeError(f"contention child failed (rc {res.returncode}): {res.stderr.strip()[-500:]}")
        return json.loads(line[0].split(" ", 1)[1])
    recs = []
    for model, n in workloads:
        for r, w in pairs:
            # Other jobs' load on a shared machine drifts by minutes: each
            # pair is measured right after its own one-thread baseline and
            # stored relative to it (``rel``); ``host`` is that baseline's
            # wall-clock mean over its CPU time, the load at sweep time.
            base = one(model, n, 1, 1)
            got = base if (r, w) == (1, 1) else one(model, n, r, w)
            steps = [v for g in got for v in g["steps"]]
            bsteps = [v for g in base for v in g["steps"]]
            # Undisturbed CPU time when the child measured it, else the
            # base run's own (older records).
            bcpu = [v for g in base for v in g.get("solo_cpu") or g["cpu"]]
            ar = _allreduce_after_last(got)
            if not steps or not bsteps:
                continue
            rel = float(np.mean(steps) / np.mean(bsteps))
            host = float(np.mean(bsteps) / np.median(bcpu))
            recs.append({"kind": "contention", "model": model, "n_subbatch": n, "ranks": r, "workers": w,
                         "t": float(np.mean(steps)), "t_median": float(np.median(steps)),
                         "rel": rel, "host": host, "ratio": rel * host,
                         "allreduce": float(np.median(ar)) if (ar and r > 1) else None, "source": "child",
                         "n_param": spec_mod.n_params(spec_mod.get_spec(model))})
    return recs


