"""Sandblaster L-BFGS (DistBelief, Dean et al. NIPS 2012; seed 003).

``mpiexec -n S+R``: ranks ``0..S-1`` are parameter shards holding their part
of the L-BFGS state (:class:`engine.parallel.lbfgs.ShardLBFGS`); server 0 is
also the *coordinator*; ranks ``S..`` are model replicas. Each L-BFGS batch
is cut into many slices of ``slice`` samples, far fewer than 1/R of the
batch, handed out one at a time to whichever replica asks: a fast replica
simply asks more often, so nobody waits for the slowest. A replica fetches
the evaluation point from every shard, computes the slice's summed gradient
and sends each shard its part; the shards accumulate. Once every slice is
in, the coordinator reduces the shards' partial dot products and runs the
two-loop recursion and a backtracking line search (:mod:`lbfgs`).

Backup tasks: when every slice is handed out but some are not back, an idle
replica is given a copy of the oldest outstanding one once that has been out
longer than the median compute time of recent slices; the first result
wins at each shard and at the coordinator, later ones are dropped and
counted (``backup=False`` turns this off, for a static-split baseline).

The coordinator runs in server 0's thread: every wait of it pumps server
0's shard messages too (no second MPI thread). Slices are contiguous ranges
of the epoch's permutation; their deformation is seeded by (seed, epoch,
first sample), so a re-issued slice computes the same gradient.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from . import lbfgs, ps
from .timers import StepTimers, summarize

_now = time.perf_counter


@dataclass
class SandblasterConfig:
    batch: int = 512                 # samples per L-BFGS iteration (>= n_file: full batch)
    slice: int = 32                  # samples per slice handed to a replica
    history: int = 10                # L-BFGS pairs m
    weight_decay: float = 0.0        # objective: mean loss + wd/2 |x|^2
    n_file: int = 0
    max_samples: int | None = None   # samples of finished batches (one pass of a batch = its size)
    max_seconds: float | None = None
    backup: bool = True
    poll: float = ps.POLL
    slow_factor: float = 1.0
    seed: int = 0

    def __post_init__(self):
        for k in ("batch", "slice", "history"):
            v = getattr(self, k)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{k} must be a positive int, got {v!r} (--{k})")


class SandShard:
    """One shard's serving: point fetches, slice gradients, coordinator commands."""

    def __init__(self, comm, index, bounds, w0, cfg: SandblasterConfig, state=None):
        from mpi4py import MPI
        self.MPI, self.comm, self.index, self.cfg = MPI, comm, index, cfg
        self.lo, self.hi = bounds[index]
        n = self.hi - self.lo
        self.opt = lbfgs.ShardLBFGS(np.asarray(w0, np.float32)[self.lo:self.hi], cfg.history)
        if state is not None:
            self.opt.S = [np.array(s[self.lo:self.hi]) for s in state["s"]]
            self.opt.Y = [np.array(y[self.lo:self.hi]) for y in state["y"]]
        self.e, self.pt, self.n_slices = -1, self.opt.x, 0
        self.acc = np.zeros(n, np.float64)
        self.got, self.n_samples, self.g_trial = set(), 0, None
        self.deferred_fetch, self.deferred_reduce = [], None
        self.duplicates = 0
        self.serving = True
        self.cmd_t = StepTimers()
        self._inbox = ps.packed(n)
        self._out, self._reqs = {}, []
        self.handlers = {ps.FETCH: self._on_fetch, ps.PUSH: self._on_push, ps.CMD: self._on_cmd}

    def _send_point(self, r):
        buf, req = self._out.get(r, (None, None))
        ps.wait_all([req], self.cfg.poll)
        if buf is None:
            buf = ps.packed(self.hi - self.lo)
        ps.header(buf)[0] = self.e
        ps.body(buf)[:] = self.pt
        self._out[r] = (buf, self.comm.Isend([buf, self.MPI.FLOAT], dest=r, tag=ps.WEIGHTS))

    def _on_fetch(self, src):
        want = np.zeros(1, np.float64)
        self.comm.Recv([want, self.MPI.DOUBLE], source=src, tag=ps.FETCH)
        if int(want[0]) > self.e:          # the coordinator's "eval" has not reached us yet
            self.deferred_fetch.append(src)
        else:                              # current point (a stale request learns it is stale)
            self._send_point(src)

    def _on_push(self, src):
        buf = self._inbox
        self.comm.Recv([buf, self.MPI.FLOAT], source=src, tag=ps.PUSH)
        h = ps.header(buf)
        e, sid = int(h[0]), int(h[1])
        if e != self.e or sid in self.got:
            self.duplicates += 1
            return
        self.got.add(sid)
        self.acc += ps.body(buf)
        self.n_samples += int(h[2])
        self._try_reduce()

    def _reply(self, obj):
        self._reqs = [r for r in self._reqs if not r.Test()]
        self._reqs.append(self.comm.isend(obj, dest=0, tag=ps.CMD_REPLY))

    def _try_reduce(self):
        if self.deferred_reduce is None or len(self.got) < self.n_slices:
            return
        want_gram, set_g = self.deferred_reduce
        self.deferred_reduce = None
        t0 = _now()
        g = (self.acc / max(self.n_samples, 1)).astype(np.float32)
        if self.cfg.weight_decay:
            g += np.float32(self.cfg.weight_decay) * self.pt
        self.g_trial = g
        if set_g:
            self.opt.g = g
        rep = {"xx": float(self.pt.astype(np.float64) @ self.pt), "gd": float(g.astype(np.float64) @ self.opt.d),
               "n": self.n_samples}
        if want_gram:
            rep["gram"] = self.opt.gram()
        self.cmd_t.add("reduce", _now() - t0)
        self._reply(rep)

    def _on_cmd(self, src):
        cmd = self.comm.recv(source=src, tag=ps.CMD)
        t0 = _now()
        op = cmd[0]
        if op == "eval":
            _, self.e, t, self.n_slices = cmd
            self.pt = np.ascontiguousarray(self.opt.point(t))
            self.acc[:] = 0
            self.got, self.n_samples = set(), 0
            waiting, self.deferred_fetch = self.deferred_fetch, []
            for r in waiting:
                self._send_point(r)
        elif op == "reduce":
            self.deferred_reduce = (cmd[1], cmd[2])
            self._try_reduce()
        elif op == "gram":
            self._reply({"gram": self.opt.gram()})
        elif op == "direction":
            self.opt.set_direction(cmd[1], cmd[2])
        elif op == "accept":
            self.opt.accept(cmd[1], self.g_trial)
        elif op == "reset":
            self.opt.S, self.opt.Y, self.opt.pending = [], [], None
        elif op == "snapshot":
            self._reply(self.opt.state())
            if cmd[1]:
                self.serving = False
        self.cmd_t.add(op, _now() - t0)

    def serve(self):
        while self.serving:
            ps.alive()
            if not ps.pump(self.comm, self.handlers):
                time.sleep(self.cfg.poll)
        ps.wait_all([r for _, r in self._out.values()], self.cfg.poll)
        for r in self._reqs:
            r.Wait()

    def stats(self):
        return {"server": self.index, "lo": self.lo, "hi": self.hi, "duplicates": self.duplicates,
                "commands": self.cmd_t.summary()}


