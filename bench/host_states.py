"""How steady is this host? The per-call time of a tiny SGEMM, as medians of
0.2 s windows, alone and then with a spinning process beside it.

On the AMD EPYC VM of 2026-12-02 (bench/RESULTS.md section 4, set 17) the
windows alone flipped between two states, 1.6-1.8 us and 2.6-3.2 us, every
0.2 to a few seconds; with a spinner on the other vCPU they stayed at the
slow one. A sweep's records are then a mix of the two, and a profile's fit
medians grow accordingly. Run it alone (cpu-exclusive):

    python bench/host_states.py [--seconds 6]
"""
import argparse
import subprocess
import sys
import time

import numpy as np


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=6.0)
    a = p.parse_args(argv)
    from engine import backend
    ext = backend.set_backend("cpu").ext
    x = np.ones((4, 4), np.float32)
    y = np.zeros((4, 4), np.float32)
    call = lambda: ext.sgemm(x, x, y, False, False, 1.0, 0.0)
    rows = [("alone", windows(call, a.seconds))]
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        rows.append(("with a spinner", windows(call, a.seconds)))
    finally:
        spin.kill()
    rows.append(("alone again", windows(call, a.seconds)))
    for name, w in rows:
        w = np.array(w) * 1e6
        print(f"{name:15s} per call: median {np.median(w):.2f} us, p10 {np.percentile(w, 10):.2f}, "
              f"p90 {np.percentile(w, 90):.2f} (p90/p10 x{np.percentile(w, 90) / np.percentile(w, 10):.2f}); "
              "windows: " + " ".join(f"{v:.1f}" for v in w))
    return 0


if __name__ == "__main__":
    sys.exit(main())
