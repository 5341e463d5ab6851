"""The round trip of a parameter-server request under mpiexec -n 2: rank 1
asks, rank 0 answers, both polling with the engine's sleep-and-test loops
(engine.parallel.ps), the reply a tiny message, so the time is the two
wake-ups and the MPI latency without the copies. ``--busy K`` starts K
processes computing digits gradients beside them (what a Downpour fetch sees:
the other replicas computing). Prints 'ROUNDTRIP mean median' in seconds.

    mpiexec -n 2 python -m mpi4py bench/ps_probe.py [--n 400] [--busy K]
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

from engine.parallel import ps

BUSY = ("from engine.net import Net; import numpy as np; n = Net('digits'); "
        "x = np.random.default_rng(0).normal(size=(32, 1, 8, 8)).astype(np.float32); "
        "y = np.arange(32) % 10\nwhile True: n.loss_and_grad(x, y)")

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=400)
ap.add_argument("--busy", type=int, default=0)
args = ap.parse_args()
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)] if rank == 0 else []
comm.Barrier()
time.sleep(1.0 if args.busy else 0.0)         # let the busy ones start computing
tiny, reply = np.zeros(1, np.float32), np.zeros(1, np.float32)
times = []
if rank == 0:
    st = MPI.Status()
    served = 0
    while served < args.n:
        if comm.Iprobe(source=1, tag=ps.FETCH, status=st):
            comm.Recv([tiny, MPI.FLOAT], source=1, tag=ps.FETCH)
            comm.Send([reply, MPI.FLOAT], dest=1, tag=ps.WEIGHTS)
            served += 1
        else:
            time.sleep(ps.POLL)
else:
    for _ in range(args.n):
        t0 = time.perf_counter()
        r = [comm.Irecv([reply, MPI.FLOAT], source=0, tag=ps.WEIGHTS),
             comm.Isend([tiny, MPI.FLOAT], dest=0, tag=ps.FETCH)]
        ps.wait_all(r)
        times.append(time.perf_counter() - t0)
        time.sleep(np.random.default_rng(len(times)).uniform(0, 2e-3))   # requests at random phases
    print("ROUNDTRIP " + json.dumps({"mean": float(np.mean(times)), "median": float(np.median(times)),
                                     "busy": args.busy, "n": args.n}), flush=True)
for p in procs:
    p.kill()
comm.Barrier()
