"""The strategy table: every way to train a TrainConfig, by name.

A strategy is one module with a ``run(cfg) -> dict`` function; adding one is
one row here (the CLI's ``--parallel`` choices, TrainConfig's validation,
``engine.train`` / ``engine.parallel.run`` dispatch and the defaults all read
this table). Its module is imported only when the strategy runs; a strategy
with options of its own names a ``cli`` module that adds them to
``sprint train`` and turns them into ``cfg.extra``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

# Training defaults shared by every strategy unless its row says otherwise.
BASE_DEFAULTS = {"epochs": 10, "lr": 0.05, "momentum": 0.9, "batch": 32}


@dataclass(frozen=True)
class Strategy:
    name: str
    target: str                    # "module:function" taking a TrainConfig
    help: str
    workers: bool = False          # takes --workers (threads of workers per process)
    distributed: bool = True       # may span MPI ranks
    whole_set_batch: bool = False  # --batch may reach the whole training set (L-BFGS: at or past it, all of it)
    defaults: dict = field(default_factory=dict)   # TrainConfig fields
    extra: dict = field(default_factory=dict)      # defaults of cfg.extra
    # a module with add_train_options(parser) and extra_from_args(args) -> dict:
    # the strategy's own `sprint train` options, which land in cfg.extra
    cli: str | None = None
    # the default lr's factor given cfg.extra (a strategy whose steps see fewer samples than --batch)
    lr_factor: object = None
    lr: bool = True                # --lr sets its step (False: a line search chooses it)

    def field_default(self, name):
        return self.defaults.get(name, BASE_DEFAULTS.get(name))

    def default_lr(self, extra=None) -> float:
        """The lr a run of this strategy gets when --lr is left out (before
        the preset's scale)."""
        base = self.field_default("lr")
        return base * self.lr_factor(extra or {}) if self.lr_factor else base

    def function(self):
        mod, fn = self.target.split(":")
        return getattr(importlib.import_module(mod), fn)


# Stale gradients with heavy-ball momentum shrink the stable step sharply (a
# delay of one update takes lr*curvature from 3.8 to 0.1), so ASGD has its
# own defaults: these reach >= 95 % on digits with 2 ranks x 2 workers;
# max_pending 2 guards against a starved updater.
_ASGD = dict(epochs=12, lr=0.02, momentum=0.0)

STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    if strategy.name in STRATEGIES:
        raise ValueError(f"strategy {strategy.name!r} is already registered")
    STRATEGIES[strategy.name] = strategy
    return strategy


# one line per strategy
register(Strategy("none", "engine.train:run_single", "one process (no --parallel)", distributed=False))
register(Strategy("asgd", "engine.parallel.runner:run", "SPRINT asynchronous SGD over MPI ranks x worker threads",
                  workers=True, defaults=_ASGD, extra={"max_pending": 2}))
register(Strategy("sync", "engine.parallel.runner:run", "synchronous allreduce SGD over MPI ranks x worker threads",
                  workers=True))


def _pipeline_lr_factor(extra) -> float:
    """1f1b and dualpipe apply an update after every micro-batch, a step of
    --batch / M samples at the rate meant for --batch: their default lr is
    the base one over M (the linear scaling rule). At 0.05 on digits (M=4,
    2 stages, 30 epochs) dualpipe fell to chance by epoch 3 and stayed there;
    one process at batch 8 and 0.05 swung between 53 and 70 % for 10
    epochs. At 0.05/4 dualpipe reached 98.6-99.7 % (seeds 0-2), 1f1b on 3
    stages 99.4 %. gpipe updates once per mini-batch: one process's rate."""
    if (extra.get("schedule") or "gpipe") == "gpipe":
        return 1.0
    m = 4 if extra.get("microbatches") is None else extra["microbatches"]
    # a bad M is refused by the pipeline's own checks, with its option named
    return 1.0 / m if isinstance(m, int) and not isinstance(m, bool) and m >= 1 else 1.0


register(Strategy("pipeline", "engine.parallel.pipeline_run:run", "K pipeline stages x D replicas over K*D ranks "
                  "(GPipe, 1F1B, DualPipe)", cli="engine.parallel.pipeline_run", lr_factor=_pipeline_lr_factor))
register(Strategy("downpour", "engine.parallel.downpour_run:run", "DistBelief Downpour SGD: S parameter-server ranks "
                  "(--servers) and model replicas", defaults=dict(lr=0.05, momentum=0.0), extra={"servers": 1},
                  cli="engine.parallel.downpour_run"))
# Sandblaster's --batch is the L-BFGS batch, not a step's. At 32 it is one
# slice of 32: each evaluation goes to a single replica while the others
# idle, and the per-batch work (two evaluations, the reductions and commands)
# is paid every 32 samples -- on digits, 3 ranks, 3 epochs took 13.0 s against
# 6.7 s at 256 for the same 91.6 %. 256 cuts into 8 slices for the replicas
# and reaches >= 95 % in 8 epochs (the test).
_SANDBLASTER = dict(batch=256)
register(Strategy("sandblaster", "engine.parallel.sandblaster_replica:run", "DistBelief Sandblaster L-BFGS: S "
                  "parameter-server ranks, server 0 coordinating slices of --batch", defaults=_SANDBLASTER,
                  whole_set_batch=True, extra={"servers": 1}, cli="engine.parallel.sandblaster_replica", lr=False))
register(Strategy("layerwise", "engine.parallel.layerwise_run:run", "a layer-wise plan (sprint plan --out): "
                  "each layer split its own way over the ranks", cli="engine.parallel.layerwise_run"))


def cli_modules() -> list:
    """(strategy, module) of every strategy that has its own train options."""
    return [(s, importlib.import_module(s.cli)) for s in STRATEGIES.values() if s.cli]


def names() -> list[str]:
    return list(STRATEGIES)


def threaded() -> list[str]:
    """The strategies that take --workers."""
    return [s.name for s in STRATEGIES.values() if s.workers]


def get_strategy(name) -> Strategy:
    try:
        return STRATEGIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"parallel must be one of {', '.join(STRATEGIES)}; got {name!r}") from None


def run(cfg) -> dict:
    """Train ``cfg`` with the strategy it names."""
    return get_strategy(cfg.parallel).function()(cfg)
