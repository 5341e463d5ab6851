"""``sprint train | eval | plot | info``: argument parsing only; the work is
in engine.train, engine.plot and engine.spec."""
from __future__ import annotations

import os
import time


def register(sub):
    from .train import TrainConfig
    d = TrainConfig()

    p = sub.add_parser("train", help="train a network (default: digits preset on the embedded digits)",
                       description="Train a SPRINT-family CNN. Without options: the digits preset on the "
                                   "embedded handwritten digits.")
    p.add_argument("--model", default=None, help=f"preset or JSON/YAML spec file (default {d.model})")
    p.add_argument("--data", default=None, help="'digits' (embedded) or a path: image tree, MNIST IDX dir, "
                                                "CIFAR-10 bin dir, .npz (default digits)")
    p.add_argument("--format", dest="fmt", default=None, choices=["digits", "tree", "mnist", "cifar", "npz"],
                   help="data format (guessed when omitted)")
    p.add_argument("--resize", action="store_true", default=None,
                   help="scale images of another size than the network's input (else that is an error)")
    p.add_argument("--skip-bad", action="store_true", default=None,
                   help="leave out images holding NaN/Inf and truncated CIFAR batch files, with a warning "
                        "(else they are an error)")
    p.add_argument("--epochs", type=int, default=None, help=f"default {d.epochs}")
    p.add_argument("--batch", type=int, default=None, help=f"minibatch size (default {d.batch})")
    p.add_argument("--lr", type=float, default=None, help=f"learning rate eta (default {d.lr})")
    p.add_argument("--momentum", type=float, default=None, help=f"nu (default {d.momentum})")
    p.add_argument("--weight-decay", type=float, default=None, help=f"default {d.weight_decay}")
    p.add_argument("--schedule", choices=["constant", "step", "cosine"], default=None,
                   help=f"learning-rate schedule (default {d.schedule})")
    p.add_argument("--warmup", type=float, default=None, help=f"epochs of linear warm-up (default {d.warmup})")
    p.add_argument("--seed", type=int, default=None, help="default 0")
    p.add_argument("--device", dest="sub_device", choices=["auto", "cpu", "gpu"], default=None)
    p.add_argument("--out", default=None, help="run directory (default runs/MODEL-TIMESTAMP)")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run in RUN_DIR from its last checkpoint (its saved options; "
                        "--epochs may extend it)")
    p.add_argument("--parallel", choices=["none", "asgd", "sync"], default=None)
    p.add_argument("--workers", type=int, default=None, help="workers per process (parallel modes)")
    p.add_argument("--max-pending", type=int, default=None,
                   help="ASGD: cap on gradients a worker queues before the updater takes them "
                        "(0: unbounded, as the seed; default 2 guards against a starved updater)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the kernels (default: 1 for nets under 20 MFLOP per image, else all)")
    p.add_argument("--conv-algo", choices=["implicit", "im2col"], default=None,
                   help="CPU convolution: implicit GEMM or explicit im2col + SGEMM (default $SPRINT_CONV_ALGO, "
                        "else implicit)")
    p.add_argument("--crop-pad", type=int, default=None, help=f"random crop padding in pixels (default {d.crop_pad})")
    p.add_argument("--flip", action="store_true", default=None, help="random horizontal flips")
    p.add_argument("--scale-jitter", type=float, default=None, help="random zoom in [1-j, 1+j]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    p.add_argument("-v", "--verbose", action="store_true", help="name every unreadable file (default: the first 5)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a checkpoint on a data set")
    p.add_argument("checkpoint", help="checkpoint.npz or a run directory")
    p.add_argument("--data", default="digits")
    p.add_argument("--format", dest="fmt", default=None, choices=["digits", "tree", "mnist", "cifar", "npz"])
    p.add_argument("--split", choices=["test", "train"], default="test")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--resize", action="store_true",
                   help="scale images of another size than the network's input (else that is an error)")
    p.add_argument("--skip-bad", action="store_true", help="leave out images holding NaN/Inf, with a warning")
    p.add_argument("-v", "--verbose", action="store_true", help="name every unreadable file (default: the first 5)")
    p.add_argument("--device", dest="sub_device", choices=["auto", "cpu", "gpu"], default=None)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("plot", help="PNG curves of loss and accuracy of a run")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="directory for the PNGs (default: the run directory)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("info", help="layer table of a model: shapes, parameters, FLOPs")
    p.add_argument("model", help="preset name or spec file")
    p.add_argument("--batch", type=int, default=1, help="batch size for the FLOP columns")
    from .perf.pipeline import add_info_options
    add_info_options(p)           # --stages K: the pipeline partition, per-stage time, memory, bubble
    p.set_defaults(func=cmd_info)


