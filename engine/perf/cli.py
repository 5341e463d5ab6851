"""``sprint predict | tune | simulate``: thin wrappers over engine.perf
(``sprint profile`` is engine.perf.cli_profile's)."""
from __future__ import annotations

import argparse
import json
import sys

from engine.argtypes import positive_float, positive_int
from engine.errors import RunError
from .cli_ranges import check_calibration, check_config, check_strategy_values, check_target, epoch_samples

from . import calibrate
from .cli_profile import PROFILE_HELP, profile_option


def _profile(args):
    """The profile the command uses, checked against this machine first
    (``--no-calibrate`` skips the few-second calibration)."""
    from engine import spec as spec_mod
    from .profile import Profile
    spec_mod.get_spec(args.model)      # a bad --model is refused before the calibration's seconds
    prof = Profile.load(profile_option(getattr(args, "profile", None), args.command))
    if getattr(args, "host_load", None) is not None:
        prof.host_factor = {"*": float(args.host_load)}
    if getattr(args, "calibrate", True):
        from .calibrate import check
        chk = check(prof, seconds=args.calibrate_seconds)
        for msg in chk.messages:
            print(f"sprint {args.command}: warning: {msg}", file=sys.stderr)
        for msg in chk.notes:
            print(f"sprint {args.command}: note: {msg}", file=sys.stderr)
    if warning := prof.path_warning(args.model):
        print(f"sprint {args.command}: warning: {warning}", file=sys.stderr)
    if getattr(args, "measure_layers", False):
        from .measure_layers import enable
        enable(prof)
    return prof


def _impl(args):
    from .model import ENGINE_IMPL, SEED_IMPL
    return SEED_IMPL if args.impl == "seed" else ENGINE_IMPL


def _config_args(p, need_config=True):
    p.add_argument("--model", required=True, help="preset name or spec file")
    if need_config:
        p.add_argument("--nodes", type=positive_int, default=None,
                       help="N_Node (MPI ranks); required unless the strategy's options say it (pipeline: "
                            "--stages x --replicas)")
        p.add_argument("--workers", type=positive_int, default=1, help="N_GPU (workers per node; default 1)")
        p.add_argument("--subbatch", type=positive_int, required=True, help="N_Subbatch (samples per worker step)")
    p.add_argument("--profile", default=None, help=PROFILE_HELP)
    p.add_argument("--n-file", type=positive_int, default=None,
                   help="training samples per epoch (default: the preset's training set: cnn-a/b/c 1281167, "
                        "cifar 50000, digits 1437, tiny 256; 50000 for a spec file)")
    p.add_argument("--ranks-per-host", type=positive_int, default=1,
                   help="ranks sharing one host's cores (CPU profiles; N_Node on one machine; default 1)")
    p.add_argument("--host-load", type=positive_float, default=None,
                   help="CPU profiles: how much slower the host steps a net now than when the profile "
                        "was swept (1 = as then; older profiles: wall/CPU time of an undisturbed step)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="BLAS/OpenMP threads per worker (default 1, as the runner uses); ranks-per-host x workers x "
                        "threads beyond the cores is priced only where the profile measured that sharing")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="skip the few-second calibration that checks the profile describes this machine "
                        "(and rescales its times when it does not)")
    p.add_argument("--calibrate-seconds", type=positive_float, default=calibrate.SECONDS,
                   help=f"length of that calibration in seconds (default {calibrate.SECONDS:g})")
    p.add_argument("--measure-layers", action="store_true",
                   help="time the net's own layer passes here (one thread, about half a second per "
                        "N_Subbatch) and price ComputeGradient by them instead of the fitted per-layer "
                        "terms; the sharing and queueing model stays")
    p.add_argument("--explain", action="store_true", help="add one line on what each printed term means")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _check_counts(args):
    """The options every strategy reads the same way: a count of samples or
    simulated steps is >= 1, a spread is >= 0 (each strategy checks its own)."""
    import math
    for flag in ("n_file", "updates", "steps"):
        v = getattr(args, flag, None)
        if v is not None and v < 1:
            raise RunError(f"must be >= 1, got {v}", "--" + flag.replace("_", "-"))
    cv = getattr(args, "cv", None)
    if cv is not None and not (math.isfinite(cv) and cv >= 0):
        raise RunError(f"must be a finite number >= 0, got {cv}", "--cv")


