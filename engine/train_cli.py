"""``sprint train | eval | plot | info``: argument parsing only; the work is
in engine.train (strategies via engine.session), engine.plot and engine.spec."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

_FORMATS = ["digits", "tree", "mnist", "cifar", "npz"]


def register(sub):
    from .argtypes import nonneg_int, positive_int
    from .ops.conv import CONV_ALGOS
    from .session import registry
    from .session.config import DEFAULT_TIMEOUT, TrainConfig
    d = TrainConfig()
    asgd = registry.get_strategy("asgd")
    strategies = "; ".join(f"{s.name}: {s.help}" for s in registry.STRATEGIES.values())

    p = sub.add_parser("train", help="train a network (default: digits preset on the embedded digits)",
                       description="Train a SPRINT-family CNN. Without options: the digits preset on the "
                                   "embedded handwritten digits.")
    p.add_argument("--model", default=None, help=f"preset or JSON/YAML spec file (default {d.model}; "
                                                  "`sprint info` lists the presets)")
    p.add_argument("--data", default=None, help="'digits' (embedded) or a path: image tree, MNIST IDX dir, "
                                                "CIFAR-10 bin dir, .npz (default digits)")
    p.add_argument("--format", dest="fmt", default=None, choices=_FORMATS,
                   help="data format (guessed when omitted)")
    p.add_argument("--resize", action="store_true", default=None,
                   help="scale images of another size than the network's input (else that is an error)")
    p.add_argument("--skip-bad", action="store_true", default=None,
                   help="leave out images holding NaN/Inf and truncated CIFAR batch files, with a warning "
                        "(else they are an error)")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"epochs in all (default {d.epochs}; asgd {asgd.field_default('epochs')}); with "
                        "--resume of a finished run: continue to this many")
    p.add_argument("--batch", type=int, default=None,
                   help=f"minibatch size; per worker in parallel runs (default {d.batch}; sandblaster: the "
                        f"L-BFGS batch, default {registry.get_strategy('sandblaster').field_default('batch')})")
    p.add_argument("--lr", type=float, default=None,
                   help=f"learning rate eta, finite and > 0 (default {d.lr}; asgd {asgd.field_default('lr')}; "
                        f"pipeline 1f1b/dualpipe {d.lr}/M, as they update after every micro-batch; "
                        "a tenth of that for --model cifar and a fiftieth for cnn-a/b/c, which diverge at 0.05)")
    p.add_argument("--momentum", type=float, default=None,
                   help=f"momentum nu in [0, 1) (default {d.momentum}; asgd {asgd.field_default('momentum')})")
    p.add_argument("--weight-decay", type=float, default=None, help=f"L2 weight decay (default {d.weight_decay})")
    p.add_argument("--schedule", choices=["constant", "step", "cosine"], default=None,
                   help=f"learning-rate schedule (default {d.schedule})")
    p.add_argument("--warmup", type=float, default=None, help=f"epochs of linear warm-up (default {d.warmup})")
    p.add_argument("--seed", type=nonneg_int, default=None, help="seed of weights, order and augmentation (default 0)")
    p.add_argument("--device", dest="sub_device", choices=["auto", "cpu", "gpu"], default=None,
                   help="compute backend (default: the global --device, $SPRINT_DEVICE or auto)")
    p.add_argument("--out", default=None, help="run directory (default runs/MODEL-TIMESTAMP)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run in RUN_DIR from its last checkpoint with its saved options "
                        "(--epochs may extend it)")
    p.add_argument("--init-from", metavar="CKPT", default=None,
                   help="start a new run from the weights of another run's checkpoint (same network)")
    p.add_argument("--parallel", choices=registry.names(), default=None,
                   help=f"training strategy (default none); {strategies}. Under mpiexec each rank is a node")
    p.add_argument("--workers", type=int, default=None,
                   help=f"worker threads per process (--parallel {' | '.join(registry.threaded())} only; default 1)")
    p.add_argument("--max-pending", type=nonneg_int, default=None,
                   help="asgd: cap on gradients a worker queues before the updater takes them "
                        f"(0: unbounded, as the seed; default {asgd.extra['max_pending']} guards against a "
                        "starved updater)")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"MPI runs: seconds without a heartbeat from a rank before the whole job ends, "
                        f"naming it (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for the kernels (default: 1 for nets under 20 MFLOP per image, else all)")
    p.add_argument("--conv-algo", choices=list(CONV_ALGOS), default=None,
                   help="CPU convolution: winograd (F(4x4,3x3) for the 3x3 stride-1 layers of 32 or more "
                        "channels, the implicit GEMM for the rest), implicit GEMM everywhere, or explicit im2col + "
                        "SGEMM (default $SPRINT_CONV_ALGO, else winograd, the fastest measured)")
    p.add_argument("--crop-pad", type=nonneg_int, default=None, help=f"random crop padding in pixels (default {d.crop_pad})")
    p.add_argument("--flip", action="store_true", default=None, help="random horizontal flips")
    p.add_argument("--scale-jitter", type=float, default=None, help="random zoom in [1-j, 1+j] (default 0)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: only when stderr is a terminal)")
    p.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    for _, mod in registry.cli_modules():
        mod.add_train_options(p)
    p.add_argument("-v", "--verbose", action="store_true", help="name every unreadable file (default: the first 5)")
    p.set_defaults(func=cmd_train, across_ranks=True)

    p = sub.add_parser("eval", help="evaluate a checkpoint on a data set",
                       description="Evaluate a checkpoint. By default on the data, format and split the run "
                                   "recorded in its config.json.")
    p.add_argument("checkpoint", help="checkpoint.npz or a run directory")
    p.add_argument("--data", default=None,
                   help="data to evaluate on (default: the run's own data; 'digits' without a run config)")
    p.add_argument("--format", dest="fmt", default=None, choices=_FORMATS,
                   help="data format (default: the run's, else guessed)")
    p.add_argument("--split", choices=["test", "train"], default="test", help="which split (default test)")
    p.add_argument("--batch", type=positive_int, default=256, help="evaluation batch size (default 256)")
    p.add_argument("--resize", action="store_true", default=None,
                   help="scale images of another size than the network's input (default: as the run did; "
                        "else that is an error)")
    p.add_argument("--skip-bad", action="store_true", default=None,
                   help="leave out images holding NaN/Inf, with a warning (default: as the run did)")
    p.add_argument("-v", "--verbose", action="store_true", help="name every unreadable file (default: the first 5)")
    p.add_argument("--device", dest="sub_device", choices=["auto", "cpu", "gpu"], default=None,
                   help="compute backend (default: the global --device, $SPRINT_DEVICE or auto)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("plot", help="PNG curves of loss and accuracy of a run")
    p.add_argument("run_dir", help="run directory holding metrics.jsonl")
    p.add_argument("--out", default=None, help="directory for the PNGs (default: the run directory)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("info", help="layer table of a model (without one: the presets)")
    p.add_argument("model", nargs="?", default=None, help="preset name or spec file (omit to list the presets)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size for the FLOP columns (default 1)")
    from .perf.pipeline import add_info_options
    add_info_options(p)           # --stages K: the pipeline partition, per-stage time, memory, bubble
    p.set_defaults(func=cmd_info)


_TRAIN_KEYS = ("model", "data", "fmt", "epochs", "batch", "lr", "momentum", "weight_decay", "schedule",
               "warmup", "seed", "parallel", "workers", "threads", "crop_pad", "flip", "scale_jitter",
               "timeout", "init_from", "resize", "skip_bad")


def _device(args):
    return args.sub_device or getattr(args, "device", None) or "auto"


def _flag(name):
    return "--" + name.replace("_", "-")


def _registry_strategy(cfg):
    from .session import registry
    return registry.get_strategy(cfg.parallel)


def _as_option_error(make):
    """TrainConfig's errors name a field: say which option it is."""
    from .errors import RunError
    try:
        return make()
    except RunError:
        raise
    except ValueError as e:
        field, _, rest = str(e).partition(" ")
        if field in _TRAIN_KEYS or field in ("extra", "resume"):
            # the Python name (weight_decay) in the option's words (weight decay)
            raise RunError(f"{field.replace('_', ' ')} {rest}",
                           "--format" if field == "fmt" else _flag(field)) from None
        raise


