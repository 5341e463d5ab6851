"""SPRINT asynchronous SGD (SPEC section 3; seed 000, Algorithms 1 and 2).

Generic over flat parameter vectors: a *worker source* supplies the data and
the gradient, this module supplies the threads, buffers, locks, the sliced
momentum update and the weight-carrying allreduce.

Per process (= node): ``N_GPU`` worker threads run :meth:`ASGD._worker`
(Algorithm 1) and the calling thread runs the updater (Algorithm 2) -- the
only thread that talks to the communicator.

The worker sources (what a worker computes on, and ``Step``, what it
returns) follow the protocol of engine.parallel.source.

Deviation from the seed, on purpose and reported: hand-overs are pointer swaps
under the locks (a worker's full update-value buffer becomes GradBuf_t when
that buffer was empty; the updater swaps non-empty GradBuf_t for spare arrays
and sums them outside the lock; LatestWeights is published by swapping in
RecvBuf), so every critical section is O(1) except "GradBuf_t += Grad".
The updater waits (not spins) until ``min_grads`` local buffers are non-empty;
``min_grads=0`` gives the seed's free-running updater, which applies the
momentum term even when no gradient arrived.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ._xp import array_module, device_sync, to_host
from .asgd_buffers import N_EXTRA, X_CORRECT, X_GRADS, X_LOSS, X_SAMPLES, X_STOP, GradBuf
from .comm import Comm, LocalComm
from .source import NonFiniteLoss, Step, nonfinite_mark, source_step  # noqa: F401  (engine.perf, bench: Step)
from .timers import StepTimers

_now = time.perf_counter

@dataclass
class ASGDConfig:
    lr: float | Callable[[float], float] = 0.01   # constant or schedule lr(epoch_float)
    momentum: float = 0.9
    weight_decay: float = 0.0
    max_samples: int | None = None     # stop once this many samples were applied (all nodes)
    max_updates: int | None = None     # or after this many updates
    max_seconds: float | None = None   # or after this long (any node asks, all stop together)
    n_file: int = 0                    # training-set size, for epoch_float = samples / n_file
    min_grads: int = 1                 # local non-empty buffers the updater waits for
    lockstep: bool = False             # deterministic mode: updater waits for every worker,
                                       # workers wait for the update (tests: ASGD == SGD)
    max_pending: int = 0               # >0: a worker whose buffer holds this many gradients
                                       # waits for the updater (bounds minibatch and staleness
                                       # when the updater is starved); 0: the seed's unbounded
    trace: bool = False                # keep weights + gradient tags of every update (tests)
    wait_timeout: float = 0.05         # seconds between liveness checks while waiting

    def lr_at(self, epoch: float) -> float:
        return float(self.lr(epoch)) if callable(self.lr) else float(self.lr)


class WorkerFailed(RuntimeError):
    pass


class ASGD:
    def __init__(self, comm: Comm | None, w0, sources: Sequence, cfg: ASGDConfig,
                 on_update: Callable[["ASGD"], bool | None] | None = None,
                 delta0=None, start_samples: int = 0, start_version: int = 0):
        self.comm = comm if comm is not None else LocalComm()
        if not sources:
            raise ValueError("sources must hold at least one worker source")
        if getattr(w0, "ndim", None) != 1:
            raise ValueError("w0 must be a flat (1-D) parameter vector")
        if cfg.max_pending < 0:     # every worker would wait for the updater forever
            raise ValueError(f"cfg.max_pending must be >= 0, got {cfg.max_pending}")
        if cfg.min_grads < 0 or cfg.min_grads > len(sources):
            raise ValueError(f"cfg.min_grads must be in [0, {len(sources)}], got {cfg.min_grads}")
        self.cfg = cfg
        self.sources = list(sources)
        self.on_update = on_update
        xp = self.xp = array_module(w0)
        n = self.n_param = int(w0.size)
        dt = w0.dtype
        self.lo, self.hi = self.comm.slice_bounds(n)

        # LatestWeights lives in the first n entries of one of two allreduce-sized
        # buffers; the other is SendBuf. Publishing swaps them.
        self._a = xp.zeros(n + N_EXTRA, dtype=dt)
        self._b = xp.zeros(n + N_EXTRA, dtype=dt)
        self._a[:n] = w0
        self.latest = self._a[:n]
        self.latest_lock = threading.Lock()
        self.version = int(start_version)
        self._published = threading.Condition(threading.Lock())

        self.delta = xp.zeros(self.hi - self.lo, dtype=dt)   # DeltaWeights_n
        if delta0 is not None:
            # a resumed run's momentum comes from the (host) checkpoint
            self.delta[...] = xp.asarray(delta0[self.lo:self.hi] if delta0.size == n else delta0, dtype=dt)
        self._tmp = xp.empty_like(self.delta)

        self.bufs = [GradBuf(xp.empty(n, dtype=dt)) for _ in sources]
        self._spares = [xp.empty(n, dtype=dt) for _ in sources]
        self._has_grad = threading.Event()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._errors: list[tuple[int, BaseException]] = []

        self.samples_total = int(start_samples)
        self.updates = 0
        self.epoch = self.samples_total / cfg.n_file if cfg.n_file else 0.0
        self.last_loss = math.nan
        self.last_acc = math.nan
        self.updater_timers = StepTimers()
        self.worker_timers = [StepTimers() for _ in sources]
        self.minibatch: list[int] = []      # global samples carried by each update
        self.local_minibatch: list[int] = []
        self.grads_per_update: list[int] = []
        self.staleness: list[int] = []      # local gradients, versions behind when applied
        self.produced = [0] * len(sources)  # gradients each worker deposited
        self.discarded = {"grads": 0, "samples": 0, "tags": []}
        self.trace_weights: list = []
        self.trace_tags: list = []
        self._window = [0.0, 0.0, 0.0]      # samples, loss_sum, correct since last read
        self._deadline = None
        if cfg.trace:
            self.trace_weights.append(to_host(self.latest).copy())

    # ------------------------------------------------------------------ workers
    def _worker(self, t: int):
        src, buf, T = self.sources[t], self.bufs[t], self.worker_timers[t]
        xp, wd = self.xp, self.cfg.weight_decay
        try:
            setup = getattr(src, "setup_thread", None)
            if setup is not None:
                setup()
            upd = xp.empty(self.n_param, dtype=self.latest.dtype)
            my_version = None
            while not self._stop.is_set():
                if not self._running.is_set():
                    self._running.wait()     # paused (evaluation, checkpoint)
                    continue
                it0 = _now()
                cpu0 = time.thread_time()
                # FetchWeights (Algorithm 1, lines 2-6): only when LatestWeights changed.
                if self.version != my_version:
                    t0 = _now()
                    with self.latest_lock:
                        t1 = _now()
                        xp.copyto(src.weights, self.latest)
                        my_version = self.version
                        device_sync(xp)
                    T.add("LockWeights", t1 - t0)
                    T.add("FetchWeights", _now() - t0)
                step = source_step(src, T)
                with T("ComputeUpdateVal"):
                    lr = self.cfg.lr_at(self.epoch)
                    # Grad = -eta * (grad + wd * w)
                    xp.multiply(step.grad, -lr, out=upd)
                    if wd:
                        upd -= (lr * wd) * src.weights
                    device_sync(xp)
                t0 = _now()
                buf.lock.acquire()
                t1 = _now()
                try:
                    if buf.empty:
                        buf.data, upd = upd, buf.data
                        buf.empty = False
                    else:
                        buf.data += upd
                        device_sync(xp)
                    buf.n += int(step.n)
                    buf.loss += float(step.loss) * int(step.n)
                    buf.correct += int(step.correct)
                    buf.grads += 1
                    buf.versions.append(my_version)
                    if step.tag is not None:
                        buf.tags.append(step.tag)
                    self.produced[t] += 1
                finally:
                    buf.lock.release()
                t2 = _now()
                T.add("LockGradient", t1 - t0)
                T.add("UpdateGradient", t2 - t1)
                self._has_grad.set()
                T.add("Iteration", t2 - it0)
                # CPU time of this thread: with single-threaded kernels, a
                # load-independent measure of the work per gradient
                T.add("IterationCPU", time.thread_time() - cpu0)
                if self.cfg.lockstep:
                    with self._published:
                        while self.version == my_version and not self._stop.is_set():
                            self._published.wait(self.cfg.wait_timeout)
                elif self.cfg.max_pending and buf.grads >= self.cfg.max_pending:
                    # bounded accumulation: wait until the updater took the buffer
                    t0 = _now()
                    with self._published:
                        while buf.grads >= self.cfg.max_pending and not self._stop.is_set():
                            self._published.wait(self.cfg.wait_timeout)
                    T.add("WaitPending", _now() - t0)
        except BaseException as e:  # reported by the updater, which owns MPI
            self._errors.append((t, e))
            self._stop.set()
            self._has_grad.set()

    # ------------------------------------------------------------------ updater
    def _diverged(self):
        """The NaN/Inf loss a worker of this rank met (NonFiniteLoss), or None."""
        bad = [e for _, e in self._errors if isinstance(e, NonFiniteLoss)]
        return bad[0].loss if bad else None

    def _check_workers(self):
        if self._errors and self._diverged() is None:   # a divergence is the allreduce's to say
            t, e = self._errors[0]
            raise WorkerFailed(f"worker {t} on rank {self.comm.rank} failed: "
                               f"{type(e).__name__}: {e}") from e

    def _wait_for_grads(self):
        need = len(self.bufs) if self.cfg.lockstep else self.cfg.min_grads
        while True:
            self._has_grad.clear()
            self._check_workers()
            if sum(not b.empty for b in self.bufs) >= need or self._stop_requested() or self._errors:
                return
            self._has_grad.wait(self.cfg.wait_timeout)

    def _stop_requested(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _sum_gradients(self, send):
        """SumGradient (Algorithm 2, lines 2-14): SendBuf = sum of non-empty
        buffers, each marked empty; zero when all were empty."""
        xp, n = self.xp, self.n_param
        meta = [0, 0.0, 0, 0]
        versions, tags = [], []
        first = True
        for t, buf in enumerate(self.bufs):
            taken = buf.take(self._spares[t])
            if taken is None:
                continue
            data, m, v, g = taken
            self._spares[t] = data
            versions.extend(v)
            tags.extend(g)
            if first:
                xp.copyto(send[:n], data)
                first = False
            else:
                send[:n] += data
            for i in range(4):
                meta[i] += m[i]
        if first:
            send[:n] = 0
        return meta, versions, tags

    def _update(self):
        T, xp, cfg = self.updater_timers, self.xp, self.cfg
        n, lo, hi = self.n_param, self.lo, self.hi
        send = self._b
        with T("WaitGradient"):
            self._wait_for_grads()
        with T("SumGradient"):
            meta, versions, tags = self._sum_gradients(send)
            device_sync(xp)
        with T("AddMomentum"):
            # SendBuf_n += OldWeights_n + nu * DeltaWeights_n
            old = self.latest[lo:hi]
            mine = send[lo:hi]
            mine += old
            if cfg.momentum:
                xp.multiply(self.delta, cfg.momentum, out=self._tmp)
                mine += self._tmp
            send[n + X_SAMPLES] = meta[0]
            # a worker's NaN/Inf loss: every rank's sum becomes non-finite, and each raises at this update
            bad = self._diverged()
            send[n + X_LOSS] = meta[1] if bad is None else nonfinite_mark(bad)
            send[n + X_CORRECT] = meta[2]
            send[n + X_GRADS] = meta[3]
            send[n + X_STOP] = 1.0 if self._stop_requested() else 0.0
            device_sync(xp)
        with T("Allreduce"):
            self.comm.allreduce_(send)   # RecvBuf: the new weights, plus global counts
        with T("UpdateMomentum"):
            xp.subtract(send[lo:hi], old, out=self.delta)   # DeltaWeights_n = RecvBuf_n - OldWeights_n
        extras = [float(v) for v in to_host(send[n:])]
        if not math.isfinite(extras[X_LOSS]):
            raise NonFiniteLoss(extras[X_LOSS], int(self.epoch) + 1)
        with T("UpdateWeights"):
            with self.latest_lock:
                self._a, self._b = self._b, self._a
                self.latest = self._a[:n]
                applied_to = self.version
                self.version += 1
            with self._published:
                self._published.notify_all()
        glob_n = int(round(extras[X_SAMPLES]))
        self.updates += 1
        self.samples_total += glob_n
        self.epoch = self.samples_total / cfg.n_file if cfg.n_file else 0.0
        self.minibatch.append(glob_n)
        self.local_minibatch.append(meta[0])
        self.grads_per_update.append(int(round(extras[X_GRADS])))
        self.staleness.extend(applied_to - v for v in versions)
        self._window[0] += extras[X_SAMPLES]
        self._window[1] += extras[X_LOSS]
        self._window[2] += extras[X_CORRECT]
        if glob_n:
            self.last_loss = extras[X_LOSS] / glob_n
            self.last_acc = extras[X_CORRECT] / glob_n
        if cfg.trace:
            self.trace_weights.append(to_host(self.latest).copy())
            self.trace_tags.append(tags)
        return extras[X_STOP] > 0

    def _done(self, stop_flag: bool) -> bool:
        cfg = self.cfg
        return bool(stop_flag
                    or (cfg.max_samples is not None and self.samples_total >= cfg.max_samples)
                    or (cfg.max_updates is not None and self.updates >= cfg.max_updates))

    @contextlib.contextmanager
    def paused(self):
        """Hold the workers (after their current gradient) while the updater
        does something else -- evaluation, checkpoints -- so that gradients do
        not pile up into one oversized update meanwhile."""
        self._running.clear()
        try:
            yield self
        finally:
            self._running.set()

    def take_window(self):
        """(samples, mean loss, accuracy) of the updates since the last call,
        over all nodes; resets the window."""
        s, l, c = self._window
        self._window = [0.0, 0.0, 0.0]
        return (int(s), l / s if s else math.nan, c / s if s else math.nan)

    def run(self) -> "ASGD":
        """Run workers + updater until the stop condition; returns self."""
        # Start together: a rank still importing would otherwise hold the first
        # allreduce while the others' workers pile up gradients.
        self.comm.barrier()
        if self.cfg.max_seconds is not None:
            self._deadline = time.monotonic() + self.cfg.max_seconds
        threads = [threading.Thread(target=self._worker, args=(t,), daemon=True,
                                    name=f"sprint-asgd-worker-{t}")
                   for t in range(len(self.sources))]
        for th in threads:
            th.start()
        t_start = _now()
        try:
            while not self._done(False):
                it0 = _now()
                stop_flag = self._update()
                self.updater_timers.add("Iteration", _now() - it0)
                # A true return from on_update stops the run; it is computed from
                # global counts, so every node stops after the same update.
                if self.on_update is not None and self.on_update(self):
                    break
                if self._done(stop_flag):
                    break
        finally:
            self._stop.set()
            self._running.set()
            with self._published:
                self._published.notify_all()
            for th in threads:
                th.join(timeout=60)
            self.wall = _now() - t_start
        self._check_workers()
        self._collect_discarded()
        return self

    def _collect_discarded(self):
        """Gradients still in the buffers at stop time are dropped, and counted."""
        for buf in self.bufs:
            buf.discard_into(self.discarded)

    def full_delta(self):
        """DeltaWeights of all slices, gathered (host array) -- for checkpoints."""
        parts = self.comm.allgather_obj(to_host(self.delta))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    # ------------------------------------------------------------------ stats
    def local_stats(self) -> dict:
        w = StepTimers().merge(*self.worker_timers)
        return {"worker": w.samples, "updater": self.updater_timers.samples,
                "staleness": list(self.staleness), "produced": sum(self.produced),
                "discarded": self.discarded["grads"]}

    def stats(self, extra: dict | None = None) -> dict:
        """asgd_stats.json content, gathered over all nodes (call on every rank)."""
        from .asgd_stats import gather
        return gather(self, extra)
