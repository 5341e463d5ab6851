"""``run(cfg)``: a TrainConfig trained by Downpour SGD (:mod:`engine.parallel.downpour`),
its servers and replicas over the roles, data, evaluation and checkpoints
of :class:`engine.parallel.ps.PSJob`."""
from __future__ import annotations

import numpy as np

from . import ps
from .downpour import DownpourConfig, DownpourReplica, DownpourServer
from .ps_optim import make_server_opt
from .ps_report import summarize_downpour as summarize_stats


def slow_factor_of(cfg, rank, servers) -> float:
    """``--slow-rank R --slow-factor F`` (a benchmarking aid): MPI rank R, a
    replica, sleeps F-1 times its compute time after every step."""
    extra = cfg.extra or {}
    r = extra.get("slow_rank")
    if r is None:
        return 1.0
    if not servers <= int(r):
        raise ValueError(f"--slow-rank {r} is a server rank; replicas are ranks {servers} and up (--slow-rank)")
    return float(extra.get("slow_factor", 2.0)) if int(r) == rank else 1.0


def add_train_options(parser):
    ps.add_train_options(parser, "downpour")


def extra_from_args(args) -> dict:
    return ps.extra_from_args(args, "downpour")


def run(cfg) -> dict:
    return ps.launch(cfg, "downpour", _run)


def _run(job):
    from engine.data import Loader
    from .runner import NetSource
    cfg, comm = job.cfg, job.comm
    extra = dict(cfg.extra or {})
    S, R, rank, mc = job.S, job.R, job.rank, comm.comm
    kind = extra.get("server_opt", "adagrad")
    dcfg = DownpourConfig(lr=job.sched, fetch_every=int(extra.get("fetch_every", 1)),
                          push_every=int(extra.get("push_every", 1)), max_samples=job.max_samples,
                          max_seconds=extra.get("max_seconds"), n_file=job.n_file,
                          slow_factor=slow_factor_of(cfg, rank, S))
    state, w_final = job.state, None
    if job.is_server:
        lo, hi = job.bounds[rank]
        opt = make_server_opt(kind, hi - lo, cfg.momentum, cfg.weight_decay)
        versions = [0] * S
        if state is not None:
            saved = state["opt"]
            if saved.get("kind") != kind:
                raise ValueError(f"checkpoint's servers ran {saved.get('kind')!r}, not {kind!r} (--server-opt)")
            opt.load({k: np.asarray(v)[lo:hi] for k, v in saved.items() if k != "kind"})
            versions = list(state.get("versions", versions)) + [0] * S
        srv = DownpourServer(mc, rank, job.bounds, job.w0, opt, range(S, comm.size), dcfg,
                             start_samples=job.start_samples, start_version=int(versions[rank]))
        if rank == 0:
            srv.on_epoch = lambda s, epoch: job.end_epoch(epoch, *_assemble(s.gather(), kind), s.take_window())
        with job.serving():
            srv.run()
            if rank == 0:
                w_final = _assemble(srv.gather(final=True), kind)[0]
        if srv.diverged is not None:
            raise job.diverged(*srv.diverged)
        mine = srv.stats()
    else:
        net = job.net()
        net.set_flat(job.w0)
        loader = Loader(job.train_ds, cfg.batch, shuffle=True, seed=cfg.seed, deform=job.deform, prefetch=0,
                        rank=rank - S, world=R)
        src = NetSource(net, loader, epoch=job.start_epoch)
        with job.serving():
            rep = DownpourReplica(mc, job.bounds, src, dcfg, index=rank - S).run()
        if rep.diverged is not None:
            raise job.diverged(*rep.diverged)
        mine = rep.stats()
    allst = comm.allgather_obj(mine)
    stats = summarize_stats(allst[:S], allst[S:], {
        "model": job.spec.name, "n_param": job.n_param, "n_subbatch": int(cfg.batch), "n_file": job.n_file,
        "server_opt": kind, "fetch_every": dcfg.fetch_every, "push_every": dcfg.push_every,
        "backend": getattr(job.be, "name", "cpu")})
    return job.finish(stats, w_final)


def _assemble(snaps, kind):
    """Full weights, optimizer state and counters from every shard's snapshot."""
    w = np.concatenate([s["w"] for s in snaps])
    opt = {"kind": kind, **{k: np.concatenate([s["opt"][k] for s in snaps]) for k in snaps[0]["opt"]}}
    counters = {"samples": int(snaps[0]["samples"]), "step": int(snaps[0]["version"]),
                "versions": [int(s["version"]) for s in snaps]}
    return w, opt, counters
