"""argparse types shared by every command line of the engine (``sprint``'s
subcommands and the strategies' own options). A module of its own so that
the parallel and perf layers can declare their options without importing
the CLI (engine.cli imports them, not the other way round)."""
from __future__ import annotations

import argparse


def _int_at_least(low: int):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {v}")
        return v
    parse.__name__ = f"int >= {low}"
    return parse


# counts: a 0 or a negative value is refused where it is given (the error
# names the option), not taken for "unset" or left to hang a run further down
positive_int, nonneg_int = _int_at_least(1), _int_at_least(0)


def positive_float(text):
    """A finite number > 0 (a time, a factor, a target)."""
    import math
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return v


positive_float.__name__ = "number > 0"
