"""SPRINT performance model: sweeps -> profile -> prediction, tuning, simulation (SPEC section 4).

The names below load on first use (PEP 562, ``engine._lazy``), as ``engine``'s:
importing a submodule (``engine.perf.pipeline`` for ``sprint info``'s options,
which every ``sprint`` command builds) then costs that submodule alone, not
the model and SciPy's optimizers behind it (0.5-0.7 s of each start).
"""
import typing as _typing

from engine._lazy import lazy_names as _lazy_names

_LAZY = {"Profile": ("engine.perf.profile", "Profile"), "Prediction": ("engine.perf.model", "Prediction"),
         "predict": ("engine.perf.model", "predict"), "format_prediction": ("engine.perf.model", "format_prediction")}

__all__ = list(_LAZY)

if _typing.TYPE_CHECKING:  # what editors and type checkers resolve; never run
    from .model import Prediction, format_prediction, predict  # noqa: F401
    from .profile import Profile  # noqa: F401


# Submodules too (engine.perf.model, .tune, ...) as attributes, as when this
# package imported the model eagerly and its submodules with it.
__getattr__, __dir__ = _lazy_names(__name__, globals(), _LAZY)
