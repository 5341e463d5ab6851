"""Fault injection for Downpour under mpiexec: --role server|replica --index I
SIGKILLs itself (--mode kill) or raises (--mode raise) after a few pushes.
The job must end non-zero, never hang; rank 0 prints the role map first so
that the launcher's pid names the role."""
import argparse
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from toy import SoftmaxSource, init_weights, make_data  # noqa: E402
from engine.parallel import ps, ps_optim  # noqa: E402
from engine.parallel.abort import abort_on_error, install_abort_hooks  # noqa: E402
from engine.parallel.comm import get_comm  # noqa: E402
from engine.parallel.downpour import DownpourConfig, DownpourReplica, DownpourServer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--role", required=True, choices=["server", "replica"])
ap.add_argument("--index", type=int, default=0)
ap.add_argument("--mode", default="kill", choices=["kill", "raise"])
ap.add_argument("--servers", type=int, default=1)
ap.add_argument("--after", type=int, default=20)
args = ap.parse_args()


def fault():
    if args.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault in {args.role} {args.index}")


class FaultyServer(DownpourServer):
    def _apply(self, r, buf):
        if self.version == args.after:
            fault()
        super()._apply(r, buf)


class FaultySource(SoftmaxSource):
    def compute(self, batch):
        if self.count == args.after:
            fault()
        return super().compute(batch)


comm = get_comm()
install_abort_hooks(comm)
with abort_on_error(comm):
    S, mc = args.servers, comm.comm
    x, y, k = make_data(n=400, d=5, k=4)
    w0 = init_weights(5, k)
    bounds = ps.shard_bounds(w0.size, S)
    pids = comm.rank_map()
    if comm.rank == 0:
        print(f"sprint: {pids}\nsprint: downpour roles: {ps.role_map(S, comm.size, bounds)}", flush=True)
    comm.barrier()
    cfg = DownpourConfig(lr=0.05, max_seconds=120)
    if comm.rank < S:
        lo, hi = bounds[comm.rank]
        cls = FaultyServer if (args.role == "server" and args.index == comm.rank) else DownpourServer
        srv = cls(mc, comm.rank, bounds, w0, ps_optim.make_server_opt("sgd", hi - lo), range(S, comm.size), cfg)
        srv.run()
    else:
        faulty = args.role == "replica" and args.index == comm.rank - S
        src = (FaultySource if faulty else SoftmaxSource)(x, y, k, 4, shard=(comm.rank - S, comm.size - S),
                                                          delay=0.002)
        DownpourReplica(mc, bounds, src, cfg, index=comm.rank - S).run()
print("UNEXPECTED: run finished", flush=True)
