"""``sprint train --parallel layerwise --plan PLAN.json`` under ``mpiexec -n N``:
the training loop around engine.parallel.layerwise, on engine.session.Session
(run folder, watchdog, evaluation, metrics) and under the abort rules every
MPI strategy shares (abort.run_guarded: a failed rank ends the job naming it).

Every rank reads the same mini-batches (same seed) and runs its part of
every layer as the plan says; the plan is checked against the net, the
batch and the number of ranks before any data is read. A partial last
mini-batch of an epoch is dropped: the plan is for one batch size.

During training a rank holds only its slices of the weights, gradients and
velocity. At the end of each epoch the owners' slices are gathered into
whole vectors (Allgatherv of the weights for the sharded evaluation, Gatherv
of the velocity to rank 0) and rank 0 writes the one checkpoint.npz of the
run, in the format of a one-process run, then they are freed. That is
FSDP's ``FULL_STATE_DICT(rank0_only)`` rather than a sharded checkpoint
(PyTorch DCP, Megatron): the nets of this family are a few MB, and one
whole file lets ``sprint eval``, ``--init-from`` and ``--resume`` under any
other plan or rank count (each rank takes its slices) read it as it is; a
net that does not fit one host would need the sharded form.
"""
from __future__ import annotations

import math
import os
import time

from . import comm as _comm
from .abort import run_guarded
from .layerwise_report import STATS_FILE as STATS      # sprint report reads it
from engine.errors import counted


def add_train_options(p):
    g = p.add_argument_group("--parallel layerwise")
    g.add_argument("--plan", default=None, help="layer-wise plan from `sprint plan --out PLAN.json`")


def extra_from_args(args) -> dict:
    # resolved: config.json keeps it, and --resume from another folder read a
    # relative path from there ("cannot read plan p.json")
    return {"plan": os.path.abspath(args.plan)} if getattr(args, "plan", None) else {}


def load_checked_plan(cfg, n_ranks):
    """The run's plan, refused (one message) unless it fits the net, --batch and the ranks."""
    from engine.errors import RunError
    from engine.perf.layerwise import Plan, check_plan
    from engine.spec import get_spec
    path = (cfg.extra or {}).get("plan")
    if not path:
        raise ValueError("--parallel layerwise needs --plan PLAN.json (write one with sprint plan --out)")
    if not os.path.exists(path):
        from engine.errors import MissingFile
        raise MissingFile("no such file for --plan; write one with sprint plan --out", path)
    plan = Plan.load(path)
    try:
        check_plan(plan, get_spec(cfg.model), batch=cfg.batch)        # the net and batch, then the ranks
    except ValueError as e:
        raise ValueError(f"plan {path}: {e}") from None
    used = max(math.prod(c) for c in plan.layers.values())
    if n_ranks < used:
        # said "conv1: configuration (1, 2, 1, 1) needs 2 devices, the job has 1 rank(s)"
        raise RunError(f"the plan is for {plan.devices} devices, the job has {counted(n_ranks, 'rank')}: run it "
                       f"with mpiexec -n {plan.devices}, as sprint plan printed"
                       + (f", or plan for {n_ranks} (sprint plan --gpus {n_ranks})" if n_ranks > 1 else ""), path)
    if n_ranks > plan.devices:
        # the executor would give the extra ranks no block of any layer: they
        # would only wait in every exchange, which nobody asks for
        raise RunError(f"the plan is for {plan.devices} devices, the job has {n_ranks} ranks: "
                       f"{_ranks(plan.devices, n_ranks)} would hold no layer; run it with mpiexec -n "
                       f"{plan.devices}, or plan for {n_ranks} (sprint plan --gpus {n_ranks})", path)
    return plan


def idle_ranks_note(plan, n_ranks) -> str:
    """'; ranks 2..3 hold no layer ...' when no layer splits as many ways as
    there are ranks (an optimum that leaves devices out)."""
    used = max(math.prod(cfg) for cfg in plan.layers.values())
    if used >= n_ranks:
        return ""
    return f"; {_ranks(used, n_ranks)} hold no layer (no layer of the plan splits more than {used} ways) and only wait"


def _ranks(lo, hi):
    return f"rank {lo}" if lo == hi - 1 else f"ranks {lo}..{hi - 1}"


def run(cfg) -> dict:
    return run_guarded(_run, cfg)


def _run(cfg, comm):
    from engine.session import Session
    plan = load_checked_plan(cfg, comm.size)        # before Session reads any data
    with Session(cfg, comm) as s:
        return _train(s, cfg, comm, plan)


