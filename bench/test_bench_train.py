"""Full training step (forward, backward, SGD update) of the `cifar` reference
net at batch 32 and 128, side by side with PyTorch CPU (same shapes, same
threads) measured in the same run; peak memory of both in fresh
subprocesses; and where the engine's step time goes.

    pytest bench/test_bench_train.py --benchmark-only -s

Threads: $SPRINT_BENCH_THREADS (default: all cores) for both BLAS and torch.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import in_fresh_process as _fresh, torch_available

from engine.parallel.threads import usable_cores

THREADS = int(os.environ.get("SPRINT_BENCH_THREADS", usable_cores()))
ROOT = Path(__file__).resolve().parents[1]
BATCHES = (32, 128)


def _limit_threads():
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(THREADS)
    except ImportError:  # BLAS keeps its own default (all cores)
        pass


def _blas_arch():
    """OpenBLAS kernel set in use ($OPENBLAS_CORETYPE may pin an older one than the CPU has)."""
    try:
        from threadpoolctl import threadpool_info
        return ",".join(str(i.get("architecture")) for i in threadpool_info() if i.get("internal_api") == "openblas")
    except ImportError:
        return "unknown"


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, n)


def engine_step_fn(n):
    from engine.net import Net
    from engine.optim import SGD
    from engine import backend
    net = Net("cifar", seed=0)
    opt = SGD(net, lr=1e-3, momentum=0.9, weight_decay=5e-4)
    x, y = _batch(n)
    x, y = backend.asarray(x), backend.get_backend().xp.asarray(y)

    def step():
        net.loss_and_grad(x, y)
        opt.step()
    return step


def torch_step_fn(n, device="cpu"):
    import torch
    from torch import nn
    from engine.spec import get_spec
    torch.set_num_threads(THREADS)
    torch.backends.cudnn.benchmark = True
    spec = get_spec("cifar")
    mods, ch, side = [], spec.m0, spec.x0
    for m, p in spec.convs:
        mods += [nn.Conv2d(ch, m, spec.c, padding=spec.pad), nn.ReLU()]
        if p > 1:
            mods.append(nn.MaxPool2d(p))
        ch, side = m, side // p
    mods.append(nn.Flatten())
    fin = ch * side * side
    for j, m in enumerate(spec.fcs):
        mods.append(nn.Linear(fin, m))
        if j < len(spec.fcs) - 1:
            mods.append(nn.ReLU())
        fin = m
    model = nn.Sequential(*mods).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    xn, yn = _batch(n)
    x, y = torch.from_numpy(xn).to(device), torch.from_numpy(yn).to(device)

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
    return step


def _times(step, rounds, warmup=2):
    for _ in range(warmup):
        step()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    return ts


def _median_time(step, rounds, warmup=2):
    return statistics.median(_times(step, rounds, warmup))


def _has_torch():
    return torch_available()


@pytest.mark.parametrize("n", BATCHES)
def test_train_step_vs_torch(benchmark, n):
    """images/s of one full step, engine and PyTorch each in fresh processes,
    alternated (3 processes each) so that drifting machine load hits both;
    medians and best steps over all rounds."""
    rounds = 6 if n == 32 else 3
    eng, tor = [], []

    def one_pair():
        eng.extend(in_fresh_process("engine", "step_times", "engine", n, rounds))
        if _has_torch():
            tor.extend(in_fresh_process("torch", "step_times", "torch", n, rounds))
    benchmark.pedantic(one_pair, rounds=3, iterations=1)
    em, eb = statistics.median(eng), min(eng)
    info = {"batch": n, "threads": THREADS, "openblas": _blas_arch(),
            "engine_img_s_median": n / em, "engine_img_s_best": n / eb}
    line = (f"\ncifar step batch {n}, {THREADS} threads, OpenBLAS {info['openblas']}: "
            f"engine {n / em:,.1f} img/s (best {n / eb:,.1f})")
    if tor:
        tm, tb = statistics.median(tor), min(tor)
        info.update(torch_img_s_median=n / tm, torch_img_s_best=n / tb,
                    ratio_vs_torch_median=tm / em, ratio_vs_torch_best=tb / eb)
        line += (f", torch {n / tm:,.1f} img/s (best {n / tb:,.1f}); engine/torch "
                 f"{tm / em:.2f}x (best {tb / eb:.2f}x)")
    else:
        line += ", torch absent"
    benchmark.extra_info.update(info)
    print(line)


@pytest.mark.gpu
@pytest.mark.parametrize("n", BATCHES)
def test_train_step_vs_torch_gpu(benchmark, n):
    """The same step on the GPU (CuPy + cuBLAS + the CUDA kernels) against
    PyTorch + cuDNN on the same device, both synchronised after each step."""
    from engine import backend
    backend.set_backend("gpu")
    try:
        xp = backend.get_backend().xp
        inner = engine_step_fn(n)

        def step():
            inner()
            xp.cuda.get_current_stream().synchronize()
        rounds = 20
        torch_ts = _times(torch_step_fn(n, "cuda"), rounds) if _has_torch() else None
        benchmark.pedantic(step, rounds=rounds, warmup_rounds=3, iterations=1)
        st = benchmark.stats.stats
        info = {"batch": n, "device": "gpu", "kernels": backend.get_backend().kernels,
                "engine_img_s_median": n / st.median}
        line = f"\ncifar step batch {n}, GPU ({info['kernels']}): engine {n / st.median:,.1f} img/s"
        if torch_ts:
            tm = statistics.median(torch_ts)
            info.update(torch_img_s_median=n / tm, ratio_vs_torch_median=tm / st.median)
            line += f", torch+cuDNN {n / tm:,.1f} img/s; engine/torch {tm / st.median:.2f}x"
        benchmark.extra_info.update(info)
        print(line)
    finally:
        backend.set_backend("cpu")


def in_fresh_process(which, fn, *args):
    """fn of this module in a new interpreter that loads only `which`'s
    framework (bench/conftest.py says why)."""
    return _fresh(which, "test_bench_train", fn, *args, threads=THREADS)


def step_times(which, n, rounds):
    _limit_threads()
    return _times((torch_step_fn if which == "torch" else engine_step_fn)(n), rounds)


def _hwm_mib():  # peak RSS of this process image (ru_maxrss would include the parent's, kept over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024


def memory_of_steps(which, n):
    import tracemalloc
    _limit_threads()
    if which != "torch":
        import engine.net  # noqa: F401
        import engine.ops  # noqa: F401
    base = _hwm_mib()
    tracemalloc.start()
    step = (torch_step_fn if which == "torch" else engine_step_fn)(n)
    for _ in range(3):
        step()
    peak = tracemalloc.get_traced_memory()[1]
    rss = _hwm_mib()
    return {"maxrss_mib": rss, "maxrss_after_import_mib": base, "step_rss_mib": rss - base,
            "tracemalloc_peak_mib": peak / 2**20}


def peak_memory(which, n):
    return in_fresh_process(which, "memory_of_steps", which, n)


@pytest.mark.parametrize("n", BATCHES)
def test_peak_memory(benchmark, n):
    """Peak RSS (VmHWM) of a fresh process doing 3 steps, over its size after
    imports; tracemalloc sees NumPy buffers, not torch's own allocator."""
    res = {"engine": benchmark.pedantic(peak_memory, args=("engine", n), rounds=1, iterations=1)}
    if _has_torch():
        res["torch"] = peak_memory("torch", n)
    benchmark.extra_info.update({f"{k}_{m}": v for k, d in res.items() for m, v in d.items()})
    for k, d in res.items():
        print(f"\npeak memory batch {n} {k}: step RSS {d['step_rss_mib']:.0f} MiB "
              f"(process {d['maxrss_mib']:.0f} MiB), tracemalloc {d['tracemalloc_peak_mib']:.0f} MiB")


