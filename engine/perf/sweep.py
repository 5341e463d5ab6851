"""Measurement harness: time the engine's kernels over size grids.

Each ``sweep_*`` function returns records ``{"kind", <size fields>, "t":
median seconds per call, "std": seconds, "n": calls timed, "holdout": bool}``
that ``fit.fit_profile`` turns into a machine profile. The same functions
serve ``sprint profile`` (quick/full) and the pytest-benchmark sweeps in
``bench/``. Kernels are called through the public ``engine.ops`` API and the
numpy operations the ASGD runner itself uses, so the profile prices what a
training step actually executes; kernels that are not built yet are skipped
(listed in ``skipped``) rather than faked.

Allreduce is timed in separate processes under ``mpiexec`` (``python -m
engine.perf.sweep --allreduce ...``), one job per rank count.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from engine import spec as spec_mod

QUICK = {"repeats": 7, "min_time": 2e-3, "sgemm_exp": (0, 2, 4, 6, 8, 9), "sgemm_nexp": (0, 2, 4, 6, 8, 10, 12, 14),
         "sgemm_kexp": (0, 2, 4, 6, 8, 10, 11), "sgemm_max": 2 ** 30, "sgemm_mid": 24, "batches": (1, 4, 16),
         "vec_exp": range(8, 25), "data_batches": (1, 2, 4, 8, 16, 32, 64), "ranks": (2, 3, 4),
         "allreduce_exp": range(10, 24, 3), "nets": ("tiny", "digits", "cifar"), "net_batches": (1, 4, 16), "im2col_max": 2 ** 25}
FULL = {"repeats": 11, "min_time": 5e-3, "sgemm_exp": tuple(range(0, 10)), "sgemm_nexp": tuple(range(0, 16)),
        "sgemm_kexp": tuple(range(0, 13)), "sgemm_max": 2 ** 31, "sgemm_mid": 80, "batches": (1, 2, 4, 8, 16, 32),
        "vec_exp": range(6, 26), "data_batches": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64), "ranks": (2, 3, 4),
        "allreduce_exp": range(8, 25, 2), "nets": ("tiny", "digits", "cifar"),
        "net_batches": (1, 2, 4, 8, 16, 32), "im2col_max": 2 ** 26}
TRANS = {"nn": (False, False), "nt": (False, True), "tn": (True, False)}
# Conv layer shapes for the im2col family: the small presets whole, the big
# ones' early layers (their later layers have the same K x P products).
LAYER_NETS = ("tiny", "digits", "cifar", "cnn-a")


def mode_config(quick: bool) -> dict:
    return dict(QUICK if quick else FULL)


# -- timing ---------------------------------------------------------------------

def _sync():
    from engine import backend
    be = backend.get_backend()
    if be.name == "gpu":
        be.xp.cuda.Device().synchronize()


# The clock of the kernel sweeps. With one BLAS/OpenMP thread a CPU kernel
# runs on the calling thread, so its thread CPU time is its cost without the
# preemption a shared machine adds (wall-clock samples there scatter by
# 100 %+); the host-sharing factors come from the contention sweep instead.
CLOCK = {"name": "wall", "fn": time.perf_counter}


def use_clock(name):
    if name not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {name!r}")
    CLOCK.update(name=name, fn=time.thread_time if name == "cpu" else time.perf_counter)


def time_call(fn, repeats=5, min_time=2e-3):
    """(median, std) seconds per call of ``fn()``, batching calls so each
    sample lasts at least ``min_time`` (timer resolution, launch jitter)."""
    clock = CLOCK["fn"]
    fn()
    _sync()
    t0 = clock()
    fn()
    _sync()
    one = max(clock() - t0, 1e-7)
    inner = max(1, int(math.ceil(min_time / one)))
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(inner):
            fn()
        _sync()
        samples.append((clock() - t0) / inner)
    return float(np.median(samples)), float(np.std(samples))


def _rec(kind, fn, cfg, **fields):
    t, s = time_call(fn, cfg["repeats"], cfg["min_time"])
    return dict(kind=kind, t=t, std=s, clock=CLOCK["name"], **fields)


def _xp():
    from engine import backend
    return backend.get_backend().xp


def _rand(shape, seed=0):
    xp = _xp()
    return xp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


# -- SGEMM ----------------------------------------------------------------------

def sgemm_grid(cfg, rng=None):
    """(m, n, k, holdout) points: powers of two to fit, in-between sizes held out.

    k = 1 (kexp 0) must be on the grid: an FC layer's dW at N_Subbatch 1 is
    an outer product, which this BLAS runs ~10x slower per output element
    than k = 2 (cifar fc1, 512 x 4096 x 1: 2.1 ms against 0.16 ms at k = 2);
    without those points the fit extrapolated it at 0.1 ms.
    """
    pts = [(2 ** a, 2 ** b, 2 ** c, False) for a, b, c in
           itertools.product(cfg["sgemm_exp"], cfg["sgemm_nexp"], cfg["sgemm_kexp"])
           if 2 ** (a + b + c) <= cfg["sgemm_max"]]
    rng = rng or np.random.default_rng(0)
    mid = []
    while len(mid) < cfg["sgemm_mid"]:
        e = [rng.uniform(min(x), max(x)) for x in (cfg["sgemm_exp"], cfg["sgemm_nexp"], cfg["sgemm_kexp"])]
        m, n, k = (max(1, int(round(2 ** v))) for v in e)
        if m * n * k <= cfg["sgemm_max"]:
            mid.append((m, n, k, True))
    return pts + mid


def net_gemm_shapes(nets=("tiny", "digits", "cifar"), batches=(1, 4, 16)):
    """(m, n, k, trans) of every SGEMM the presets run: held-out checks."""
    from .model import layer_kernels
    out = set()
    for name in nets:
        sp = spec_mod.get_spec(name)
        for n in batches:
            geoms = spec_mod.layers(sp, n)
            for i, g in enumerate(geoms):
                for _, kern, size in layer_kernels(g, n, i == 0, i == len(geoms) - 1):
                    if kern.startswith("sgemm"):
                        out.add(tuple(size) + (kern.split("_")[1],))
    return sorted(out)


def sweep_sgemm(cfg, variants=("nn", "nt", "tn"), extra_shapes=(), progress=None):
    from engine import ops
    recs = []
    pts = sgemm_grid(cfg)
    for var in variants:
        ta, tb = TRANS[var]
        todo = [(m, n, k, h, "grid") for m, n, k, h in pts] + \
               [(m, n, k, True, "net") for m, n, k, v in extra_shapes if v == var]
        for m, n, k, hold, src in todo:
            a = _rand((k, m) if ta else (m, k), 1)
            b = _rand((n, k) if tb else (k, n), 2)
            c = _xp().empty((m, n), np.float32)
            recs.append(_rec("sgemm", lambda: ops.gemm(a, b, trans_a=ta, trans_b=tb, out=c), cfg,
                             m=m, n=n, k=k, trans=var, holdout=hold, src=src))
            if progress:
                progress(1)
    return recs


# -- the im2col family and the layer kernels -----------------------------------

def conv_shapes(cfg):
    """(C, H, c, M, pool, N) of the preset conv layers, batch sizes from cfg."""
    out = set()
    for name in LAYER_NETS:
        sp = spec_mod.get_spec(name)
        for g in spec_mod.layers(sp, 1):
            if g.kind != "conv":
                continue
            C, H, _ = g.in_shape
            for n in cfg["batches"]:
                if g.im2col_elems * n <= cfg["im2col_max"]:
                    out.add((C, H, sp.c, g.w_shape[0], g.pool, n))
    return sorted(out)


def _private_conv_kernels():
    """The layout kernels conv2d runs between im2col and SGEMM (engine.ops.conv)."""
    try:
        from engine.backend import get_backend
        from engine.ops import conv as conv_mod
        return get_backend(), conv_mod
    except Exception:  # pragma: no cover - only while the kernels are being built
        return None, None


def sweep_layers(cfg, skipped=None):
    """im2col, col2im, layout/bias, pooling, ReLU over the presets' conv shapes."""
    from engine import ops
    skipped = skipped if skipped is not None else []
    be, conv_mod = _private_conv_kernels()
    recs = []
    for i, (C, H, c, M, p, n) in enumerate(conv_shapes(cfg)):
        hold = i % 4 == 3
        pad = (c - 1) // 2
        x = _rand((n, C, H, H), 3)
        cols = ops.im2col(x, c, c, (1, 1), (pad, pad))
        K = C * c * c
        # x2: contiguous row segments (one per (k, n, output row)): the
        # per-segment cost makes the same element count cheaper on wide maps.
        recs.append(_rec("im2col", lambda: ops.im2col(x, c, c, (1, 1), (pad, pad), out=cols), cfg,
                         x=K * H * H * n, x2=K * H * n, holdout=hold))
        xo = _xp().empty_like(x)
        recs.append(_rec("col2im", lambda: ops.col2im(cols, x.shape, c, c, (1, 1), (pad, pad), out=xo), cfg,
                         x=K * H * H * n, x2=K * H * n, holdout=hold))
        y = _rand((n, M, H, H), 4)
        elems = n * M * H * H
        if conv_mod is not None:
            g = conv_mod.Geom(n, M, H, H, 1, 1, 1, 1, 0, 0, H, H)
            yt = _rand((M, n * H * H), 5)
            b = _rand((M,), 6)
            db = _xp().empty(M, np.float32)
            y3 = y.reshape(n, M, H * H)
            recs.append(_rec("to_nchw", lambda: conv_mod._k_cnhw_to_nchw(be, yt, b, y3), cfg, x=elems,
                             x2=n * M, holdout=hold))
            recs.append(_rec("to_cnhw", lambda: conv_mod._k_nchw_to_cnhw(be, y3, yt, db, False), cfg,
                             x=elems, x2=n * M, holdout=hold))
            del g
        for name, fn in _elementwise_fns(ops, y, p, skipped):
            recs.append(_rec(name, fn, cfg, x=elems, holdout=hold))
    return recs


