"""Synchronous mode on N ranks x W workers == one process with N*W times the
batch (same samples per step), to 1e-5; replicas stay identical.

Usage: mpiexec -n N python -m mpi4py tests/mpi/sync_equiv.py [--workers W]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from toy import SoftmaxSource, init_weights, make_data  # noqa: E402
from engine.parallel.abort import abort_on_error  # noqa: E402
from engine.parallel.comm import LocalComm, get_comm  # noqa: E402
from engine.parallel.sync import SyncConfig, SyncSGD  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--workers", type=int, default=1)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--bucket-bytes", type=int, default=32)   # several buckets even for the toy
args = ap.parse_args()


class Concat:
    """One source whose batch is the union of the given sources' batches."""

    def __init__(self, parts):
        self.parts = parts
        self.weights = parts[0].weights.copy()
        self.k = parts[0].k

    def load(self):
        bs = [p.load() for p in self.parts]
        return np.concatenate([b[0] for b in bs]), np.concatenate([b[1] for b in bs])

    def deform(self, b):
        return b

    def compute(self, b):
        self.parts[0].weights = self.weights
        return self.parts[0].compute(b)


comm = get_comm()
with abort_on_error(comm):
    x, y, k = make_data(n=640, d=5, k=4, seed=3)
    W, world = args.workers, comm.size * args.workers
    w0 = init_weights(x.shape[1], k)
    cfg = SyncConfig(lr=0.1, momentum=0.9, weight_decay=1e-3, max_steps=args.steps,
                     bucket_bytes=args.bucket_bytes, trace=True)

    def shard_sources(ids):
        return [SoftmaxSource(x, y, k, args.batch, shard=(j, world)) for j in ids]

    dist = SyncSGD(comm, w0, shard_sources(range(comm.rank * W, comm.rank * W + W)), cfg).run()
    assert len(dist.buckets) > 2, dist.buckets
    ref = SyncSGD(LocalComm(), w0, [Concat(shard_sources(range(world)))], cfg).run()
    a, b = np.array(dist.trace_weights), np.array(ref.trace_weights)
    err = float(np.abs(a - b).max())
    assert err <= 1e-5, f"sync on {comm.size}x{W} differs from one process by {err}"
    moved = float(np.abs(b[-1] - b[0]).max())
    assert moved > 1e-2, f"weights hardly moved ({moved}); the comparison would be vacuous"
    finals = comm.allgather_obj(a[-1])
    assert all(np.array_equal(f, finals[0]) for f in finals), "replicas diverged"
    assert dist.samples_total == args.steps * args.batch * world
    if comm.rank == 0:
        print(f"SYNC OK ranks={comm.size} workers={W} steps={args.steps} err={err:.2e} moved={moved:.2f}",
              flush=True)
