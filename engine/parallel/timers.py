"""Per-step wall-clock timers named after SPEC section 3.

Each thread owns its own :class:`StepTimers` (no locking on the hot path);
the trainer merges them at the end. Durations are kept raw so that medians
and distributions, not only means, reach ``asgd_stats.json``.
"""
from __future__ import annotations

import time

WORKER_STEPS = ("FetchWeights", "LockWeights", "LoadImage", "DeformImage", "ComputeGradient",
                "ComputeUpdateVal", "LockGradient", "UpdateGradient")
UPDATER_STEPS = ("WaitGradient", "SumGradient", "AddMomentum", "Allreduce", "UpdateMomentum",
                 "UpdateWeights")

_now = time.perf_counter


class _Span:
    __slots__ = ("_timers", "_name", "_t0")

    def __init__(self, timers, name):
        self._timers = timers
        self._name = name

    def __enter__(self):
        self._t0 = _now()
        return self

    def __exit__(self, *exc):
        self._timers.add(self._name, _now() - self._t0)
        return False


class StepTimers:
    """Named lists of durations (seconds)."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    def __call__(self, name: str) -> _Span:
        return _Span(self, name)

    def add(self, name: str, seconds: float) -> None:
        lst = self.samples.get(name)
        if lst is None:
            lst = self.samples[name] = []
        lst.append(seconds)

    def merge(self, *others: "StepTimers") -> "StepTimers":
        return StepTimers.gathered(t.samples for t in (self, *others))

    @staticmethod
    def gathered(sample_dicts) -> "StepTimers":
        """One StepTimers holding every sample of ``sample_dicts`` (the
        ``samples`` of several timers, e.g. gathered from every rank)."""
        out = StepTimers()
        for d in sample_dicts:
            for k, v in d.items():
                out.samples.setdefault(k, []).extend(v)
        return out

    def total(self, name: str) -> float:
        return float(sum(self.samples.get(name, ())))

    def summary(self) -> dict:
        return {k: summarize(v) for k, v in self.samples.items()}


def summarize(values) -> dict:
    """{"mean", "median", "count", "total"} of a list of seconds (zeros when empty)."""
    vals = sorted(values)
    n = len(vals)
    if n == 0:
        return {"mean": 0.0, "median": 0.0, "count": 0, "total": 0.0}
    mid = n // 2
    median = vals[mid] if n % 2 else 0.5 * (vals[mid - 1] + vals[mid])
    total = float(sum(vals))
    return {"mean": total / n, "median": float(median), "count": n, "total": total}
