"""The command line of the pipeline's cost model (engine.perf.pipeline):
the tables ``sprint predict|simulate`` print, its options in ``sprint predict|simulate --parallel pipeline`` (the
strategy table, engine.perf.strategies, adds them and refuses them under
another strategy) and ``sprint info MODEL --stages K``.

Functions import engine.perf.pipeline when called: that module imports
these names at its end, so either may be imported first.
"""
from __future__ import annotations

import math
import sys

from engine.argtypes import nonneg_int, positive_int
from engine import spec as spec_mod
from engine.errors import RunError
from engine.parallel.pipeline import PREDICT
from engine.parallel.pipeline_schedule import SCHEDULES
from engine.errors import counted

from .cli_profile import PROFILE_HELP, profile_option


def add_cli_arguments(p):
    """Options of ``sprint predict|simulate --parallel pipeline``."""
    p.add_argument("--stages", type=positive_int, default=None,
                   help="pipeline stages K (default: --nodes / --replicas)")
    p.add_argument("--replicas", type=positive_int, default=1,
                   help="data-parallel copies D of every stage (K*D ranks; default 1)")
    p.add_argument("--microbatches", type=positive_int, default=4,
                   help="micro-batches M per mini-batch (--subbatch; default 4)")
    # no learning-rate schedule here: --schedule is free, as in sprint info
    p.add_argument("--pipe-schedule", "--schedule", dest="pipe_schedule", choices=SCHEDULES, default="gpipe",
                   help="gpipe (default), 1f1b (PipeDream) or dualpipe (the seed's)")
    p.add_argument("--predict", dest="predict_mode", choices=PREDICT, default="none",
                   help="weights a pass uses (default none); stash and spectrain add their copies to the passes")
    p.add_argument("--partition", default=None, help="layer ranges per stage, e.g. 0:2,2:4 (default: balanced)")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="share of the shorter pass of a dualpipe pair hidden under the longer (default 0, CPU ranks; "
                        "up to 1 with two GPU streams)")
    p.add_argument("--executor", default=None, metavar="JSON",
                   help="the executor's costs beyond the kernels (per pass, per instruction, core sharing) "
                        "from this JSON instead of the profile's pipeline section (default: the profile's)")


def add_simulate_arguments(p):
    p.add_argument("--updates", type=positive_int, default=50, help="mini-batches to simulate (default 50)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the drawn pass durations (default 0)")
    p.add_argument("--cv", type=float, default=0.0, help="spread (coefficient of variation) of every pass (default 0)")


def cli_kwargs(args) -> dict:
    """predict/simulate keywords from the parsed options, checked; ``n_node``
    (K x D) replaces --nodes, which may then be left out."""
    from engine.parallel.stage import stage_ranges
    K, D, M = args.stages, args.replicas, args.microbatches
    if getattr(args, "workers", 1) != 1:
        raise RunError("a pipeline stage is one worker: use --replicas for data-parallel copies", "--workers")
    if D < 1 or (K is not None and K < 1):
        raise RunError(f"must be >= 1 (got {K if K is not None and K < 1 else D})",
                       "--stages" if K is not None and K < 1 else "--replicas")
    if K is None:
        if args.nodes is None:
            raise RunError("say how many stages: --stages K or --nodes K*D", "--stages")
        if args.nodes % D:
            raise RunError(f"--nodes {args.nodes} is not a multiple of --replicas {D}", "--nodes")
        K = args.nodes // D
    elif args.nodes is not None and args.nodes != K * D:
        raise RunError(f"--stages {K} x --replicas {D} needs {K * D} ranks, not --nodes {args.nodes}", "--nodes")
    if not 1 <= M <= args.subbatch:
        raise RunError(f"must be between 1 and --subbatch ({args.subbatch}), got {M}", "--microbatches")
    if args.predict_mode == "spectrain" and args.pipe_schedule == "gpipe":
        raise RunError("spectrain needs --pipe-schedule 1f1b or dualpipe (gpipe has no stale weights)",
                       "--predict")
    kw = dict(n_node=K * D, stages=K, replicas=D, microbatches=M, schedule=args.pipe_schedule,
              predict_mode=args.predict_mode, overlap=float(args.overlap))
    sp = spec_mod.get_spec(args.model)
    parts = stage_ranges(args.partition, K, len(spec_mod.layers(sp)), sp.name)
    if parts:
        kw["partition"] = parts
    if getattr(args, "executor", None):
        from .pipeline import Executor
        try:
            kw["executor"] = Executor.load(args.executor)
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise RunError(f"cannot read the executor's costs: {e}", args.executor) from None
    for key in ("updates", "seed", "cv"):
        if hasattr(args, key):
            kw[key] = getattr(args, key)
    return kw


def add_info_options(p):
    """``sprint info MODEL --stages K [--microbatches M] [--partition ...]``."""
    g = p.add_argument_group("pipeline (with --stages)")
    g.add_argument("--stages", type=positive_int, default=None, help="show the partition into K pipeline stages")
    g.add_argument("--microbatches", type=positive_int, default=None,
                   help="micro-batches per mini-batch (--batch; default min(4, batch))")
    g.add_argument("--partition", default=None, help="layer ranges to show instead of the balanced ones")
    g.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="schedule whose bubble is simulated (default gpipe)")
    g.add_argument("--profile", default=None, help=PROFILE_HELP)