def _strategy_call(args):
    """(strategy, n_node, keywords) of predict/simulate: the chosen strategy's
    own options (others' refused) and the common ones."""
    from . import strategies
    kw = strategies.kwargs_from_args(args.strategy, args, args.strategy_options)
    n_node = kw.pop("n_node", args.nodes)
    if n_node is None:
        raise RunError(f"required with --parallel {args.strategy}", "--nodes")
    _check_counts(args)
    check_strategy_values(args)
    check_config(args.model, n_node, args.workers, args.subbatch, args.n_file,
                 "--nodes" if args.nodes is not None else "--replicas")
    check_calibration(args)
    return n_node, dict(kw, n_file=args.n_file, ranks_per_host=args.ranks_per_host, threads=args.threads)


def _warn(args, *messages):
    for msg in messages:
        if msg:
            print(f"sprint {args.command}: warning: {msg}", file=sys.stderr)


def _size_warnings(args, n_node, prof):
    """What of the configuration lies outside what the profile measured."""
    from .cli_ranges import epoch_samples, node_warning, round_warning
    _warn(args, node_warning(n_node, prof, "--nodes" if args.nodes is not None else "N_Node"))
    if args.strategy == "asgd":
        _warn(args, round_warning(n_node, args.workers, args.subbatch, epoch_samples(args.model, args.n_file)))


def cmd_predict(args) -> int:
    from . import strategies
    n_node, kw = _strategy_call(args)
    prof = _profile(args)
    _size_warnings(args, n_node, prof)
    p = strategies.predict(args.strategy, args.model, n_node, args.workers, args.subbatch, prof, **kw)
    if args.json:
        print(json.dumps(p.as_dict(), default=str))
    else:
        print(strategies.formatter(args.strategy)(p, per_layer=not args.no_layers, explain_terms=args.explain))
    return 0


def cmd_tune(args) -> int:
    from .report import TUNE_TERMS, explain
    from .tune import format_candidates, search
    _check_counts(args)
    if not 0 <= args.tolerance < 1:
        raise RunError(f"must be in [0, 1), got {args.tolerance}", "--tolerance")
    check_target(args.model, args.target_minibatch, args.n_file)
    check_config(args.model, args.max_nodes, 1, 1, args.n_file, "--max-nodes")
    check_calibration(args)
    workers = range(1, args.max_workers + 1) if args.max_workers else (args.workers,)
    refused = []
    prof = _profile(args)
    from .cli_ranges import node_warning, search_warning
    from .tune import NODE_GRID, SUBBATCH_GRID
    _warn(args, node_warning(args.max_nodes, prof, "--max-nodes"))
    _warn(args, search_warning(len(workers) * sum(s <= args.max_subbatch for s in SUBBATCH_GRID)
                               * (sum(n <= args.max_nodes for n in NODE_GRID) + (args.max_nodes > NODE_GRID[-1]))))
    beyond = []
    cands = search(args.model, prof, args.target_minibatch, args.tolerance, args.max_nodes,
                   workers=tuple(workers), max_subbatch=args.max_subbatch, impl=_impl(args),
                   n_file=args.n_file, ranks_per_host=args.ranks_per_host, threads=args.threads, refused=refused,
                   beyond=beyond)
    total = epoch_samples(args.model, args.n_file)
    if not cands and beyond:
        raise RunError(f"every configuration searched has more workers x N_Subbatch than the {total:,} samples "
                       f"of an epoch (the smallest: {min(n * g * s for n, g, s in beyond):,})",
                       "--n-file" if args.n_file else "--workers")
    if args.json:
        print(json.dumps([c.__dict__ for c in cands[:args.top]]))
    else:
        print(format_candidates(cands, args.target_minibatch, args.tolerance, args.top, refused=refused,
                                beyond=beyond, n_file=total))
        if args.explain:
            print(explain(TUNE_TERMS))
    return 0 if any(c.feasible for c in cands) else 1


