"""``sprint profile | predict | tune | simulate``: thin wrappers over engine.perf."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from engine.argtypes import positive_float, positive_int
from engine.errors import RunError
from .cli_ranges import check_calibration, check_config, check_strategy_values, check_target

from . import calibrate


def _profile(args):
    """The profile the command uses, checked against this machine first
    (``--no-calibrate`` skips the few-second calibration)."""
    from engine import spec as spec_mod
    from .profile import Profile
    spec_mod.get_spec(args.model)      # a bad --model is refused before the calibration's seconds
    prof = Profile.load(getattr(args, "profile", None))
    if getattr(args, "host_load", None) is not None:
        prof.host_factor = {"*": float(args.host_load)}
    if getattr(args, "calibrate", True):
        from .calibrate import check
        for msg in check(prof, seconds=args.calibrate_seconds).messages:
            print(f"sprint {args.command}: warning: {msg}", file=sys.stderr)
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
        p.add_argument("--workers", type=positive_int, default=1, help="N_GPU (workers per node)")
        p.add_argument("--subbatch", type=positive_int, required=True, help="N_Subbatch (samples per worker step)")
    p.add_argument("--profile", default=None, help="machine profile JSON (default: the shipped one)")
    p.add_argument("--n-file", type=positive_int, default=None, help="training samples per epoch")
    p.add_argument("--ranks-per-host", type=positive_int, default=1,
                   help="ranks sharing one host's cores (CPU profiles; N_Node on one machine)")
    p.add_argument("--host-load", type=positive_float, default=None,
                   help="CPU profiles: how much slower the host steps a net now than when the profile "
                        "was swept (1 = as then; older profiles: wall/CPU time of an undisturbed step)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="BLAS/OpenMP threads per worker (the runner uses 1); ranks-per-host x workers x "
                        "threads beyond the cores is priced only where the profile measured that sharing")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="skip the few-second calibration that checks the profile describes this machine "
                        "(and rescales its times when it does not)")
    p.add_argument("--calibrate-seconds", type=positive_float, default=calibrate.SECONDS,
                   help="length of that calibration")
    p.add_argument("--measure-layers", action="store_true",
                   help="time the net's own layer passes here (one thread, about half a second per "
                        "N_Subbatch) and price ComputeGradient by them instead of the fitted per-layer "
                        "terms; the sharing and queueing model stays")
    p.add_argument("--explain", action="store_true", help="add one line on what each printed term means")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _read_records(path):
    """Saved sweep records (``--records``), or one error line naming the file."""
    try:
        data = json.loads(Path(path).read_text())
    except UnicodeDecodeError:
        raise RunError("not sweep records (not a text file)", path) from None
    except json.JSONDecodeError as e:
        raise RunError(f"not sweep records (not valid JSON: {e})", path) from None
    data = {"records": data} if isinstance(data, list) else data
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise RunError("not sweep records (no \"records\" list; `sprint profile --records FILE` writes one)", path)
    return data


def _write_json(path, obj):
    from engine.checkpoint import atomic_write
    atomic_write(path, json.dumps(obj))


def _check_outputs(*paths):
    """Refuse an output that cannot be written before a sweep of minutes, not
    after it (the sweep would be lost)."""
    for path in paths:
        if path is None:
            continue
        p = Path(path)
        if p.is_dir():
            raise RunError("is a folder, not a file", path)
        folder = p.parent
        if folder.exists() and not folder.is_dir():
            raise RunError("not a folder", folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(folder)) from None
        # a file made and removed: os.access says yes to root everywhere (/proc, a
        # read-only mount), and the sweep's minutes were lost at its end
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".sprint-write-check-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise RunError(f"cannot write into this folder ({e.strerror})", folder) from None


# Sections measured on top of an existing profile's prices: ``--update`` adds
# them alone (the pipeline section without --only).
ON_TOP = ("pipeline", "calibration")


def _update_calibration(args, prof) -> int:
    """``--update PROFILE --only calibration``: this machine's calibration
    (every part of ``calibrate.PARTS``) replaces the profile's, the old one
    kept beside it. Run right after a sweep made in several ``--only``
    parts, each of which stored only its own calibration, or to add a part
    a profile was swept without; refused for a profile of another machine."""
    from .calibrate import PARTS, calibration_step, differing, fingerprint, merge_calibrations
    if args.from_records:
        raise RunError("the calibration is measured, not refitted from records", "--from-records")
    old = prof.data.get("fingerprint") or {}
    here = fingerprint()
    differs = differing(old, here)
    if differs:
        raise RunError("the profile was measured on another machine or software (" + ", ".join(
            f"{k} {a!r} there, {b!r} here" for k, (a, b) in differs.items()) + "): its prices do not match "
            "this machine's calibration; run `sprint profile`", args.update)
    # Two, as a sweep's before and after: their difference is the noise a later check allows.
    both = merge_calibrations([calibration_step(args.calibrate_seconds) for _ in range(2)])
    if old.get("calibration"):
        both["replaced"] = {k: v for k, v in old["calibration"].items() if k not in ("before", "after", "replaced")}
    prof.data["fingerprint"] = dict(old or here, calibration=both)
    out = Path(args.out or args.update)
    prof.save(out)
    print("calibration: " + ", ".join(f"{k.split('_')[0]} {1e3 * both[k]:.4f} ms" for k in ("wall_s",) + PARTS if k in both)
          + (f"; x{both['wall_s'] / both['replaced']['wall_s']:.3f} the one it replaces" if "replaced" in both else ""))
    print(f"profile written to {out}")
    return 0


def _update_profile(args, only) -> int:
    """``sprint profile --update PROFILE``: measure the ON_TOP sweeps (or refit
    them from ``--from-records``) and write their sections into PROFILE."""
    from .pipeline_probe import fit_section, sweep_pipeline
    from .profile import Profile
    bad = [n for n in only or () if n not in ON_TOP]
    if bad:
        raise RunError(f"only {', '.join(ON_TOP)} can be added to an existing profile, not {', '.join(bad)}",
                       "--only")
    prof = Profile.load(args.update)
    _check_outputs(args.out or args.update, args.records)
    if only and "calibration" in only:
        if len(only) > 1:
            raise RunError("--only calibration is measured alone", "--only")
        return _update_calibration(args, prof)
    if args.from_records:
        recs = _read_records(args.from_records)["records"]
    else:
        recs = sweep_pipeline(profile=prof, log=lambda m: print(m, file=sys.stderr, flush=True))
        if args.records:
            _write_json(args.records, {"records": recs})
    try:
        prof.data["pipeline"] = fit_section(prof, recs)
    except ValueError as e:
        raise RunError(str(e), args.from_records or args.update) from None
    out = Path(args.out or args.update)
    prof.save(out)
    sec = prof.data["pipeline"]
    ex = sec["executor"]
    print(f"pipeline section: per pass {1e3 * ex['per_pass']:.3f} ms, cold x{1 + ex['cold']:.2f}, per instruction "
          f"{1e3 * ex['per_instruction']:.3f} ms, shared x{1 + ex['shared']:.2f}"
          + ("" if sec.get("shared_fitted") else " (not measured: the ranks fit the cores)")
          + "; kernels x " + ", ".join(f"{ex.get(k, 1.0):.2f} {k.replace('_f', ' fwd').replace('_b', ' bwd')}"
                                       for k in ("conv_f", "conv_b", "other_f", "other_b"))
          + f", eager size {sec.get('p2p', {}).get('eager_bytes', '?')} B; host at x{sec['calibration_ratio']:.2f} "
          f"the profile's calibration (stored rescaled)")
    print(f"profile written to {out}")
    return 0


def _fit_pipeline(prof, records):
    """The fresh profile's pipeline section, when its sweep ran."""
    if any(r.get("kind") == "pipeline_run" for r in records):
        from .pipeline_probe import fit_section
        from .profile import Profile
        prof["pipeline"] = fit_section(Profile(prof), records)


