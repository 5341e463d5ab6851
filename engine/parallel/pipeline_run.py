"""``run(cfg)`` for ``--parallel pipeline``: K stages x D replicas on K*D ranks.

Rank r is stage ``k = r % K`` of replica ``d = r // K`` (a replica's stages
are consecutive ranks). Stage 0 of replica d reads shard d of D of the
training set and feeds its pipeline; each stage's gradients are summed over
its D replicas before every update (gpipe: one allreduce per mini-batch),
so gpipe on K x D ranks is single-process SGD on D-times larger batches.
Each epoch is one stream of micro-batches ending in a flush: then the
stages' slices are gathered, every rank evaluates a shard of the test set
and the session (engine.session.Session: run folder, watchdog, metrics)
records the epoch. Each stage saves its own weights, velocity and update
count in its own file, with a manifest (engine.parallel.pipeline_ckpt);
resume checks the manifest against --stages/--partition and each rank reads
only its own stage's file, so a resumed run is the uninterrupted one.

Options (``cfg.extra``): ``stages`` (K, default the number of ranks),
``replicas`` (D, default 1), ``schedule`` (gpipe), ``microbatches`` (M,
default 4), ``predict`` (none), ``partition`` ('0:2,2:4'; default balanced
by the performance model's per-layer time), ``max_samples``.
"""
from __future__ import annotations

import time

import numpy as np

from engine.errors import counted
from . import comm as _comm
from .abort import run_guarded
from . import pipeline_ckpt as _ck
from .pipeline import TRACE_KEEP, StageDiverged, StageExecutor, micro_sizes, split_micro, _host
from .stage import Stage, even_partition, format_partition, stage_ranges

STATS = "pipeline_stats.json"


OPTIONS = ("stages", "replicas", "schedule", "microbatches", "predict", "partition")


def add_train_options(p):
    """The strategy's own ``sprint train`` options (they land in cfg.extra)."""
    from engine.argtypes import positive_int
    from .pipeline import PREDICT
    from .pipeline_schedule import SCHEDULES
    # --schedule names the learning-rate schedule; the pipeline's names
    # (gpipe, 1f1b, dualpipe) share no value with it, so it takes them too
    lr = p._option_string_actions.get("--schedule")
    if lr is not None and lr.choices is not None:
        lr.choices = list(lr.choices) + [s for s in SCHEDULES if s not in lr.choices]
        lr.help = f"{lr.help}; with --parallel pipeline also {' | '.join(SCHEDULES)} (= --pipe-schedule)"
    g = p.add_argument_group("--parallel pipeline")
    g.add_argument("--stages", type=positive_int, default=None,
                   help="pipeline stages K (default: the number of ranks / D)")
    g.add_argument("--replicas", type=positive_int, default=None,
                   help="data-parallel copies D of every stage (K*D ranks; default 1)")
    g.add_argument("--pipe-schedule", dest="pipe_schedule", choices=SCHEDULES, default=None,
                   help="gpipe (default), 1f1b (PipeDream) or dualpipe (the seed's)")
    g.add_argument("--microbatches", type=positive_int, default=None, help="micro-batches M per mini-batch (default 4)")
    g.add_argument("--predict", choices=PREDICT, default=None,
                   help="weights a pass uses: none (live; the default), stash (PipeDream), spectrain (predicted)")
    g.add_argument("--partition", default=None, help="layer ranges per stage, e.g. 0:2,2:4 (default: balanced "
                                                     "by the performance model)")


def extra_from_args(args) -> dict:
    """cfg.extra entries of the options given on the command line. A
    pipeline schedule given as --schedule moves to --pipe-schedule (the
    learning-rate schedule keeps its default)."""
    from engine.errors import RunError
    from .pipeline_schedule import SCHEDULES
    if getattr(args, "schedule", None) in SCHEDULES:
        if getattr(args, "parallel", None) != "pipeline":
            raise RunError(f"{args.schedule} is a pipeline schedule (add --parallel pipeline); the learning-rate "
                           f"schedules are constant, step and cosine", "--schedule")
        if args.pipe_schedule not in (None, args.schedule):
            raise RunError(f"two pipeline schedules: --schedule {args.schedule} and --pipe-schedule "
                           f"{args.pipe_schedule}", "--schedule")
        args.pipe_schedule, args.schedule = args.schedule, None
    given = {k: getattr(args, "pipe_schedule" if k == "schedule" else k, None) for k in OPTIONS}
    return {k: v for k, v in given.items() if v is not None}


