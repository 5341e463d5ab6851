"""``sprint train --parallel layerwise --plan PLAN.json`` under ``mpiexec -n N``:
the training loop around engine.parallel.layerwise.

Every rank reads the same mini-batches (same seed) and runs its part of
every layer as the plan says; the plan is checked against the net, the
batch and the number of ranks before any data is read. A partial last
mini-batch of an epoch is dropped: the plan is for one batch size. At the
end of each epoch the owners' slices of the weights and the velocity are
gathered on every rank, rank 0 evaluates and writes the checkpoint (whole
vectors: ``sprint eval`` reads it like any other, and ``--resume`` loads it
on every rank: bit-identical to an uninterrupted run in a manual 2-rank
check, not yet a test).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from . import comm as _comm


def add_train_options(p):
    g = p.add_argument_group("--parallel layerwise")
    g.add_argument("--plan", default=None, help="layer-wise plan from `sprint plan --out PLAN.json`")


def extra_from_args(args) -> dict:
    return {"plan": args.plan} if getattr(args, "plan", None) else {}


def load_checked_plan(cfg, n_ranks):
    """The run's plan, refused (one message) unless it fits the net, --batch and the ranks."""
    from engine.perf.layerwise import Plan, check_plan
    from engine.spec import get_spec
    path = (cfg.extra or {}).get("plan")
    if not path:
        raise ValueError("--parallel layerwise needs --plan PLAN.json (write one with sprint plan --out)")
    plan = Plan.load(path)
    try:
        check_plan(plan, get_spec(cfg.model), ranks=n_ranks, batch=cfg.batch)
    except ValueError as e:
        raise ValueError(f"plan {path}: {e}") from None
    return plan


def run(cfg) -> dict:
    comm = _comm.get_comm()
    with _comm.abort_on_error(comm):
        return _run(cfg, comm)


def _run(cfg, comm):
    from engine import backend
    from engine import checkpoint as ckpt
    from engine import metrics as _metrics
    from engine.data import Loader
    from engine.spec import get_spec
    from engine.train import CHECKPOINT, CONFIG, METRICS, build, evaluate, load_state, prepare_data, \
        setup_device, state_dict
    from .layerwise import LayerwiseExecutor
    plan = load_checked_plan(cfg, comm.size)
    be = setup_device(cfg)
    if be.name != "cpu":
        raise ValueError("--parallel layerwise runs on the CPU backend for now (--device cpu)")
    spec = get_spec(cfg.model)
    train_ds, test_ds, deform = prepare_data(cfg, spec)
    net, opt = build(cfg, spec)
    mpi = getattr(comm, "comm", None)
    if mpi is None:
        from mpi4py import MPI
        mpi = MPI.COMM_SELF
    ex = LayerwiseExecutor(net, plan, mpi)
    root = comm.rank == 0
    run_dir = Path(cfg.out) if cfg.out else None
    start = 0
    if cfg.resume:
        start = load_state(net, opt, ckpt.load(Path(cfg.resume) / CHECKPOINT))
        run_dir = run_dir or Path(cfg.resume)
    if run_dir is not None and root:
        run_dir.mkdir(parents=True, exist_ok=True)
        _atomic(run_dir / CONFIG, json.dumps({"train": cfg.to_dict(), "spec": spec.to_dict(),
                                              "deform": deform.to_dict(), "plan": plan.to_dict()}, indent=2))
        _metrics.truncate(run_dir / METRICS, start)
    loader = Loader(train_ds, cfg.batch, shuffle=True, seed=cfg.seed, deform=deform, prefetch=cfg.prefetch,
                    drop_last=True)
    steps = len(loader)
    if steps == 0:
        raise ValueError(f"--batch {cfg.batch} is larger than the {len(train_ds)} training images")
    if root and cfg.verbose:
        print(f"{spec.name}: layer-wise plan on {comm.size} rank(s), batch {cfg.batch}, {steps} steps per epoch: "
              + ", ".join(f"{k}{tuple(v)}" for k, v in plan.layers.items()), flush=True)
    history, t0, step_times = [], time.perf_counter(), []
    for epoch in range(start, cfg.epochs):
        loader.set_epoch(epoch)
        loss_sum, right, seen, te = 0.0, 0, 0, time.perf_counter()
        for i, (x, y) in enumerate(loader):
            ts = time.perf_counter()
            loss, r = ex.step(x, y)
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss became {loss} at epoch {epoch + 1}, step {i + 1}: lower --lr")
            opt.step(epoch + i / steps)
            step_times.append(time.perf_counter() - ts)
            loss_sum, right, seen = loss_sum + loss * len(y), right + r, seen + len(y)
        train_time = time.perf_counter() - te
        ex.gather_params()
        ex.sync_vector(opt.velocity)
        rec = {"epoch": epoch + 1, "step": opt.steps, "lr": opt.lr_at(epoch + 1), "train_loss": loss_sum / seen,
               "train_acc": right / seen, "images_per_s": seen / train_time, "time": time.perf_counter() - t0}
        if root:
            rec["test_loss"], rec["test_acc"] = evaluate(net, test_ds, cfg.eval_batch, deform)
            if run_dir is not None:
                ckpt.save(run_dir / CHECKPOINT, state_dict(net, opt, epoch + 1, cfg, deform))
                _metrics.append(run_dir / METRICS, rec)
            if cfg.verbose:
                print(f"epoch {epoch + 1:3d}  train_loss {rec['train_loss']:.4f}  test_acc "
                      f"{100 * rec['test_acc']:6.2f} %  {rec['images_per_s']:,.0f} img/s", flush=True)
        history.append(rec)
        if cfg.stop_after is not None and epoch + 1 >= cfg.stop_after:
            break
    if root and run_dir is not None:
        steps_sorted = sorted(step_times)
        _atomic(run_dir / "layerwise_stats.json", json.dumps(
            {"ranks": comm.size, "plan": plan.to_dict(), "steps": len(step_times),
             "step_s_median": steps_sorted[len(steps_sorted) // 2] if steps_sorted else None,
             "predicted_step_s": plan.predicted.get("step_s")}, indent=1))
    final = history[-1] if history else {}
    return {"run_dir": str(run_dir) if run_dir else None, "epochs": len(history) + start, "history": history,
            "test_acc": final.get("test_acc"), "test_loss": final.get("test_loss"),
            "train_loss": final.get("train_loss"), "time_s": time.perf_counter() - t0, "n_params": net.n_params,
            "net": net, "optimizer": opt, "rank": comm.rank, "n_node": comm.size,
            "step_times": step_times}


def _atomic(path: Path, text: str):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