def _check_skipped(data, only, old):
    """Say each sweep that did not run; when none of the ``--only`` sweeps
    ran, the profile would be the old one or empty: an error, not a file."""
    before = len(old.get("skipped", [])) if old else 0
    new = data.get("skipped", [])[before:]
    for msg in new:
        print(f"sprint profile: warning: sweep {msg}; the profile has no fits from it", file=sys.stderr)
    if only and {m.split(":", 1)[0] for m in new} >= set(only):
        raise RunError("none of the sweeps ran (" + "; ".join(new) + ")", "--only")


def cmd_profile(args) -> int:
    from . import fit, sweep
    from .profile import Profile
    only = [n.strip() for n in args.only.split(",")] if args.only else None
    if args.update:
        return _update_profile(args, only)
    _check_outputs(args.out or "profile.json", args.records, args.plots and Path(args.plots) / "x.png")
    old = _read_records(args.from_records) if args.from_records else None
    if old is not None and only is None:
        data = old
    else:
        log = (lambda m: print(m, file=sys.stderr, flush=True))
        data = sweep.run_all(quick=args.quick, threads=args.threads, allreduce=not args.no_allreduce,
                             contention=not args.no_contention, log=log, only=only, merge=old)
        if args.records:
            _write_json(args.records, data)
        _check_skipped(data, only, old)
    from engine import backend
    prof = fit.fit_profile(data["records"], machine=args.machine, backend=backend.get_backend().name)
    prof["sweep"] = {k: v for k, v in data.get("meta", {}).items() if k != "fingerprint"}
    if data.get("meta", {}).get("fingerprint"):
        prof["fingerprint"] = data["meta"]["fingerprint"]
    prof["skipped"] = data.get("skipped", [])
    _fit_pipeline(prof, data["records"])
    out = args.out or "profile.json"
    Profile(prof).save(out)
    print(fit.format_errors(prof))
    if args.plots:
        from . import plots
        for f in plots.plot_fits(data["records"], prof, args.plots):
            print(f"wrote {f}")
    print(f"profile written to {out}")
    return 0


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
    cands = search(args.model, prof, args.target_minibatch, args.tolerance, args.max_nodes,
                   workers=tuple(workers), max_subbatch=args.max_subbatch, impl=_impl(args),
                   n_file=args.n_file, ranks_per_host=args.ranks_per_host, threads=args.threads, refused=refused)
    if args.json:
        print(json.dumps([c.__dict__ for c in cands[:args.top]]))
    else:
        print(format_candidates(cands, args.target_minibatch, args.tolerance, args.top, refused=refused))
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


