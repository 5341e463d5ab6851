"""Downpour's communication measured apart from training, under
``mpiexec -n 1+R``: rank 0 is a real DownpourServer (Adagrad on a shard of
``--floats`` values), ranks 1..R real DownpourReplicas pushing a zero
gradient, so each step is one push and one fetch through the engine's
polling loops. ``--compute`` makes each replica also compute a digits
gradient per step (thrown away: the contention of R replicas that compute
between their messages, which the server's queue sees); ``--busy K`` starts
K processes computing digits gradients beside them. Prints 'CYCLE {...}'
with seconds per step of the replicas' fetch and push (means over
replicas) and the server's busy time per step (wall - idle), the numbers
engine.perf.downpour.predict takes as fetch_time, push_time and server_time.

    mpiexec -n 1+R python -m mpi4py bench/ps_probe.py [--steps 300] [--floats 151306] [--busy K] [--compute]
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

from engine.parallel import ps, ps_optim
from engine.parallel.asgd import Step
from engine.parallel.downpour import DownpourConfig, DownpourReplica, DownpourServer

BUSY = ("from engine.net import Net; import numpy as np; n = Net('digits'); "
        "x = np.random.default_rng(0).normal(size=(32, 1, 8, 8)).astype(np.float32); "
        "y = np.arange(32) % 10\nwhile True: n.loss_and_grad(x, y)")


class ZeroSource:
    """A replica's source whose gradient is free (only the messages cost),
    or, with ``net``, costs one digits gradient computed and thrown away."""

    def __init__(self, n, net=False):
        self.weights = np.zeros(n, np.float32)
        self.grad = np.zeros(n, np.float32)
        self.net = None
        if net:
            from engine.net import Net
            self.net = Net("digits")
            self.x = np.random.default_rng(0).normal(size=(32, 1, 8, 8)).astype(np.float32)
            self.y = np.arange(32) % 10

    def load(self):
        return None

    def deform(self, batch):
        return batch

    def compute(self, batch):
        if self.net is not None:
            self.net.loss_and_grad(self.x, self.y)
        return Step(grad=self.grad, n=32, loss=0.0, correct=0, tag=None)


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--floats", type=int, default=151306)
ap.add_argument("--busy", type=int, default=0)
ap.add_argument("--compute", action="store_true")
args = ap.parse_args()
comm = MPI.COMM_WORLD
rank, R = comm.Get_rank(), comm.Get_size() - 1
procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)] if rank == 0 else []
comm.Barrier()
time.sleep(1.0 if args.busy else 0.0)         # let the busy ones start computing
bounds = ps.shard_bounds(args.floats, 1)
cfg = DownpourConfig(lr=0.0, max_samples=32 * args.steps * R)
if rank == 0:
    srv = DownpourServer(comm, 0, bounds, np.zeros(args.floats, np.float32),
                         ps_optim.make_server_opt("adagrad", args.floats), range(1, R + 1), cfg).run()
    st = srv.stats()
    reps = comm.gather(None, root=0)[1:]      # after the serving loop: no message may reach it
    print("CYCLE " + json.dumps({"fetch_time": float(np.mean([r[0] for r in reps])),
                                 "push_time": float(np.mean([r[1] for r in reps])),
                                 "compute_time": float(np.mean([r[2] for r in reps])),
                                 "server_time": (st["wall_s"] - st["idle_s"]) / max(st["applied"], 1),
                                 "busy": args.busy, "replicas": R, "compute": args.compute,
                                 "floats": args.floats, "steps": int(sum(r[3] for r in reps))}), flush=True)
else:
    rep = DownpourReplica(comm, bounds, ZeroSource(args.floats, args.compute), cfg, index=rank - 1).run()
    t = rep.stats()["timers"]
    comm.gather((t["Fetch"]["total"] / rep.fetches, t["PushTotal"]["total"] / rep.pushes,
                 t["Compute"]["total"] / max(rep.steps, 1), rep.steps), root=0)
for p in procs:
    p.kill()
comm.Barrier()