def _elementwise_fns(ops, y, p, skipped):
    """(kind, callable) of pooling and ReLU on a conv output, where the ops exist."""
    fns = []
    if hasattr(ops, "maxpool_forward") and p > 1:
        yp, am = ops.maxpool_forward(y, p)
        fns.append(("pool_fwd", lambda: ops.maxpool_forward(y, p)))
        fns.append(("pool_bwd", lambda: ops.maxpool_backward(yp, am, y.shape, p)))
    elif p > 1:
        skipped.append("maxpool")
    if hasattr(ops, "relu_forward"):
        r = ops.relu_forward(y)
        out = _xp().empty_like(y)
        fns.append(("relu_fwd", lambda: ops.relu_forward(y, out=out)))
        fns.append(("relu_bwd", lambda: ops.relu_backward(r, y, out=out)))
    else:
        skipped.append("relu")
    return fns


def sweep_fc_softmax(cfg, skipped=None):
    """The FC layer's bias add and row sum (numpy, as linear_* run them) and softmax."""
    from engine import ops
    skipped = skipped if skipped is not None else []
    xp = _xp()
    recs = []
    i = 0
    for n in (1, 2, 4, 8, 16, 32, 64):
        for width in (3, 10, 64, 256, 1000, 4096):
            hold = i % 4 == 3
            i += 1
            y = _rand((n, width), 7)
            b = _rand((width,), 8)
            db = xp.empty(width, np.float32)
            recs.append(_rec("bias", lambda: y.__iadd__(b), cfg, x=n * width, holdout=hold))
            recs.append(_rec("bias_grad", lambda: xp.sum(y, axis=0, out=db), cfg, x=n * width, holdout=hold))
            if hasattr(ops, "softmax_xent"):
                lab = xp.asarray(np.random.default_rng(0).integers(0, width, n))
                recs.append(_rec("softmax", lambda: ops.softmax_xent(y, lab), cfg, x=n * width, holdout=hold))
    if not hasattr(ops, "softmax_xent"):
        skipped.append("softmax_xent")
    return recs