def _saved_train_options(run_dir) -> dict:
    """The options a run folder's config.json saved ({} when unreadable:
    resume_config then says why)."""
    from pathlib import Path
    from .session.rundir import CONFIG, read_json
    try:
        d = read_json(Path(run_dir) / CONFIG).get("train")
    except (OSError, ValueError, AttributeError):
        return {}
    return d if isinstance(d, dict) else {}


def _same_as_saved(key, value, saved) -> bool:
    if key == "extra":
        own = saved.get("extra") or {}
        return isinstance(value, dict) and all(k in own and own[k] == v for k, v in value.items())
    return key in saved and saved[key] == value


def _changed_flags(keys, given, saved) -> list:
    """The options behind changed keys: a strategy's own (--stages, --max-pending)
    sit in "extra", which was named as an option "--extra" that does not exist."""
    flags = []
    for k in keys:
        if k != "extra":
            flags.append(_flag(k))
            continue
        own = saved.get("extra") or {}
        flags += ["--pipe-schedule" if e == "schedule" else _flag(e)
                  for e, v in given["extra"].items() if e not in own or own[e] != v]
    return flags


def _new_run_dir(model) -> str:
    """runs/MODEL-TIMESTAMP, claimed by creating it: runs started in the same
    second (a loop of `sprint train &`) get -2, -3, ... instead of writing one
    folder together. Under mpiexec rank 0 claims it and the session hands its
    name to the other ranks (engine.session.Session)."""
    from .parallel.launcher import launcher_rank
    base = os.path.join("runs", f"{model.replace('/', '_')}-{time.strftime('%Y%m%d-%H%M%S')}")
    if launcher_rank() != 0:
        return base
    os.makedirs("runs", exist_ok=True)
    k = 1
    while True:
        path = base if k == 1 else f"{base}-{k}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            k += 1


