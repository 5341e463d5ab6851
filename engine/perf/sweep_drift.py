"""The host's speed between sweeps: marks that ``sweep.run_all`` takes and a
profile keeps, and the warning ``sprint profile`` prints when it moved.

A quick sweep takes 18-30 minutes, and a shared host does not keep one speed
that long. On the AMD VM of 2026-12-02 the calibration workload ran 1.40 ms
before a sweep and 2.18 ms after it, and a one-second mark between the
sweeps of the next one read 1.57-2.61 ms (bench/RESULTS.md section 4, set
17): the host flips between a fast and a slow state every 0.2 s to a few
seconds (``bench/host_states.py``), so every record is a sample of one or
the other, and the fits' medians were 2-3 times the Intel VM's.

Each sweep's records are tagged with the sweep's name and ``meta
["part_calibrations"]`` holds the marks before and after it. Together the
marks are the calibration of the whole sweep, which ``sprint profile``
stores as the profile's (``sweep_reference``): the records were measured
over the sweep's minutes, not at its two ends (set 18's sweep read 2.26 ms
at both ends and 1.48-2.59 ms, mean 2.09, at its 20 marks).

No record is corrected by the marks. Rescaling each sweep's records by its
marks changed no prediction on the AMD VM (the marks' state is as random
as the records'). On the Intel VM of 2026-12-06, which keeps a state for
minutes, pricing each one-process sweep's records at the sweep's mean
state by the mean of its two marks (6395c60) took the seen set 25 from
20.1 to 9.6 % (T_GPU, calibrated) and was then judged on held-out set 26
(bench/RESULTS.md section 4): 22.0 %, where the same runs priced by the
records as measured come out at 11.9 % (set 26's layer passes, timed
between marks of 1.54 ms against a reference of 1.24 ms, were scaled by
x0.81, and its runs came out in that slow state). Two one-second marks do
not tell the state the runs will see: reverted.
"""
from __future__ import annotations

import numpy as np

MARK_SECONDS = 1.0
# Marks further apart than this (max / min - 1) get the warning: twice the
# calibration's own noise floor (calibrate.MIN_NOISE).
WARN_SPREAD = 0.2


# What a mark keeps of its calibration: the whole workload and the kernel and
# Python parts (the ones ``calibrate.RESCALES`` rescales by), each with its
# uncertainty, so that the marks can be read as calibrations of the sweeps'
# own minutes, not only as the wall time that shows the drift.
MARK_KEYS = ("wall_s", "u", "kernel_s", "u_kernel", "python_s", "u_python", "date")


def mark(seconds: float = MARK_SECONDS) -> dict:
    """A short calibration (wall seconds per call of the workload and of its
    kernel and Python parts, their uncertainties and the date): the host's
    speed between two sweeps."""
    from .calibrate import calibration_step
    c = calibration_step(seconds, blocks=3, compute=False)
    return {k: c[k] for k in MARK_KEYS if k in c}


def spread(meta: dict) -> tuple[float, float] | None:
    """(fastest, slowest) wall seconds of the marks, or None without marks."""
    walls = [m["wall_s"] for p in (meta.get("part_calibrations") or {}).values()
             for m in (p.get("before") or {}, p.get("after") or {}) if m.get("wall_s")]
    return (min(walls), max(walls)) if walls else None


def _moved(meta: dict) -> tuple[float, float] | None:
    """``spread`` where the marks moved beyond ``WARN_SPREAD``, else None."""
    s = spread(meta)
    return s if s is not None and s[1] / s[0] - 1 > WARN_SPREAD else None


def warning(meta: dict) -> str | None:
    """The line ``sprint profile`` prints when the host moved beyond the
    calibration's noise during the sweeps."""
    if (s := _moved(meta)) is None:
        return None
    return (f"the host's speed moved during the sweeps: the calibration between them ran {1e3 * s[0]:.2f}-"
            f"{1e3 * s[1]:.2f} ms (x{s[1] / s[0]:.2f}); the fits carry that noise, and a profile swept on a "
            "quieter host (or at a quieter time) predicts better. bench/host_states.py shows the host's states")


def profile_note(meta: dict, source: str = "the profile") -> str | None:
    """The note ``predict``/``tune``/``simulate``/``plan`` print for a
    profile whose sweeps saw the host move (``warning``): said at every use,
    not only once by ``sprint profile``, since that is where its times are
    read. Set 23 (2026-12-06, bench/RESULTS.md section 4) was judged on
    such a profile (marks x1.68 apart) and missed T_GPU by 15 %, its runs
    spreading by 27 % from one to the next."""
    if (s := _moved(meta)) is None:
        return None
    return (f"{source} was swept while the host's speed moved (its calibrations between the sweeps ran "
            f"{1e3 * s[0]:.2f}-{1e3 * s[1]:.2f} ms, x{s[1] / s[0]:.2f}): its times, and so these predictions, "
            "are a mix of the host's states; `sprint profile --quick` at a quieter time measures a steadier one "
            "(bench/host_states.py shows the states)")


def readings(meta: dict) -> list[dict]:
    """The marks taken after each sweep that timed the kernel and Python parts
    (``MARK_KEYS``; marks written before they did are left out)."""
    return [m for p in (meta.get("part_calibrations") or {}).values() for m in (p.get("after") or {},)
            if all(m.get(k) for k in ("wall_s", "kernel_s", "python_s"))]


def sweep_reference(cal: dict, meta: dict) -> dict | None:
    """The calibration the profile's records were measured at: the sweep's
    closing calibration ``cal`` (before and after merged,
    ``calibrate.merge_calibrations``) with the marks between the sweeps
    folded in, each reading weighted by the seconds its kernel and Python
    parts ran (3 for ``before`` and ``after``, 1 for a mark). ``u`` and the
    parts' uncertainties become the weighted mean's standard error over the
    readings, ``drift`` their spread's half-range relative to the mean
    (the before/after drift reads two of them only); the compute part,
    which the marks do not time, is kept. None without marks."""
    marks = readings(meta)
    ends = [c for c in (cal.get("before"), cal.get("after")) if c and all(c.get(k) for k in ("wall_s", "kernel_s", "python_s"))]
    if not marks or not ends:
        return None
    rows = [(3.0, c) for c in ends] + [(1.0, m) for m in marks]
    w = np.array([r[0] for r in rows])
    n_eff = w.sum() ** 2 / (w ** 2).sum()
    out = dict(cal, marks=len(marks))
    for key, u in (("wall_s", "u"), ("kernel_s", "u_kernel"), ("python_s", "u_python")):
        x = np.array([r[1][key] for r in rows])
        mean = float(np.average(x, weights=w))
        sd = float(np.sqrt(np.average((x - mean) ** 2, weights=w)))
        out[key], out[u] = mean, float(sd / mean / np.sqrt(n_eff))
    x = np.array([r[1]["wall_s"] for r in rows])
    out["drift"] = float((x.max() - x.min()) / 2 / out["wall_s"])
    return out
