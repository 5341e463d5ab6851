"""What one worker's net step costs in the runner's company, against the
same step back to back: ``Net.loss_and_grad`` on one thread (as a worker
runs it) alone on the same batch, on a new batch each step, after 4 MiB of
writes that evict the L2 (as DeformImage and the updater's vectors do),
and beside a Python thread that, after each step, does an updater's
vector work over N_Param while the next step runs (the GIL and the memory
traffic of 1 rank x 1 worker); with the sum of its layer passes as the
sweeps time them (``sweep_layer_passes.layer_pass_times``).

    python bench/step_context.py bench/specs/heldout_c3g.json 24

Each figure is the median over 3 rounds of the median of 55 steps, the
rounds interleaved; run it alone on the CPU. Found for set 29 (RESULTS
section 4): on the AMD EPYC VM the runner's ComputeGradient of that 3x3 net
ran 12-14 % above its layer passes, of its 5x5 net 3-4 %; timed at once
after the runner, the updater thread beside the worker and the evicting
writes reproduced the 3x3 net's gap to within 2 %, the updater the most
(5-7 %). On a host whose speed flips, rounds swing by more than that:
read it when the rounds agree.
"""
import argparse
import threading
import time

import numpy as np

from engine import backend, spec as spec_mod
from engine.errors import RunError
from engine.net import Net
from engine.parallel.threads import limit_this_thread
from engine.perf.sweep_layer_passes import layer_pass_times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="a preset name or a spec file")
    ap.add_argument("batch", type=int)
    args = ap.parse_args()
    backend.set_backend("cpu")
    limit_this_thread(1)
    try:
        sp = spec_mod.get_spec(args.spec)
    except RunError as e:
        raise SystemExit(f"step_context: error: {e}")
    net = Net(sp, seed=0)
    rng = np.random.default_rng(0)
    pool = [rng.standard_normal((args.batch,) + sp.input_shape).astype(np.float32) for _ in range(64)]
    y = rng.integers(0, sp.n_classes, args.batch)
    junk = np.ones(1 << 20, np.float32)
    n_param = spec_mod.n_params(sp)
    stop, ready = threading.Event(), threading.Event()

    def steps(mode, n=60):
        ts = []
        for i in range(n):
            x = pool[0] if mode == "same batch" else pool[i % len(pool)]
            if mode.startswith("evicted"):
                junk[:] += 1.0
            t = time.perf_counter()
            net.loss_and_grad(x, y)
            ts.append(time.perf_counter() - t)
            ready.set()                  # the gradient is handed over
        return float(np.median(ts[5:]))

    def updater():
        """1 x 1's updater: waits for each gradient, then sums it into the
        momentum and updates the weights over N_Param in numpy, while the
        worker runs its next step."""
        g, m, w = (np.ones(n_param, np.float32) for _ in range(3))
        while not stop.is_set():
            if ready.wait(0.1):
                ready.clear()
                m *= 0.9
                m += g
                w -= 0.01 * m

    res = {}
    for _ in range(3):          # rounds interleaved: the host's speed drifts between them
        res.setdefault("layer passes (sum)", []).append(
            sum(t for t, _ in layer_pass_times(sp, args.batch, 21).values()))
        for mode in ("same batch", "new batch", "evicted, new batch"):
            res.setdefault(mode, []).append(steps(mode))
        stop.clear()
        ready.clear()
        th = threading.Thread(target=updater, daemon=True)
        th.start()
        res.setdefault("new batch, updater beside", []).append(steps("new batch"))
        res.setdefault("evicted, updater beside", []).append(steps("evicted, new batch"))
        stop.set()
        th.join()
    base = np.median(res["same batch"])
    for k, v in res.items():
        print(f"{sp.name} n={args.batch} {k:28s} {1e3 * np.median(v):8.2f} ms  x{np.median(v) / base:.3f}  "
              f"(rounds {', '.join(f'{1e3 * t:.2f}' for t in v)})")


if __name__ == "__main__":
    main()
