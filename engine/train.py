"""``engine.train(cfg)``: train a TrainConfig with the strategy it names, and
the trivial strategy itself: one process, data -> Net -> SGD, per-epoch
evaluation, checkpoints and exact resume (the run folder, evaluation and
output are engine.session's, shared with every parallel strategy).

All randomness of a run derives from ``cfg.seed``: the initial weights from
``Net(seed)``, each epoch's order and deformations from (seed, epoch).  A
checkpoint after epoch k holds the parameters, the momentum, the step count,
the schedule and that seed, so resuming replays epochs k+1.. exactly as an
uninterrupted run would (bit for bit on the CPU).
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from . import checkpoint as _ckpt
from .session import (CHECKPOINT, CONFIG, METRICS, Session, TrainConfig, auto_threads,  # noqa: F401
                      evaluate, prepare_data, resume_config, setup_device)
from .session import registry as _registry
from .session.setup import SMALL_NET_FLOPS  # noqa: F401
from .errors import RunError
from .errors import counted


def train(cfg: TrainConfig | None = None, **kw) -> dict:
    """Train as ``cfg`` (or TrainConfig(**kw)) says, with the strategy
    ``cfg.parallel`` names; returns the final metrics, this invocation's
    per-epoch history, the run directory and the trained net."""
    if cfg is None:
        cfg = TrainConfig(**kw)
    elif kw:
        raise TypeError("give a TrainConfig or keyword fields, not both")
    return _registry.run(cfg)


def build(cfg: TrainConfig, spec, dtype=np.float32):
    """Net and SGD of a config (fresh, seeded)."""
    from .net import Net
    from .optim import SGD, make_schedule
    net = Net(spec, seed=cfg.seed, dtype=dtype)
    sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
    opt = SGD(net, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, schedule=sched)
    return net, opt


def state_dict(net, opt, epoch, cfg, deform) -> dict:
    from engine import backend
    return {"params": backend.to_host(net.params).copy(), "optim": opt.state_dict(),
            "epoch": int(epoch), "step": int(opt.steps),
            "rng": {"seed": int(cfg.seed), "next_epoch": int(epoch)},
            "spec": net.spec.to_dict(), "spec_hash": net.spec.hash(), "deform": deform.to_dict()}


def load_state(net, opt, state):
    if state.get("spec_hash") != net.spec.hash():
        raise ValueError(f"checkpoint was written for model {state.get('spec', {}).get('name')!r}, "
                         f"not {net.spec.name!r}")
    net.set_flat(state["params"])
    if "optim" not in state:
        raise RunError("the checkpoint holds no optimizer state (written by a parallel strategy?)")
    opt.load_state_dict(state["optim"])
    return int(state["epoch"])


def load_checkpoint(path):
    """(net, state) from a checkpoint file or run directory."""
    from .net import Net
    from .spec import NetSpec
    state = _ckpt.load(path)
    try:
        spec = NetSpec.from_dict(state["spec"])
    except (KeyError, TypeError, ValueError) as e:
        raise _ckpt.CheckpointError(f"the checkpoint's network spec is invalid ({e})", path) from None
    _ckpt.check_params(state, spec, path)
    net = Net(spec)
    net.set_flat(state["params"])
    return net, state


def refuse_launcher_ranks(cfg):
    """Under mpiexec with several ranks, `sprint train` without a strategy would
    train one copy per rank into the same folder: refuse and name the
    strategies. (The Python API lets a rank train alone on purpose.)"""
    from .parallel.launcher import launcher_world_size
    n = launcher_world_size()
    if n > 1:
        choices = [s.name for s in _registry.STRATEGIES.values() if s.distributed]
        # every rank raises it; the CLI says it once for the job (engine.cli._fail)
        raise RunError(f"{n} MPI ranks were started but no parallel strategy was chosen (each rank would "
                       f"train its own copy into the same folder); choose --parallel "
                       f"{' | '.join(choices)}, or run without mpiexec", "--parallel")


# ---- the trivial strategy ----------------------------------------------------
def run_single(cfg: TrainConfig) -> dict:
    """One process: the whole batch on one device, SGD after every batch."""
    from .data import Loader
    s = Session(cfg)
    net, opt = build(cfg, s.spec)
    state = s.load_state()
    start = 0
    if cfg.resume:
        fresh = opt.schedule
        start = load_state(net, opt, state)
        if opt.schedule.to_dict() != fresh.to_dict():
            # more (or fewer) epochs than planned: follow the new plan from here on
            opt.schedule = fresh
    elif state is not None:
        net.set_flat(state["params"])
    s.start(start)

    loader = Loader(s.train_ds, cfg.batch, shuffle=True, seed=cfg.seed, deform=s.deform, prefetch=cfg.prefetch)
    steps = len(loader)
    from engine import backend
    try:
        # the header inside: a Ctrl-C right after it (the user saw training begin) says how to resume
        s.log(f"{s.spec.name}: {net.n_params:,} parameters; {s.train_ds.name} {len(s.train_ds)} / "
              f"{s.test_ds.name} {len(s.test_ds)} images; batch {cfg.batch}, {counted(steps, 'step')} per epoch; "
              f"device {backend.get_backend().name}" + (f"; resuming after epoch {start}" if start else ""))
        # overflow on the way to a NaN loss is reported once, as divergence
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            last = _epochs(s, cfg, net, opt, loader, start)
    except KeyboardInterrupt:
        raise s.interrupted() from None
    return s.result(net, last, optimizer=opt)


def _epochs(s, cfg, net, opt, loader, start):
    from .metrics import Meter
    meter = Meter()
    steps = len(loader)
    t_run = time.perf_counter()
    last = start
    bar = None
    try:
        for epoch in range(start, cfg.epochs):
            loader.set_epoch(epoch)
            meter.reset()
            bar = s.progress(steps, f"epoch {epoch + 1}/{cfg.epochs}")
            for i, (x, y) in enumerate(loader):
                loss, correct = net.loss_and_grad(x, y)
                if not math.isfinite(loss):
                    raise s.diverged(loss, epoch + 1, i + 1, opt.lr_at(epoch + i / steps))
                opt.step(epoch + i / steps)
                meter.add(loss, correct, len(y))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{meter.loss:.4f}", img_s=f"{meter.images_per_s:,.0f}")
            if bar is not None:
                bar.close()
                bar = None
            train_time = meter.elapsed
            test_loss, test_acc = s.evaluate(net)
            rec = {"epoch": epoch + 1, "step": opt.steps, "lr": opt.lr_at(epoch + 1),
                   "train_loss": meter.loss, "train_acc": meter.acc, "test_loss": test_loss,
                   "test_acc": test_acc, "images_per_s": meter.seen / train_time if train_time else 0.0,
                   "time": time.perf_counter() - t_run, "skipped": s.train_ds.skipped + s.test_ds.skipped}
            s.end_epoch(rec, state_dict(net, opt, epoch + 1, cfg, s.deform) if s.run else None)
            last = epoch + 1
            if cfg.stop_after is not None and epoch + 1 >= cfg.stop_after:
                break
    finally:
        if bar is not None:
            bar.close()
    return last


class _CallableModule(type(sys)):
    """Lets ``engine.train(cfg)`` call train() although ``engine.train`` is this module."""

    def __call__(self, cfg=None, **kw):
        return train(cfg, **kw)


sys.modules[__name__].__class__ = _CallableModule
