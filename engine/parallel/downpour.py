"""Downpour SGD (DistBelief, Dean et al. NIPS 2012; seed 003).

``mpiexec -n S+R``: ranks ``0..S-1`` are parameter-server shards
(:mod:`engine.parallel.ps`), ranks ``S..`` model replicas. A replica fetches
every shard each ``fetch_every`` steps, runs the engine's forward/backward on
its own data shard and pushes the sum of its accumulated gradients every
``push_every`` steps; replicas never wait for one another. Each server
applies pushes in the order they arrive (momentum SGD or Adagrad on its
shard), so a push may be computed on weights several server versions old:
its *staleness*, recorded for every applied push.

Stopping: servers set a stop flag in their fetch replies once the sample
budget (or time) is spent; a replica that sees it drops what it has not
pushed yet (counted), says DONE to every shard and leaves. A replica whose
loss becomes NaN or Inf says DIVERGED to server 0 instead of pushing; server
0 stops applying pushes and answers every fetch with the stop flag, the loss
and the samples applied when it heard (``diverged``), and hands them to the
other shards with their final snapshot request: every rank then raises the
same Diverged, and the job ends with one line instead of MPI_Abort. Server 0 owns the
epoch boundaries: it asks the other shards for a snapshot (weights and
optimizer state), evaluates, logs and checkpoints through ``on_epoch``;
the other shards serve until server 0 sends them the final snapshot request.

Worker sources follow :mod:`engine.parallel.source`'s protocol; a source's
``compute`` returns the *mean* gradient of its sub-batch.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import ps
from ._xp import to_host
from .source import NonFiniteLoss, source_step
from .timers import StepTimers, summarize

_now = time.perf_counter


@dataclass
class DownpourConfig:
    lr: float | Callable[[float], float] = 0.01
    fetch_every: int = 1
    push_every: int = 1
    max_samples: int | None = None     # servers raise the stop flag past this many applied samples
    max_seconds: float | None = None
    n_file: int = 0                    # samples per epoch (lr schedule and epoch boundaries)
    poll: float = ps.POLL
    slow_factor: float = 1.0           # this replica sleeps (F-1) x its compute time (benchmark aid)
    trace: bool = False                # servers keep their shard after every apply (tests)

    def __post_init__(self):
        for k in ("fetch_every", "push_every"):
            v = getattr(self, k)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{k} must be a positive int, got {v!r} (--{k.replace('_', '-')})")
        if not self.slow_factor >= 1:
            raise ValueError(f"slow factor must be >= 1, got {self.slow_factor} (--slow-factor)")

    def lr_at(self, epoch: float) -> float:
        return float(self.lr(epoch)) if callable(self.lr) else float(self.lr)


class DownpourServer:
    """The serving loop of one shard: fetch replies, pushes, snapshots."""

    def __init__(self, comm, index, bounds, w0, opt, replicas, cfg: DownpourConfig,
                 start_samples=0, start_version=0, on_epoch=None):
        from mpi4py import MPI
        self.MPI, self.comm, self.index, self.cfg = MPI, comm, index, cfg
        self.bounds = bounds
        self.lo, self.hi = bounds[index]
        self.w = np.ascontiguousarray(to_host(w0)[self.lo:self.hi], np.float32).copy()
        self.opt = opt
        self.replicas = list(replicas)
        self.version = int(start_version)
        self.samples = int(start_samples)
        self.on_epoch = on_epoch            # server 0: f(server, epoch) -> True to stop
        self.epoch_done = self.samples // cfg.n_file if cfg.n_file else 0
        self.stop = False
        self.diverged = None                # (loss, samples applied) once a replica's loss was NaN/Inf
        self.staleness, self.queue, self.apply_t = [], [], []
        self.pushes_from = {r: 0 for r in self.replicas}
        self.idle = 0.0
        self.window = [0, 0.0, 0]           # samples, loss sum, correct since the last epoch
        self.trace = [self.w.copy()] if cfg.trace else []
        self._out = {r: (ps.packed(self.hi - self.lo), None) for r in self.replicas}
        self._pool = []
        self.t0 = _now()

    def _stop_now(self):
        c = self.cfg
        return ((c.max_samples is not None and self.samples >= c.max_samples)
                or (c.max_seconds is not None and _now() - self.t0 >= c.max_seconds))

    def _reply_weights(self, r):
        buf, req = self._out[r]
        ps.wait_all([req], self.cfg.poll)
        h = ps.header(buf)
        h[:] = 0
        h[0], h[1], h[2] = self.version, float(self.stop or self._stop_now()), self.samples
        if self.diverged is not None:
            h[3], h[4] = self.diverged
        ps.body(buf)[:] = self.w
        self._out[r] = (buf, self.comm.Isend([buf, self.MPI.FLOAT], dest=r, tag=ps.WEIGHTS))

    def _apply(self, r, buf):
        if self.diverged is not None:
            return                          # the run is over: no epoch is recorded past it
        h = ps.header(buf)
        fetched, n, k = int(h[0]), int(h[1]), int(h[2])
        t0 = _now()
        epoch = self.samples / self.cfg.n_file if self.cfg.n_file else 0.0
        self.opt.apply(self.w, ps.body(buf), self.cfg.lr_at(epoch), k)
        self.apply_t.append(_now() - t0)
        self.staleness.append(self.version - fetched)
        self.version += 1
        self.samples += n
        self.pushes_from[r] += 1
        self.window[0] += n
        self.window[1] += float(h[3])
        self.window[2] += int(h[4])
        if self.cfg.trace:
            self.trace.append(self.w.copy())
        if self.on_epoch is not None and self.cfg.n_file:
            epoch = self.samples // self.cfg.n_file
            if epoch > self.epoch_done:
                self.epoch_done = epoch
                if self.on_epoch(self, epoch):
                    self.stop = True

    def snapshot(self):
        """This shard's weights, optimizer state and counters."""
        return {"w": self.w.copy(), "opt": {k: v.copy() for k, v in self.opt.state().items()},
                "version": self.version, "samples": self.samples}

    def gather(self, final=False):
        """Server 0: every shard's snapshot (the others keep serving; with
        ``final`` they leave their loop after answering, told of a divergence)."""
        snaps = [self.snapshot()]
        for s in range(1, len(self.bounds)):
            self.comm.send((self.diverged or True) if final else False, dest=s, tag=ps.SNAP)
            snaps.append(ps.recv_poll(self.comm, s, ps.SNAP_REPLY, self.cfg.poll))
        return snaps

    def take_window(self):
        s, l, c = self.window
        self.window = [0, 0.0, 0]
        return s, (l / s if s else math.nan), (c / s if s else math.nan)

    def run(self):
        # a diverging push overflows in the shard's update: the replica that
        # computed the NaN loss says so in one line, numpy's warnings would
        # only add noise before it
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._serve()

    def _serve(self):
        MPI, comm = self.MPI, self.comm
        st = MPI.Status()
        active = set(self.replicas)
        tiny = np.zeros(1, np.float32)
        serving = True
        while serving:
            ps.alive()
            msgs = []
            # Drain what has arrived, in arrival order: the count of pushes
            # taken in one sweep is the server's queue length.
            while comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st):
                src, tag = st.Get_source(), st.Get_tag()
                if tag == ps.PUSH:
                    buf = self._pool.pop() if self._pool else ps.packed(self.hi - self.lo)
                    comm.Recv([buf, MPI.FLOAT], source=src, tag=tag)
                    msgs.append((tag, src, buf))
                elif tag == ps.SNAP:
                    msgs.append((tag, src, comm.recv(source=src, tag=tag)))
                else:
                    comm.Recv([tiny, MPI.FLOAT], source=src, tag=tag)
                    msgs.append((tag, src, float(tiny[0])))
            if not msgs:
                if not active and self.index == 0:
                    break
                t0 = _now()
                time.sleep(self.cfg.poll)
                self.idle += _now() - t0
                continue
            self.queue.append(sum(1 for m in msgs if m[0] == ps.PUSH))
            for tag, src, obj in msgs:
                if tag == ps.PUSH:
                    self._apply(src, obj)
                    self._pool.append(obj)
                elif tag == ps.FETCH:
                    self._reply_weights(src)
                elif tag == ps.DONE:
                    active.discard(src)
                elif tag == ps.DIVERGED:
                    if self.diverged is None:   # the first replica's loss is the job's
                        self.diverged, self.stop = (obj, self.samples), True
                elif tag == ps.SNAP:
                    comm.send(self.snapshot(), dest=src, tag=ps.SNAP_REPLY)
                    if obj:
                        serving = False
                        if isinstance(obj, tuple):
                            self.diverged = obj
        ps.wait_all([req for _, req in self._out.values()], self.cfg.poll)
        self.wall = _now() - self.t0
        return self

    def stats(self) -> dict:
        return {"server": self.index, "lo": self.lo, "hi": self.hi, "version": self.version,
                "applied": len(self.staleness),
                "samples": self.samples, "staleness": self.staleness, "queue": self.queue,
                "apply": summarize(self.apply_t), "idle_s": self.idle, "wall_s": getattr(self, "wall", 0.0),
                "pushes_from": {str(k): v for k, v in self.pushes_from.items()}}


