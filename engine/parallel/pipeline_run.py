"""``run(cfg)`` for ``--parallel pipeline``: K stages x D replicas on K*D ranks.

Rank r is stage ``k = r % K`` of replica ``d = r // K`` (a replica's stages
are consecutive ranks). Stage 0 of replica d reads shard d of D of the
training set and feeds its pipeline; each stage's gradients are summed over
its D replicas before every update (gpipe: one allreduce per mini-batch),
so gpipe on K x D ranks is single-process SGD on D-times larger batches.
Each epoch is one stream of micro-batches ending in a flush: then the
stages' slices are gathered, every rank evaluates a shard of the test set,
rank 0 logs metrics.jsonl and writes one checkpoint with the whole weight
and velocity vectors (resume slices them again, for any partition), so a
resumed gpipe run is the uninterrupted one.

Options (``cfg.extra``): ``stages`` (K, default the number of ranks),
``replicas`` (D, default 1), ``schedule`` (gpipe), ``microbatches`` (M,
default 4), ``predict`` (none), ``partition`` ('0:2,2:4'; default balanced
by the performance model's per-layer time), ``max_samples``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from . import comm as _comm
from .pipeline import TRACE_KEEP, StageExecutor, micro_sizes, split_micro, _host
from .stage import Stage, check_partition, even_partition, format_partition, parse_partition

STATS = "pipeline_stats.json"


OPTIONS = ("stages", "replicas", "schedule", "microbatches", "predict", "partition")


def add_train_options(p):
    """The strategy's own ``sprint train`` options (they land in cfg.extra)."""
    from .pipeline import PREDICT
    from .pipeline_schedule import SCHEDULES
    g = p.add_argument_group("--parallel pipeline")
    g.add_argument("--stages", type=int, default=None, help="pipeline stages K (default: the number of ranks / D)")
    g.add_argument("--replicas", type=int, default=None, help="data-parallel copies D of every stage (K*D ranks)")
    # --schedule already names the learning-rate schedule
    g.add_argument("--pipe-schedule", dest="pipe_schedule", choices=SCHEDULES, default=None,
                   help="gpipe (default), 1f1b (PipeDream) or dualpipe (the seed's)")
    g.add_argument("--microbatches", type=int, default=None, help="micro-batches M per mini-batch (default 4)")
    g.add_argument("--predict", choices=PREDICT, default=None,
                   help="weights a pass uses: none (live), stash (PipeDream), spectrain (predicted)")
    g.add_argument("--partition", default=None, help="layer ranges per stage, e.g. 0:2,2:4 (default: balanced "
                                                     "by the performance model)")


def extra_from_args(args) -> dict:
    """cfg.extra entries of the options given on the command line."""
    given = {k: getattr(args, "pipe_schedule" if k == "schedule" else k, None) for k in OPTIONS}
    return {k: v for k, v in given.items() if v is not None}


def options(cfg, n_ranks):
    """(K, D, schedule, M, predict) from cfg.extra, checked."""
    extra = dict(cfg.extra or {})
    K = int(extra.get("stages") or n_ranks)
    D = int(extra.get("replicas") or 1)
    if K < 1 or D < 1:
        raise ValueError(f"--stages and --replicas must be >= 1 (got {K} and {D})")
    if K * D != n_ranks:
        raise ValueError(f"--stages {K} x --replicas {D} needs mpiexec -n {K * D}, not {n_ranks} rank(s)")
    M = int(extra.get("microbatches") or 4)
    if M < 1 or M > cfg.batch:
        raise ValueError(f"--microbatches must be between 1 and --batch ({cfg.batch}), got {M}")
    return K, D, str(extra.get("schedule") or "gpipe"), M, str(extra.get("predict") or "none")


def choose_partition(cfg, spec, K):
    from engine.spec import layers
    n = len(layers(spec))
    text = (cfg.extra or {}).get("partition")
    if text:
        parts = parse_partition(text, n)
        if len(parts) != K:
            raise ValueError(f"--partition {text} has {len(parts)} stages, --stages says {K}")
        return parts
    if K > n:
        raise ValueError(f"--stages {K} exceeds the {n} layers of {spec.name}")
    try:
        from engine.perf.pipeline import balanced_partition
        return balanced_partition(spec, K, cfg.batch)
    except ImportError:
        return even_partition(n, K)


def run(cfg) -> dict:
    comm = _comm.get_comm()
    _comm.install_abort_hooks(comm)
    with _comm.abort_on_error(comm):
        return _run(cfg, comm)


