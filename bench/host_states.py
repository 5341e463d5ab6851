"""How steady is this host? The per-call time of a tiny SGEMM, as medians of
0.2 s windows, alone and then with a spinning process beside it.

On the AMD EPYC VM of 2026-12-02 (bench/RESULTS.md section 4, set 17) the
windows alone flipped between two states, 1.6-1.8 us and 2.6-3.2 us, every
0.2 to a few seconds; with a spinner on the other vCPU they stayed at the
slow one. A sweep's records are then a mix of the two, and a profile's fit
medians grow accordingly. Run it alone (cpu-exclusive):

    python bench/host_states.py [--seconds 6]

A held-out set meant for a steady host is judged at the first reading
that is steady (every phase's p90/p10 at most ``--steady``) before a
deadline: ``--until HH:MM`` repeats the reading every ``--every`` seconds
and then runs the command after ``--`` (exit 3 when no reading was steady
by then). ``--consecutive N`` waits for N steady readings in a row: on the
Xeon VM of 2026-12-06 a steady reading was mostly alone among unsteady
ones (4 of about 90), and the three sweeps begun at one found the host
unsteady again within minutes (RESULTS section 4, sets 24, 27 and 28).
``--lock FILE`` holds an flock on FILE during each reading and the
command, so that other timed work sharing the lock never overlaps them
(the command runs holding it: it must not take it again):

    python bench/host_states.py --until 09:30 --lock /tmp/cpu.lock -- bash judge.sh
"""
import argparse
import datetime
import fcntl
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np


# A reading is steady when every phase's windows' p90/p10 is at most this
# (bench/validate_report.py judges its readings before each run by it too).
STEADY = 1.10


def windows(call, seconds, width=0.2):
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        ts, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < width:
            s = time.perf_counter()
            call()
            ts.append(time.perf_counter() - s)
        out.append(float(np.median(ts)))
    return out


def tiny_sgemm():
    """One call of the engine's SGEMM on 4x4 matrices: almost nothing but the
    call's fixed cost, which follows the core's speed."""
    from engine import backend
    ext = backend.set_backend("cpu").ext
    x = np.ones((4, 4), np.float32)
    y = np.zeros((4, 4), np.float32)
    return lambda: ext.sgemm(x, x, y, False, False, 1.0, 0.0)


def reading(seconds):
    """[(phase, window medians in seconds)]: alone, with a spinner on the other vCPU, alone again."""
    call = tiny_sgemm()
    rows = [("alone", windows(call, seconds))]
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        rows.append(("with a spinner", windows(call, seconds)))
    finally:
        spin.kill()
    rows.append(("alone again", windows(call, seconds)))
    return rows


def spread(w) -> float:
    return float(np.percentile(w, 90) / np.percentile(w, 10))


def short_reading(seconds=1.0, width=0.1) -> dict:
    """One phase alone, short enough to take between the runs of a
    validation (bench/validate_model.py): the per-call median (us) and the
    p90/p10 of its ``width``-s windows."""
    w = np.array(windows(tiny_sgemm(), seconds, width))
    return {"us": float(np.median(w) * 1e6), "spread": spread(w), "windows": int(w.size),
            "at": datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")}


def report(rows) -> str:
    out = []
    for name, w in rows:
        w = np.array(w) * 1e6
        out.append(f"{name:15s} per call: median {np.median(w):.2f} us, p10 {np.percentile(w, 10):.2f}, "
                   f"p90 {np.percentile(w, 90):.2f} (p90/p10 x{spread(w):.2f}); "
                   "windows: " + " ".join(f"{v:.1f}" for v in w))
    return "\n".join(out)


@contextmanager
def held(path):
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def deadline(hhmm, now=None):
    """The next UTC time ``hhmm`` (today's, or tomorrow's when it has passed)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        h, m = (int(v) for v in hhmm.split(":"))
        at = now.replace(hour=h, minute=m, second=0, microsecond=0)
    except ValueError:
        raise SystemExit(f"host_states: error: --until {hhmm!r}: expected a UTC time HH:MM")
    return at if at > now else at + datetime.timedelta(days=1)


def wait_steady(a, read=reading, sleep=time.sleep, clock=None) -> int:
    """Readings every ``a.every`` s until ``a.consecutive`` in a row are
    steady (run ``a.then``, its exit status) or ``a.until`` passes (3)."""
    clock = clock or (lambda: datetime.datetime.now(datetime.timezone.utc))
    end = deadline(a.until, clock())
    need, run = a.consecutive, 0
    # Said first: a time already past today means tomorrow's.
    print(f"reading every {a.every:g} s until {end:%Y-%m-%d %H:%M} UTC (steady: every phase at most "
          f"x{a.steady:.2f}" + (f"; {need} steady readings in a row" if need > 1 else "") + ")", flush=True)
    while clock() < end:
        with held(a.lock):
            rows = read(a.seconds)
        worst = max(spread(w) for _, w in rows)
        print(f"== {clock():%Y-%m-%d %H:%M:%S} UTC\n{report(rows)}\nworst phase x{worst:.2f}", flush=True)
        run = run + 1 if worst <= a.steady else 0
        if run and run < need:
            print(f"steady, {run} of {need} in a row", flush=True)
        elif run:
            print(f"steady (every phase at most x{a.steady:.2f})" + (f": {' '.join(a.then)}" if a.then else ""),
                  flush=True)
            if not a.then:
                return 0
            with held(a.lock):
                return subprocess.call(a.then)
        sleep(a.every)
    print(f"host_states: not steady by {a.until} UTC: nothing run", flush=True)
    return 3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=6.0, help="seconds of each phase")
    p.add_argument("--until", default=None, help="UTC HH:MM: read again until steady or then")
    p.add_argument("--every", type=float, default=240.0, help="seconds between readings (--until)")
    p.add_argument("--steady", type=float, default=STEADY, help="steady: every phase's p90/p10 at most this")
    p.add_argument("--consecutive", type=int, default=1, help="--until: this many steady readings in a row")
    p.add_argument("--lock", default=None, help="flock this file during each reading and the command")
    p.add_argument("then", nargs=argparse.REMAINDER, help="-- COMMAND: run at the first steady reading")
    a = p.parse_args(argv)
    if a.then[:1] == ["--"]:
        a.then = a.then[1:]
    if a.then and not a.until:
        p.error("a command runs at a steady reading: give --until")
    if a.consecutive < 1:
        p.error(f"--consecutive {a.consecutive}: at least 1")
    if a.until:
        return wait_steady(a)
    print(report(reading(a.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
