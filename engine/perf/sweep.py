"""Measurement harness: time the engine's kernels over size grids.

Each ``sweep_*`` function returns records ``{"kind", <size fields>, "t":
median seconds per call, "std": seconds, "n": calls timed, "holdout": bool}``
that ``fit.fit_profile`` turns into a machine profile. The same functions
serve ``sprint profile`` (quick/full) and the pytest-benchmark sweeps in
``bench/``. Kernels are called through the public ``engine.ops`` API and the
numpy operations the ASGD runner itself uses, so the profile prices what a
training step actually executes; kernels that are not built yet are skipped
(listed in ``skipped``) rather than faked.

Allreduce is timed in separate processes under ``mpiexec`` (``python -m
engine.perf.sweep --allreduce ...``), one job per rank count.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .timing import CLOCK, set_threads, time_call, use_clock  # noqa: F401  (public API)
from .sweep_kernels import (LAYER_NETS, SWEPT_NETS, TRANS, conv_shapes,  # noqa: F401
                            net_gemm_shapes, sgemm_grid, sweep_data, sweep_fc_softmax, sweep_handover,
                            sweep_layers, sweep_net_steps,
                            sweep_sgemm, sweep_vectors, sweep_vectors_cold)
from .sweep_layer_passes import LAYER_PASS_NETS, layer_pass_times, sweep_gapped_layer_passes, sweep_layer_passes  # noqa: F401
from .cache_decay import sweep_refill_decay  # noqa: E402
from .pool_cost import sweep_pooling  # noqa: E402
from .sweep_ops import sweep_conv_ops, sweep_fc_ops  # noqa: F401
from .sweep_mpi import (_allreduce_after_last, _allreduce_child, _contention_child, sweep_allreduce,  # noqa: F401
                        sweep_contention)
from .pipeline_probe import sweep_pipeline  # noqa: F401
from .sweep_runner import (CONTENTION_WORKLOADS, MID_PAIRS, MID_WORKLOADS, UPDATER_TIMERS, UPDATER_WORK, WORKER_SMALL,  # noqa: F401
                           WORKER_TIMERS, _runner_child, probe_host, runner_job, runner_step_means,
                           sweep_contention_long, sweep_contention_runner, sweep_loop_overhead, synthetic_npz)

QUICK = {"repeats": 7, "min_time": 2e-3, "sgemm_exp": (0, 2, 4, 6, 8, 9), "sgemm_nexp": (0, 2, 4, 6, 8, 10, 12, 14),
         "sgemm_kexp": (0, 2, 4, 6, 8, 10, 11), "sgemm_max": 2 ** 30, "sgemm_mid": 24, "batches": (1, 4, 16),
         "vec_exp": range(8, 25), "data_batches": (1, 2, 4, 8, 16, 32, 64), "ranks": (2, 3, 4),
         "allreduce_exp": range(10, 24, 3), "nets": SWEPT_NETS, "net_batches": (1, 4, 16), "im2col_max": 2 ** 25,
         "layer_pass_nets": LAYER_PASS_NETS, "layer_pass_batches": (1, 2, 4, 8, 16, 32), "layer_pass_repeats": 101,
         "net_step_nets": LAYER_PASS_NETS, "op_shapes": 96, "op_max": 2 ** 26}
FULL = {"repeats": 11, "min_time": 5e-3, "sgemm_exp": tuple(range(0, 10)), "sgemm_nexp": tuple(range(0, 16)),
        "sgemm_kexp": tuple(range(0, 13)), "sgemm_max": 2 ** 31, "sgemm_mid": 80, "batches": (1, 2, 4, 8, 16, 32),
        "vec_exp": range(6, 26), "data_batches": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64), "ranks": (2, 3, 4),
        "allreduce_exp": range(8, 25, 2), "nets": SWEPT_NETS, "layer_pass_nets": LAYER_PASS_NETS,
        "net_batches": (1, 2, 4, 8, 16, 32), "im2col_max": 2 ** 26, "op_shapes": 120, "op_max": 2 ** 27,
        "layer_pass_repeats": 151, "net_step_nets": LAYER_PASS_NETS}


def mode_config(quick: bool) -> dict:
    return dict(QUICK if quick else FULL)


# -- everything -----------------------------------------------------------------

def _steps(cfg, skipped, be):
    """name -> sweep of every step ``run_all`` knows, in running order."""
    steps = {"sgemm": lambda: sweep_sgemm(cfg, extra_shapes=net_gemm_shapes(cfg["nets"], cfg["net_batches"])),
             "layers": lambda: sweep_layers(cfg, skipped), "pooling": lambda: sweep_pooling(cfg, skipped),
             "fc+softmax": lambda: sweep_fc_softmax(cfg, skipped),
             "conv ops": lambda: sweep_conv_ops(cfg, skipped), "fc ops": lambda: sweep_fc_ops(cfg, skipped),
             "vectors": lambda: sweep_vectors(cfg, skipped), "cold vectors": lambda: sweep_vectors_cold(cfg, skipped),
             "handover": lambda: sweep_handover(cfg), "data": lambda: sweep_data(cfg, skipped),
             "net steps": lambda: sweep_net_steps(cfg, skipped),
             "layer passes": lambda: sweep_layer_passes(cfg, skipped),
             "gapped layer passes": lambda: sweep_gapped_layer_passes(cfg, skipped),
             "refill decay": lambda: sweep_refill_decay(cfg), "allreduce": lambda: sweep_allreduce(cfg),
             "loop overhead": lambda: sweep_loop_overhead(cfg), "contention": lambda: sweep_contention(cfg),
             "pipeline": lambda: sweep_pipeline(cfg)}
    if be.name == "cpu":
        steps["runner contention"] = lambda: sweep_contention_runner(cfg)
        steps["runner contention mid"] = lambda: sweep_contention_runner(cfg, pairs=MID_PAIRS,
                                                                         workloads=MID_WORKLOADS)
        steps["runner contention long"] = lambda: sweep_contention_long(cfg, skipped)
    return steps


SWEEPS = ("sgemm", "layers", "pooling", "fc+softmax", "conv ops", "fc ops", "vectors", "cold vectors", "handover", "data", "net steps", "layer passes", "gapped layer passes", "refill decay",
          "allreduce", "loop overhead", "contention", "runner contention", "runner contention mid", "runner contention long", "pipeline")


# Sweeps run only when named in ``only`` (``sprint profile --only``).
OPT_IN = ("gapped layer passes",)
# The runner's sweeps: on the cpu backend only (``_steps``).
CPU_ONLY = ("runner contention", "runner contention mid", "runner contention long")
# What ``allreduce=False`` (--no-allreduce) and ``contention=False``
# (--no-contention) leave out: the pipeline's runs need mpiexec too.
NO_ALLREDUCE = ("allreduce", "pipeline")
NO_CONTENTION = ("loop overhead", "contention") + CPU_ONLY
# Sweeps that start mpiexec jobs: ``sprint profile`` refuses them up front
# where mpiexec is missing, rather than each failing after the others' minutes.
NEEDS_MPIEXEC = ("allreduce", "pipeline", "contention") + CPU_ONLY


def selection(backend_name, only=None, allreduce=True, contention=True) -> list:
    """The names of the sweeps ``run_all`` runs on this backend."""
    names = [n for n in SWEEPS if backend_name == "cpu" or n not in CPU_ONLY]
    if only is not None:
        bad = [n for n in only if n not in SWEEPS]
        if bad:
            raise ValueError(f"unknown sweep{'s' * (len(bad) > 1)} {', '.join(map(repr, bad))}; choose from "
                             + ", ".join(SWEEPS))
        return [n for n in names if n in only]
    # Opt-in: their records change no fit unless asked (``l2_refill``: the gapped passes).
    return [n for n in names if n not in OPT_IN and (allreduce or n not in NO_ALLREDUCE)
            and (contention or n not in NO_CONTENTION)]


def merge_key(r) -> tuple:
    """What a re-run record replaces in merged records: its kind (and source);
    a runner contention record only its own net's."""
    return (r["kind"], r.get("source"), r.get("model") if r.get("source") == "runner" else None)