def _run(cfg, comm):
    from engine import checkpoint as ckpt
    from engine import metrics as _metrics
    from engine.data import Loader
    from engine.net import Net
    from engine.optim import SGD, make_schedule
    from engine.spec import get_spec
    from .runner import _check_ranks_agree
    CHECKPOINT, CONFIG, METRICS, prepare_data, setup_device, _evaluate_sharded = _shared()

    K, D, schedule, M, predict = options(cfg, comm.size)
    be = setup_device(cfg)
    spec = get_spec(cfg.model)
    train_ds, test_ds, deform = prepare_data(cfg, spec)
    root = comm.rank == 0
    try:
        _check_ranks_agree(comm, cfg, spec, train_ds, test_ds)
    except _comm.ConfigMismatch as e:
        if root:
            print(f"sprint: {e}", file=sys.stderr, flush=True)
        comm.barrier()
        raise
    parts = choose_partition(cfg, spec, K)
    check_partition(parts, len(parts) and parts[-1][1])
    comm.check_agreement("partition", format_partition(parts))
    if comm.size > 1 and root:
        print(f"sprint: {comm.rank_map()}", file=sys.stderr, flush=True)
    elif comm.size > 1:
        comm.rank_map()
    k, d = comm.rank % K, comm.rank // K
    stage = Stage(spec, *parts[k], seed=cfg.seed)
    acc = stage.grads.copy()
    sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
    opt = SGD(stage.params, acc, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, schedule=sched)
    state = None
    if cfg.resume:
        state = comm.bcast_obj(ckpt.load(Path(cfg.resume) / CHECKPOINT) if root else None)
        if state.get("spec_hash") != spec.hash():
            raise ValueError(f"checkpoint was written for another network (--resume {cfg.resume})")
        if state.get("mode") != "pipeline":
            raise ValueError(f"checkpoint is from a {state.get('mode')!r} run, not a pipeline (--resume)")
        stage.params[...] = be.xp.asarray(state["params"][stage.p_lo:stage.p_hi])
        opt.velocity[...] = be.xp.asarray(state["momentum"][stage.p_lo:stage.p_hi])
        opt.steps = int(state["stage_steps"][k]) if len(state.get("stage_steps", [])) == K else 0
    start_epoch = int(state["epoch"]) if state else 0

    run_dir = Path(cfg.out) if cfg.out else (Path(cfg.resume) if cfg.resume else None)
    if root and run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(run_dir / CONFIG, json.dumps({"train": cfg.to_dict(), "spec": spec.to_dict(),
                                                    "deform": deform.to_dict()}, indent=2))
        _metrics.truncate(run_dir / METRICS, start_epoch)

    mpi = comm.comm if isinstance(comm, _comm.MPIComm) else None
    rep = _comm.MPIComm(mpi.Split(color=k, key=d)) if D > 1 else None
    base = d * K
    ex = StageExecutor(stage, k, K, schedule, M, predict, opt, acc, mpi_comm=mpi,
                       ranks=(base + k - 1 if k else None, base + k + 1 if k < K - 1 else None, base, base + K - 1),
                       replicas=rep, timeout=float(getattr(cfg, "timeout", None) or
                                                   (cfg.extra or {}).get("timeout", 300.0)))
    loader = None
    # replicas' shards differ by at most one sample: all streams take the
    # smallest, so every stage of every replica runs the same micro-batches
    n_stream = min(len(range(r, len(train_ds), D)) for r in range(D))
    if k == 0:
        loader = Loader(train_ds, cfg.batch, shuffle=True, seed=cfg.seed, deform=deform,
                        prefetch=cfg.prefetch, rank=d, world=D)
    sizes, minis = micro_sizes(n_stream, cfg.batch, M)
    n_upd = len(minis) if schedule == "gpipe" else len(sizes)
    eval_net = Net(spec, seed=cfg.seed)
    log = (lambda msg: print(msg, flush=True)) if (root and cfg.verbose) else (lambda msg: None)
    log(f"sprint pipeline: {K} stage(s) x {D} replica(s), schedule {schedule}, {M} micro-batch(es) of "
        f"mini-batch {cfg.batch}, predict {predict}, partition {format_partition(parts)}, {spec.name} "
        f"({eval_net.n_params:,} params)")
    history, t0 = [], time.perf_counter()
    last_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, cfg.stop_after)
    max_samples = int((cfg.extra or {}).get("max_samples", 0)) or None
    for epoch in range(start_epoch, last_epoch):
        micro = None
        if loader is not None:
            loader.set_epoch(epoch)
            micro = _micro_stream(loader, M, n_stream)
        ex.reset_window()
        t_ep = time.perf_counter()
        ex.run_stream(sizes, minis, micro, epoch_at=lambda u, e=epoch: e + u / n_upd)
        wall = time.perf_counter() - t_ep
        full_w, full_v = _gather(comm, K, stage, opt)
        eval_net.set_flat(full_w)
        test_loss, test_acc = _evaluate_sharded(comm, eval_net, test_ds, cfg, deform)
        s = comm.allreduce_scalars([ex.loss_sum, ex.correct, ex.seen])
        rec = {"epoch": epoch + 1, "step": int(ex.version), "lr": float(sched(epoch + 1)),
               "train_loss": s[0] / s[2], "train_acc": s[1] / s[2], "test_loss": test_loss,
               "test_acc": test_acc, "images_per_s": s[2] / wall, "time": time.perf_counter() - t0,
               "skipped": train_ds.skipped + test_ds.skipped, "parallel": "pipeline", "n_node": comm.size,
               "stages": K, "replicas": D, "schedule": schedule, "predict": predict}
        history.append(rec)
        steps = comm.allgather_obj(opt.steps)[:K]
        if root and run_dir is not None:
            ckpt.save(run_dir / CHECKPOINT, {
                "params": full_w, "momentum": full_v, "mode": "pipeline", "epoch": epoch + 1,
                "samples": int((epoch + 1) * n_stream * D), "step": int(ex.version), "stage_steps": steps,
                "partition": format_partition(parts), "schedule": schedule, "spec": spec.to_dict(),
                "spec_hash": spec.hash(), "deform": deform.to_dict(),
                "rng": {"seed": int(cfg.seed), "next_epoch": epoch + 1}})
            _metrics.append(run_dir / METRICS, rec)
        log(f"epoch {epoch + 1:3d}  train_loss {rec['train_loss']:.4f}  test_loss {test_loss:.4f}  "
            f"test_acc {100 * test_acc:6.2f} %  {rec['images_per_s']:,.0f} img/s  {rec['time']:.1f} s")
        if max_samples and (epoch + 1 - start_epoch) * n_stream * D >= max_samples:
            break
    stats = _stats(comm, ex, K, D, parts, spec, cfg, schedule, predict, M, n_stream, sizes, minis)
    if root and run_dir is not None:
        _atomic_write(run_dir / STATS, json.dumps(stats))
    if not history:
        full_w, _ = _gather(comm, K, stage, opt)
        eval_net.set_flat(full_w)
    final = history[-1] if history else dict(zip(("test_loss", "test_acc"),
                                                  _evaluate_sharded(comm, eval_net, test_ds, cfg, deform)))
    return {"run_dir": str(run_dir) if run_dir else None, "epochs": len(history) + start_epoch,
            "history": history, "test_acc": final.get("test_acc"), "test_loss": final.get("test_loss"),
            "train_loss": final.get("train_loss"), "time_s": time.perf_counter() - t0,
            "n_params": eval_net.n_params, "net": eval_net, "stats": stats, "rank": comm.rank,
            "n_node": comm.size}


