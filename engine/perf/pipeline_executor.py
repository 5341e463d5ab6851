"""The pipeline executor's costs beyond the kernels (engine.perf.pipeline's
``executor`` term, documented in its module docstring): the
:class:`Executor` a probe measures (engine.perf.pipeline_probe), its fit,
and the executor's own copies inside its timers. Kept apart from
engine.perf.pipeline for size; that module re-exports every name.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


KINDS = ("conv_f", "conv_b", "other_f", "other_b")


@dataclass(frozen=True)
class Executor:
    """The executor's costs beyond the kernels (engine.perf.pipeline's module
    docstring); ``sprint profile`` measures them (engine.perf.pipeline_probe)."""
    per_pass: float = 0.0           # s per timed forward or backward
    cold: float = 0.0               # the kernels' slowdown inside the pipeline, x their profile price
    per_instruction: float = 0.0    # s of untimed work per instruction
    shared: float = 0.0             # the extra slowdown of everything when ranks outnumber cores
    # x (1 + cold) on the kernels of conv / other layers, forward / backward:
    # what the profile's prices miss for each kind inside the pipeline (KINDS)
    conv_f: float = 1.0
    conv_b: float = 1.0
    other_f: float = 1.0
    other_b: float = 1.0

    @classmethod
    def load(cls, src) -> "Executor":
        """From a dict or a JSON file holding one (an "executor" key or the
        fields; factors it lacks are 1: a section written before them)."""
        import json
        from pathlib import Path
        d = src if isinstance(src, dict) else json.loads(Path(src).read_text())
        d = d.get("executor", d)
        kw = {k: float(d.get(k, 0.0)) for k in ("per_pass", "cold", "per_instruction", "shared")}
        kw.update({k: float(d.get(k, 1.0)) for k in KINDS})
        return cls(**kw)

    def kernels(self, conv: float, other: float, direction: str) -> float:
        """The kernels of a pass whose conv and other layers the profile prices
        at ``conv`` and ``other`` seconds, as they run inside the pipeline."""
        d = direction[0]
        return (1.0 + self.cold) * (getattr(self, f"conv_{d}") * conv + getattr(self, f"other_{d}") * other)

    def scaled(self, k: float) -> "Executor":
        """Its seconds x ``k`` (a profile's ``time_scale``: the host runs k x
        slower than when the profile was measured); the factors unchanged."""
        return replace(self, per_pass=k * self.per_pass, per_instruction=k * self.per_instruction)

    @classmethod
    def of_profile(cls, profile):
        """The executor's costs the profile's ``pipeline`` section holds
        (engine.perf.pipeline_probe), or None (a profile written before it)."""
        sec = profile.data.get("pipeline")
        return cls.load(sec) if sec and "executor" in sec else None

    def pass_time(self, kernels: float, copies: float) -> float:
        """One timed pass: its kernels (profile) slowed by cold caches, the
        executor's copies and its Python."""
        return (1.0 + self.cold) * kernels + copies + self.per_pass


def fit_executor(passes, untimed=()) -> Executor:
    """The Executor that best explains measured passes: ``passes`` holds
    (kernels' profile price, the executor's copies' price, measured) per
    timed pass, ``untimed`` the untimed seconds per instruction of each
    stage. Least squares of measured - copies = per_pass + (1 + cold) x
    kernels on the relative error, with per_pass >= 0 and cold >= 0 (a pass
    is never cheaper than the warm profile); per_instruction the median."""
    import numpy as np
    X = np.array([[1.0, k] for k, _, _ in passes])
    y = np.array([m - c for _, c, m in passes])
    w = 1.0 / np.array([m for _, _, m in passes])
    a, b = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)[0]
    if b < 1.0:
        a, b = float(np.sum((y - X[:, 1]) * w * w) / np.sum(w * w)), 1.0
    if a < 0.0:
        a, b = 0.0, float(max(1.0, np.sum(X[:, 1] * y * w * w) / np.sum(X[:, 1] ** 2 * w * w)))
    return Executor(float(a), float(b - 1.0), float(np.median(untimed)) if len(untimed) else 0.0)


def fit_kind_factors(ex: Executor, passes) -> Executor:
    """``ex`` with each KINDS factor fitted on its own passes: ``passes``
    holds (kind, kernels' profile price, copies' price, measured); the
    factor is the least-squares (relative) ratio of measured - copies -
    per_pass to (1 + cold) x kernels over that kind's passes, 1 where it has
    none. A pass mixing kinds is left out of both."""
    import numpy as np
    out = {}
    for kind in KINDS:
        rows = [(k, c, m) for kd, k, c, m in passes if kd == kind and k > 0]
        if not rows:
            continue
        k = np.array([(1.0 + ex.cold) * r[0] for r in rows])
        y = np.array([r[2] - r[1] - ex.per_pass for r in rows])
        w = 1.0 / np.array([r[2] for r in rows])
        out[kind] = float(max(0.2, np.sum(k * y * w * w) / np.sum(k * k * w * w)))
    return replace(ex, **out)


def executor_copies(schedule: str = "gpipe", predict_mode: str = "none"):
    """(forward, backward) passes over the stage's weights that
    engine.parallel.pipeline.StageExecutor makes inside its timers, beyond
    weight_costs' stash/spectrain versions: the trace sums the weights a
    forward and a backward used; off gpipe the trace keeps a copy of the
    forward's weights (SpecTrain also of its prediction); the backward
    copies the gradient into the update's buffer."""
    fwd = 1 + (0 if schedule == "gpipe" else 1 + (predict_mode == "spectrain"))
    return fwd, 2