# -- flat-vector work of the ASGD worker and updater ----------------------------

def _vector_cases(cfg, xp):
    """(N_Param, held out, (source, target), {op: call}) of the flat-buffer
    sweeps: powers of two and 1.5x in between, the operations the ASGD
    runner itself runs."""
    for i, e in enumerate(cfg["vec_exp"]):
        n = 2 ** e + (0 if i % 2 else 2 ** (e - 1))
        a, b, c = _rand((n,), 1), _rand((n,), 2), xp.empty(n, np.float32)
        yield n, i % 4 == 3, (a, c), {"copy": lambda: xp.copyto(c, a), "add": lambda: c.__iadd__(a),
                                      "scale": lambda: xp.multiply(a, 0.5, out=c),
                                      "sub": lambda: xp.subtract(a, b, out=c), "fill": lambda: c.fill(0)}


def sweep_vectors(cfg, skipped=None):
    """The flat-buffer operations Algorithms 1 and 2 run, over N_Param."""
    from engine import ops
    skipped = skipped if skipped is not None else []
    recs = []
    for n, hold, (a, c), fns in _vector_cases(cfg, _xp()):
        if hasattr(ops, "axpy"):
            fns["axpy"] = lambda: ops.axpy(0.5, a, c)
        for name, fn in fns.items():
            recs.append(_rec(name, fn, cfg, x=n, holdout=hold))
    if not hasattr(ops, "axpy"):
        skipped.append("axpy")
    return recs