def _shared():
    """The pieces every run shares: from engine.session once it exists (the
    session layer is landing beside this module), else from engine.train."""
    try:
        from engine.session import CHECKPOINT, CONFIG, METRICS, evaluate_sharded, prepare_data, setup_device

        def evaluate(comm, net, ds, cfg, deform):
            return evaluate_sharded(comm, net, ds, cfg.eval_batch, deform)
    except ImportError:
        from engine.train import CHECKPOINT, CONFIG, METRICS, prepare_data, setup_device
        from .runner import _evaluate_sharded as evaluate
    return CHECKPOINT, CONFIG, METRICS, prepare_data, setup_device, evaluate


def _micro_stream(loader, m, n_stream):
    left = n_stream
    for x, y in loader:
        if left <= 0:
            return
        if len(y) > left:
            x, y = x[:left], y[:left]
        left -= len(y)
        yield from split_micro(x, y, m)


def _gather(comm, K, stage, opt):
    """The whole weight and velocity vectors on every rank (stage order)."""
    pieces = comm.allgather_obj((_host(stage.params), _host(opt.velocity)))[:K]
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


def _atomic_write(path: Path, text: str):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _stats(comm, ex, K, D, parts, spec, cfg, schedule, predict, M, n_stream, sizes, minis) -> dict:
    from .timers import summarize
    T = ex.timers.samples
    mine = {"stage": ex.k, "replica": comm.rank // K,
            "layers": ex.stage.names(), "n_params": ex.stage.n_params,
            "timers": {n: summarize(v) for n, v in T.items()},
            "trace": ex.trace[-TRACE_KEEP:]}
    stream = sum(T.get("stream", [])) or 1e-12
    busy = sum(sum(T.get(n, [])) for n in ("fwd", "bwd", "update"))
    mine["busy_s"], mine["wall_s"] = busy, stream
    mine["bubble"] = max(0.0, 1.0 - busy / stream)
    errs = [r for r in ex.trace if "err_stale" in r]
    if errs:
        mine["err_stale_mean"] = float(np.mean([r["err_stale"] for r in errs]))
        hats = [r["err_hat"] for r in errs if "err_hat" in r]
        if hats:
            mine["err_hat_mean"] = float(np.mean(hats))
            mine["err_ratio"] = mine["err_hat_mean"] / mine["err_stale_mean"] if mine["err_stale_mean"] else None
    stages = comm.allgather_obj(mine)
    return {"mode": "pipeline", "model": spec.name, "n_node": comm.size, "stages": K, "replicas": D,
            "schedule": schedule, "predict": predict, "microbatches": M, "n_subbatch": int(cfg.batch),
            "partition": format_partition(parts), "n_param": int(sum(s["n_params"] for s in stages[:K])),
            "samples": int(n_stream * D * len(ex.timers.samples.get("stream", []))),
            "minibatch": [int(n * D) for n in ((minis if schedule == "gpipe" else sizes)[:TRACE_KEEP])],
            "wall_s": max(s["wall_s"] for s in stages), "per_stage": stages}
