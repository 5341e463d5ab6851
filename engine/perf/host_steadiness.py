"""Is this host's speed steady? What a calibration's calls say of it, and the
note ``predict``/``tune``/``simulate``/``plan`` print when it is not.

A shared VM may run its cores at two speeds: on the AMD EPYC VM of
2026-12-02 a tiny SGEMM call, a Python loop and a large GEMM alike took
x1.65 longer in some 0.05-0.2 s windows than in others, flipping every
0.2 s to a few seconds, whatever this VM's other core was doing (another
tenant's load; ``bench/host_states.py``), and the share of fast windows
moved between 5 % and 100 % from one 4-s stretch to the next. A run of a
few seconds is then a sample of that mix: runs of one configuration spread
by 9 % (median over test set 17's 24 configurations, bench/RESULTS.md
section 4) and a prediction, which prices the host's average, cannot be
checked more closely than that on such a host. The calibration's own
calls show it: their medians over short windows (``WINDOW``) spread by
the states' ratio on an unsteady host and by a few percent on a steady
one. On the Intel Xeon VM of 2026-12-06 (three levels: 1.15, 1.5 and
1.9 us a tiny SGEMM call) the slow ones were not stolen time: the
kernel's steal counter (/proc/stat) rose by 0-2 ticks in a second of
them, so the core itself ran slower (its clock, or another tenant on its
hyperthread sibling), which no count inside the VM shows but timing.
"""
from __future__ import annotations

import numpy as np

# Seconds of one window: shorter than the states last (0.2 s and more),
# long enough for a few calls of the calibration's Python part (about 1 ms).
WINDOW = 0.05
# Fewer windows than this say nothing (a short test calibration).
MIN_WINDOWS = 10
# Windows' slow tenth over their fast tenth beyond which the host is said to
# be unsteady: twice the calibration's noise floor (calibrate.MIN_NOISE) and
# more than a steady host's window-to-window scatter.
UNSTEADY = 1.3


def window_spread(starts, times, window: float = WINDOW) -> dict:
    """``{"spread": p90 / p10 of the windows' median call times, "fast":
    share of windows nearer the fast end (below the geometric middle),
    "windows": count}`` of calls begun at ``starts`` (seconds) lasting
    ``times``; {} with fewer than ``MIN_WINDOWS`` windows of 3 calls."""
    starts, times = np.asarray(starts, float), np.asarray(times, float)
    if starts.size == 0:
        return {}
    idx = np.floor((starts - starts[0]) / window).astype(int)
    meds = np.array([np.median(times[idx == i]) for i in np.unique(idx) if np.count_nonzero(idx == i) >= 3])
    if meds.size < MIN_WINDOWS:
        return {}
    lo, hi = np.percentile(meds, 10), np.percentile(meds, 90)
    return {"spread": float(hi / lo), "fast": float(np.mean(meds < np.sqrt(lo * hi))), "windows": int(meds.size)}


def note(calibration: dict | None) -> str | None:
    """The line said when ``calibration``'s windows spread beyond ``UNSTEADY``."""
    s = (calibration or {}).get("steadiness") or {}
    if s.get("spread", 1.0) <= UNSTEADY:
        return None
    return (f"this host's speed is not steady: the calibration's {WINDOW:g}-s windows ran up to "
            f"x{s['spread']:.2f} apart (the fast speed in {100 * s['fast']:.0f} % of them), as on a VM "
            "whose cores other tenants share; the prediction prices the host's average speed, and a run "
            "of a few seconds may land anywhere between its states: repeat a run, or run it longer, "
            "before reading a difference of a few percent (bench/host_states.py shows the states)")