def _llc_bytes():
    try:
        txt = open("/sys/devices/system/cpu/cpu0/cache/index3/size").read().strip()
        return int(txt[:-1]) * {"K": 1 << 10, "M": 1 << 20}[txt[-1]]
    except (OSError, ValueError, KeyError):
        return 32 << 20


def sweep_vectors_cold(cfg, skipped=None):
    """The same flat-buffer operations with their operands evicted from the
    caches first (kinds ``<op>_cold``).

    In a run they are cold: between two fetches a worker's ComputeGradient
    streams its activations and im2col buffers through the caches, and the
    updater touches each vector once per cycle. On the CPU that is up to 3x
    the warm sweep's time for N_Param in the millions; on a GPU the step
    sizes dwarf the caches' reach and the warm sweep stands.
    """
    from engine import backend
    if backend.get_backend().name != "cpu":
        if skipped is not None:
            skipped.append("cold vectors (CPU only)")
        return []
    llc = _llc_bytes()
    scratch = np.ones(2 * llc // 4, np.float32)
    clock = CLOCK["fn"]
    recs = []
    for n, hold, _, fns in _vector_cases(cfg, np):
        for op, fn in fns.items():
            name = op + "_cold"
            fn()
            samples = []
            for _ in range(3 * cfg["repeats"]):
                scratch += 1.0          # evicts a, b and c from every cache level
                t0 = clock()
                fn()
                samples.append(clock() - t0)
            recs.append(dict(kind=name, t=float(np.median(samples)), std=float(np.std(samples)),
                             clock=CLOCK["name"], x=n, holdout=hold, llc_bytes=llc))
    return recs


def sweep_handover(cfg):
    """A lock round trip with a pointer swap: the O(1) critical sections of the runner."""
    import threading
    lock = threading.Lock()
    box = [np.zeros(1), np.zeros(1)]

    def swap():
        with lock:
            box[0], box[1] = box[1], box[0]
    t, s = time_call(swap, cfg["repeats"], cfg["min_time"])
    return [{"kind": "handover", "x": 1, "t": t, "std": s}, {"kind": "handover", "x": 2, "t": t, "std": s}]


# -- data -------------------------------------------------------------------------

def sweep_data(cfg, skipped=None):
    """LoadImage (gather N_Subbatch samples) and DeformImage over N_Subbatch."""
    from engine.data import Loader
    from engine.data.dataset import Dataset
    from engine.data.deform import DeformConfig
    skipped = skipped if skipped is not None else []
    recs = []
    rng = np.random.default_rng(0)
    for shape in ((1, 8, 8), (2, 8, 8), (3, 32, 32)):
        ds = Dataset(rng.integers(0, 256, (2048,) + shape, dtype=np.uint8), rng.integers(0, 3, 2048), 3)
        dc = DeformConfig(crop_pad=2, flip=True, mean=(0.5,) * shape[0], std=(0.25,) * shape[0],
                          out_hw=shape[1:])
        for i, n in enumerate(cfg["data_batches"]):
            hold = i % 4 == 3
            loader = Loader(ds, n, prefetch=0, deform=dc)
            idx = rng.permutation(len(ds))[:n]
            px = n * int(np.prod(shape))
            recs.append(_rec("load", lambda: loader.load(idx), cfg, x=px, holdout=hold))
            x, y = loader.load(idx)
            r = np.random.default_rng(1)
            try:
                recs.append(_rec("deform", lambda: loader.deform(x, y, r), cfg, x=px, holdout=hold))
            except (AttributeError, ImportError):
                if "deform" not in skipped:
                    skipped.append("deform")
    return recs


# -- whole steps: what the kernels do not explain ----------------------------------

def sweep_net_steps(cfg, skipped=None):
    """Net.loss_and_grad of the presets: the framework overhead fit and a check."""
    from engine.net import Net
    recs = []
    for name in cfg["nets"]:
        sp = spec_mod.get_spec(name)
        try:
            net = Net(sp, seed=0)
        except Exception as e:  # kernels still missing
            (skipped if skipped is not None else []).append(f"net {name}: {type(e).__name__}")
            continue
        for i, n in enumerate(cfg["net_batches"]):
            x = _rand((n,) + sp.input_shape, 9)
            y = _xp().asarray(np.random.default_rng(0).integers(0, sp.n_classes, n))
            try:
                recs.append(_rec("net_step", lambda: net.loss_and_grad(x, y), cfg, model=name,
                                 n_subbatch=n, holdout=i % 3 == 2))
            except Exception as e:
                (skipped if skipped is not None else []).append(f"net {name}: {type(e).__name__}: {e}")
                break
    return recs


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
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(timeout))
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


