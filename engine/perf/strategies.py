"""The cost model of each parallel strategy: one table, one line per strategy.

Each parallel strategy is a module under ``engine/parallel/`` with its cost
model beside it under ``engine/perf/``. A row of :data:`COST_MODELS` names
that cost-model module, which provides

* ``predict(spec, n_node, n_gpu, n_subbatch, profile=None, **kw)`` whose
  result has at least ``t_epoch`` (seconds per epoch) and ``as_dict()``;
  ``profile=None`` means the shipped profile (``Profile.load()``);
* ``format_prediction(p, per_layer=True, explain_terms=False) -> str``;

and optionally

* ``add_cli_arguments(parser)``: the strategy's own options of ``sprint
  predict`` and ``sprint simulate`` (``parser.add_argument`` only);
  ``add_simulate_arguments(parser)``: those of ``sprint simulate`` alone;
* ``cli_kwargs(args) -> dict``: the parsed options as keywords of its
  predict/simulate; an ``n_node`` entry replaces ``--nodes`` (which a
  strategy may then let the user leave out);
* ``simulate(spec, n_node, n_gpu, n_subbatch, profile=None, **kw)`` with
  ``as_dict()``, and ``format_simulation(sim, explain_terms=False) -> str``.

Two strategies may declare the same option (same flag and dest): it belongs
to both, each with its own default. An option of another strategy than the
chosen one is refused (argparse alone would accept it silently). A new
strategy plugs in with one line below; nothing else dispatches on its name.
"""
from __future__ import annotations

import argparse
import importlib

from engine.errors import RunError

# name -> module of its cost model (imported on first use)
COST_MODELS = {
    "asgd": "engine.perf.asgd",
    "pipeline": "engine.perf.pipeline",
    "downpour": "engine.perf.downpour",
    "sandblaster": "engine.perf.sandblaster",
}


def names() -> tuple:
    return tuple(COST_MODELS)


def module(name: str):
    try:
        target = COST_MODELS[name]
    except KeyError:
        raise ValueError(f"no cost model for strategy {name!r}; known: {', '.join(COST_MODELS)}") from None
    return importlib.import_module(target)


def cost_model(name: str):
    """The ``predict`` function of strategy ``name``."""
    return module(name).predict


def formatter(name: str):
    """The strategy's ``format_prediction``, for the CLI."""
    return module(name).format_prediction


def simulator(name: str):
    """(simulate, format_simulation) of strategy ``name``; a clear error when it has none."""
    mod = module(name)
    if not hasattr(mod, "simulate"):
        have = [n for n in COST_MODELS if hasattr(module(n), "simulate")]
        raise RunError(f"strategy {name} has a cost model (sprint predict) but no simulator; "
                       f"simulate one of {', '.join(have)}", "--parallel")
    return mod.simulate, mod.format_simulation


def predict(name: str, spec, n_node: int, n_gpu: int, n_subbatch: int, profile=None, **kw):
    """Predict one configuration of strategy ``name``."""
    return cost_model(name)(spec, n_node, n_gpu, n_subbatch, profile, **kw)


# ---- the strategies' own command-line options --------------------------------------
class _Declarer:
    """The ``parser`` a strategy's add_*_arguments sees: each option is
    added once (in the strategy's argument group) and remembered with the
    strategies that declared it, so that it can be refused under another."""

    def __init__(self, parser, options):
        self.parser, self.options = parser, options
        self.groups, self.name = {}, None

    def add_argument(self, *flags, **kw):
        seen = {self.options["flag"].get(f) for f in flags}
        if seen != {None}:
            action = seen.pop()
            if seen or set(flags) != set(action.option_strings):
                raise ValueError(f"strategy {self.name}: option {'/'.join(flags)} clashes with "
                                 f"{'/'.join(action.option_strings)} of another strategy")
            if kw.get("help") and kw["help"] not in (action.help or ""):
                # one help line, each owner's meaning named
                first = self.options["owners"][action.dest][0]
                mine = action.help if (action.help or "").startswith(f"{first}: ") else f"{first}: {action.help}"
                action.help = f"{mine}; {self.name}: {kw['help']}"
        else:
            group = self.groups.get(self.name) or self.parser.add_argument_group(f"--parallel {self.name}")
            self.groups[self.name] = group
            action = group.add_argument(*flags, **kw)
            for f in flags:
                self.options["flag"][f] = action
        # absent from the namespace unless given: that is how "given" is told apart
        self.options["default"].setdefault(self.name, {})[action.dest] = kw.get(
            "default", False if kw.get("action") == "store_true" else None)
        self.options["owners"].setdefault(action.dest, []).append(self.name)
        self.options["flag_of"][action.dest] = max(action.option_strings, key=len)
        action.default = argparse.SUPPRESS
        return action


def add_options(parser, command: str) -> dict:
    """Every strategy's options for ``command`` ('predict' or 'simulate') on
    ``parser``; returns the bookkeeping :func:`kwargs_from_args` needs."""
    options = {"flag": {}, "default": {}, "owners": {}, "flag_of": {}}
    dec = _Declarer(parser, options)
    hooks = ["add_cli_arguments"] + (["add_simulate_arguments"] if command == "simulate" else [])
    for name in COST_MODELS:
        dec.name = name
        mod = module(name)
        for hook in hooks:
            if hasattr(mod, hook):
                getattr(mod, hook)(dec)
    return options


def kwargs_from_args(name: str, args, options: dict) -> dict:
    """Refuse options of strategies other than ``name`` (one error naming
    them and their strategy), fill in ``name``'s defaults, and return its
    ``cli_kwargs(args)``."""
    foreign = sorted(d for d, owners in options["owners"].items() if hasattr(args, d) and name not in owners)
    if foreign:
        owners = sorted({o for d in foreign for o in options["owners"][d]})
        raise RunError(f"{'applies' if len(foreign) == 1 else 'apply'} to --parallel {' / '.join(owners)} "
                       f"only, not to --parallel {name}",
                       ", ".join(options["flag_of"][d] for d in foreign))
    for dest, default in options["default"].get(name, {}).items():
        if not hasattr(args, dest):
            setattr(args, dest, default)
    mod = module(name)
    return mod.cli_kwargs(args) if hasattr(mod, "cli_kwargs") else {}
