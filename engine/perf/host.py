"""A CPU host shared by ranks, workers and updaters: cache regimes of the
flat-vector steps, the updaters' share of the cores, the allreduce under
load, and oversubscription (more busy threads than cores)."""
from __future__ import annotations

import math

from engine import spec as spec_mod
from engine.errors import counted


def _allreduce_cost(pr, cpu, n_node, n_gpu, ranks_per_host, model, n_param, slice_wait):
    """Allreduce of N_Param + a few counters, from the allreduce fit.

    Its sweep runs on an otherwise idle host. When the ranks share a CPU
    host with busy workers, each poll of the collective waits for a core:
    the fit is scaled by the load the contention sweep measured for this
    sharing (``Profile.allreduce_load``).
    """
    if n_node <= 1:
        return 0.0
    load = pr.allreduce_load(ranks_per_host, n_gpu, model) if (cpu and ranks_per_host > 1) else 1.0
    # Ranks sharing a host's cores with busy workers: each poll of the
    # collective waits for a time slice (and, more ranks than cores, for a
    # descheduled GIL holder): measured per cycle by the runner contention
    # sweep beyond the model (fit_steps.anchor_contention), >= 0.
    # ``slice_wait`` is its ``(c, beta[, t0])`` (``slice_terms``, or a
    # caller's own); the part that grows with the step is added where
    # T_GPU is known (step_times._updater_steps).
    wait = max(slice_wait[0], 0.0)
    return load * pr.allreduce_bw(n_node, n_param) + wait


def cycle_gap(pr, cpu, ranks_per_host, n_gpu, model) -> tuple:
    """``(c, beta)``: a worker's cycle beyond its timed steps, ``c + beta *
    T_GPU`` seconds (``Profile.cycle_gap``); (0, 0) off shared CPU hosts."""
    if not cpu:
        return 0.0, 0.0
    return pr.cycle_gap(ranks_per_host, n_gpu, model)


def slice_terms(pr, cpu, ranks_per_host, n_gpu, model, n_param) -> tuple:
    """``(c, beta, t0)`` of the updaters' wait for time slices per cycle,
    ``c + beta T / (1 + T / t0)`` at T = T_GPU: with more ranks than cores
    the curve through the swept nets' waits (``slice_wait.slice_curve``),
    else (or where too few nets were swept) ``Profile.slice_terms``'s line
    (t0 infinite); (0, 0, inf) off shared CPU hosts."""
    if not (cpu and ranks_per_host > 1):
        return 0.0, 0.0, math.inf
    from .slice_wait import slice_curve
    curve = slice_curve(pr, ranks_per_host, n_gpu)
    return curve if curve is not None else pr.slice_terms(ranks_per_host, n_gpu, model, n_param) + (math.inf,)


def _cold(profile, name, footprint=None):
    """``name`` priced with cold caches when the profile swept it so and a
    step's data (``footprint`` bytes) do not fit in the last-level cache."""
    llc = profile.data.get("cache", {}).get("llc_bytes")
    if footprint is not None and llc and footprint <= llc:
        return name
    return name + "_cold" if profile.has(name + "_cold") else name


def _updater_excess(pr, cpu, ranks_per_host, n_gpu, model, n_param=0):
    """Seconds per cycle the runner's updater spent beyond its modelled
    steps in the contention sweep of this host sharing (GIL waits behind
    the node's workers); 0 off CPU hosts or when not measured."""
    if not cpu:
        return 0.0
    return pr.sharing_excess("updater_excess", ranks_per_host, n_gpu, model, n_param)


def step_footprint(sp, n_subbatch) -> int:
    """Bytes a worker iteration streams through the caches: the flat
    parameter, gradient and published-weights vectors, and per layer its
    activations and column matrix."""
    acts = 0
    for g in spec_mod.layers(sp, n_subbatch):
        acts += g.im2col_elems + n_subbatch * spec_mod._prod(g.extra.get("conv_out", g.out_shape))
    return 4 * (3 * spec_mod.n_params(sp) + acts)