def cmd_simulate(args) -> int:
    from . import strategies
    n_node, kw = _strategy_call(args)
    simulate, fmt = strategies.simulator(args.strategy)
    prof = _profile(args)
    _size_warnings(args, n_node, prof)
    if args.strategy == "asgd":
        from .cli_ranges import simulation_warning
        closed = strategies.predict("asgd", args.model, n_node, args.workers, args.subbatch, prof,
                                    **{k: v for k, v in kw.items() if k not in ("n_updates", "seed", "cv")})
        _warn(args, simulation_warning(closed, kw["n_updates"]))
    elif args.strategy == "downpour":
        from .cli_ranges import downpour_warning
        _warn(args, downpour_warning(n_node, kw.get("steps", 40)))
    sim = simulate(args.model, n_node, args.workers, args.subbatch, prof, **kw)
    if args.json:
        print(json.dumps(sim.as_dict(), default=str))
    else:
        print(fmt(sim, explain_terms=args.explain))
    return 0


def _strategy_name(command, takes=None, why=None, verb="prices"):
    """--parallel's type: a strategy that `sprint plan` prices but this
    command has no row for (predict, simulate: sync, layerwise; tune, which
    searches ASGD configurations: every other) was told only argparse's
    "invalid choice" or "unrecognized arguments"; say which command answers
    for it. ``takes``: the names the command takes (the cost models')."""
    def parse(value):
        from . import strategies
        from .plan import STRATEGIES as PLANNED
        names = takes or strategies.names()
        if value not in names and (value in strategies.names() or value in dict(PLANNED)):
            how = (" and writes its plan with --out PLAN.json for `sprint train --parallel layerwise --plan`"
                   if value == "layerwise" else "")
            reason = why or f"has no cost model of {value} (it takes {', '.join(names)})"
            raise argparse.ArgumentTypeError(
                f"sprint {command} {reason}: `sprint plan --model MODEL --gpus N` {verb} {value} beside every "
                f"other strategy{how}")
        return value
    return parse


def _parallel_option(p, command):
    from . import strategies
    p.add_argument("--parallel", "--strategy", dest="strategy", type=_strategy_name(command),
                   choices=strategies.names(), default="asgd",
                   help="parallel strategy whose cost model " + ("predicts" if command == "predict" else
                                                                 "is simulated") +
                        " (default asgd; engine.perf.strategies; --strategy is the older name)")
    p.set_defaults(strategy_options=strategies.add_options(p, command))


def register(sub):
    from .cli_profile import register as register_profile
    register_profile(sub)

    p = sub.add_parser("predict", help="predict a parallel strategy's step times and T_Epoch "
                                       "(asgd: T_GPU, T_Update, N_Minibatch_avg, staleness)")
    _config_args(p)
    _parallel_option(p, "predict")
    p.add_argument("--no-layers", action="store_true", help="omit the per-layer table")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("tune", help="fastest (N_Node, N_Subbatch[, N_GPU]) at a target minibatch")
    _config_args(p, need_config=False)
    from .asgd import add_cli_arguments as asgd_options
    asgd_options(p)                  # tune searches ASGD configurations: --impl
    p.add_argument("--parallel", "--strategy", dest="strategy", choices=("asgd",), default="asgd",
                   type=_strategy_name("tune", ("asgd",), "searches asgd configurations only (its target is "
                                       "ASGD's N_Minibatch_avg)", "ranks"),
                   help="asgd (the default), the one strategy tune searches (sprint plan ranks the others)")
    p.add_argument("--target-minibatch", type=positive_float, required=True,
                   help="N_Minibatch_avg to reach (samples per global update)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="relative band around the target a configuration must fall in (default 0.05)")
    p.add_argument("--max-nodes", type=positive_int, default=64, help="largest N_Node searched (default 64)")
    p.add_argument("--workers", type=positive_int, default=1, help="N_GPU, fixed (default 1)")
    p.add_argument("--max-workers", type=positive_int, default=None, help="search N_GPU in 1..this instead")
    p.add_argument("--max-subbatch", type=positive_int, default=256, help="largest N_Subbatch searched (default 256)")
    p.add_argument("--top", type=positive_int, default=5, help="rows to show, the fastest qualifying first (default 5)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("simulate", help="discrete-event simulation of a parallel strategy beside its closed "
                                        "form (asgd: Algorithms 1 and 2)")
    _config_args(p)
    _parallel_option(p, "simulate")
    p.set_defaults(func=cmd_simulate)