def _train(s, cfg, comm, plan):
    from engine.data import Loader
    from engine.errors import RunError
    from engine.net import Net
    from engine.optim import SGD, make_schedule
    from .layerwise import LayerwiseExecutor
    from .runner import ranks_agree_or_refuse
    if s.gpu:
        # every rank refuses alike, before any collective: one line, from rank 0
        e = _comm.ConfigMismatch("--parallel layerwise runs on the CPU backend for now (--device cpu)")
        e.reported_by_root = comm.rank != 0
        raise e
    ranks_agree_or_refuse(s, comm, cfg)
    spec = s.spec
    mpi = getattr(comm, "comm", None)
    if mpi is None:
        from mpi4py import MPI
        mpi = MPI.COMM_SELF
    ex = LayerwiseExecutor(Net(spec, seed=cfg.seed), plan, mpi)     # the whole net is dropped here
    sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
    opt = SGD(ex.params, ex.grads, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, schedule=sched)
    state = s.load_state()
    start = 0
    if state is not None:
        ex.take(state["params"])
    if cfg.resume:
        if "optim" not in state:
            raise RunError("the checkpoint holds no optimizer state to resume layer-wise from", cfg.resume)
        o = state["optim"]
        ex.take_into(opt.velocity, o["velocity"])
        opt.steps, opt.epoch = int(o["steps"]), float(o["epoch"])
        start = int(state["epoch"])
    s.start(start)
    loader = Loader(s.train_ds, cfg.batch, shuffle=True, seed=cfg.seed, deform=s.deform, prefetch=cfg.prefetch,
                    drop_last=True)
    steps = len(loader)
    if steps == 0:
        raise ValueError(f"--batch {cfg.batch} is larger than the {len(s.train_ds)} training images")
    s.log(f"{spec.name}: layer-wise plan on {counted(comm.size, 'rank')}, batch {cfg.batch}, {counted(steps, 'step')} per epoch, "
          f"{ex.params.size:,} of {ex.n_params:,} parameters on rank 0: "
          + ", ".join(f"{k}{tuple(v)}" for k, v in plan.layers.items()) + idle_ranks_note(plan, comm.size))
    last = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, cfg.stop_after)
    step_times = []
    for epoch in range(start, last):
        loader.set_epoch(epoch)
        loss_sum, right, seen, te = 0.0, 0, 0, time.perf_counter()
        for i, (x, y) in enumerate(loader):
            ts = time.perf_counter()
            loss, r = ex.step(x, y)
            if not math.isfinite(loss):
                raise s.diverged(loss, epoch + 1, i + 1, opt.lr_at(epoch + i / steps))
            opt.step(epoch + i / steps)
            step_times.append(time.perf_counter() - ts)
            loss_sum, right, seen = loss_sum + loss * len(y), right + r, seen + len(y)
        train_time = time.perf_counter() - te
        net = _whole_net(ex, spec)
        test_loss, test_acc = s.evaluate(net)
        rec = {"epoch": epoch + 1, "step": opt.steps, "lr": opt.lr_at(epoch + 1), "train_loss": loss_sum / seen,
               "train_acc": right / seen, "test_loss": test_loss, "test_acc": test_acc,
               "images_per_s": seen / train_time, "time": time.perf_counter() - s.t0,
               "skipped": s.train_ds.skipped + s.test_ds.skipped, "parallel": "layerwise", "n_node": comm.size}
        velocity = ex.whole(opt.velocity, root=0)
        s.end_epoch(rec, None if velocity is None else _state(net, opt, velocity, epoch + 1, cfg, s, plan))
    stats = {"mode": "layerwise", "ranks": comm.size, "plan": plan.to_dict(), "steps": len(step_times),
             "params_held": comm.allgather_obj(int(ex.params.size)), "n_params": ex.n_params,
             "step_s_median": sorted(step_times)[len(step_times) // 2] if step_times else None,
             "predicted_step_s": plan.predicted.get("step_s")}
    s.write_stats(STATS, stats)
    return s.result(_whole_net(ex, spec), len(s.history), optimizer=opt, executor=ex, rank=comm.rank,
                    n_node=comm.size, step_times=step_times, stats=stats)


def _whole_net(ex, spec):
    """A Net with the gathered whole weights (for evaluation and the result; freed by the caller)."""
    from engine.net import Net
    net = Net(spec, dtype=ex.dtype)
    net.set_flat(ex.whole(ex.params))
    return net


def _state(net, opt, velocity, epoch, cfg, s, plan) -> dict:
    """A one-process checkpoint (engine.train.state_dict's fields) of the gathered vectors."""
    o = opt.state_dict()
    o["velocity"] = velocity
    return {"params": net.params.copy(), "optim": o, "epoch": int(epoch), "step": int(opt.steps),
            "rng": {"seed": int(cfg.seed), "next_epoch": int(epoch)}, "spec": s.spec.to_dict(),
            "spec_hash": s.spec.hash(), "deform": s.deform.to_dict(), "mode": "layerwise", "plan": plan.to_dict()}