def _parallel_option(p, command):
    from . import strategies
    p.add_argument("--parallel", "--strategy", dest="strategy", choices=strategies.names(), default="asgd",
                   help="parallel strategy whose cost model " + ("predicts" if command == "predict" else
                                                                 "is simulated") +
                        " (engine.perf.strategies; --strategy is the older name)")
    p.set_defaults(strategy_options=strategies.add_options(p, command))


def register(sub):
    from .sweep import SWEEPS
    p = sub.add_parser("profile", help="sweep the kernels and fit a machine profile (SPEC section 4)")
    p.add_argument("--quick", action="store_true", help="small grids (about 8 minutes on 2 quiet cores)")
    p.add_argument("--out", default=None, help="profile JSON to write (default profile.json)")
    p.add_argument("--records", default=None, help="also save the raw sweep records here")
    p.add_argument("--from-records", default=None, help="refit saved records instead of sweeping")
    p.add_argument("--threads", type=positive_int, default=1, help="BLAS/OpenMP threads while sweeping (default 1)")
    p.add_argument("--machine", default=None, help="machine description stored in the profile")
    p.add_argument("--no-allreduce", action="store_true", help="skip the mpiexec allreduce sweep")
    p.add_argument("--no-contention", action="store_true", help="skip the core-sharing sweep")
    p.add_argument("--only", default=None,
                   help="comma list of sweeps to run (with --from-records: re-run them and keep the "
                        "rest of the saved records): " + ", ".join(SWEEPS))
    p.add_argument("--plots", default=None, help="directory for PNGs of each fit against its sweep")
    p.add_argument("--update", default=None, metavar="PROFILE",
                   help="measure only the sections fitted on top of an existing profile (" + ", ".join(ON_TOP) +
                        ": the pipeline executor's costs and message table; with --only calibration: this "
                        "machine's calibration, measured now) and write them into PROFILE "
                        "(or --out); with --from-records: refit them from saved records")
    p.add_argument("--calibrate-seconds", type=positive_float, default=calibrate.SECONDS,
                   help="length of each of the two calibrations of --update --only calibration")
    p.set_defaults(func=cmd_profile)

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
    p.add_argument("--target-minibatch", type=positive_float, required=True,
                   help="N_Minibatch_avg to reach (samples per global update)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="relative band around the target a configuration must fall in (default 0.05)")
    p.add_argument("--max-nodes", type=positive_int, default=64, help="largest N_Node searched")
    p.add_argument("--workers", type=positive_int, default=1, help="N_GPU, fixed")
    p.add_argument("--max-workers", type=positive_int, default=None, help="search N_GPU in 1..this instead")
    p.add_argument("--max-subbatch", type=positive_int, default=256, help="largest N_Subbatch searched")
    p.add_argument("--top", type=positive_int, default=5, help="rows to show (the fastest qualifying first)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("simulate", help="discrete-event simulation of a parallel strategy beside its closed "
                                        "form (asgd: Algorithms 1 and 2)")
    _config_args(p)
    _parallel_option(p, "simulate")
    p.set_defaults(func=cmd_simulate)
