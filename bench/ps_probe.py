"""One Downpour replica's communication without its training, under
``mpiexec -n 2``: rank 0 is a real DownpourServer (Adagrad on a shard of
``--floats`` values), rank 1 a real DownpourReplica whose gradient costs
nothing (a zero vector), so each step is one push and one fetch through the
engine's polling loops. ``--busy K`` starts K processes computing digits
gradients beside them (what a fetch sees: the other replicas computing).
Prints 'CYCLE {...}' with seconds per step of the replica's fetch and push
and the server's busy time per step (wall - idle), the numbers
engine.perf.downpour.predict takes as fetch_time, push_time and server_time.

    mpiexec -n 2 python -m mpi4py bench/ps_probe.py [--steps 300] [--floats 151306] [--busy K]
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

from engine.parallel import ps
from engine.parallel.asgd import Step
from engine.parallel.downpour import DownpourConfig, DownpourReplica, DownpourServer

BUSY = ("from engine.net import Net; import numpy as np; n = Net('digits'); "
        "x = np.random.default_rng(0).normal(size=(32, 1, 8, 8)).astype(np.float32); "
        "y = np.arange(32) % 10\nwhile True: n.loss_and_grad(x, y)")


class ZeroSource:
    """A replica's source whose gradient is free: only the messages cost."""

    def __init__(self, n):
        self.weights = np.zeros(n, np.float32)
        self.grad = np.zeros(n, np.float32)

    def load(self):
        return None

    def deform(self, batch):
        return batch

    def compute(self, batch):
        return Step(grad=self.grad, n=32, loss=0.0, correct=0, tag=None)


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--floats", type=int, default=151306)
ap.add_argument("--busy", type=int, default=0)
args = ap.parse_args()
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)] if rank == 0 else []
comm.Barrier()
time.sleep(1.0 if args.busy else 0.0)         # let the busy ones start computing
bounds = ps.shard_bounds(args.floats, 1)
cfg = DownpourConfig(lr=0.0, max_samples=32 * args.steps)
if rank == 0:
    srv = DownpourServer(comm, 0, bounds, np.zeros(args.floats, np.float32),
                         ps.make_server_opt("adagrad", args.floats), [1], cfg).run()
    st = srv.stats()
    comm.send((st["wall_s"] - st["idle_s"]) / max(st["applied"], 1), dest=1)
else:
    rep = DownpourReplica(comm, bounds, ZeroSource(args.floats), cfg).run()
    t = rep.stats()["timers"]
    server = comm.recv(source=0)
    print("CYCLE " + json.dumps({"fetch_time": t["Fetch"]["total"] / rep.fetches,
                                 "push_time": t["PushTotal"]["total"] / rep.pushes, "server_time": server,
                                 "busy": args.busy, "floats": args.floats, "steps": rep.steps}), flush=True)
for p in procs:
    p.kill()
comm.Barrier()
