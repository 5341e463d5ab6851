"""``sprint plan``: how should I train this network on N devices?

Two tables under one machine profile. First the layer-wise optimum (OptCNN,
engine.perf.layerwise): every layer's configuration with its compute,
transfer and sync time, the step time, throughput and bytes moved, and the
speedup over pure data and pure model parallelism. Then every strategy the
engine can run, ranked by predicted images per second at the same global
batch.

Each strategy answers through one entry of ``STRATEGIES``: a function
``(spec, n_dev, batch, profile) -> [Candidate]`` in its own cost module. A
new strategy adds its function and one line here.
"""
from __future__ import annotations

import importlib
import json
import math
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field, asdict

from engine.argtypes import positive_float, positive_int
from engine import spec as spec_mod
from . import calibrate, layerwise as L
from .cli_profile import PROFILE_HELP, profile_option
from engine.errors import RunError, counted

STRATEGIES = [
    ("sync", "engine.perf.plan:sync_candidates"),
    ("asgd", "engine.perf.plan:asgd_candidates"),
    ("pipeline", "engine.perf.plan:pipeline_candidates"),
    ("downpour", "engine.perf.plan:downpour_candidates"),
    ("sandblaster", "engine.perf.plan:sandblaster_candidates"),
    ("layerwise", "engine.perf.plan:layerwise_candidates"),
]


@dataclass
class Candidate:
    strategy: str
    setup: str
    throughput: float            # images per second, all devices
    step_s: float                # seconds per global batch of ``batch`` images
    comm_bytes: float | None     # bytes moved per global batch, all devices (None: not modelled)
    note: str = ""
    extra: dict = field(default_factory=dict)


# ---- datasheet profiles (not measured: stated as such wherever they are used) ----
def h200_datasheet():
    """One H200 SXM from its datasheet, not measured here: FP32 67 TFLOP/s,
    HBM3e 4.8 TB/s, NVLink 900 GB/s (450 GB/s each way), ~5 us launches."""
    from .profile import Profile
    prof = Profile.synthetic(sgemm_flop_s=67e12, vec_bytes_s=4.8e12, launch=5e-6, allreduce_bw=450e9,
                             allreduce_lat=1e-5, cores=1, backend="gpu")
    prof.data["p2p"] = {"latency": 1e-5, "per_byte": 1 / 450e9}
    prof.data["machine"] = "H200 datasheet (synthetic, not measured)"
    prof.source = "h200 datasheet"
    return prof


DATASHEETS = {"h200": h200_datasheet}


def load_profile(name_or_path=None):
    """A datasheet profile by name (``h200``), a profile file, or the shipped one."""
    from .profile import Profile, profile_choices
    if name_or_path in DATASHEETS:
        return DATASHEETS[name_or_path]()
    if name_or_path is not None and not Path(name_or_path).exists():
        from engine.errors import MissingFile
        raise MissingFile(f"no profile file or datasheet named {name_or_path}; "
                          f"{profile_choices(name_or_path, sorted(DATASHEETS))}", "--profile")
    return Profile.load(name_or_path)


# ---- the strategies' entries ------------------------------------------------------
def _split(batch, n_dev):
    if batch % n_dev:
        raise ValueError(f"batch {batch} does not split over {n_dev} devices")


def sync_candidates(spec, n_dev, batch, profile):
    """engine.parallel.sync: every rank a 1/N slice of the batch, one
    allreduce of the whole gradient vector, the update on every rank."""
    _split(batch, n_dev)
    n_p = spec_mod.n_params(spec)
    t = sum(L.t_compute(v, (n_dev, 1, 1, 1), batch, profile) for v in L.graph_nodes(spec))
    t += sum(profile.term(k, n_p) for k in ("scale", "sub", "add") if profile.has(k))
    if n_dev > 1:
        t += profile.allreduce_bw(n_dev, n_p)
    return [Candidate("sync", f"{counted(n_dev, 'rank')} x {batch // n_dev}", batch / t, t, 8.0 * (n_dev - 1) * n_p)]