def updater_duty(p: "Prediction", profile) -> float:
    """Share of one core a node's updater keeps busy: its vector steps
    (without the host slowdown they were given) and the allreduce's own
    summing and copying, 2 (N-1)/N N_Param elements, per T_Update. The
    polls and the waits sleep."""
    if p.t_update <= 0:
        return 0.0
    work = sum(p.updater.get(k, 0.0) for k in ("SumGradient", "AddMomentum", "UpdateMomentum")) \
        / p.extra.get("updater_slowdown", p.slowdown)
    if p.n_node > 1:
        work += profile.term(_cold(profile, "add"), 2 * (p.n_node - 1) * p.n_param // p.n_node)
    return min(work / p.t_update, 1.0)


def core_share(ranks, n_gpu, cores, duty):
    """Slowdown of each worker thread when ``ranks`` nodes of ``n_gpu``
    workers share ``cores`` with their updaters. The workers run niced
    (engine.parallel.runner.CPU_WORKER_NICE), so the updaters take their
    ``duty`` first and the workers split the rest."""
    free = max(cores - ranks * duty, 0.1 * cores)
    return max(1.0, ranks * n_gpu / free)


class Oversubscribed(ValueError):
    """More busy threads than cores, in a sharing the profile never measured."""


def oversubscription(profile, ranks_per_host: int, n_gpu: int, model: str = "", threads: int = 1):
    """None when the busy threads fit the cores (or each worker has a GPU);
    else how the time-sharing is priced: from the runner contention sweep's
    run of this very sharing, or of another sharing with as many busy
    threads (``Profile.slowdown`` takes the nearest by thread count). Raises
    ``Oversubscribed`` when no measured sharing had that many busy threads:
    a slowdown extrapolated by thread count was off by 45-70 % on
    N_Minibatch_avg (issue 15), so the model refuses to guess."""
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    busy = ranks_per_host * n_gpu * threads
    if profile.data.get("backend", "cpu") != "cpu" or busy <= profile.cores:
        return None
    entries = profile._contention()
    measured = sorted({(e["ranks"], e["workers"]) for e in entries})
    entry = profile.contention_entry(ranks_per_host, n_gpu, model)
    # More processes than cores: the updaters and the allreduce wait for
    # time slices that no term prices (measured, bench/RESULTS.md section 4).
    sliced = any(e.get("slice_wait") is not None for e in entries
                 if (e["ranks"], e["workers"]) == (ranks_per_host, n_gpu))
    ranks_note = "" if ranks_per_host <= profile.cores else (
        f"; {ranks_per_host} ranks on {profile.cores} cores: the updaters' wait for time slices is priced "
        f"from the runner contention sweep's wait per cycle beyond the model (c + beta T_GPU across the swept "
        f"nets that recorded their T_GPU, else read between them by N_Param)" if sliced else
        f"; {ranks_per_host} ranks on {profile.cores} cores: the updaters and the allreduce wait "
        f"for time slices the model does not price (T_Update measured 30-50 % longer than "
        f"predicted on held-out nets)")
    if entry is not None and threads == 1:
        return (f"time-sharing priced from the runner contention sweep's own {ranks_per_host}x{n_gpu} run "
                f"(net {entry.get('model')}, N_Subbatch {entry.get('n_subbatch')})" + ranks_note)
    # BLAS threads beyond one per worker were never swept: no slowdown prices them.
    same = sorted({(r, w) for r, w in measured if r * w == busy}) if threads == 1 else []
    if same:
        return (f"time-sharing priced from the contention sweep's runs with as many busy threads "
                f"({', '.join(f'{r}x{w}' for r, w in same)}); this {ranks_per_host}x{n_gpu}x{threads} sharing "
                f"itself was not measured" + ranks_note)
    raise Oversubscribed(
        f"{counted(ranks_per_host, 'rank')} x {counted(n_gpu, 'worker')} x {counted(threads, 'thread')} = "
        f"{counted(busy, 'busy thread')} on "
        f"{profile.cores} cores: oversubscribed, and the profile ({profile.source}) measured no sharing "
        f"with that many busy threads (measured ranks x workers: "
        f"{', '.join(f'{r}x{w}' for r, w in measured) or 'none'}, 1 thread each); run `sprint profile` "
        f"with that sharing or use fewer ranks/workers/threads")
