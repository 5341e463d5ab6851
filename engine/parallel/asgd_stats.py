"""``asgd_stats.json``: what an ASGD run measured (SPEC's timers by name,
per-update minibatch and staleness), gathered over all nodes; ``sprint
report`` summarises it and the performance model is validated against it."""
from __future__ import annotations

import numpy as np

from .timers import StepTimers, summarize


def gather(asgd, extra: dict | None = None) -> dict:
    """The stats of ``asgd`` (an engine.parallel.asgd.ASGD) over all nodes;
    a collective: call it on every rank."""
    allst = asgd.comm.allgather_obj(asgd.local_stats())
    wt = StepTimers.gathered(s["worker"] for s in allst)
    ut = StepTimers.gathered(s["updater"] for s in allst)
    timers = {**{k: summarize(v) for k, v in wt.samples.items() if k not in ("Iteration", "IterationCPU")},
              **{k: summarize(v) for k, v in ut.samples.items() if k != "Iteration"}}
    t_gpu = summarize(wt.samples.get("Iteration", []))
    t_upd = summarize(ut.samples.get("Iteration", []))
    busy = sum(wt.total(k) for k in ("Iteration",))
    waiting = wt.total("LockGradient") + wt.total("FetchWeights")
    out = {
        "mode": "asgd",
        "n_node": asgd.comm.size,
        "n_gpu": len(asgd.sources),
        "T_GPU": t_gpu["mean"], "T_GPU_median": t_gpu["median"],
        "T_Update": t_upd["mean"], "T_Update_median": t_upd["median"],
        "timers": timers,
        "minibatch": list(asgd.minibatch),
        "N_Minibatch_avg": float(np.mean(asgd.minibatch)) if asgd.minibatch else 0.0,
        "grads_per_update": list(asgd.grads_per_update),
        "staleness": [x for s in allst for x in s["staleness"]],
        "updates": asgd.updates,
        "samples": asgd.samples_total,
        "gradients_produced": sum(s["produced"] for s in allst),
        "gradients_discarded_at_stop": sum(s["discarded"] for s in allst),
        "worker_wait_share": waiting / busy if busy else 0.0,
        "lock_wait_share": (wt.total("LockGradient") + wt.total("LockWeights")) / busy if busy else 0.0,
        "wall_s": getattr(asgd, "wall", 0.0),
        "worker_cpu_s": wt.total("IterationCPU"),
        "worker_busy_s": busy,
        "min_grads": asgd.cfg.min_grads,
        "lockstep": asgd.cfg.lockstep,
    }
    st = out["staleness"]
    out["staleness_mean"] = float(np.mean(st)) if st else 0.0
    if extra:
        out.update(extra)
    return out
