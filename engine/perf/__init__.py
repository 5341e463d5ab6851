"""SPRINT performance model: sweeps -> profile -> prediction, tuning, simulation (SPEC section 4).

The names below load on first use (PEP 562), as in ``engine/__init__.py``:
importing a submodule (``engine.perf.pipeline`` for ``sprint info``'s options,
which every ``sprint`` command builds) then costs that submodule alone, not
the model and SciPy's optimizers behind it (0.5-0.7 s of each start).
"""
import importlib as _importlib
import typing as _typing

_LAZY = {"Profile": "profile", "Prediction": "model", "predict": "model", "format_prediction": "model"}

__all__ = list(_LAZY)

if _typing.TYPE_CHECKING:  # what editors and type checkers resolve; never run
    from .model import Prediction, format_prediction, predict  # noqa: F401
    from .profile import Profile  # noqa: F401


def __getattr__(name):
    if name in _LAZY:
        value = getattr(_importlib.import_module(f"engine.perf.{_LAZY[name]}"), name)
    else:
        # A submodule (engine.perf.model, .tune, ...) as an attribute, as when
        # this package imported the model eagerly and its submodules with it.
        try:
            value = _importlib.import_module(f"engine.perf.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"engine.perf.{name}":
                raise
            raise AttributeError(f"module 'engine.perf' has no attribute {name!r}") from None
    globals()[name] = value
    return value
