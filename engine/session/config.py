"""TrainConfig: every option of a training run, validated once, and the saved
config of a run folder to resume from.

``epochs``, ``lr``, ``momentum`` and ``workers`` left at None take the
default of the chosen strategy (engine.session.registry), so the CLI, ``engine.train``
and ``engine.parallel.run`` resolve them the same way.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from . import registry
from engine.errors import MissingFile, RunError

# Watchdog for MPI runs: a rank that sends no heartbeat for this long has
# stopped answering and the job ends. Healthy ranks beat from a thread every
# second or so whatever they compute, so only a frozen or dead rank hits it.
DEFAULT_TIMEOUT = 300.0


@dataclass
class TrainConfig:
    """Every option of a training run (``sprint train``'s flags by the same
    names); ``engine.train(cfg)`` runs it, ``engine.train(epochs=1)`` builds
    one from keywords. ``to_dict``/``from_dict`` give its JSON form (a run
    directory's config.json). Fields left at None take the chosen strategy's
    default (engine.session.registry)."""
    # The defaults train the digits preset on the embedded digits to ~98.5 %
    # test accuracy (98.33-99.16 % over seeds 0-4) in under 10 s on 2 cores.
    model: str = "digits"            # preset name or JSON/YAML spec file
    data: str = "digits"             # 'digits' (embedded) or a path
    fmt: str | None = None           # tree | mnist | cifar | npz (guessed when None)
    epochs: int | None = None        # None: the strategy's default (10; ASGD 12)
    batch: int | None = None         # None: the strategy's default (32; sandblaster 256)
    lr: float | None = None          # None: the strategy's default (0.05; ASGD 0.02; 1f1b/dualpipe 0.05/M), x0.1 for cifar
    momentum: float | None = None    # None: the strategy's default (0.9; ASGD 0)
    weight_decay: float = 5e-4
    schedule: str = "cosine"         # constant | step | cosine
    warmup: float = 1.0              # epochs of linear warm-up
    seed: int = 0
    device: str = "auto"             # auto | cpu | gpu
    out: str | None = None           # run directory (None: keep nothing on disk)
    resume: str | None = None        # run directory to continue
    init_from: str | None = None     # checkpoint whose weights start a new run
    parallel: str = "none"           # a strategy of engine.session.registry
    workers: int | None = None       # worker threads per process (parallel strategies; None: 1)
    threads: int | None = None       # CPU threads for the kernels/BLAS (None: auto_threads)
    crop_pad: int = 1                # DeformImage: random shift in pixels
    flip: bool = False               # DeformImage: random horizontal mirror
    scale_jitter: float = 0.0        # DeformImage: zoom in [1-j, 1+j]
    test_fraction: float = 0.2       # split for sources without a test set
    resize: bool = False             # scale images of another size than the net's input (else an error)
    skip_bad: bool = False           # leave out NaN/Inf images and truncated batch files (else an error)
    eval_batch: int = 256
    prefetch: int = 2
    progress: bool | None = None     # tqdm bar on stderr (None: when stderr is a terminal)
    verbose: bool = True             # one summary line per epoch on stdout
    timeout: float = DEFAULT_TIMEOUT  # MPI watchdog: seconds without a heartbeat from a rank
    stop_after: int | None = None    # end after this epoch (an interrupted run, for tests)
    extra: dict = field(default_factory=dict)  # strategy options (engine.parallel.runner)

    def __post_init__(self):
        strat = registry.get_strategy(self.parallel)
        self.extra = {**strat.extra, **(self.extra or {})}
        if self.lr is None:
            from engine.spec import PRESET_LR_SCALE
            scale = PRESET_LR_SCALE.get(self.model, 1.0) if isinstance(self.model, str) else 1.0
            self.lr = round(strat.default_lr(self.extra) * scale, 12)
        for k in ("epochs", "momentum", "batch"):
            if getattr(self, k) is None:
                setattr(self, k, strat.field_default(k))
        if self.workers is None:
            self.workers = 1
        elif self.workers != 1 and not strat.workers:
            takes = [s.name for s in registry.STRATEGIES.values() if s.workers]
            raise ValueError(f"workers applies to a parallel strategy ({', '.join(takes)}), "
                             f"not parallel={self.parallel!r}")
        for k in ("epochs", "batch", "eval_batch", "workers"):
            _integer(k, getattr(self, k), 1)
        if self.threads is not None:
            _integer("threads", self.threads, 1)
        _integer("seed", self.seed, 0)
        _integer("crop_pad", self.crop_pad, 0)
        if self.extra.get("max_pending") is not None:
            # negative: every worker would wait for a drained buffer forever
            _integer("max_pending", self.extra["max_pending"], 0)
        _number("lr", self.lr, lambda v: v > 0, "finite and > 0")
        _number("momentum", self.momentum, lambda v: 0 <= v < 1, "in [0, 1)")
        _number("weight_decay", self.weight_decay, lambda v: v >= 0, "finite and >= 0")
        _number("warmup", self.warmup, lambda v: v >= 0, "finite and >= 0")
        # checked here, not when a source without a test set is split: test_fraction=2
        # was taken for a source that has one, and refused for one that has none only
        # once its data were read
        _number("test_fraction", self.test_fraction, lambda v: 0 < v < 1, "in (0, 1)")
        # heartbeats go out up to once a second: a shorter timeout ends healthy jobs
        _number("timeout", self.timeout, lambda v: v >= 1, "finite and >= 1 (seconds)")
        if self.schedule not in ("constant", "step", "cosine"):
            raise ValueError(f"schedule must be constant, step or cosine, got {self.schedule!r}")
        if self.device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device must be auto, cpu or gpu, got {self.device!r}")
        if not 0 <= self.scale_jitter < 1:
            raise ValueError(f"scale_jitter must be in [0, 1), got {self.scale_jitter}")
        if self.resume and self.init_from:
            raise ValueError("resume continues a run with its own weights; init_from starts a new one "
                             "from another run's: give one of them")

    def to_dict(self) -> dict:
        """Every field, JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """From ``to_dict``'s form; unknown fields are an error."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {sorted(unknown)}")
        return cls(**d)


def _integer(name, v, low):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")


def _number(name, v, ok, what):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number {what}, got {v!r}")
    if not math.isfinite(v) or not ok(v):
        raise ValueError(f"{name} must be {what}, got {v}")


# Fields a resumed run may change; everything else is the run's own.
RESUME_MAY_CHANGE = ("epochs", "threads", "workers", "progress", "verbose", "device", "timeout",
                     "stop_after", "prefetch", "eval_batch")


# The input paths config.json keeps as they were given: --data, and a
# layer-wise run's --plan (stored resolved since it broke a resume from
# another folder; older runs hold it as given). The digits preset is no path.
_INPUTS = {
    "data": lambda train: None if "digits" in (train.get("data"), train.get("fmt")) else train.get("data"),
    "plan": lambda train: (train.get("extra") or {}).get("plan"),
}


def refuse_inputs_not_found_here(train: dict, config_path, fix: str, names=tuple(_INPUTS)) -> None:
    """A relative input path of the run read from another folder was refused
    as "no such file or folder for --data" (or "cannot read plan"), an
    option the user of `--resume` or `sprint eval` had not given: name the
    run's config.json and the folder it was looked for from."""
    for name in names:
        value = _INPUTS[name](train)
        if isinstance(value, str) and not os.path.isabs(value) and not os.path.exists(value):
            raise MissingFile(f"the run's {name} {value}, a relative path in its config.json, is not found "
                              f"from {os.getcwd()}: {fix}", config_path)


def resume_config(run_dir, **overrides) -> TrainConfig:
    """The saved config of ``run_dir`` set to resume there, with ``overrides``
    (e.g. more epochs) applied."""
    from .rundir import CONFIG, read_json
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    if run_dir.is_file():
        # `sprint eval` takes a checkpoint file or its folder; given to --resume, the file
        # was said to be "no such run directory" though it is there
        hint = f"; resume its run with --resume {run_dir.parent}" if (run_dir.parent / CONFIG).is_file() else ""
        raise RunError(f"--resume takes a run directory, not a file{hint}", run_dir)
    if not run_dir.is_dir():
        raise MissingFile("no such run directory", run_dir)
    if not path.exists():
        raise MissingFile(f"not a run directory (no {CONFIG})", run_dir)
    saved = read_json(path)
    d = saved.get("train") if isinstance(saved, dict) else None
    if not isinstance(d, dict):
        raise RunError("no 'train' options in the run's config", path)
    d = dict(d)
    d.pop("init_from", None)
    if not isinstance(d.get("threads"), int) or d["threads"] < 1:
        d["threads"] = None     # runs saved before 0 and negatives were refused ran with auto_threads
    d.update({k: v for k, v in overrides.items() if v is not None})
    model = d.get("model")
    if isinstance(model, str) and isinstance(saved.get("spec"), dict) and not os.path.exists(model):
        from engine.spec import PRESETS
        if model not in PRESETS:
            # its spec file moved, or a relative path from another folder: the net the run saved
            # (said "model 'net.json' is neither a preset nor a spec file (--model)", an option not given)
            d["model"] = saved["spec"]
    refuse_inputs_not_found_here(d, path, "resume from the folder the run was started in")
    d["resume"] = str(run_dir)
    d["out"] = str(run_dir)
    d["stop_after"] = overrides.get("stop_after")
    known = {f.name for f in fields(TrainConfig)}
    try:
        return TrainConfig.from_dict({k: v for k, v in d.items() if k in known})
    except (TypeError, ValueError) as e:
        if overrides.get(str(e).split(" ", 1)[0]) is not None:
            # a value given now (--epochs 0): the CLI names its option, not the saved config
            raise ValueError(str(e)) from None
        raise RunError(f"saved options are invalid: {e}", path) from None