def asgd_candidates(spec, n_dev, batch, profile):
    """SPRINT ASGD (engine.parallel.asgd): nodes x workers = N devices, each
    worker N_Subbatch = batch / N; its effective minibatch and staleness
    are what a user trades for the throughput."""
    from .model import predict
    _split(batch, n_dev)
    out = []
    for g in sorted({1, 8 if n_dev % 8 == 0 else 1}):
        nodes = n_dev // g
        p = predict(spec, nodes, g, batch // n_dev, profile)
        thr = n_dev * p.n_subbatch / p.t_gpu
        comm = 8.0 * (nodes - 1) * p.n_param * batch / p.n_minibatch_avg if nodes > 1 else 0.0
        out.append(Candidate("asgd", f"{counted(nodes, 'node')} x {counted(g, 'worker')} x {batch // n_dev}", thr, batch / thr, comm,
                             f"minibatch {p.n_minibatch_avg:.0f}, staleness {p.staleness:.2f}",
                             {"n_minibatch_avg": p.n_minibatch_avg, "staleness": p.staleness}))
    return out


def pipeline_candidates(spec, n_dev, batch, profile):
    """engine.parallel.pipeline: K stages x D replicas = N, each schedule at
    its best K; 2K micro-batches per replica mini-batch of batch / D."""
    from . import pipeline as P
    sp = spec_mod.get_spec(spec)
    geoms = spec_mod.layers(sp)
    gpu = profile.data.get("backend") == "gpu"
    best = {}
    for K in (k for k in L._divisors(n_dev) if 2 <= k <= len(geoms)):
        D = n_dev // K
        if batch % D:
            continue
        b = batch // D
        M = min(2 * K, b)
        for sched in ("gpipe", "1f1b", "dualpipe"):
            p = P.predict(sp, stages=K, replicas=D, n_subbatch=b, profile=profile, schedule=sched,
                          microbatches=M, overlap=0.5 if gpu else 0.0, n_mb=4 * M)
            acts = sum(spec_mod._prod(geoms[hi - 1].out_shape) for _, hi in p.partition[:-1])
            comm = 4.0 * 2 * batch * acts + 8.0 * (D - 1) * spec_mod.n_params(sp)
            c = Candidate(f"pipeline {sched}", f"{counted(K, 'stage')} x {counted(D, 'replica')}, "
                          f"{counted(p.microbatches, 'micro-batch', 'micro-batches')}",
                          p.throughput, batch / p.throughput, comm,
                          f"bubble {100 * max(p.bubble):.0f} %" + (" (stale weights)" if sched != "gpipe" else ""))
            if sched not in best or c.throughput > best[sched].throughput:
                best[sched] = c
    return list(best.values())


def downpour_candidates(spec, n_dev, batch, profile):
    """engine.parallel.downpour: N/8 (at least one) parameter servers, the
    other devices replicas of batch / N each."""
    from .downpour import predict
    S = max(1, n_dev // 8)
    R = n_dev - S
    _split(batch, n_dev)
    if R < 1:
        raise ValueError("needs at least 2 devices (a server and a replica)")
    p = predict(spec, R, 1, batch // n_dev, profile, servers=S)
    comm = 4.0 * 2 * spec_mod.n_params(spec) * batch / p.n_subbatch
    return [Candidate("downpour", f"{counted(S, 'server')} x {counted(R, 'replica')} x {p.n_subbatch}", p.images_per_s,
                      batch / p.images_per_s, comm, f"staleness {p.staleness:.1f}" +
                      (", server-bound" if p.server_bound else ""))]


def sandblaster_candidates(spec, n_dev, batch, profile):
    """engine.parallel.sandblaster: N/8 (at least one) parameter servers,
    the other devices replicas taking slices of 32 of the L-BFGS batch on
    request (one slice per replica when the batch is smaller)."""
    from .sandblaster import predict
    S = max(1, n_dev // 8)
    R = n_dev - S
    if R < 1:
        raise ValueError("needs at least 2 devices (a server and a replica)")
    p = predict(spec, R, 1, min(32, max(1, batch // R)), profile, servers=S, batch=batch)
    # every slice's gradient goes to the shards, every replica fetches the point once per evaluation
    comm = 4.0 * spec_mod.n_params(spec) * p.evaluations * (p.n_slices + R)
    return [Candidate("sandblaster", f"{counted(S, 'server')} x {counted(R, 'replica')}, slices of {p.slice}", p.images_per_s,
                      p.t_batch, comm, f"L-BFGS, {counted(p.evaluations, 'evaluation', fmt='g')}/batch" +
                      (", server-bound" if p.server_bound else ""))]


def layerwise_candidates(spec, n_dev, batch, profile, plan=None):
    """engine.parallel.layerwise: the searched optimum and the single
    strategies written as layer-wise plans."""
    plan = plan or L.optimize(spec, n_dev, batch, profile)
    out = [Candidate("layer-wise optimum", "per layer (see table above)", plan.predicted["throughput"],
                     plan.predicted["step_s"], plan.predicted["comm_bytes"], "exact under the cost model")]
    for kind, label in (("owt", "layer-wise one weird trick"), ("model", "layer-wise model parallel")):
        try:
            ev = L.evaluate(spec, L.named_plan(kind, spec, n_dev, batch).layers, n_dev, batch, profile)
        except ValueError:
            continue
        out.append(Candidate(label, "convs x samples, FCs x features" if kind == "owt" else
                             "every layer x channels", ev.throughput, ev.step_s, ev.comm_bytes))
    return out


def _entry(ref):
    mod, fn = ref.split(":")
    return getattr(importlib.import_module(mod), fn)


def rank_strategies(spec, n_dev, batch, profile, plan=None) -> list:
    """Every registered strategy's candidates, fastest first; a strategy
    whose model cannot price this setup says why in its row."""
    out = []
    for name, ref in STRATEGIES:
        kw = {"plan": plan} if name == "layerwise" else {}
        try:
            out += _entry(ref)(spec, n_dev, batch, profile, **kw)
        except (ValueError, ZeroDivisionError) as e:
            out.append(Candidate(name, "-", 0.0, math.inf, None, f"not priced: {e}"))
    return sorted(out, key=lambda c: -c.throughput)


# ---- the command ----------------------------------------------------------------
def make_plan(model, gpus, batch=None, profile=None):
    """(plan, evaluation, baselines {data, model}, ranked candidates)."""
    sp = spec_mod.get_spec(model)
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"--gpus must be a positive integer, got {gpus!r}")
    batch = batch or 32 * gpus
    prof = profile if profile is not None and not isinstance(profile, str) else load_profile(profile)
    plan = L.optimize(sp, gpus, batch, prof)
    ev = L.evaluate(sp, plan.layers, gpus, batch, prof)
    base = {}
    for kind in ("data", "model"):
        base[kind] = L.evaluate(sp, L.named_plan(kind, sp, gpus, batch).layers, gpus, batch, prof)
    t0 = time.perf_counter()
    ranked = rank_strategies(sp, gpus, batch, prof, plan)
    plan.predicted["rank_s"] = time.perf_counter() - t0
    return plan, ev, base, ranked, prof


def format_plan(plan, ev, base, ranked, prof) -> str:
    ms = lambda s: f"{1e3 * s:9.3f}"
    lines = [f"{plan.model} on {counted(plan.devices, 'device')}, global batch {plan.batch}; profile {prof.source}"
             + (" (datasheet figures, not measured)" if "datasheet" in str(prof.data.get("machine", "")) else ""),
             "", "layer-wise optimum (OptCNN): configuration (n,c,h,w) = splits of samples, channels, height, width",
             f"{'layer':<9}{'config':>14}{'devs':>5}{'t_c ms':>10}{'t_x ms':>10}{'t_s ms':>10}{'MB moved':>10}"]
    for r in ev.rows:
        lines.append(f"{r['name']:<9}{'(' + ','.join(map(str, r['config'])) + ')':>14}{math.prod(r['config']):>5}"
                     f"{ms(r['t_c'])} {ms(r['t_x'])} {ms(r['t_s'])}{r['bytes'] / 2**20:>10.1f}")
    tot = lambda k: sum(r[k] for r in ev.rows)
    lines.append(f"{'total':<28}{ms(tot('t_c'))} {ms(tot('t_x'))} {ms(tot('t_s'))}{ev.comm_bytes / 2**20:>10.1f}")
    lines.append(f"step {1e3 * ev.step_s:.3f} ms, {ev.throughput:,.0f} img/s, {ev.comm_bytes / 2**30:.3f} GiB "
                 f"moved per step; speedup x{base['data'].step_s / ev.step_s:.2f} over pure data parallel "
                 f"({base['data'].comm_bytes / max(ev.comm_bytes, 1):.1f}x its traffic), "
                 f"x{base['model'].step_s / ev.step_s:.2f} over pure model parallel "
                 f"({base['model'].comm_bytes / max(ev.comm_bytes, 1):.1f}x its traffic)")
    lines.append(f"search: {counted(plan.predicted['configurations'], 'configuration')}, cost tables "
                 f"{plan.predicted['cost_table_s']:.3f} s, search {plan.predicted['search_s']:.3f} s")
    lines += ["", f"every strategy, same model and profile, ranked by images/s at global batch {plan.batch}:",
              f"{'#':>2} {'strategy':<28}{'setup':<40}{'img/s':>12} {'ms/batch':>9} {'GiB/batch':>9}  note"]
    for i, c in enumerate(ranked, 1):
        gib = "-" if c.comm_bytes is None else f"{c.comm_bytes / 2**30:.3f}"
        # a space before each number: a wide one (a batch of millions) does not run into its neighbour
        lines.append(f"{i:>2} {c.strategy:<28}{c.setup:<40}{c.throughput:>12,.0f}"
                     f" {1e3 * c.step_s:>9.3f} {gib:>9}  {c.note}")
    return "\n".join(lines)


def cmd_plan(args) -> int:
    from .cli_ranges import check_calibration, check_plan_size, node_warning
    spec_mod.get_spec(args.model)      # a bad --model is refused before the calibration's seconds
    check_calibration(args)
    # a search too big for this machine's memory is refused before any of its seconds
    slow = check_plan_size(args.model, args.gpus, args.batch or 32 * args.gpus)
    if args.out and Path(args.out).is_dir():
        # was said after the search, exit 1
        raise RunError("is a folder, not a file; --out takes the plan's file name (e.g. plan.json)", args.out)
    if args.out and Path(args.out).parent.is_dir():
        # a folder that takes no file (/proc) is refused before the search, not after it, as sprint
        # profile's outputs are; a path in the way is named by Plan.save as the user wrote it
        from .cli_profile import check_outputs
        check_outputs(args.out)
    args.profile = profile_option(args.profile, "plan")
    prof = load_profile(args.profile)
    for warning in (node_warning(args.gpus, prof, "--gpus"), slow):
        if warning:
            print(f"sprint plan: warning: {warning}", file=sys.stderr)
    # A measured profile is checked against this machine first, as predict,
    # tune and simulate do; a datasheet describes another machine by design.
    if args.calibrate and args.profile not in DATASHEETS:
        from .calibrate import check
        chk = check(prof, seconds=args.calibrate_seconds)
        for msg in chk.messages:
            print(f"sprint plan: warning: {msg}", file=sys.stderr)
        for msg in chk.notes:
            print(f"sprint plan: note: {msg}", file=sys.stderr)
    if hasattr(prof, "path_warning") and (warning := prof.path_warning(args.model)):
        print(f"sprint plan: warning: {warning}", file=sys.stderr)
    plan, ev, base, ranked, prof = make_plan(args.model, args.gpus, args.batch, prof)
    if args.out and args.write != "optimum":
        named = L.named_plan(args.write, args.model, plan.devices, plan.batch)
        ev_named = L.evaluate(args.model, named.layers, plan.devices, plan.batch, prof)
        named.predicted = {"step_s": ev_named.step_s, "throughput": ev_named.throughput,
                           "comm_bytes": ev_named.comm_bytes, "profile": prof.source, "named": args.write}
        named.save(args.out)
    elif args.out:
        plan.save(args.out)
    if args.json:
        print(json.dumps({"plan": plan.to_dict(), "layers": ev.rows, "data_parallel_step_s": base["data"].step_s,
                          "model_parallel_step_s": base["model"].step_s,
                          "strategies": [asdict(c) for c in ranked]}, default=str))
    else:
        print(format_plan(plan, ev, base, ranked, prof))
        if args.out:
            print(f"plan written to {args.out} (run it: mpiexec -n {args.gpus} sprint train --model "
                  f"{args.model} --batch {plan.batch} --parallel layerwise --plan {args.out})")
    return 0


def register(sub):
    p = sub.add_parser("plan", help="layer-wise optimum (OptCNN) and every strategy ranked for N devices",
                       description="Search the per-layer parallel configuration with the lowest predicted "
                                   "step time, then rank every strategy the engine runs under the same profile.")
    p.add_argument("--model", required=True, help="preset name or spec file")
    p.add_argument("--gpus", type=positive_int, required=True, help="number of devices (MPI ranks)")
    p.add_argument("--batch", type=positive_int, default=None, help="global batch (default 32 per device)")
    p.add_argument("--profile", default=None,
                   help=f"a datasheet {sorted(DATASHEETS)}, or a {PROFILE_HELP}")
    p.add_argument("--out", default=None, help="write the layer-wise plan here (for sprint train --plan)")
    p.add_argument("--write", choices=["optimum", "data", "owt", "model"], default="optimum",
                   help="which plan --out writes: the searched optimum (default), pure data parallel, "
                        "Krizhevsky's one weird trick, or pure model parallel")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="skip the few-second calibration that checks a measured profile describes this machine "
                        "(and rescales it when the machine runs faster or slower now)")
    p.add_argument("--calibrate-seconds", type=positive_float, default=calibrate.SECONDS,
                   help=f"length of that calibration in seconds (default {calibrate.SECONDS:g})")
    p.set_defaults(func=cmd_plan)
