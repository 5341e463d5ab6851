"""The cost model of each parallel strategy: one table, one line per strategy.

Each parallel strategy is a module under ``engine/parallel/`` with its cost
model beside it under ``engine/perf/``. A cost model is a function

    predict(spec, n_node, n_gpu, n_subbatch, profile=None, **kw) -> prediction

whose result has at least ``t_epoch`` (seconds per epoch), ``as_dict()``,
and, for ``sprint predict``, a ``format_prediction(p, per_layer=True)`` in
the same module. ``profile=None`` means the shipped profile
(``Profile.load()``). A new strategy plugs in with one line below; nothing
else dispatches on the strategy's name.
"""
from __future__ import annotations

import importlib

# name -> "module:function" of its cost model (imported on first use).
COST_MODELS = {
    "asgd": "engine.perf.model:predict",
    "pipeline": "engine.perf.pipeline:predict",
    "downpour": "engine.perf.downpour:predict",
}


def names() -> tuple:
    return tuple(COST_MODELS)


def _resolve(name: str):
    try:
        target = COST_MODELS[name]
    except KeyError:
        raise ValueError(f"no cost model for strategy {name!r}; known: {', '.join(COST_MODELS)}") from None
    mod, fn = target.split(":")
    return importlib.import_module(mod), fn


def cost_model(name: str):
    """The ``predict`` function of strategy ``name``."""
    mod, fn = _resolve(name)
    return getattr(mod, fn)


def formatter(name: str):
    """The strategy's ``format_prediction`` (its module's), for the CLI."""
    mod, _ = _resolve(name)
    return getattr(mod, "format_prediction")


def predict(name: str, spec, n_node: int, n_gpu: int, n_subbatch: int, profile=None, **kw):
    """Predict one configuration of strategy ``name``."""
    return cost_model(name)(spec, n_node, n_gpu, n_subbatch, profile, **kw)