def run_all(quick=True, threads=1, allreduce=True, contention=True, log=print, only=None, merge=None) -> dict:
    """All sweeps (or the ``only`` ones); returns {"records", "skipped", "meta"}.

    ``merge``: an earlier result whose records of the re-run sweeps are
    replaced and the rest kept (``sprint profile --from-records OLD --only ...``).
    """
    cfg = mode_config(quick)
    applied = set_threads(threads)
    from engine import backend
    be = backend.get_backend()
    use_clock("cpu" if (threads == 1 and be.name == "cpu") else "wall")
    skipped = []
    steps = _steps(cfg, skipped, be)
    chosen = selection(be.name, only, allreduce, contention)
    names = [n for n in steps if n in chosen]
    from .calibrate import calibration_step, merge_calibrations, record
    from .sweep_drift import MARK_KEYS, mark
    # The machine and its speed, before and after the sweeps: what a later
    # predict checks its own calibration against.
    fp = record()
    recs, done = [], []
    t0 = time.perf_counter()
    # The host's speed between sweeps (sweep_drift): how far it moved while
    # the sweeps ran, kept with the records. CPU backend only: ``last``, the
    # mark before the next sweep (first the start's calibration), too.
    marks = be.name == "cpu"
    last = {k: v for k, v in (fp.get("calibration") or {}).items() if k in MARK_KEYS} if marks else None
    parts = {}

    def result(ran, after=True):
        if after:
            fp["calibration"] = merge_calibrations([fp["calibration"], calibration_step()])
        meta = {"quick": quick, "threads": threads, "threads_applied": applied, "backend": be.name, "fingerprint": fp,
                **({"part_calibrations": parts} if parts else {}),
                "nets": list(cfg["nets"]), "layer_nets": list(LAYER_NETS),
                "layer_pass_nets": [n if isinstance(n, str) else n["name"] for n in cfg["layer_pass_nets"]],
                "clock": CLOCK["name"],
                "seconds": time.perf_counter() - t0, "repeats": cfg["repeats"], "min_time": cfg["min_time"]}
        if merge is None:
            return {"records": recs, "skipped": skipped, "meta": meta}
        # A re-run sweep replaces its own kinds (the contention sweeps by source,
        # the runner's by net too: its two sweeps run different nets).
        fresh = {merge_key(r) for r in recs}
        kept = [r for r in merge.get("records", []) if merge_key(r) not in fresh]
        meta = dict(merge.get("meta", {}), **{f"resweep {n}": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                                              for n in ran})
        # The machine of the latest sweeps is the one the profile must match.
        meta["fingerprint"] = fp
        if parts or merge.get("meta", {}).get("part_calibrations"):
            meta["part_calibrations"] = dict(merge.get("meta", {}).get("part_calibrations") or {}, **parts)
        return {"records": kept + recs, "skipped": merge.get("skipped", []) + skipped, "meta": meta}

    try:
        for name in names:
            t1 = time.perf_counter()
            try:
                got = steps[name]()
            except Exception as e:
                # a sweep that cannot run here (no mpiexec, a kernel not built) is
                # listed, said at once, and its records left out rather than faked
                skipped.append(f"{name}: {type(e).__name__}: {e}")
                if log:
                    log(f"sweep {name}: skipped ({type(e).__name__}: {e})")
                done.append(name)
                continue
            if marks:
                now = mark()
                parts[name] = {"before": last, "after": now}
                last = now
                for r in got:
                    r["sweep"] = name
            recs += got
            done.append(name)
            if log:
                log(f"sweep {name}: {len(got)} points in {time.perf_counter() - t1:.1f} s")
    except KeyboardInterrupt as e:
        # Ctrl-C: the sweeps done are not lost. ``e.partial``: what run_all returns
        # of them (the interrupted one left out); ``e.left``: the sweeps not done.
        e.partial, e.left = result(done, after=False), names[len(done):]
        raise
    return result(names)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--allreduce-child", default=None)
    p.add_argument("--contention-child", default=None)
    p.add_argument("--runner-child", default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-time", type=float, default=2e-3)
    p.add_argument("--poll", type=float, default=0.0)
    a = p.parse_args(argv)
    if a.runner_child:
        _runner_child(json.loads(a.runner_child))
        return 0
    if a.contention_child:
        _contention_child(json.loads(a.contention_child))
        return 0
    if a.allreduce_child:
        _allreduce_child(json.loads(a.allreduce_child), a.repeats, a.min_time, a.poll)
        return 0
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