def options(cfg, n_ranks, spec=None):
    """(K, D, schedule, M, predict, parts) from cfg.extra, checked; ``parts``:
    --partition's ranges, parsed and checked against --stages and ``spec``'s
    layers when ``spec`` is given (None when not given, or without ``spec``):
    the one parse of --partition, which choose_partition takes."""
    extra = {k: v for k, v in (cfg.extra or {}).items() if v is not None}
    # a 0 given is an error below, not "unset"
    D = int(extra.get("replicas", 1))
    # --stages defaults to the ranks / D, as its help says (n_ranks // D; a
    # remainder is refused below)
    K = int(extra.get("stages", max(1, n_ranks // max(D, 1))))
    if K < 1 or D < 1:
        raise ValueError(f"--stages and --replicas must be >= 1 (got {K} and {D})")
    parts = None
    if spec is not None:
        # the net first: `--stages 9` on a 4-layer net asked for mpiexec -n 9, which then refused it
        parts = given_partition(cfg, spec, K)
    if K * D != n_ranks:
        why = f"--stages {K} x --replicas {D} needs mpiexec -n {K * D}, not {counted(n_ranks, 'rank')}"
        if cfg.resume:          # the user gave neither: the run saved them
            why += (f" (the run's saved options: resume it on the ranks it was saved with, mpiexec -n {K * D} "
                    f"sprint train --resume {cfg.resume}; or start a new run from its weights with --init-from "
                    f"{cfg.resume})") if "stages" in extra else (
                    f" (the run saved --replicas {D}: resume it on the ranks it was saved with)")
        raise ValueError(why)
    M = int(extra.get("microbatches", 4))
    if M < 1 or M > cfg.batch:
        raise ValueError(f"--microbatches must be between 1 and --batch ({cfg.batch}), got {M}")
    return K, D, str(extra.get("schedule") or "gpipe"), M, str(extra.get("predict") or "none"), parts


def given_partition(cfg, spec, K):
    """--partition checked against --stages and the net (None when not
    given); --stages past the net's layers refused (stage_ranges)."""
    from engine.spec import layers
    return stage_ranges((cfg.extra or {}).get("partition"), K, len(layers(spec)), spec.name)


def choose_partition(given, spec, K, batch, manifest=None):
    """``given`` (--partition as options() parsed it), else (resuming) the
    one the stage files hold, else the balanced one for mini-batch ``batch``."""
    from engine.spec import layers
    from .pipeline_ckpt import manifest_partition
    if given:
        return given
    n = len(layers(spec))
    saved = manifest_partition(manifest, K, n) if manifest else None
    if saved:
        return saved
    try:
        from engine.perf.pipeline import balanced_partition
        return balanced_partition(spec, K, batch)
    except ImportError:
        return even_partition(n, K)


def run(cfg) -> dict:
    return run_guarded(_run, cfg)


def _run(cfg, comm):
    from engine.session import Session
    with Session(cfg, comm) as s:
        return _train(s, cfg, comm)


def _train(s, cfg, comm):
    from engine.data import Loader
    from engine.net import Net
    from engine.optim import SGD, make_schedule
    from .runner import ranks_agree_or_refuse

    K, D, schedule, M, predict, given = options(cfg, comm.size, s.spec)
    be, spec, train_ds, test_ds, deform = s.backend, s.spec, s.train_ds, s.test_ds, s.deform
    ranks_agree_or_refuse(s, comm, cfg)
    run = s.run
    # resuming: every rank reads the small manifest, then only its own stage file
    manifest = _ck.on_every_rank(comm, lambda: _ck.read_manifest(run)) if cfg.resume else None
    parts = choose_partition(given, spec, K, cfg.batch, manifest)
    comm.check_agreement("partition", format_partition(parts))
    k, d = comm.rank % K, comm.rank // K
    if s.gpu and comm.size > 1:
        _comm.select_device(comm)       # one GPU per stage; messages are staged through the host
    stage = Stage(spec, *parts[k], seed=cfg.seed)
    acc = stage.grads.copy()
    sched = make_schedule(cfg.schedule, cfg.lr, cfg.epochs, cfg.warmup)
    opt = SGD(stage.params, acc, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, schedule=sched)
    state = s.load_state(weights=not cfg.resume)
    start_step = 0
    if cfg.resume:
        if state.get("mode") != "pipeline":
            raise ValueError(f"checkpoint is from a {state.get('mode')!r} run, not a pipeline (--resume)")
        entry = _ck.on_every_rank(comm, lambda: _ck.check_manifest(
            run, manifest, K, format_partition(parts), int(state["epoch"]), D))
        own = _ck.on_every_rank(comm, lambda: _ck.load_stage(run, entry, k, stage, s.run_id, spec.hash()))
        stage.params[...] = be.xp.asarray(own["params"])
        opt.velocity[...] = be.xp.asarray(own["velocity"])
        opt.steps, start_step = int(own["steps"]), int(entry["step"])
    elif state is not None:
        # --init-from: whole vectors; any partition takes its slice
        stage.params[...] = be.xp.asarray(state["params"][stage.p_lo:stage.p_hi])
    start_epoch = int(state["epoch"]) if cfg.resume else 0
    s.start(start_epoch)

    mpi = comm.comm if isinstance(comm, _comm.MPIComm) else None
    rep = _comm.MPIComm(mpi.Split(color=k, key=d)) if D > 1 else None
    base = d * K
    ex = StageExecutor(stage, k, K, schedule, M, predict, opt, acc, mpi_comm=mpi,
                       ranks=(base + k - 1 if k else None, base + k + 1 if k < K - 1 else None, base, base + K - 1),
                       replicas=rep, timeout=float(cfg.timeout))
    ex.version = start_step
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
    s.log(f"sprint pipeline: {counted(K, 'stage')} x {counted(D, 'replica')}, schedule {schedule}, "
          f"{counted(M, 'micro-batch', 'micro-batches')} of "
          f"mini-batch {cfg.batch}, lr {cfg.lr:g}, predict {predict}, partition {format_partition(parts)}, {spec.name} "
          f"({eval_net.n_params:,} params)")
    last_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, cfg.stop_after)
    max_samples = int((cfg.extra or {}).get("max_samples", 0)) or None
    epoch = start_epoch
    for epoch in range(start_epoch, last_epoch):
        micro = None
        if loader is not None:
            loader.set_epoch(epoch)
            micro = _micro_stream(loader, M, n_stream)
        ex.reset_window()
        t_ep = time.perf_counter()
        try:
            # overflow on the way to a NaN loss is reported once, as divergence
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                ex.run_stream(sizes, minis, micro, epoch_at=lambda u, e=epoch: e + u / n_upd)
        except StageDiverged as e:
            # every stage raises it at the same update with the same loss: one line for the job
            raise s.diverged(e.loss, epoch + 1, e.u + 1, opt.lr_at(epoch + e.u / n_upd)) from None
        wall = time.perf_counter() - t_ep
        full_w = _gather(comm, K, stage)
        eval_net.set_flat(full_w)
        test_loss, test_acc = s.evaluate(eval_net)
        tot = comm.allreduce_scalars([ex.loss_sum, ex.correct, ex.seen])
        rec = {"epoch": epoch + 1, "step": int(ex.version), "lr": float(sched(epoch + 1)),
               "train_loss": tot[0] / tot[2], "train_acc": tot[1] / tot[2], "test_loss": test_loss,
               "test_acc": test_acc, "images_per_s": tot[2] / wall, "time": time.perf_counter() - s.t0,
               "skipped": train_ds.skipped + test_ds.skipped, "parallel": "pipeline", "n_node": comm.size,
               "stages": K, "replicas": D, "schedule": schedule, "predict": predict}
        if run is not None:          # each stage its own file, then the manifest (pipeline_ckpt)
            _ck.on_every_rank(comm, lambda e=epoch: d == 0 and _ck.save_stage(
                run, k, e + 1, stage, opt, s.run_id, spec.hash()))
            if s.root:
                _ck.write_manifest(run, K, format_partition(parts), schedule, epoch + 1, ex.version, s.run_id)
        # the session's checkpoint commits the epoch; its whole weights serve sprint eval and --init-from
        s.end_epoch(rec, {
            "params": full_w, "mode": "pipeline", "epoch": epoch + 1,
            "samples": int((epoch + 1) * n_stream * D), "step": int(ex.version), "stages": K,
            "partition": format_partition(parts), "schedule": schedule, "spec": spec.to_dict(),
            "spec_hash": spec.hash(), "deform": deform.to_dict(),
            "rng": {"seed": int(cfg.seed), "next_epoch": epoch + 1}})
        if run is not None:
            comm.barrier()
            if d == 0:
                _ck.prune(run, k)
        if max_samples and (epoch + 1 - start_epoch) * n_stream * D >= max_samples:
            break
    stats = _stats(comm, ex, K, D, parts, spec, cfg, schedule, predict, M, n_stream, sizes, minis)
    s.write_stats(STATS, stats)
    if not s.history[s.first_new:]:
        eval_net.set_flat(_gather(comm, K, stage))
    return s.result(eval_net, len(s.history), stats=stats, rank=comm.rank, n_node=comm.size)


def _micro_stream(loader, m, n_stream):
    left = n_stream
    for x, y in loader:
        if left <= 0:
            return
        if len(y) > left:
            x, y = x[:left], y[:left]
        left -= len(y)
        yield from split_micro(x, y, m)


def _gather(comm, K, stage):
    """The whole weight vector on every rank (stage order), for evaluation."""
    return np.concatenate(comm.allgather_obj(_host(stage.params))[:K])


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
