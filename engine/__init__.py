"""SPRINT CNN training engine.

Attributes load on first use so that ``import engine`` stays fast and works
without the compiled extension (e.g. for ``engine.spec`` only).
"""
from __future__ import annotations

import importlib

__all__ = ["Net", "SGD", "train", "evaluate", "TrainConfig", "data", "spec"]

_LAZY = {
    "Net": ("engine.net", "Net"),
    "SGD": ("engine.optim", "SGD"),
    "TrainConfig": ("engine.train", "TrainConfig"),
    "evaluate": ("engine.train", "evaluate"),
}
# engine.train is the module and also callable as train(): see engine/train.py
_SUBMODULES = {"train", "data", "spec", "ops", "backend", "optim", "net", "layers", "checkpoint", "metrics",
               "plot", "parallel", "perf"}


def __getattr__(name):
    if name in _LAZY:
        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f"engine.{name}")
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