def runner_job(model, data, n_subbatch, n_node, workers, seconds, out, timeout=300) -> dict:
    """Run SPRINT ASGD on ``n_node`` ranks of this host (mpiexec) for
    ``seconds`` on the npz ``data``; returns its asgd_stats.json."""
    arg = json.dumps({"model": model, "data": str(data), "n": n_subbatch, "workers": workers,
                      "seconds": seconds, "out": str(out)})
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(timeout),
               PYTHONPATH=_ENGINE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
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
                            workloads=CONTENTION_WORKLOADS, seconds=None, timeout=300):
    """Host sharing measured on the ASGD runner itself: r ranks x w workers
    on this machine, one N_Subbatch per net, for a few seconds each.

    ``rel``: the runner's mean ComputeGradient time over the one of a
    (1, 1) run made just before it (other jobs' load drifts by minutes);
    ``host``: that (1, 1) time over the undisturbed CPU time of a step
    (probe in this process), so ``rel * host`` is the factor the CPU-clock
    kernel sweeps must be multiplied by. Unlike ``sweep_contention`` this
    carries the runner's whole loop (loading, deformation, the flat-vector
    steps, the timers) into the competition for the GIL and the cores.
    """
    import tempfile
    seconds = seconds or (3.0 if cfg["repeats"] < 9 else 6.0)
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        def one(model, data, n, r, w):
            st = runner_job(model, data, n, r, w, seconds, os.path.join(tmp, f"{model}-{r}-{w}"), timeout)
            worker, updater = runner_step_means(st["timers"])
            return (worker["ComputeGradient"], {k: updater[k] for k in UPDATER_WORK if k in updater},
                    {k: worker[k] for k in WORKER_SMALL})
        for model, n in workloads:
            data = os.path.join(tmp, f"{model}.npz")
            synthetic_npz(model, data, 200_000 if spec_mod._prod(spec_mod.get_spec(model).input_shape) < 1024
                          else 20_000)
            solo = _solo(model, n)
            for r, w in pairs:
                base = one(model, data, n, 1, 1)
                got, upd, worker = base if (r, w) == (1, 1) else one(model, data, n, r, w)
                base = base[0]
                rel = got / base
                host = base / solo[0]
                recs.append({"kind": "contention", "source": "runner", "model": model, "n_subbatch": n,
                             "ranks": r, "workers": w, "t": got, "rel": rel, "host": host,
                             "ratio": rel * host, "allreduce": None, "solo_cpu": solo[0], "solo_wall": solo[1],
                             "updater": upd, "worker": worker,
                             "n_param": spec_mod.n_params(spec_mod.get_spec(model))})
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
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPIEXEC_TIMEOUT=str(timeout))

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


# -- everything -----------------------------------------------------------------