class Coordinator:
    """Server 0's second role: slices, backup tasks, reductions, L-BFGS steps."""

    def __init__(self, comm, shard: SandShard, servers, replicas, cfg: SandblasterConfig,
                 start_samples=0, on_epoch=None):
        from mpi4py import MPI
        self.MPI, self.comm, self.shard, self.cfg = MPI, comm, shard, cfg
        self.S, self.replicas = servers, list(replicas)
        self.samples = int(start_samples)
        self.on_epoch = on_epoch
        self.handlers = {**shard.handlers, ps.REQ: self._on_req, ps.SLICE: self._on_slice,
                         ps.CMD_REPLY: self._on_reply}
        self.idle, self.replies, self.stopped = [], {}, set()
        self.stopping = False
        self.e = -1
        self.slices, self.issued, self.done = {}, {}, {}
        self.task_out = {}
        self.cmd_reqs = []
        self.slices_by = {r: 0 for r in self.replicas}
        self.duplicates = self.reissued = 0
        self.slice_dt = []
        self.batch_t, self.loss, self.trials = [], [], []
        self.window = [0, 0.0, 0]
        self.t0 = _now()

    # -- messages ----------------------------------------------------------------
    def _on_req(self, src):
        self.comm.Recv([np.zeros(1, np.float32), self.MPI.FLOAT], source=src, tag=ps.REQ)
        self.idle.append(src)

    def _on_slice(self, src):
        m = np.zeros(6, np.float64)
        self.comm.Recv([m, self.MPI.DOUBLE], source=src, tag=ps.SLICE)
        e, sid = int(m[0]), int(m[1])
        if e != self.e or sid in self.done:
            self.duplicates += 1
            return
        self.done[sid] = (int(m[2]), float(m[3]), int(m[4]))
        self.slices_by[src] += 1
        self.slice_dt = (self.slice_dt + [float(m[5])])[-64:]

    def _on_reply(self, src):
        self.replies[src] = self.comm.recv(source=src, tag=ps.CMD_REPLY)

    def _task(self, r, vals):
        buf, req = self.task_out.get(r, (np.zeros(6, np.float64), None))
        ps.wait_all([req], self.cfg.poll)
        buf[:] = vals
        self.task_out[r] = (buf, self.comm.Isend([buf, self.MPI.DOUBLE], dest=r, tag=ps.TASK))

    def _dispatch(self):
        while self.idle:
            if self.stopping:
                r = self.idle.pop(0)
                self._task(r, [-1, -1, 0, 0, 0, 1])
                self.stopped.add(r)
                continue
            fresh = [s for s in self.slices if s not in self.issued]
            if fresh:
                sid = fresh[0]
            else:
                # late: out for longer than a typical slice takes to compute
                now, typical = _now(), float(np.median(self.slice_dt)) if self.slice_dt else 0.0
                late = [s for s in self.issued if s not in self.done and len(self.issued[s]) < 2
                        and now - self.issued[s][0] > typical]
                if not (late and self.cfg.backup):
                    return
                sid = min(late, key=lambda s: self.issued[s][0])
                self.reissued += 1
            r = self.idle.pop(0)
            self.issued.setdefault(sid, []).append(_now())
            ep, lo, hi = self.slices[sid]
            self._task(r, [self.e, sid, ep, lo, hi, 0])

    def wait(self, done):
        while not done():
            ps.alive()
            got = ps.pump(self.comm, self.handlers)
            self._dispatch()
            if not got:
                time.sleep(self.cfg.poll)

    def command(self, cmd, reply=False):
        self.cmd_reqs = [r for r in self.cmd_reqs if not r.Test()]
        self.replies = {}
        for s in range(self.S):
            self.cmd_reqs.append(self.comm.isend(cmd, dest=s, tag=ps.CMD))
        if reply:
            self.wait(lambda: len(self.replies) == self.S)
            return [self.replies[s] for s in range(self.S)]
        return None

    # -- one function value and gradient over a batch ----------------------------
    def evaluate(self, t, batch, gram=False, set_g=False):
        ep, lo, hi = batch
        self.e += 1
        bounds = list(range(lo, hi, self.cfg.slice)) + [hi]
        self.slices = {i: (ep, a, b) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))}
        self.issued, self.done = {}, {}
        self.command(("eval", self.e, t, len(self.slices)))
        self.wait(lambda: len(self.done) == len(self.slices))
        reps = self.command(("reduce", gram, set_g), reply=True)
        n = sum(v[0] for v in self.done.values())
        loss = sum(v[1] for v in self.done.values()) / n
        xx = sum(r["xx"] for r in reps)
        f = loss + 0.5 * self.cfg.weight_decay * xx
        return f, reps, (n, sum(v[1] for v in self.done.values()), sum(v[2] for v in self.done.values()))

    # -- the L-BFGS loop -------------------------------------------------------------
    def run(self):
        cfg, n_file = self.cfg, self.cfg.n_file
        ep, pos = divmod(self.samples, n_file)
        full = cfg.batch >= n_file and getattr(self, "deterministic", True)
        have_trial, f_trial = False, None
        while True:
            tb = _now()
            batch = (ep, 0, n_file) if full else (ep, pos, min(pos + cfg.batch, n_file))
            if full and have_trial:
                f, reps = f_trial, self.command(("gram",), reply=True)
            else:
                f, reps, win = self.evaluate(0.0, batch, gram=True, set_g=True)
                self._count(win)
            G = sum(r["gram"] for r in reps)
            kb = (G.shape[0] - 1) // 2
            keep = lbfgs.choose_pairs(G, kb, cfg.history)
            Gs = lbfgs.select(G, kb, keep)
            c = lbfgs.two_loop_coeffs(Gs, len(keep))
            gd = float(c @ Gs[:, -1])
            if not gd < 0:
                keep, Gs = [], lbfgs.select(G, kb, [])
                c, gd = np.array([-1.0]), -float(G[-1, -1])
            self.command(("direction", c, keep))
            t = 1.0 if keep else min(1.0, 1.0 / max(math.sqrt(G[-1, -1]), 1e-12))
            ok = False
            for trial in range(lbfgs.MAX_TRIALS):
                ft, _, win = self.evaluate(t, batch)
                if full:
                    self._count(win)
                if ft <= f + lbfgs.C1 * t * gd:
                    ok = True
                    break
                t = lbfgs.backtrack(t, f, gd, ft)
            self.trials.append(trial + 1)
            if ok:
                self.command(("accept", t))
                have_trial, f_trial = True, ft
            else:
                self.command(("reset",))
                have_trial = False
            self.loss.append(f)
            self.samples += batch[2] - batch[1]
            pos = batch[2]
            if pos >= n_file:
                ep, pos = ep + 1, 0
            self.batch_t.append(_now() - tb)
            stop = (cfg.max_samples is not None and self.samples >= cfg.max_samples) or \
                   (cfg.max_seconds is not None and _now() - self.t0 >= cfg.max_seconds)
            if pos == 0 and self.on_epoch is not None and self.on_epoch(self, self.samples // n_file):
                stop = True
            if stop:
                break
        self.stopping = True
        self.wait(lambda: len(self.stopped) == len(self.replicas))
        final = self.snapshot(final=True)
        ps.wait_all([r for _, r in self.task_out.values()], cfg.poll)
        self.shard.serve()             # answer its own final snapshot command, flush replies
        self.wall = _now() - self.t0
        return final

    def _count(self, win):
        for i in range(3):
            self.window[i] += win[i]

    def take_window(self):
        n, l, c = self.window
        self.window = [0, 0.0, 0]
        return n, (l / n if n else math.nan), (c / n if n else math.nan)

    def snapshot(self, final=False):
        reps = self.command(("snapshot", final), reply=True)
        return {k: np.concatenate([r[k] for r in reps], axis=-1) for k in ("x", "s", "y")}

    def stats(self):
        return {"batches": len(self.batch_t), "batch_time": summarize(self.batch_t), "batch_times": self.batch_t,
                "loss": self.loss, "trials": self.trials, "duplicates": self.duplicates,
                "reissued": self.reissued, "slices_by": {str(k): v for k, v in self.slices_by.items()},
                "evaluations": self.e + 1, "samples": self.samples, "wall_s": getattr(self, "wall", 0.0)}
