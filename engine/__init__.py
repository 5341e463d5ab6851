"""SPRINT CNN training engine.

    import engine
    net = engine.Net("digits")                     # preset, spec dict, JSON/YAML path or NetSpec
    result = engine.train(engine.TrainConfig(epochs=1, out="runs/d"))
    train_ds, test_ds = engine.load_dataset("digits")

Names load on first use so that ``import engine`` stays fast and works
without the compiled extension (e.g. for ``engine.spec`` only); ``dir(engine)``
and editors still see all of them.
"""
import typing as _typing

from ._lazy import lazy_names as _lazy_names

# name -> (module, attribute); one table for __getattr__, __all__ and __dir__
_LAZY = {
    "Net": ("engine.net", "Net"),
    "SGD": ("engine.optim", "SGD"),
    "TrainConfig": ("engine.train", "TrainConfig"),
    "evaluate": ("engine.train", "evaluate"),
    "load_checkpoint": ("engine.train", "load_checkpoint"),
    "NetSpec": ("engine.spec", "NetSpec"),
    "get_spec": ("engine.spec", "get_spec"),
    "load_dataset": ("engine.data", "load_dataset"),
    "Dataset": ("engine.data", "Dataset"),
    "DeformConfig": ("engine.data", "DeformConfig"),
    "Loader": ("engine.data", "Loader"),
}
# engine.train is the module and also callable as train(cfg): see engine/train.py
_SUBMODULES = ("train", "data", "spec", "ops", "backend", "optim", "net", "layers", "checkpoint",
               "metrics", "plot", "parallel", "perf", "selfcheck")

__all__ = sorted(_LAZY) + list(_SUBMODULES)

if _typing.TYPE_CHECKING:  # what editors and type checkers resolve; never run
    from . import (backend, checkpoint, data, layers, metrics, net, ops, optim, parallel, perf,  # noqa: F401
                   plot, selfcheck, spec, train)
    from .data import Dataset, DeformConfig, Loader, load_dataset  # noqa: F401
    from .net import Net  # noqa: F401
    from .optim import SGD  # noqa: F401
    from .spec import NetSpec, get_spec  # noqa: F401
    from .train import TrainConfig, evaluate, load_checkpoint  # noqa: F401


__getattr__, __dir__ = _lazy_names(__name__, globals(), _LAZY, _SUBMODULES)
