"""Sweeps on SPRINT's own ASGD runner: its loop overhead, the host sharing
of r ranks x w workers (``sweep_contention_runner``), the one-thread step
probe, and the runner job the validation shares with them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from engine import spec as spec_mod

from .timing import _rand, _xp, set_threads

# -- the runner's own loop and the host's cores ---------------------------------

class _SleepSource:
    """A worker source whose ComputeGradient sleeps (releasing the GIL like a kernel)."""

    def __init__(self, n, seconds):
        self.weights = np.zeros(n, np.float32)
        self.grad = np.zeros(n, np.float32)
        self.seconds = seconds

    def load(self):
        return None

    def deform(self, batch):
        return batch

    def compute(self, batch):
        from engine.parallel.asgd import Step
        time.sleep(self.seconds)
        return Step(grad=self.grad, n=1)


def sweep_loop_overhead(cfg, n_param=4096, seconds=1e-3, updates=300):
    """Per-iteration cost of the ASGD loops beyond their timed steps."""
    from engine.parallel.asgd import ASGD, ASGDConfig
    from engine.parallel.comm import LocalComm
    recs = []
    for workers in (1, 2):
        srcs = [_SleepSource(n_param, seconds) for _ in range(workers)]
        tr = ASGD(LocalComm(), np.zeros(n_param, np.float32), srcs, ASGDConfig(lr=0.01, max_updates=updates))
        tr.run()
        st = tr.stats()
        w = {k: v for k, v in tr.local_stats()["worker"].items()}
        u = tr.local_stats()["updater"]
        it_w = len(w["Iteration"])
        it_u = len(u["Iteration"])
        # Untimed work per iteration: the loop itself, the timers, lr, signalling.
        w_rest = (sum(w["Iteration"]) - sum(sum(v) for k, v in w.items()
                                            if k not in ("Iteration", "LockWeights"))) / it_w
        u_rest = (sum(u["Iteration"]) - sum(sum(v) for k, v in u.items() if k != "Iteration")) / it_u
        recs.append({"kind": "loop", "workers": workers, "worker_loop": max(w_rest, 0.0),
                     "updater_loop": max(u_rest, 0.0), "t": st["T_GPU"]})
    return recs



def probe_host(model, n=None, seconds=1.0, profile=None):
    """How much slower this machine steps ``model`` right now than when
    ``profile`` was swept: the mean wall time of one undisturbed thread's
    step over the one the runner contention sweep stored (other jobs' load
    and the CPU's own speed both drift on a shared machine). Without a
    profile that stored one: the wall-clock over CPU time of the step."""
    ref = None
    if profile is not None:
        es = [e for e in profile.data.get("contention", {}).get("entries", [])
              if e.get("model") == model and e.get("solo_wall")]
        if es:
            ref = es[0]
            n = ref["n_subbatch"]
    n = n or dict(CONTENTION_WORKLOADS).get(model, 4)
    cpu, wall = _step_times(model, n, seconds)
    if ref is not None:
        return float(np.median(wall) / ref["solo_wall"])
    return float(np.mean(wall) / np.median(cpu))


CONTENTION_WORKLOADS = (("tiny", 8), ("cifar", 4))
# Mid-size nets run in the runner too (``runner contention mid``), so that the
# runner's per-step excess, its small steps and the time slices are fitted
# across nets between tiny (580 parameters, all per-call) and cifar (3.2 M,
# all kernel), not anchored on tiny alone: that anchor, swept an hour before
# and on older runner code, put 0.3 ms per step on every held-out net of
# test set 5 (bench/RESULTS.md section 4). Seen nets only (sets 1-2), at
# the batch a user would start from; up to 3 ranks (what the validations run).
MID_WORKLOADS = (("mnist", 4), ("digits", 16))
MID_PAIRS = ((1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2))
# Long compute-bound steps of nets whose vectors fit the L2, where more ranks
# than cores time-slice the workers (``runner contention long``): the swept
# nets above are all short steps there (tiny, mnist and digits, 0.5-2.5 ms)
# or large vectors (cifar), and compute-bound nets of 3-20 ms steps ran
# x1.1-1.3 beyond their core share at 3 x 2, where the model read x1 (seen
# sets 2-11: ComputeGradient slowdown priced 10-18 % short). Seen nets (test
# sets 10 and 7; spec files of a source checkout), their entries kept apart
# (``LONG_SOURCE``) so that they price that one reading and no 1-2 rank term;
# repeated, as one run per sharing scatters by 10 %. Swept within the cores
# too (1 x 2, 2 x 1, 2 x 2) for held-out set 34, they read 1.01-1.20x at
# 2 x 1 where the swept nets read 1.18-1.28x and the held-out ones ran
# 1.10-1.24x; anchoring the large-vector nets' reading there priced the set
# no better (bench/RESULTS.md section 4), and the pairs cost 5 minutes of
# the quick profile: not kept.
LONG_WORKLOADS = (("bench/specs/heldout_allconv.json", 28), ("bench/specs/heldout_k9.json", 18))
LONG_PAIRS = ((3, 1), (3, 2))
LONG_REPEATS = 3
LONG_SOURCE = "runner_long"


# The runner's timed steps: a worker's per iteration, the updater's per cycle.
WORKER_TIMERS = ("LockWeights", "FetchWeights", "LoadImage", "DeformImage", "ComputeGradient",
                 "ComputeUpdateVal", "LockGradient", "UpdateGradient")
UPDATER_TIMERS = ("WaitGradient", "SumGradient", "AddMomentum", "Allreduce", "UpdateMomentum", "UpdateWeights")
# The updater's own work per cycle (its waits and the allreduce aside).
UPDATER_WORK = ("SumGradient", "AddMomentum", "UpdateMomentum", "UpdateWeights")
# A worker's steps besides ComputeGradient (the lock waits aside).
WORKER_SMALL = ("FetchWeights", "LoadImage", "DeformImage", "ComputeUpdateVal", "UpdateGradient")
# Where ``engine`` is, for the ranks of a runner job (also without an install).
_ENGINE_ROOT = str(Path(__file__).resolve().parents[2])


def _runner_child(args):
    """One rank of a runner job: SPRINT ASGD itself (engine.parallel.run)
    with the training settings the sweeps and the validation price."""
    from engine.parallel import run
    from engine.train import TrainConfig
    cfg = TrainConfig(model=args["model"], data=args["data"], fmt="npz", epochs=1000, batch=args["n"],
                      lr=0.001, momentum=0.9, weight_decay=5e-4, schedule="constant", parallel="asgd",
                      workers=args["workers"], threads=1, out=args["out"], progress=False, verbose=False,
                      device="cpu", extra={"max_seconds": args["seconds"], "min_grads": 1})
    run(cfg)


def mpiexec_env(timeout, **extra) -> dict:
    """The environment of an mpiexec job the sweeps start: one BLAS/OpenMP
    thread a rank, hydra's MPIEXEC_TIMEOUT, and HWLOC_XMLFILE set (empty) so
    that hydra's proxy writes no /tmp/hydra_hwloc_xmlfile_*, which it leaves
    behind whenever a job aborts (README, troubleshooting); a user's own
    HWLOC_XMLFILE is kept."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(timeout), **extra)
    env.setdefault("HWLOC_XMLFILE", "")
    return env


def runner_job(model, data, n_subbatch, n_node, workers, seconds, out, timeout=300) -> dict:
    """Run SPRINT ASGD on ``n_node`` ranks of this host (mpiexec) for
    ``seconds`` on the npz ``data``; returns its asgd_stats.json."""
    arg = json.dumps({"model": model, "data": str(data), "n": n_subbatch, "workers": workers,
                      "seconds": seconds, "out": str(out)})
    env = mpiexec_env(timeout, PYTHONPATH=_ENGINE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(["mpiexec", "-n", str(n_node), sys.executable, "-m", "mpi4py", "-m", "engine.perf.sweep",
                          "--runner-child", arg], capture_output=True, text=True, timeout=timeout + 30, env=env)
    if res.returncode:
        raise RuntimeError(f"{model} {n_node}x{workers}x{n_subbatch}: rc {res.returncode}: {res.stderr[-1500:]}")
    with open(os.path.join(out, "asgd_stats.json")) as f:
        return json.load(f)


def runner_step_means(timers):
    """({worker step: seconds per iteration}, {updater step: seconds per
    cycle}) from the timers of an asgd_stats.json; FetchWeights without the
    wait for its lock (the runner's span includes it)."""
    total = lambda t: t["total"] if "total" in t else t["mean"] * t["count"]
    its = max(timers.get("ComputeGradient", {}).get("count", 1), 1)
    cycles = max(timers.get("SumGradient", {}).get("count", 1), 1)
    worker = {k: total(timers[k]) / its if k in timers else 0.0 for k in WORKER_TIMERS}
    worker["FetchWeights"] -= worker["LockWeights"]
    return worker, {k: total(timers[k]) / cycles for k in UPDATER_TIMERS if k in timers}


def synthetic_npz(model, path, n):
    """Random images and labels in the shape of ``model``'s input: timing
    does not depend on the pixel values."""
    sp = spec_mod.get_spec(model)
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (n,) + sp.input_shape, dtype=np.uint8),
             y_train=rng.integers(0, sp.n_classes, n),
             x_test=rng.integers(0, 256, (64,) + sp.input_shape, dtype=np.uint8),
             y_test=rng.integers(0, sp.n_classes, 64))


