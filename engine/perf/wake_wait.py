"""The wait a worker pays after waking its updater on a shared CPU host.

When a deposit finds the updater waiting for it (``step_times.
_idle_at_deposit``), the updater wakes at a higher priority than the niced
workers and, with every core busy, takes the depositing worker's core: the
worker waits through the updater's cycle before it fetches and loads. The
runner's FetchWeights and LoadImage ran 1.5-2.3 ms a step beyond their
price at 2 x 2 on the held-out nets of sets 2-9 (5-10 % of T_GPU), about
3 ms per deposit that woke the updater, and 0.2-0.3 ms at 1 x 2, 2 x 1 and
3 x 1; the model priced none of it.

Measured, not derived: per sharing, the runner contention sweep's own runs
give each swept net's excess at those two steps over the model's price,
per deposit that woke the updater in the model of that run. A swept net
takes its own; another net the median over the swept nets whose vectors
fit the L2 (cifar's 13 MB fetch copy slows under the sharing for another
reason, bandwidth, which its slowdown already prices)."""
from __future__ import annotations

import numpy as np

WAKE_STEPS = ("FetchWeights", "LoadImage")
# Runs whose model rarely had a deposit wake the updater say nothing of the wait.
MIN_WAKE_SHARE = 0.1


def wake_wait(profile, ranks_per_host: int, n_gpu: int, model: str, kw: dict) -> float:
    """Seconds a worker waits per deposit that wakes its updater, for this
    sharing (0 within one worker on one rank, or where not measured)."""
    if ranks_per_host * n_gpu < 2 or profile.data.get("backend", "cpu") != "cpu":
        return 0.0
    per = swept_wake_waits(profile, ranks_per_host, n_gpu, kw)
    if model in per:
        return per[model][0]
    small = [w for w, big in per.values() if not big]
    return float(np.median(small)) if small else 0.0


def swept_wake_waits(profile, R, n_gpu, kw) -> dict:
    """{swept net: (seconds per waking deposit, whether its vectors overflow
    the L2)} from the runner contention entries of this sharing; kept on the
    profile per sharing (``model.per_swept_run``)."""
    from .model import per_swept_run

    def runner_with_steps(e):
        return e.get("source") == "runner" and all(s in (e.get("worker") or {}) for s in WAKE_STEPS)

    def per_waking_deposit(e, ref):
        share = ref.extra.get("wake_share") or 0.0
        if share < MIN_WAKE_SHARE:
            return None
        excess = sum(e["worker"][s] * profile.time_scale - ref.worker[s] for s in WAKE_STEPS)
        return max(excess, 0.0) / share, profile._overflows_l2(e.get("n_param"))

    return per_swept_run(profile, R, n_gpu, kw, "_wake_waits", per_waking_deposit,
                         accept=runner_with_steps, wake=0.0)
