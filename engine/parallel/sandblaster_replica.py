"""Sandblaster's model replicas, and ``run(cfg)``: a TrainConfig trained by
Sandblaster L-BFGS (roles, data, evaluation and checkpoints as Downpour's,
:class:`engine.parallel.ps.PSJob`)."""
from __future__ import annotations

import time

import numpy as np

from . import ps
from .sandblaster import Coordinator, SandblasterConfig, SandShard
from .timers import StepTimers

_now = time.perf_counter


class SliceSource:
    """The summed gradient of a slice (epoch, [lo, hi)) of the epoch's
    permutation on the engine's Net, deformed with a slice-seeded rng."""

    def __init__(self, net, loader, seed):
        self.net, self.loader, self.seed = net, loader, int(seed)
        self.weights = net.params
        self._perm = (None, None)

    def __call__(self, ep, lo, hi):
        from ._xp import to_host
        if self._perm[0] != ep:
            self._perm = (ep, np.random.default_rng([self.seed, ep]).permutation(len(self.loader.dataset)))
        idx = self._perm[1][lo:hi]
        x, y = self.loader.load(idx)
        x, y = self.loader.deform(x, y, np.random.default_rng([self.seed, ep, lo, 7]))
        loss, correct = self.net.loss_and_grad(x, y)
        n = len(idx)
        return to_host(self.net.grads) * np.float32(n), n, float(loss) * n, int(correct)


class SandReplica:
    def __init__(self, comm, bounds, source, cfg: SandblasterConfig, index=0):
        from mpi4py import MPI
        self.MPI, self.comm, self.bounds, self.src, self.cfg = MPI, comm, bounds, source, cfg
        self.index, self.S = index, len(bounds)
        self.e = -1
        self.inbox = [ps.packed(hi - lo) for lo, hi in bounds]
        self.outbox = [ps.packed(hi - lo) for lo, hi in bounds]
        self.push_reqs = [None] * self.S
        self.done_buf, self.done_req = np.zeros(6, np.float64), None
        self.T = StepTimers()
        self.slices = self.stale = 0

    def fetch(self, e) -> bool:
        """The point of evaluation e from every shard; False when a shard has
        already moved past e (the task is a late copy: skip it)."""
        ps.fetch_all(self.comm, self.inbox, [np.array([e], np.float64), self.MPI.DOUBLE], self.cfg.poll)
        if any(int(ps.header(b)[0]) != e for b in self.inbox):
            return False
        ps.assemble_into(self.src.weights, self.bounds, self.inbox)
        self.e = e
        return True

    def run(self):
        MPI, comm, cfg, T = self.MPI, self.comm, self.cfg, self.T
        task, tiny = np.zeros(6, np.float64), np.zeros(1, np.float32)
        t_start = _now()
        while True:
            ps.alive()
            t0 = _now()
            r = comm.Irecv([task, MPI.DOUBLE], source=0, tag=ps.TASK)
            ps.wait_all([r, comm.Isend([tiny, MPI.FLOAT], dest=0, tag=ps.REQ)], cfg.poll)
            T.add("WaitTask", _now() - t0)
            e, sid, ep, lo, hi, stop = (int(v) for v in task)
            if stop:
                break
            t0 = _now()
            ok = e == self.e or self.fetch(e)
            T.add("Fetch", _now() - t0)
            if not ok:
                self.stale += 1
                continue
            t0 = _now()
            g, n, loss, correct = self.src(ep, lo, hi)
            dt = _now() - t0
            if cfg.slow_factor > 1:
                time.sleep((cfg.slow_factor - 1) * dt)
            T.add("Compute", _now() - t0)
            t0 = _now()
            T.add("Wait", ps.wait_all(self.push_reqs + [self.done_req], cfg.poll))
            self.push_reqs = ps.push_all(comm, self.bounds, self.outbox, g, [(e, sid, n, loss, correct)] * self.S)
            self.done_buf[:] = (e, sid, n, loss, correct, dt)
            self.done_req = comm.Isend([self.done_buf, MPI.DOUBLE], dest=0, tag=ps.SLICE)
            T.add("Push", _now() - t0)
            self.slices += 1
        ps.wait_all(self.push_reqs + [self.done_req], cfg.poll)
        self.wall = _now() - t_start
        return self

    def stats(self):
        return {"replica": self.index, "slices": self.slices, "stale_tasks": self.stale,
                "slow_factor": self.cfg.slow_factor, "wall_s": getattr(self, "wall", 0.0),
                "timers": self.T.summary()}


# ---- the engine's run -------------------------------------------------------------
def add_train_options(parser):
    ps.add_train_options(parser, "sandblaster")


def extra_from_args(args) -> dict:
    return ps.extra_from_args(args, "sandblaster")


def run(cfg) -> dict:
    return ps.launch(cfg, "sandblaster", _run)


def _run(job):
    from engine.data import Loader
    from .downpour_run import slow_factor_of
    from .ps_report import summarize_sandblaster
    cfg, comm = job.cfg, job.comm
    extra = dict(cfg.extra or {})
    S, rank, mc = job.S, job.rank, comm.comm
    scfg = SandblasterConfig(batch=int(cfg.batch), slice=int(extra.get("slice", min(32, cfg.batch))),
                             history=int(extra.get("history", 10)), weight_decay=cfg.weight_decay,
                             n_file=job.n_file, max_samples=job.max_samples,
                             max_seconds=extra.get("max_seconds"), backup=bool(extra.get("backup", True)),
                             slow_factor=slow_factor_of(cfg, rank, S), seed=cfg.seed)
    state = job.state["opt"] if job.state is not None else None
    final = None
    if job.is_server:
        shard = SandShard(mc, rank, job.bounds, job.w0, scfg, state)
        if rank == 0:
            coord = Coordinator(mc, shard, S, range(S, comm.size), scfg, start_samples=job.start_samples)
            coord.deterministic = not job.deform.augments

            def on_epoch(c, epoch):
                snap = c.snapshot()
                counters = {"samples": c.samples, "step": len(c.batch_t)}
                return job.end_epoch(epoch, snap["x"], {"kind": "lbfgs", **snap}, counters, c.take_window())

            coord.on_epoch = on_epoch
            with job.serving():
                final = coord.run()
            mine = {**shard.stats(), "coordinator": coord.stats()}
        else:
            with job.serving():
                shard.serve()
            mine = shard.stats()
    else:
        net = job.net()
        loader = Loader(job.train_ds, 1, shuffle=False, deform=job.deform, prefetch=0)
        with job.serving():
            mine = SandReplica(mc, job.bounds, SliceSource(net, loader, cfg.seed), scfg, index=rank - S).run().stats()
    allst = comm.allgather_obj(mine)
    stats = summarize_sandblaster(allst[:S], allst[S:], {
        "model": job.spec.name, "n_param": job.n_param, "n_subbatch": scfg.batch, "slice": scfg.slice,
        "history": scfg.history, "backup": scfg.backup, "n_file": job.n_file,
        "backend": getattr(job.be, "name", "cpu")})
    return job.finish(stats, final["x"] if final is not None else None)