def cmd_train(args) -> int:
    from . import train as _train
    from .errors import RunError
    from .session import registry
    from .session.config import RESUME_MAY_CHANGE, TrainConfig, resume_config
    from .data.dataset import name_all_skipped
    name_all_skipped(args.verbose)
    if args.conv_algo:  # through the environment, so loader and MPI children agree
        os.environ["SPRINT_CONV_ALGO"] = args.conv_algo
    # first: a strategy may take its own values off a shared flag (pipeline: --schedule 1f1b)
    owns = [(strat, mod.extra_from_args(args)) for strat, mod in registry.cli_modules()]
    given = {k: getattr(args, k) for k in _TRAIN_KEYS if getattr(args, k) is not None}
    saved = _saved_train_options(args.resume) if args.resume else {}
    # a resumed run's strategy is its saved one (--stages with --resume of a
    # pipeline was told "apply to --parallel pipeline only")
    parallel = given.get("parallel") or saved.get("parallel")
    for strat, own in owns:
        if own and parallel != strat.name:
            flags = sorted("--pipe-schedule" if k == "schedule" else _flag(k) for k in own)
            # worded as predict's (engine.perf.strategies)
            raise RunError(f"{'applies' if len(flags) == 1 else 'apply'} to --parallel {strat.name} only"
                           + (f", not to --parallel {parallel}" if parallel else ""), ", ".join(flags))
        if own:
            given["extra"] = {**given.get("extra", {}), **own}
    if args.max_pending is not None:
        strat = registry.get_strategy(given.get("parallel", "none"))
        if "max_pending" not in strat.extra and not args.resume:
            raise RunError("applies to --parallel asgd only", "--max-pending")
        given["extra"] = {**given.get("extra", {}), "max_pending": args.max_pending}
    chosen = given.get("parallel", "none")
    if args.workers is not None and not args.resume and not registry.get_strategy(chosen).workers:
        # "need a parallel strategy" was said to --parallel pipeline too, which is one
        raise RunError(f"worker threads need --parallel {' | '.join(registry.threaded())}"
                       + ("" if chosen == "none" else f", not {chosen}"), "--workers")
    common = dict(device=_device(args), progress=args.progress, verbose=not args.quiet)
    if args.resume:
        if args.out and os.path.realpath(args.out) != os.path.realpath(args.resume):
            # it was ignored: the run went on in its own folder
            raise RunError(f"--resume continues the run in its own folder ({args.resume}); --out names another",
                           "--out")
        # an option given again with the run's own value changes nothing (under
        # mpiexec one naturally repeats --parallel): only a different value is refused
        extra = {k for k in set(given) - set(RESUME_MAY_CHANGE) if not _same_as_saved(k, given[k], saved)}
        if extra:
            raise RunError(f"--resume continues with the run's saved options; only "
                           f"{', '.join(_flag(k) for k in RESUME_MAY_CHANGE if hasattr(args, k))} may change "
                           f"(to change the others, start a new run from its weights: --init-from {args.resume})",
                           ", ".join(sorted(_changed_flags(extra, given, saved))))
        cfg = _as_option_error(lambda: resume_config(args.resume, **given, **common))
    else:
        out = args.out or _new_run_dir(given.get("model", TrainConfig.model))
    from .parallel.launcher import launcher_rank
    claimed = None if args.resume or args.out or launcher_rank() != 0 else out     # made by _new_run_dir
    try:
        if not args.resume:
            cfg = _as_option_error(lambda: TrainConfig(out=out, **given, **common))
        if not _registry_strategy(cfg).distributed:
            _train.refuse_launcher_ranks(cfg)
        res = _train.train(cfg)
    except BaseException:
        # the runs/MODEL-TIMESTAMP folder this command made, still empty: each
        # mistyped option (--epochs 0, --model nosuch) left one behind
        if claimed is not None:
            with contextlib.suppress(OSError):
                os.rmdir(claimed)
        raise
    if res.get("rank", 0) != 0:
        return 0
    acc = res.get("test_acc")
    from engine.errors import counted
    print(f"done: {counted(res.get('epochs'), 'epoch')}, test accuracy "
          f"{'n/a' if acc is None else f'{100 * acc:.2f} %'}, {res.get('time_s', 0):.1f} s, "
          f"run directory {res.get('run_dir')}")
    return 0


