"""``--measure-layers``: the given net's layer passes timed on this machine,
now, in place of the fitted per-layer terms.

FlexFlow and PipeDream time each operator of the user's own network on the
target machine for a few iterations before they simulate. The fitted terms
(``layer_cost.compute_gradient_terms``) extrapolate from the swept shapes
and from the minute of the sweep: on held-out nets they were off by a
median 13-17 % per layer pass (bench/RESULTS.md section 4, sets 6-7), and
the machine drifts by x0.8-1.3 within the hour. Timing the net's own passes
(one thread, in-process, its thread CPU time: the clock of the sweeps) for
a fraction of a second replaces both. The contention and queueing model
stays as it is: a measured pass is still multiplied by the host's sharing
slowdown, and the softmax between the passes keeps its fitted price.
"""
from __future__ import annotations

import time

from engine import spec as spec_mod
from engine.errors import RunError

PASSES = ("fwd", "bwd")


class LayerMeasure:
    """{(layer, "fwd"|"bwd"): seconds} of a net at a batch size, timed on
    first use and kept. ``seconds``: the time one measurement may take
    (at least ``min_repeats`` steps, at most ``max_repeats``)."""

    def __init__(self, seconds=0.5, min_repeats=5, max_repeats=41):
        if seconds <= 0 or not 1 <= min_repeats <= max_repeats:
            raise ValueError("need seconds > 0 and 1 <= min_repeats <= max_repeats")
        self.seconds, self.min_repeats, self.max_repeats = seconds, min_repeats, max_repeats
        self.cache = {}

    @staticmethod
    def _key(spec, n):
        return spec_mod.get_spec(spec).hash(), int(n)

    def put(self, spec, n, times: dict) -> None:
        """Passes timed elsewhere (bench/validate_model.py's in-process passes)."""
        self.cache[self._key(spec, n)] = {(k[0], k[1]): float(v) for k, v in times.items()}

    def times(self, spec, n) -> dict:
        key = self._key(spec, n)
        if key not in self.cache:
            self.cache[key] = measure_passes(spec, n, self.seconds, self.min_repeats, self.max_repeats)
        return self.cache[key]


def measure_passes(spec, n, seconds=0.5, min_repeats=5, max_repeats=41) -> dict:
    """The median forward and backward of each layer of ``spec`` over steps
    of ``n`` samples, one thread; as many steps as fit in ``seconds``."""
    from .sweep import set_threads
    from .sweep_layer_passes import layer_pass_times
    set_threads(1)
    sp = spec_mod.get_spec(spec)
    one = layer_pass_times(sp, n, repeats=1, clock=time.thread_time)
    step = max(sum(t for t, _ in one.values()), 1e-6)
    repeats = max(min_repeats, min(max_repeats, int(seconds / step)))
    return {k: v[0] for k, v in layer_pass_times(sp, n, repeats=repeats, clock=time.thread_time).items()}


def enable(profile, seconds=0.5) -> None:
    """Price ``profile``'s ComputeGradient layers by measured passes. Only
    for a profile of the backend this process runs: the passes are timed
    here."""
    from engine import backend
    here = backend.get_backend().name
    there = profile.data.get("backend", "cpu")
    if there != here:
        raise RunError(f"the profile describes a {there} machine and this process runs on the {here}: "
                       "the passes timed here would not be its", "--measure-layers")
    profile.layer_measure = LayerMeasure(seconds=seconds)


def measured_rows(spec, n_subbatch, profile, fitted):
    """``compute_gradient_terms`` rows with each layer pass measured: one
    ``measured`` row per layer and pass, and the fitted ``loss`` rows (the
    softmax runs between the passes, outside every layer)."""
    got = profile.layer_measure.times(spec, n_subbatch)
    rows = []
    for g in spec_mod.layers(spec, n_subbatch):
        rows += [(g.name, pas, "measured", 1, got[(g.name, pas)]) for pas in PASSES if (g.name, pas) in got]
        rows += [r for r in fitted if r[0] == g.name and r[1] == "loss"]
    return rows
