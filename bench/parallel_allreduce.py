"""Updater allreduce time for a parameter vector (default: the cifar net's),
as ASGD does it: one in-place float32 sum of N_Param + 5 values.

    for n in 1 2 3 4; do mpiexec -n $n python -m mpi4py bench/parallel_allreduce.py; done
"""
import argparse
import json
import time

import numpy as np

from engine.parallel.asgd_buffers import N_EXTRA
from engine.parallel.comm import get_comm
from engine.spec import get_spec, n_params

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="cifar")
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--poll", type=float, default=0.0, help="poll interval (s) instead of a blocking wait")
args = ap.parse_args()

comm = get_comm()
comm.poll_interval = args.poll
n = n_params(get_spec(args.model)) + N_EXTRA
buf = np.ones(n, np.float32)
comm.allreduce_(buf)          # warm up (connections, buffers)
times = []
for _ in range(args.reps):
    comm.barrier()
    t0 = time.perf_counter()
    comm.allreduce_(buf)
    times.append(time.perf_counter() - t0)
worst = comm.allreduce_scalars(times, op="max")   # a collective ends when its slowest rank does
if comm.rank == 0:
    print(json.dumps({"bench": "allreduce", "model": args.model, "n_node": comm.size, "n_param": n,
                      "median_ms": 1e3 * float(np.median(worst)), "min_ms": 1e3 * float(np.min(worst)),
                      "GB_per_s": 4 * n / float(np.median(worst)) / 1e9 if comm.size > 1 else None}))