def sweep_contention_runner(cfg, pairs=((1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2)),
                            workloads=CONTENTION_WORKLOADS, seconds=None, timeout=300, source="runner"):
    """Host sharing measured on the ASGD runner itself: r ranks x w workers
    on this machine, one N_Subbatch per net, for a few seconds each.

    ``rel``: the runner's mean ComputeGradient time over the one of a
    (1, 1) run made just before it (other jobs' load drifts by minutes);
    ``host``: that (1, 1) time over the undisturbed CPU time of a step
    (probe in this process), so ``rel * host`` is the factor the CPU-clock
    kernel sweeps must be multiplied by. Unlike ``sweep_contention`` this
    carries the runner's whole loop (loading, deformation, the flat-vector
    steps, the timers) into the competition for the GIL and the cores.
    A workload's net may be a spec file: its entries carry the spec itself
    (``spec``) and its name as ``model``.
    """
    import tempfile
    seconds = seconds or (3.0 if cfg["repeats"] < 9 else 6.0)
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        def one(model, data, n, r, w):
            st = runner_job(model, data, n, r, w, seconds,
                            os.path.join(tmp, f"{spec_mod.get_spec(model).name}-{r}-{w}"), timeout)
            worker, updater = runner_step_means(st["timers"])
            # The whole cycle too: the waits and the collective are where
            # ranks beyond the cores wait for time slices (fit_steps.slice_wait).
            # N_Minibatch_avg: the workers' real cycle, T_GPU plus what their
            # loop spends outside its timed steps (fit_steps.cycle_gap).
            cycle = dict({k: updater[k] for k in ("WaitGradient", "Allreduce") if k in updater},
                         T_GPU=st.get("T_GPU"), T_Update=st.get("T_Update"),
                         N_Minibatch_avg=st.get("N_Minibatch_avg"))
            return (worker["ComputeGradient"], {k: updater[k] for k in UPDATER_WORK if k in updater},
                    {k: worker[k] for k in WORKER_SMALL}, cycle)
        for model, n in workloads:
            sp = spec_mod.get_spec(model)
            spec = None if sp.name == model else json.loads(Path(model).read_text())
            data = os.path.join(tmp, f"{sp.name}.npz")
            synthetic_npz(model, data, 200_000 if spec_mod._prod(sp.input_shape) < 1024 else 20_000)
            for r, w in pairs:
                # The one-thread step is timed again beside each (1, 1) run: on a
                # host that flips between speed states every 0.2 s to a few seconds
                # (host_steadiness), one second of it before all the runs was a
                # sample of one state and every pair's excess carried it
                # (cpu_test20: 0.53 ms a step against 0.08 ms from cpu_test19c's
                # records, tiny's T_GPU priced 40-80 % long); the fit takes the
                # median of the pairs (fit_steps.anchor_contention).
                solo = _solo(model, n)
                base = one(model, data, n, 1, 1)
                got, upd, worker, cycle = base if (r, w) == (1, 1) else one(model, data, n, r, w)
                base = base[0]
                rel = got / base
                host = base / solo[0]
                recs.append({"kind": "contention", "source": source, "model": sp.name, "spec": spec, "n_subbatch": n,
                             "ranks": r, "workers": w, "t": got, "rel": rel, "host": host,
                             "ratio": rel * host, "allreduce": None, "solo_cpu": solo[0], "solo_wall": solo[1],
                             "updater": upd, "worker": worker, "cycle": cycle,
                             "n_param": spec_mod.n_params(sp)})
    return recs


