"""The runner's ComputeGradient beyond the model's step, in seconds per
step (``overhead.runner_compute``): fitted from the runner contention
sweep's (1, 1) runs against the one-thread step timed beside them, priced
by ``Profile.runner_compute``. Apart from ``fit_steps`` (at its size cap),
whose ``anchor_contention`` calls it.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from .layer_cost import bytes_beyond_l2
from .cache_decay import refill_share
from .vector_age import mark_runner_shares, runner_age


def runner_compute_excess(prof: dict, by_net: dict, p) -> None:
    """Price the runner's ComputeGradient beyond the model's as seconds per
    step, ``c + d * N_Param`` (``overhead.runner_compute``), not as a factor.

    The excess of a net's 1 x 1 run over its modelled step is
    ``(host - 1) * step``: 0.17 ms for ``tiny`` (580 parameters), 3.4 ms for
    ``cifar`` (3.2 M). As a factor (1.23 and 1.08) it was read between the
    nets for others and missed held-out nets at N_Subbatch 1 by 20-30 %:
    their small steps carry the same per-step cost as ``tiny``'s and more,
    with the parameter vector's (gradient flattening, the updater's copies
    in the same caches). Every runner entry then keeps ``host`` 1: its
    ``rel`` alone prices the sharing.

    With the L2 size known, ``d`` is per byte of the parameter vector beyond
    one core's L2 (``l2_bytes`` stored beside it), as for the layers' cold
    weights: per parameter, cifar's excess (3.2 M parameters, 13 MB) put
    0.6 ms per step on heldout-wide's 243 K (1 MB, inside the L2), whose
    1 x 1 runs show 0.1-0.15 ms beyond their layers (bench/RESULTS.md
    section 4: set 4's nets run again before test set 5, as development
    data).

    The excess of a net is its (1, 1) runs' ComputeGradient minus the
    one-thread step timed beside them in the same sweep (``excess_solo``),
    not minus the model's step: that difference also held the layer terms'
    error on the swept nets at the sweep's minute (fitted an hour apart, on
    a machine that drifts by 10-30 % within that). It fitted ``c`` to 0 in
    bench/profiles/cpu_test6 while the runner's steps of held-out set 6's
    nets ran 0.2-0.5 ms beyond their layers' passes, and their T_GPU came
    out 20-30 % short at N_Subbatch 2. Entries without the probe (older
    records) keep ``(host - 1) * step``."""
    from engine import spec as spec_mod
    from .model import compute_gradient_terms
    l2 = (prof.get("cache") or {}).get("l2_bytes")
    size = (lambda n: bytes_beyond_l2(n, l2)) if l2 else (lambda n: float(n))
    # d per byte beyond the L2 at the vector's age in the sweep's run (vector_age).
    tau = (prof.get("overhead") or {}).get("vector_tau")
    mark_runner_shares(prof.get("contention", {}).get("entries", []), l2, tau)
    pts = []
    for net, es in by_net.items():
        if not es:
            continue
        e = es[0]
        sp = spec_mod.get_spec(net)
        age = runner_age(e)
        x = size(spec_mod.n_params(sp)) * (refill_share(age, tau) if (tau and age) else 1.0)
        if e.get("excess_solo") is not None:
            pts.append((x, e["excess_solo"], e["solo_wall"]))
            continue
        cg = sum(r[4] for r in compute_gradient_terms(sp, int(e["n_subbatch"]), p)) + p.per_step(spec_mod.n_params(sp))
        pts.append((x, (e["host"] - 1.0) * cg, None))
    if not pts:
        return
    n, x = (np.array(v, dtype=float) for v in list(zip(*pts))[:2])
    # A paired excess is a difference of two times measured a minute apart:
    # its error grows with the step (cifar's 35 ms step drifts by 0.4 ms,
    # more than tiny's whole excess), so each net weighs by 1 / its step.
    wt = np.array([1.0 / s if s else 1.0 for *_, s in pts]) if all(s for *_, s in pts) else np.ones(len(pts))
    if len(pts) == 1 or n.max() < 10 * max(n.min(), 1.0):
        c, d = max(float(np.median(x)), 0.0), 0.0
    else:
        c, d = nnls(np.column_stack([np.ones_like(n), n]) * wt[:, None], x * wt)[0]
    prof.setdefault("overhead", {})["runner_compute"] = dict({"c": float(c), "d": float(d)},
                                                             **({"l2_bytes": l2} if l2 else {}))
    for es in by_net.values():
        for e in es:
            e["host_fitted"], e["host"] = e["host"], 1.0
            e["ratio"] = e["rel"]
