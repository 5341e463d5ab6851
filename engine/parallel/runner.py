"""``run(cfg)``: a TrainConfig trained by SPRINT ASGD or synchronous SGD.

Every MPI rank is a node running ``cfg.workers`` workers (each its own Net
and data shard ``rank * workers + t`` of ``n_node * workers``). The run
folder, evaluation, logging and the watchdog are engine.session's: rank 0
writes, all ranks start from rank 0's weights, evaluate a shard of the test
set each and average. Ranks that disagree on options, network or data
refuse to start, naming what differs. ``cfg.batch`` is N_Subbatch, per worker.

Options in ``cfg.extra``: ``min_grads`` (ASGD, default 1), ``lockstep``
(ASGD, deterministic), ``max_pending`` (ASGD, bounded accumulation; the
strategy table's default 2, 0 = off), ``bucket_bytes`` (sync), ``max_seconds``,
``mpi_poll`` (seconds; poll instead of busy-waiting in MPI), ``max_samples``,
``worker_nice`` (CPU: niceness added to worker threads so the updater is
scheduled first; default 10).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time

import numpy as np

from . import comm as _comm
from .abort import run_guarded
from .asgd import ASGD, ASGDConfig
from .source import NonFiniteLoss, Step
from .sync import SyncConfig, SyncSGD
from .threads import limit_this_thread, threads_per_worker
from engine.errors import counted

STATS = {"asgd": "asgd_stats.json", "sync": "sync_stats.json"}
# CPU runs, where the updater shares cores with the workers: it waits for an
# allreduce by sleeping between polls (seconds) rather than in MPICH's busy
# loop, and the workers run this much nicer. The profile sweeps
# (engine.perf.sweep) use the same two numbers, so the model prices the same
# scheduling the runner gets.
CPU_MPI_POLL = 2e-4
CPU_WORKER_NICE = 10
# TrainConfig fields that may differ between ranks without changing the run.
_LOCAL_FIELDS = ("progress", "verbose", "out", "resume", "device", "threads", "prefetch", "timeout")


class NetSource:
    """Worker source over a Net and a sharded Loader: LoadImage, DeformImage
    and ComputeGradient of one sub-batch at a time, epoch after epoch."""

    def __init__(self, net, loader, epoch=0, threads=None, gpu=False, nice=0):
        self.net, self.loader = net, loader
        self.nice = int(nice)
        self.weights = net.params
        self.threads = threads
        self.gpu = gpu
        # the worker thread adopts this (the rank's) GPU: a new thread starts on device 0
        from engine.backend import follow_device
        self._follow_device = follow_device()
        self.epoch = int(epoch)
        self._start_epoch(self.epoch)

    def _start_epoch(self, epoch):
        self.epoch = epoch
        self.loader.set_epoch(epoch)
        self.idx = self.loader.indices()
        self.pos = 0
        self.rng = np.random.default_rng([self.loader.seed, epoch, self.loader.rank, 1])

    def setup_thread(self):
        if self.threads:
            limit_this_thread(self.threads)
        if self.nice:
            # Workers yield to the updater thread (and its MPI progress) when
            # they share cores with it: a late allreduce grows the minibatch.
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (OSError, AttributeError):
                pass
        self._follow_device()
        if self.gpu:
            import cupy

            from engine.backend import synchronize
            # each worker its own stream: two workers overlap on one GPU. The
            # stream does not wait for the null stream, where the net, its
            # weights and the data were written: let that work finish first
            synchronize()
            self._stream = cupy.cuda.Stream(non_blocking=True)
            self._stream.use()

    def load(self):
        if self.pos >= len(self.idx):
            self._start_epoch(self.epoch + 1)
        sel = self.idx[self.pos:self.pos + self.loader.batch]
        self.pos += len(sel)
        return self.loader.load(sel)

    def deform(self, batch):
        return self.loader.deform(batch[0], batch[1], self.rng)

    def compute(self, batch):
        x, y = batch
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # reported as divergence
            loss, correct = self.net.loss_and_grad(x, y)
        if not math.isfinite(loss):
            raise NonFiniteLoss(loss, self.epoch + 1)
        return Step(grad=self.net.grads, n=int(len(y)), loss=loss, correct=int(correct))


def _data_fingerprint(ds) -> str:
    """Hash of every sample (x and y), so ranks whose data differ in one image
    refuse to start; the buffers are hashed in place (no copy: about 0.13 s
    for MNIST's 47 MB).  A lazy image tree is fingerprinted by its file list
    and labels (its pixels are not in memory)."""
    h = _comm.hashlib.sha256()
    h.update(repr((type(ds).__name__, tuple(ds.shape), len(ds), int(ds.n_classes))).encode())
    h.update(memoryview(np.ascontiguousarray(ds.y)).cast("B"))
    if hasattr(ds, "x"):
        h.update(str(ds.x.dtype).encode())
        h.update(memoryview(np.ascontiguousarray(ds.x)).cast("B"))
    else:
        h.update("\0".join(ds.files).encode())
    return h.hexdigest()[:16]


def _data_summary(ds) -> str:
    """'name: N images CxHxW, sha256 H': says which set differs and how."""
    return f"{ds.name}: {len(ds)} images {'x'.join(map(str, ds.shape))}, sha256 {_data_fingerprint(ds)}"


def _check_ranks_agree(comm, cfg, spec, train_ds, test_ds):
    opts = {k: v for k, v in cfg.to_dict().items() if k not in _LOCAL_FIELDS}
    comm.check_agreement("options", opts)
    comm.check_agreement("network", {"spec": spec.to_dict()})
    comm.check_agreement("data", {"train": _data_summary(train_ds), "test": _data_summary(test_ds)})


def ranks_agree_or_refuse(s, comm, cfg):
    """Every rank of a Session's run has the same options, network and data,
    or the job refuses to start with rank 0's one line naming what differs.
    Then rank 0 prints every rank's pid: a launcher reports a killed rank
    by pid, this turns it into a rank."""
    try:
        _check_ranks_agree(comm, cfg, s.spec, s.train_ds, s.test_ds)
    except _comm.ConfigMismatch as e:
        # every rank sees the mismatch; make sure rank 0's line is out before
        # any rank's exit can take the job down, and that it is the only one
        if s.root:
            print(f"sprint: error: {e}", file=sys.stderr, flush=True)
        e.reported_by_root = True
        comm.barrier()
        raise
    if comm.size > 1:
        ranks = comm.rank_map()
        if s.root:
            print(f"sprint: {ranks}", file=sys.stderr, flush=True)


def _evaluate_sharded(comm, net, test_ds, cfg, deform):
    """(loss, accuracy) over the whole test set, each rank a shard (for strategies
    not on engine.session.Session yet)."""
    from engine.session import evaluate_sharded
    return evaluate_sharded(comm, net, test_ds, cfg.eval_batch, deform)


def _to_host(a):
    from engine import backend
    return backend.to_host(a)


def run(cfg) -> dict:
    return run_guarded(_run, cfg)


def _run(cfg, comm):
    from engine.session import Session

    mode = cfg.parallel
    if mode not in STATS:
        raise ValueError(f"parallel must be asgd or sync, got {mode!r}")
    with Session(cfg, comm) as s:
        return _train(s, cfg, comm)


def _train(s, cfg, comm):
    from engine.data import Loader
    from engine.net import Net
    from engine.optim import make_schedule
    mode = cfg.parallel
    extra = dict(cfg.extra or {})
    be, gpu, spec = s.backend, s.gpu, s.spec
    if gpu and comm.size > 1:
        _comm.select_device(comm)
    if gpu and isinstance(comm, _comm.MPIComm):
        comm.setup_device()
    if isinstance(comm, _comm.MPIComm) and comm.size > 1:
        # On CPU the updater shares cores with the workers: wait for the
        # allreduce by polling with sleeps, not by MPICH's busy loop.
        comm.poll_interval = float(extra.get("mpi_poll", 0.0 if gpu else CPU_MPI_POLL))
    train_ds, test_ds, deform = s.train_ds, s.test_ds, s.deform
    ranks_agree_or_refuse(s, comm, cfg)

    W, world = cfg.workers, comm.size * cfg.workers
    n_file = len(train_ds)
    nets = [Net(spec, seed=cfg.seed) for _ in range(W)]
    state = s.load_state()
    if cfg.resume and state.get("mode") != mode:
        raise ValueError(f"checkpoint is from a {state.get('mode')!r} run, not {mode!r}")
    w0 = nets[0].params
    if state is not None:
        nets[0].set_flat(state["params"])
    comm.bcast_(w0)                  # every rank starts from rank 0's weights
    start_samples = int(state["samples"]) if cfg.resume else 0
    start_epoch = start_samples // n_file
    s.start(start_epoch)

    # cfg.threads is the process's CPU thread budget, split over its workers
    per_worker = threads_per_worker(W, int(cfg.threads) if cfg.threads else None)
    sources = []
    for t, net in enumerate(nets):
        loader = Loader(train_ds, cfg.batch, shuffle=True, seed=cfg.seed, deform=deform, prefetch=0,
                        rank=comm.rank * W + t, world=world)
        sources.append(NetSource(net, loader, epoch=start_epoch, threads=None if gpu else per_worker,
                                 gpu=gpu, nice=int(extra.get("worker_nice", 0 if gpu else CPU_WORKER_NICE))))
    sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
    max_samples = int(extra.get("max_samples", cfg.epochs * n_file))
    last_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, cfg.stop_after)
    eval_net = Net(spec, seed=cfg.seed)
    s.log(f"sprint {mode}: {counted(comm.size, 'node')} x {counted(W, 'worker')}, N_Subbatch {cfg.batch}, "
          f"{spec.name} ({nets[0].n_params:,} params), {comm.describe(gpu)}, "
          f"{'GPU streams' if gpu else counted(per_worker, 'BLAS thread') + ' per worker'}")

    clock = {"t0": time.perf_counter(), "t_epoch": time.perf_counter(), "epoch": start_epoch, "upd0": 0}
    bar = s.progress(max_samples, mode, unit="img", initial=start_samples)

    def checkpoint_state(trainer, epoch):
        if mode == "asgd":
            mom = trainer.full_delta()
            version = trainer.version
        else:
            mom = _to_host(trainer.v)
            version = trainer.steps
        return {"params": _to_host(trainer.latest).copy(), "momentum": np.asarray(mom),
                "mode": mode, "epoch": int(epoch), "samples": int(trainer.samples_total),
                "step": int(version), "n_node": comm.size, "workers": W,
                "spec": spec.to_dict(), "spec_hash": spec.hash(), "deform": deform.to_dict(),
                "rng": {"seed": int(cfg.seed), "next_epoch": int(epoch)}}

    def on_progress(trainer):
        """After every update/step, identical on all ranks: epoch ends ->
        evaluate, log, checkpoint. Returns True to stop."""
        if bar is not None:
            bar.n = min(trainer.samples_total, max_samples)
            bar.set_postfix(loss=f"{trainer.last_loss:.4f}" if hasattr(trainer, "last_loss") else "")
        epoch = trainer.samples_total // n_file
        if epoch <= clock["epoch"]:
            return False
        clock["epoch"] = epoch
        seen, tr_loss, tr_acc = trainer.take_window()
        now = time.perf_counter()
        pause = trainer.paused() if hasattr(trainer, "paused") else contextlib.nullcontext()
        with pause:
            _end_of_epoch(trainer, epoch, seen, tr_loss, tr_acc, now)
        clock["t_epoch"] = time.perf_counter()
        return epoch >= last_epoch

    def _end_of_epoch(trainer, epoch, seen, tr_loss, tr_acc, now):
        eval_net.set_flat(trainer.latest)
        test_loss, test_acc = s.evaluate(eval_net)
        rec = {"epoch": int(epoch), "step": int(getattr(trainer, "updates", getattr(trainer, "steps", 0))),
               "lr": float(sched(epoch)), "train_loss": tr_loss, "train_acc": tr_acc,
               "test_loss": test_loss, "test_acc": test_acc,
               "images_per_s": seen / (now - clock["t_epoch"]) if now > clock["t_epoch"] else 0.0,
               "time": now - clock["t0"], "skipped": train_ds.skipped + test_ds.skipped,
               "parallel": mode, "n_node": comm.size, "workers": W}
        if mode == "asgd" and trainer.minibatch:
            rec["N_Minibatch_avg"] = float(np.mean(trainer.minibatch[clock["upd0"]:]))
            clock["upd0"] = len(trainer.minibatch)
        # collective (ASGD gathers DeltaWeights)
        st = checkpoint_state(trainer, epoch) if s.run is not None else None
        if bar is not None:
            bar.clear()
        s.end_epoch(rec, st)

    if mode == "asgd":
        acfg = ASGDConfig(lr=sched, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                          max_samples=max_samples, max_seconds=extra.get("max_seconds"),
                          n_file=n_file, min_grads=int(extra.get("min_grads", 1)),
                          lockstep=bool(extra.get("lockstep", False)),
                          max_pending=int(extra.get("max_pending", 0)))
        mom0 = state["momentum"] if cfg.resume else None
        trainer = ASGD(comm, w0, sources, acfg, on_update=on_progress, delta0=mom0,
                       start_samples=start_samples, start_version=int(state["step"]) if cfg.resume else 0)
    else:
        scfg = SyncConfig(lr=sched, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                          max_samples=max_samples, n_file=n_file,
                          bucket_bytes=int(extra.get("bucket_bytes", 4 << 20)))
        v0 = be.xp.asarray(state["momentum"]) if cfg.resume else None
        trainer = SyncSGD(comm, w0, sources, scfg, on_step=on_progress, velocity0=v0,
                          start_samples=start_samples)
        if cfg.resume:
            trainer.steps = int(state["step"])
    try:
        trainer.run()
    except KeyboardInterrupt:
        raise s.interrupted() from None
    except NonFiniteLoss as e:      # raised by every rank at the same update (asgd, sync)
        raise s.diverged(e.loss, e.epoch, None, float(sched(trainer.samples_total / n_file))) from None
    finally:
        if bar is not None:
            bar.close()

    stats = trainer.stats({"model": spec.name, "n_param": int(nets[0].n_params),
                           "n_subbatch": int(cfg.batch), "n_file": n_file,
                           "comm": comm.kind, "device_path": comm.device_path,
                           "backend": getattr(be, "name", "cpu"),
                           "threads_per_worker": None if gpu else per_worker})
    s.write_stats(STATS[mode], stats)
    eval_net.set_flat(trainer.latest)
    more = {"stats": stats, "rank": comm.rank, "n_node": comm.size}
    res = s.result(eval_net, int(trainer.samples_total // n_file), **more)
    if res["test_acc"] is None:
        res["test_loss"], res["test_acc"] = s.evaluate(eval_net)
    return res