def sweep_contention_long(cfg, skipped=None):
    """``sweep_contention_runner`` of ``LONG_WORKLOADS`` at ``LONG_PAIRS``,
    ``LONG_REPEATS`` times (the profile pools each sharing's runs by their
    median rel), as ``LONG_SOURCE`` entries; skipped without the spec files."""
    have = [(str(Path(_ENGINE_ROOT) / f), n) for f, n in LONG_WORKLOADS if (Path(_ENGINE_ROOT) / f).exists()]
    if len(have) < len(LONG_WORKLOADS):
        if skipped is not None:
            skipped.append("runner contention long: its nets' spec files (bench/specs of a source checkout) "
                           "are not here")
        return []
    recs = []
    for _ in range(LONG_REPEATS):
        recs += sweep_contention_runner(cfg, pairs=LONG_PAIRS, workloads=have, source=LONG_SOURCE)
    return recs


def _step_times(model, n, seconds=1.0):
    """(CPU, wall) seconds of each undisturbed forward+backward of
    ``model`` on ``n`` samples, one thread stepping for ``seconds``."""
    from engine.net import Net
    set_threads(1)
    sp = spec_mod.get_spec(model)
    net = Net(sp, seed=0)
    x = _rand((n,) + sp.input_shape, 9)
    y = _xp().asarray(np.random.default_rng(0).integers(0, sp.n_classes, n))
    net.loss_and_grad(x, y)
    cpu, wall = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(wall) < 5:
        t0, c0 = time.perf_counter(), time.thread_time()
        net.loss_and_grad(x, y)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return np.array(cpu), np.array(wall)


def _solo(model, n):
    """(CPU, wall) median seconds of one undisturbed step; ``probe_host``
    later compares its own wall median with the stored one."""
    cpu, wall = _step_times(model, n)
    return float(np.median(cpu)), float(np.median(wall))