# ---- breakdown ------------------------------------------------------------------------
# (category, module, function): wrapped with timers while real steps run.  Inner
# functions are timed separately so their time is taken out of the outer op's.
_TIMED = [
    ("im2col/col2im", "engine.ops.conv", "_k_im2col"),
    ("im2col/col2im", "engine.ops.conv", "_k_col2im"),
    ("sgemm", "engine.ops.conv", "gemm"),
    ("conv/fc other (bias, layout)", "engine.ops", "conv2d_forward"),
    ("conv/fc other (bias, layout)", "engine.ops", "conv2d_backward"),
    ("conv/fc other (bias, layout)", "engine.ops", "linear_forward"),
    ("conv/fc other (bias, layout)", "engine.ops", "linear_backward"),
    ("pooling", "engine.ops", "maxpool_forward"),
    ("pooling", "engine.ops", "maxpool_backward"),
    ("relu", "engine.ops", "relu_forward"),
    ("relu", "engine.ops", "relu_backward"),
    ("softmax+xent", "engine.ops", "softmax_xent"),
    ("update (sgd_update)", "engine.ops", "sgd_update"),
]


class _Timers:
    def __init__(self):
        self.total = defaultdict(float)
        self.stack = []

    def wrap(self, cat, fn):
        def timed(*a, **k):
            self.stack.append(0.0)
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t
                inner = self.stack.pop()
                self.total[cat] += dt - inner     # exclusive time
                if self.stack:
                    self.stack[-1] += dt
        return timed


def breakdown(n, steps=4):
    import importlib
    _limit_threads()
    timers, patched = _Timers(), []
    for cat, mod, name in _TIMED:
        m = importlib.import_module(mod)
        if hasattr(m, name):
            patched.append((m, name, getattr(m, name)))
            setattr(m, name, timers.wrap(cat, getattr(m, name)))
    try:
        step = engine_step_fn(n)
        step()
        timers.total.clear()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - t) / steps
    finally:
        for m, name, fn in reversed(patched):
            setattr(m, name, fn)
    out = {k: v / steps for k, v in timers.total.items()}
    out["python/rest"] = wall - sum(out.values())
    out["data (deform, loader thread)"] = _data_time(n)
    return wall, out


def _data_time(n, rounds=5):
    """DeformImage of one uint8 CIFAR batch (crop 4, flip): runs in the loader
    thread, overlapped with the step, so it is listed beside it, not in it."""
    from engine.data import Dataset, DeformConfig, Loader
    rng = np.random.default_rng(0)
    ds = Dataset(rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), np.zeros(n), 10)
    ld = Loader(ds, n, deform=DeformConfig(crop_pad=4, flip=True).with_stats(ds), prefetch=0)
    return _median_time(lambda: next(iter(ld.batches())), rounds, warmup=1)


@pytest.mark.parametrize("n", BATCHES)
def test_step_breakdown(benchmark, n):
    wall, parts = benchmark.pedantic(in_fresh_process, args=("engine", "breakdown", n), rounds=1, iterations=1)
    benchmark.extra_info.update({"step_ms": 1e3 * wall, **{f"{k}_ms": 1e3 * v for k, v in parts.items()}})
    print(f"\nwhere the time goes, cifar batch {n} ({1e3 * wall:.1f} ms/step, {THREADS} threads):")
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {k:32s} {1e3 * v:8.2f} ms  {100 * v / wall:5.1f} %")