def _run_config(path):
    """config.json of the run a checkpoint path belongs to, or None."""
    from pathlib import Path

    from .session.rundir import CONFIG, read_json
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not (folder / CONFIG).is_file():
        return None
    d = read_json(folder / CONFIG)
    return d.get("train") if isinstance(d, dict) and isinstance(d.get("train"), dict) else None


def cmd_eval(args) -> int:
    from engine import backend
    from .data import DeformConfig, load_dataset
    from .data.dataset import name_all_skipped
    from .train import evaluate, load_checkpoint
    name_all_skipped(args.verbose)
    if args.sub_device:
        backend.set_backend(args.sub_device)
    net, state = load_checkpoint(args.checkpoint)
    spec = net.spec
    run = _run_config(args.checkpoint) or {}
    if run:
        from pathlib import Path
        from .data.readers import check_test_fraction
        from .session.rundir import CONFIG
        folder = Path(args.checkpoint) if Path(args.checkpoint).is_dir() else Path(args.checkpoint).parent
        try:
            check_test_fraction(run.get("test_fraction", 0.2))
        except ValueError as e:
            from .errors import RunError
            raise RunError(f"the run's {e}", folder / CONFIG) from None     # said with no file
    if run and args.data is None:
        from .session.config import refuse_inputs_not_found_here
        refuse_inputs_not_found_here(run, folder / CONFIG, "give --data, or run from the folder the run was "
                                     "started in", names=("data",))     # eval needs no plan
    data = args.data or run.get("data", "digits")
    fmt = args.fmt or (run.get("fmt") if args.data is None else None)
    if run and args.data is not None and args.data != run.get("data"):
        print(f"note: evaluating on {args.data}, not the run's own data {run.get('data')}", file=sys.stderr)
    own = args.data is None or args.data == run.get("data")
    resize = args.resize if args.resize is not None else bool(own and run.get("resize"))
    skip_bad = args.skip_bad if args.skip_bad is not None else bool(own and run.get("skip_bad"))
    train_ds, test_ds = load_dataset(data, fmt, size=spec.x0, channels=spec.m0,
                                     test_fraction=run.get("test_fraction", 0.2), resize=resize,
                                     skip_bad=skip_bad, suggest_model=False)   # the checkpoint's net: no --model
    ds = test_ds if args.split == "test" else train_ds
    if ds.n_classes != spec.n_classes or ds.shape[0] != spec.m0:
        from .errors import RunError, counted
        raise RunError(f"the checkpoint's model {spec.name} takes {counted(spec.m0, 'channel')} and has "
                       f"{counted(spec.n_classes, 'output')}, {ds.name} has {counted(ds.shape[0], 'channel')} and "
                       f"{counted(ds.n_classes, 'class', 'classes')}", "--data" if args.data else None)
    d = dict(state.get("deform") or {})
    deform = DeformConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}) if d else None
    loss, acc = evaluate(net, ds, args.batch, deform)
    print(f"{spec.name} epoch {state.get('epoch')} on {ds.name}, {args.split} split ({len(ds)} images): "
          f"loss {loss:.4f}  accuracy {100 * acc:.2f} %")
    return 0