def set_threads(threads):
    """Limit BLAS/OpenMP threads of this thread (after the kernels' libraries
    are loaded: a library loaded later would keep its default)."""
    if not threads:
        return []
    from engine import backend, ops  # noqa: F401  (loads the extension and its OpenMP)
    backend.get_backend()
    from engine.parallel.threads import limit_this_thread
    return limit_this_thread(int(threads))


def _steps(cfg, skipped, be):
    """name -> sweep of every step ``run_all`` knows, in running order."""
    steps = {"sgemm": lambda: sweep_sgemm(cfg, extra_shapes=net_gemm_shapes(batches=cfg["net_batches"])),
             "layers": lambda: sweep_layers(cfg, skipped), "fc+softmax": lambda: sweep_fc_softmax(cfg, skipped),
             "vectors": lambda: sweep_vectors(cfg, skipped), "cold vectors": lambda: sweep_vectors_cold(cfg, skipped),
             "handover": lambda: sweep_handover(cfg), "data": lambda: sweep_data(cfg, skipped),
             "net steps": lambda: sweep_net_steps(cfg, skipped), "allreduce": lambda: sweep_allreduce(cfg),
             "loop overhead": lambda: sweep_loop_overhead(cfg), "contention": lambda: sweep_contention(cfg)}
    if be.name == "cpu":
        steps["runner contention"] = lambda: sweep_contention_runner(cfg)
    return steps


SWEEPS = ("sgemm", "layers", "fc+softmax", "vectors", "cold vectors", "handover", "data", "net steps",
          "allreduce", "loop overhead", "contention", "runner contention")


def run_all(quick=True, threads=1, allreduce=True, contention=True, log=print, only=None, merge=None) -> dict:
    """All sweeps (or the ``only`` ones); returns {"records", "skipped", "meta"}.

    ``merge``: an earlier result whose records of the re-run sweeps are
    replaced and the rest kept (``sprint profile --from-records OLD --only ...``).
    """
    cfg = mode_config(quick)
    applied = set_threads(threads)
    from engine import backend as _be
    use_clock("cpu" if (threads == 1 and _be.get_backend().name == "cpu") else "wall")
    skipped = []
    from engine import backend
    be = backend.get_backend()
    steps = _steps(cfg, skipped, be)
    names = list(steps)
    if only is not None:
        bad = [n for n in only if n not in SWEEPS]
        if bad:
            raise ValueError(f"unknown sweep(s) {bad}; choose from {', '.join(SWEEPS)}")
        names = [n for n in names if n in only]
    else:
        if not allreduce:
            names.remove("allreduce")
        if not contention:
            names = [n for n in names if n not in ("loop overhead", "contention", "runner contention")]
    recs = []
    t0 = time.perf_counter()
    for name in names:
        t1 = time.perf_counter()
        try:
            got = steps[name]()
        except Exception as e:
            skipped.append(f"{name}: {type(e).__name__}: {e}")
            got = []
        recs += got
        if log:
            log(f"sweep {name}: {len(got)} points in {time.perf_counter() - t1:.1f} s")
    meta = {"quick": quick, "threads": threads, "threads_applied": applied, "backend": be.name,
            "clock": CLOCK["name"],
            "seconds": time.perf_counter() - t0, "repeats": cfg["repeats"], "min_time": cfg["min_time"]}
    if merge is None:
        return {"records": recs, "skipped": skipped, "meta": meta}
    # A re-run sweep replaces its own kinds (the contention sweeps by source).
    fresh = {(r["kind"], r.get("source")) for r in recs}
    kept = [r for r in merge.get("records", []) if (r["kind"], r.get("source")) not in fresh]
    meta = dict(merge.get("meta", {}), **{f"resweep {n}": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                                          for n in names})
    return {"records": kept + recs, "skipped": merge.get("skipped", []) + skipped, "meta": meta}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--allreduce-child", default=None)
    p.add_argument("--contention-child", default=None)
    p.add_argument("--runner-child", default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-time", type=float, default=2e-3)
    p.add_argument("--poll", type=float, default=0.0)
    a = p.parse_args(argv)
    if a.runner_child:
        _runner_child(json.loads(a.runner_child))
        return 0
    if a.contention_child:
        _contention_child(json.loads(a.contention_child))
        return 0
    if a.allreduce_child:
        _allreduce_child(json.loads(a.allreduce_child), a.repeats, a.min_time, a.poll)
        return 0
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