def info_table(spec, args) -> str:
    """Each stage's layers, predicted time and memory, and the bubble."""
    from engine.parallel import pipeline_schedule as S
    from engine.parallel.stage import stage_ranges
    from .pipeline import format_prediction, predict
    from .profile import Profile
    sp = spec_mod.get_spec(spec)
    n = len(spec_mod.layers(sp))
    K = int(args.stages)
    parts = stage_ranges(args.partition, K, n, sp.name)
    m = args.microbatches or min(4, args.batch)
    if not 1 <= m <= args.batch:
        raise ValueError(f"--microbatches must be between 1 and --batch ({args.batch}), got {m}")
    prof = Profile.load(profile_option(args.profile, "info"))
    if warning := prof.path_warning(spec):      # as predict/simulate/tune/plan say it (engine.perf.cli)
        print(f"sprint info: warning: {warning}", file=sys.stderr)
    p = predict(sp, stages=K, n_subbatch=args.batch, profile=prof, schedule=args.schedule or "gpipe",
                microbatches=m, partition=parts)
    b = max(1, math.ceil(args.batch / p.microbatches))
    geoms = spec_mod.layers(sp)
    lines = [format_prediction(p)]
    lines.append(f"{'stage':>5}{'weights+grad+velocity MB':>26}{'activations MB (in flight)':>28}")
    for k, (lo, hi) in enumerate(p.partition):
        live = S.in_flight(S.schedule(p.schedule, K, k, 4 * K * p.microbatches, p.microbatches))
        act = sum(b * spec_mod._prod(g.out_shape) for g in geoms[lo:hi]) * 4 * live / 2 ** 20
        lines.append(f"{k:>5}{3 * 4 * p.costs[k].params / 2 ** 20:>26.2f}{act:>20.2f} ({live:>3})")
    lines.append(f"times from profile {prof.source}; with --predict stash each in-flight micro-batch also "
                 f"keeps a copy of its stage's weights")
    return "\n".join(lines)


def format_prediction(p: PipelinePrediction, per_layer: bool = True, explain_terms: bool = False) -> str:
    from engine.parallel.stage import format_partition
    lines = [f"{p.model}: {counted(p.stages, 'stage')} x {counted(p.replicas, 'replica')}, schedule {p.schedule}, "
             f"{counted(p.microbatches, 'micro-batch', 'micro-batches')} of mini-batch {p.batch}, partition {format_partition(p.partition)}",
             f"{'stage':>5} {'layers':<24}{'params':>12}{'fwd ms':>9}{'bwd ms':>9}{'upd ms':>9}"
             f"{'send ms':>9}{'bubble':>8}"]
    for k, c in enumerate(p.costs):
        lines.append(f"{k:>5} {','.join(c.layers):<24}{c.params:>12,}{1e3 * c.t_f:>9.3f}{1e3 * c.t_b:>9.3f}"
                     f"{1e3 * c.t_u:>9.3f}{1e3 * c.t_c:>9.3f}{100 * p.bubble[k]:>7.1f}%")
    lines.append(f"mini-batch {1e3 * p.t_minibatch:.3f} ms, {p.throughput:,.1f} img/s, T_Epoch "
                 f"{p.t_epoch:.4g} s; for comparison, the ideal bubble of GPipe and 1F1B, (K-1)/(M+K-1) = "
                 f"{100 * p.bubble_gpipe:.1f} %")
    lines += [f"note: {n}" for n in p.extra.get("notes", ())]
    if explain_terms:
        lines.append("fwd/bwd: the stage's layers' kernels on one micro-batch (profile); upd: momentum "
                     "update of its slice (+ replica allreduce); send: one activation message; bubble: "
                     "idle share of a simulated stream")
    return "\n".join(lines)


def format_simulation(s: PipelineSimulation, explain_terms: bool = False) -> str:
    from .simulate import format_compare
    p, cf, sim = s.prediction, s.closed, s.sim
    head = format_prediction(p).splitlines()[0]
    where = "each stage its own processor" if p.extra["cores"] is None else \
        f"the stages sharing {p.extra['cores']:g} cores"
    lines = [head, f"simulated {counted(s.minibatches, 'mini-batch', 'mini-batches')} "
                   f"({counted(s.minibatches * p.microbatches, 'micro-batch', 'micro-batches')}), "
                   f"{where}, cv {s.cv:g}, seed {s.seed}: {sim['makespan']:.4g} s simulated in {s.wall_s:.2f} s",
             f"{'stage':>5} {'layers':<24}{'busy s':>10}{'bubble closed form':>20}{'simulated':>11}"]
    for k, c in enumerate(p.costs):
        lines.append(f"{k:>5} {','.join(c.layers):<24}{sim['busy'][k]:>10.4g}{100 * cf['bubble'][k]:>19.1f}%"
                     f"{100 * sim['bubble'][k]:>10.1f}%")
    n_img = s.minibatches * p.batch * p.replicas
    rows = [("stream s", s.closed_stream, sim["makespan"]),
            ("mini-batch s", cf["t_minibatch"], sim["makespan"] / s.minibatches),
            ("img/s", n_img / s.closed_stream, n_img / sim["makespan"])]
    lines.append(format_compare([(n, a, b, (a - b) / b if b else 0.0, "") for n, a, b in rows]))
    lines.append(f"for comparison, the ideal bubble of GPipe and 1F1B, (K-1)/(M+K-1) = "
                 f"{100 * cf['bubble_gpipe']:.1f} %")
    if explain_terms:
        lines.append("closed form: fill-drain (gpipe) or steady state (1f1b, dualpipe) of these stage costs; "
                     "simulated: the schedules' instruction lists played with them (engine.perf.pipeline_sim); "
                     "stream: the whole simulated run, one fill and drain included for 1f1b/dualpipe; "
                     "mini-batch: stream / mini-batches; bubble: idle share of the stream")
    return "\n".join(lines)
