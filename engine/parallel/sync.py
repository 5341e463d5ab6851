"""Synchronous data-parallel SGD (the ChainerMN / Horovod / DDP semantics).

Every step each worker of each node computes the gradient of its own
sub-batch on the same weights; the gradients are summed locally, summed over
all nodes with an allreduce split into buckets, divided by the global sample
count, and every replica applies the same momentum update
(``v = nu v - eta (g + wd w); w += v``), so all replicas stay identical.

Buckets are taken from the end of the flat vector (the last layers, whose
gradients a backward pass produces first) and each bucket's allreduce is
started (non-blocking) as soon as its local sum is done, so the local
reduction of the next bucket overlaps the communication of this one. The
engine's ``Net.loss_and_grad`` returns the whole gradient at once, so the
allreduce cannot start inside the backward pass itself; a source whose
``compute`` accepts ``on_ready`` could drive the buckets earlier.

Worker sources follow the protocol of :mod:`engine.parallel.source`.
"""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence


from ._xp import array_module, device_sync, to_host
from .comm import Comm, LocalComm
from .source import NonFiniteLoss, nonfinite_mark, source_step
from .timers import StepTimers, summarize

_now = time.perf_counter


@dataclass
class SyncConfig:
    lr: float | Callable[[float], float] = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
    max_samples: int | None = None
    max_steps: int | None = None
    n_file: int = 0
    bucket_bytes: int = 4 << 20
    trace: bool = False

    def lr_at(self, epoch: float) -> float:
        return float(self.lr(epoch)) if callable(self.lr) else float(self.lr)


