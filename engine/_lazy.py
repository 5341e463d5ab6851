"""Names of a package that load on first use (PEP 562), for ``engine`` and
``engine.perf``: one table says which module holds each name, and the
package's ``__getattr__`` / ``__dir__`` come from here, not from a copy of
this logic in each ``__init__``.

Why lazily: every ``sprint`` command imports both packages; importing the
model, the trainer and SciPy's optimizers behind them up front cost 0.5-0.7 s
of each start.
"""
from __future__ import annotations

import importlib


def lazy_names(package: str, namespace: dict, names: dict, submodules=None):
    """``(__getattr__, __dir__)`` for ``package`` whose ``namespace`` is its
    ``globals()``.

    ``names``: {public name: (module, attribute)}. ``submodules``: the
    submodules given as attributes (``package.name``); None gives any
    submodule that exists, as a package that imported them eagerly did.
    A name found is stored in ``namespace``, so later look-ups skip
    ``__getattr__``."""
    def __getattr__(name):
        if name in names:
            mod, attr = names[name]
            value = getattr(importlib.import_module(mod), attr)
        elif submodules is None or name in submodules:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if submodules is not None or e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__():
        # The exports, what has loaded, and the dunders; not the private helpers.
        return sorted(set(namespace.get("__all__", ()))
                      | {k for k in namespace if k.startswith("__") or not k.startswith("_")})
    return __getattr__, __dir__