_TRAIN_KEYS = ("model", "data", "fmt", "epochs", "batch", "lr", "momentum", "weight_decay", "schedule",
               "warmup", "seed", "parallel", "workers", "threads", "crop_pad", "flip", "scale_jitter", "resize",
               "skip_bad")


def _device(args):
    return args.sub_device or getattr(args, "device", None) or "auto"


# Stale gradients with heavy-ball momentum shrink the stable step sharply
# (a delay of one update takes lr*curvature from 3.8 to 0.1), so ASGD gets
# its own defaults where the user left them open: these reach >= 95 % on
# digits with 2 ranks x 2 workers.
ASGD_DEFAULTS = dict(lr=0.02, momentum=0.0, epochs=12)


def cmd_train(args) -> int:
    from .data.dataset import name_all_skipped
    from .train import TrainConfig, resume_config, train
    name_all_skipped(args.verbose)
    if args.conv_algo:  # through the environment, so loader and MPI children agree
        os.environ["SPRINT_CONV_ALGO"] = args.conv_algo
    given = {k: getattr(args, k) for k in _TRAIN_KEYS if getattr(args, k) is not None}
    if given.get("parallel") == "asgd" and not args.resume:
        given = {**ASGD_DEFAULTS, **given}
        given["extra"] = {"max_pending": 2 if args.max_pending is None else args.max_pending}
    elif args.max_pending is not None:
        raise ValueError("--max-pending applies to --parallel asgd only")
    common = dict(device=_device(args), progress=not args.no_progress, verbose=not args.quiet)
    if args.resume:
        extra = set(given) - {"epochs", "threads", "workers"}
        if extra:
            raise ValueError(f"--resume continues with the run's saved options; only --epochs, --threads "
                             f"and --workers may change (got {sorted('--' + k.replace('_', '-') for k in extra)})")
        cfg = resume_config(args.resume, **given, **common)
    else:
        out = args.out or os.path.join("runs", f"{given.get('model', TrainConfig.model).replace('/', '_')}-"
                                               f"{time.strftime('%Y%m%d-%H%M%S')}")
        cfg = TrainConfig(out=out, **given, **common)
    res = train(cfg)
    if res.get("rank", 0) != 0:
        return 0
    acc = res.get("test_acc")
    print(f"done: {res.get('epochs')} epochs, test accuracy "
          f"{'n/a' if acc is None else f'{100 * acc:.2f} %'}, {res.get('time_s', 0):.1f} s, "
          f"run directory {res.get('run_dir')}")
    return 0


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
    train_ds, test_ds = load_dataset(args.data, args.fmt, size=spec.x0, channels=spec.m0, resize=args.resize,
                                     skip_bad=args.skip_bad)
    ds = test_ds if args.split == "test" else train_ds
    if ds.n_classes != spec.n_classes or ds.shape[0] != spec.m0:
        raise ValueError(f"checkpoint model {spec.name} ({spec.m0} channels, {spec.n_classes} classes) does not "
                         f"fit {ds.name} ({ds.shape[0]} channels, {ds.n_classes} classes)")
    d = dict(state.get("deform") or {})
    deform = DeformConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}) if d else None
    loss, acc = evaluate(net, ds, args.batch, deform)
    print(f"{spec.name} epoch {state.get('epoch')} on {ds.name} ({len(ds)} images): "
          f"loss {loss:.4f}  accuracy {100 * acc:.2f} %")
    return 0


def cmd_plot(args) -> int:
    from .plot import plot_run
    for p in plot_run(args.run_dir, args.out):
        print(p)
    return 0


def cmd_info(args) -> int:
    from .spec import get_spec, n_params, n_params_formula, summary_table
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    spec = get_spec(args.model)
    print(summary_table(spec, args.batch))
    print(f"N_Param = {n_params(spec):,} (SPEC formula: {n_params_formula(spec):,})")
    if getattr(args, "stages", None):
        from .perf.pipeline import info_table
        print(info_table(spec, args))
    return 0
