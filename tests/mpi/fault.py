"""Fault injection for ASGD under mpiexec.

--mode raise     : a worker thread of --rank raises mid-run
--mode raise-main: the updater (main thread) of --rank raises mid-run
--mode kill      : --rank SIGKILLs itself from a worker thread mid-run
--mode mismatch  : --rank starts with a different learning rate

The other ranks must end (non-zero) with a message naming the failed rank,
never hang; the test bounds everything with MPIEXEC_TIMEOUT and a timeout.
"""
import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toy import SoftmaxSource, init_weights, make_data  # noqa: E402
from engine.parallel.asgd import ASGD, ASGDConfig  # noqa: E402
from engine.parallel.abort import abort_on_error  # noqa: E402
from engine.parallel.comm import ConfigMismatch, config_hash, get_comm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--mode", required=True, choices=["raise", "raise-main", "kill", "mismatch"])
ap.add_argument("--rank", type=int, default=1)
ap.add_argument("--after", type=int, default=30, help="gradients before the fault")
args = ap.parse_args()


class Faulty(SoftmaxSource):
    def compute(self, batch):
        if self.count == args.after:
            if args.mode == "raise":
                raise RuntimeError("injected fault in a worker")
            if args.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        return super().compute(batch)


comm = get_comm()
with abort_on_error(comm):
    lr = 0.05 + (0.01 if args.mode == "mismatch" and comm.rank == args.rank else 0.0)
    ranks = comm.rank_map()
    if comm.rank == 0:
        print(f"sprint: {ranks}", flush=True)
    try:
        comm.check_agreement("config hash", config_hash({"model": "toy", "lr": lr}))
    except ConfigMismatch as e:
        if comm.rank == 0:
            print(f"sprint: {e}", file=sys.stderr, flush=True)
        comm.barrier()
        raise
    x, y, k = make_data(n=400, d=5, k=4)
    cls = Faulty if comm.rank == args.rank else SoftmaxSource
    srcs = [cls(x, y, k, 4, shard=(comm.rank * 2 + t, comm.size * 2), delay=0.002) for t in range(2)]

    def on_update(a):
        if args.mode == "raise-main" and comm.rank == args.rank and a.updates == args.after:
            raise RuntimeError("injected fault in the updater")

    ASGD(comm, init_weights(5, k), srcs, ASGDConfig(lr=lr, max_seconds=120), on_update=on_update).run()
print("UNEXPECTED: run finished", flush=True)