def bucket_bounds(n: int, itemsize: int, bucket_bytes: int):
    """[lo, hi) buckets of a length-n vector, last bucket first."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    per = max(1, bucket_bytes // itemsize)
    out = []
    hi = n
    while hi > 0:
        lo = max(0, hi - per)
        out.append((lo, hi))
        hi = lo
    return out


class SyncSGD:
    def __init__(self, comm: Comm | None, w0, sources: Sequence, cfg: SyncConfig,
                 on_step: Callable[["SyncSGD"], bool | None] | None = None,
                 velocity0=None, start_samples: int = 0):
        if not sources:
            raise ValueError("sources must hold at least one worker source")
        if getattr(w0, "ndim", None) != 1:
            raise ValueError("w0 must be a flat (1-D) parameter vector")
        self.comm = comm if comm is not None else LocalComm()
        self.cfg = cfg
        self.sources = list(sources)
        self.on_step = on_step
        xp = self.xp = array_module(w0)
        n = self.n_param = int(w0.size)
        self.w = w0.copy()
        self.v = xp.zeros_like(self.w) if velocity0 is None else xp.asarray(velocity0).copy()
        # The gradient sum and, in its last slot, the sample count ride one vector.
        self.g = xp.zeros(n + 1, dtype=w0.dtype)
        self.buckets = bucket_bounds(n + 1, w0.dtype.itemsize, cfg.bucket_bytes)
        self.samples_total = int(start_samples)
        self.steps = 0
        self.last_loss = math.nan
        self.epoch = self.samples_total / cfg.n_file if cfg.n_file else 0.0
        self.timers = StepTimers()
        self.worker_timers = [StepTimers() for _ in sources]
        self.step_end: list[float] = []        # when each step ended, and samples by then:
        self.step_samples: list[int] = []      # throughput over time in sprint report
        self.trace_weights = [to_host(self.w).copy()] if cfg.trace else []
        self._window = [0.0, 0.0, 0.0]
        self._pool = ThreadPoolExecutor(len(sources), thread_name_prefix="sprint-sync-worker") \
            if len(sources) > 1 else None
        self._setup_done = set()
        self._setup_lock = threading.Lock()

    def _work(self, t):
        src, T = self.sources[t], self.worker_timers[t]
        if t not in self._setup_done:
            setup = getattr(src, "setup_thread", None)
            if setup is not None:
                setup()
            with self._setup_lock:
                self._setup_done.add(t)
        it0 = _now()
        with T("FetchWeights"):
            self.xp.copyto(src.weights, self.w)
        step = source_step(src, T, self.xp)
        T.add("Iteration", _now() - it0)
        return step

    def step(self):
        T, xp, cfg, n = self.timers, self.xp, self.cfg, self.n_param
        it0 = _now()
        bad = None
        with T("WaitWorkers"):
            try:
                if self._pool is None:
                    steps = [self._work(0)]
                else:
                    steps = list(self._pool.map(self._work, range(len(self.sources))))
            except NonFiniteLoss as e:
                # said in the sample count of this step's allreduce: every rank raises below
                bad, steps = e.loss, []
        t_sum = t_comm = 0.0
        pending = []
        for lo, hi in self.buckets:
            t0 = _now()
            seg = self.g[lo:hi]
            hi_p = min(hi, n)
            if bad is not None:
                seg[...] = 0
            elif lo < hi_p:
                # Sum of n_i * g_i: exact global mean even for ragged sub-batches.
                xp.multiply(steps[0].grad[lo:hi_p], float(steps[0].n), out=seg[:hi_p - lo])
                for s in steps[1:]:
                    seg[:hi_p - lo] += float(s.n) * s.grad[lo:hi_p]
            if hi > n:
                seg[-1] = float(sum(s.n for s in steps)) if bad is None else nonfinite_mark(bad)
            device_sync(xp)
            t1 = _now()
            pending.append(self.comm.iallreduce_(seg))
            t_sum += t1 - t0
            t_comm += _now() - t1
        t0 = _now()
        for p in pending:
            p.wait()
        t_comm += _now() - t0
        T.add("SumGradient", t_sum)
        T.add("Allreduce", t_comm)
        with T("UpdateWeights"):
            total = float(to_host(self.g[n:])[0])
            if not math.isfinite(total):
                raise NonFiniteLoss(total, int(self.epoch) + 1)
            grad = self.g[:n]
            grad *= 1.0 / total
            lr = cfg.lr_at(self.epoch)
            if cfg.weight_decay:
                grad += cfg.weight_decay * self.w
            self.v *= cfg.momentum
            self.v -= lr * grad
            self.w += self.v
            device_sync(xp)
        local = [sum(s.n for s in steps), sum(s.loss * s.n for s in steps),
                 sum(s.correct for s in steps)]
        glob = self.comm.allreduce_scalars(local) if self.comm.size > 1 else local
        self.steps += 1
        self.last_loss = glob[1] / glob[0] if glob[0] else math.nan
        self.samples_total += int(round(total))
        self.epoch = self.samples_total / cfg.n_file if cfg.n_file else 0.0
        for i in range(3):
            self._window[i] += glob[i]
        if cfg.trace:
            self.trace_weights.append(to_host(self.w).copy())
        t_end = _now()
        T.add("Iteration", t_end - it0)
        self.step_end.append(t_end)
        self.step_samples.append(self.samples_total)

    def _done(self):
        cfg = self.cfg
        return ((cfg.max_samples is not None and self.samples_total >= cfg.max_samples)
                or (cfg.max_steps is not None and self.steps >= cfg.max_steps))

    def take_window(self):
        s, l, c = self._window
        self._window = [0.0, 0.0, 0.0]
        return (int(s), l / s if s else math.nan, c / s if s else math.nan)

    @property
    def latest(self):
        return self.w

    def run(self) -> "SyncSGD":
        t0 = self.t_start = _now()
        try:
            while not self._done():
                self.step()
                if self.on_step is not None and self.on_step(self):
                    break
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self.wall = _now() - t0
        return self

    def _series(self) -> dict:
        """This rank's per-step record: step end time (s since run start),
        samples so far (all ranks), the step's Allreduce and whole duration (s)."""
        t0 = getattr(self, "t_start", self.step_end[0] if self.step_end else 0.0)
        own = self.timers.samples
        return {"t": [round(t - t0, 6) for t in self.step_end], "samples": list(self.step_samples),
                "allreduce": [round(t, 7) for t in own.get("Allreduce", [])],
                "step": [round(t, 7) for t in own.get("Iteration", [])]}

    def stats(self, extra: dict | None = None) -> dict:
        allst = self.comm.allgather_obj(
            {"worker": StepTimers().merge(*self.worker_timers).samples, "step": self.timers.samples})
        wt = StepTimers.gathered(s["worker"] for s in allst)
        st = StepTimers.gathered(s["step"] for s in allst)
        it = summarize(st.samples.get("Iteration", []))
        out = {
            "mode": "sync", "n_node": self.comm.size, "n_gpu": len(self.sources),
            "T_Step": it["mean"], "T_Step_median": it["median"],
            "T_GPU": summarize(wt.samples.get("Iteration", []))["mean"],
            "timers": {**{k: summarize(v) for k, v in wt.samples.items() if k != "Iteration"},
                       **{k: summarize(v) for k, v in st.samples.items() if k != "Iteration"}},
            "steps": self.steps, "samples": self.samples_total,
            "buckets": len(self.buckets), "wall_s": getattr(self, "wall", 0.0),
            "series": self._series(),
        }
        if extra:
            out.update(extra)
        return out