class DownpourReplica:
    """One model replica: fetch, compute, accumulate, push; never waits for
    another replica (only for its own fetch replies and its previous push)."""

    def __init__(self, comm, bounds, src, cfg: DownpourConfig, index=0):
        from mpi4py import MPI
        self.MPI, self.comm, self.bounds, self.src, self.cfg = MPI, comm, bounds, src, cfg
        self.index = index
        self.n = bounds[-1][1]
        self.S = len(bounds)
        self.acc = np.zeros(self.n, np.float32)
        self.k = self.n_acc = self.correct = 0
        self.loss = 0.0
        self.versions = [0] * self.S
        self.inbox = [ps.packed(hi - lo) for lo, hi in bounds]
        self.outbox = [ps.packed(hi - lo) for lo, hi in bounds]
        self.push_reqs = [None] * self.S
        self.T = StepTimers()
        self.steps = self.pushes = self.fetches = 0
        self.discarded_grads = 0
        self.diverged = None                # server 0's (loss, samples) when the run diverged
        self._staging = None if isinstance(src.weights, np.ndarray) else np.zeros(self.n, np.float32)

    def fetch(self) -> bool:
        """All shards into the source's weights; True when a server says stop."""
        t0 = _now()
        ps.fetch_all(self.comm, self.inbox, [np.zeros(1, np.float32), self.MPI.FLOAT], self.cfg.poll)
        stop = False
        for s, buf in enumerate(self.inbox):
            h = ps.header(buf)
            self.versions[s] = int(h[0])
            stop = stop or h[1] > 0
        h = ps.header(self.inbox[0])
        if not math.isfinite(h[3]):
            self.diverged = (float(h[3]), int(h[4]))
        ps.assemble_into(self.src.weights, self.bounds, self.inbox, self._staging)
        self.fetches += 1
        self.T.add("Fetch", _now() - t0)
        return stop

    def push(self):
        t0 = _now()
        self.T.add("Wait", ps.wait_all(self.push_reqs, self.cfg.poll))
        t1 = _now()
        heads = [(v, self.n_acc, self.k, self.loss, self.correct) for v in self.versions]
        self.push_reqs = ps.push_all(self.comm, self.bounds, self.outbox, self.acc, heads)
        self.acc[:] = 0
        self.k = self.n_acc = self.correct = 0
        self.loss = 0.0
        self.pushes += 1
        self.T.add("Push", _now() - t1)
        self.T.add("PushTotal", _now() - t0)

    def say_diverged(self, loss):
        """Tell server 0 instead of pushing the gradient, then fetch: its
        reply carries the job's verdict (this loss, or an earlier replica's)."""
        ps.wait_all([self.comm.Isend([np.array([loss], np.float32), self.MPI.FLOAT], dest=0,
                                     tag=ps.DIVERGED)], self.cfg.poll)
        self.fetch()

    def run(self):
        cfg, src, T = self.cfg, self.src, self.T
        setup = getattr(src, "setup_thread", None)
        if setup is not None:
            setup()
        t_start = _now()
        while True:
            ps.alive()
            if self.steps % cfg.fetch_every == 0 and self.fetch():
                break
            t0 = _now()
            try:
                st = source_step(src, T)
            except NonFiniteLoss as e:          # the engine's source: a NaN/Inf loss
                self.say_diverged(e.loss)
                break
            dt = _now() - t0
            if cfg.slow_factor > 1:
                time.sleep((cfg.slow_factor - 1) * dt)
                T.add("Slow", (cfg.slow_factor - 1) * dt)
            T.add("Compute", _now() - t0)
            if not math.isfinite(st.loss):
                self.say_diverged(st.loss)
                break
            self.acc += to_host(st.grad)
            self.k += 1
            self.n_acc += int(st.n)
            self.loss += float(st.loss) * int(st.n)
            self.correct += int(st.correct)
            self.steps += 1
            if self.steps % cfg.push_every == 0:
                self.push()
        self.discarded_grads = self.k
        ps.wait_all(self.push_reqs, cfg.poll)
        tiny = np.zeros(1, np.float32)
        ps.wait_all([self.comm.Isend([tiny, self.MPI.FLOAT], dest=s, tag=ps.DONE) for s in range(self.S)],
                    cfg.poll)
        self.wall = _now() - t_start
        return self

    def stats(self) -> dict:
        return {"replica": self.index, "steps": self.steps, "pushes": self.pushes, "fetches": self.fetches,
                "grads_discarded_at_stop": self.discarded_grads, "wall_s": getattr(self, "wall", 0.0),
                "slow_factor": self.cfg.slow_factor, "timers": self.T.summary()}