def cmd_plot(args) -> int:
    from .plot import plot_run
    for p in plot_run(args.run_dir, args.out):
        print(p)
    return 0


def _info_stages(args):
    """--stages of `sprint info`, else the number of --partition's ranges; the
    other pipeline options alone are refused (they were silently ignored)."""
    from .errors import RunError
    if getattr(args, "stages", None) is None and getattr(args, "partition", None):
        args.stages = len(str(args.partition).split(","))     # the ranges say how many
    given = [f"--{f} {getattr(args, f)}" for f in ("stages", "microbatches", "schedule", "profile")
             if getattr(args, f, None) is not None]
    if args.model is None and given:
        raise RunError(f"{given[0].split()[0]} needs a model to split into stages", "sprint info MODEL")
    if given and not given[0].startswith("--stages"):
        raise RunError(f"{given[0].split()[0]} applies to the pipeline table: add --stages K (e.g. sprint info "
                       f"{args.model} --stages 2 {given[0]})", given[0].split()[0])
    return getattr(args, "stages", None)


def cmd_info(args) -> int:
    from .spec import PRESETS, get_spec, n_params, n_params_formula, summary_table
    stages = _info_stages(args)
    if args.model is None:
        print("presets (sprint info NAME for the layer table):")
        for name, spec in PRESETS.items():
            convs = len(spec.convs)
            print(f"  {name:8s} {spec.x0}x{spec.x0}x{spec.m0} input, {spec.n_classes} classes, "
                  f"{convs} conv + {len(spec.fcs)} fc layers, {n_params(spec):,} parameters")
        return 0
    from .errors import RunError
    try:
        spec = get_spec(args.model)
    except RunError as e:
        if e.where != "--model":
            raise
        raise RunError(e.what, "sprint info MODEL") from None     # a positional here, not --model
    table = None
    if stages:
        # checked before anything is printed: `info cifar --stages 99` printed
        # the whole layer table, then its error
        from .perf.pipeline import info_table
        table = info_table(spec, args)
    print(summary_table(spec, args.batch))
    print(f"N_Param = {n_params(spec):,} (SPEC formula: {n_params_formula(spec):,})")
    if table is not None:
        print(table)
    return 0
