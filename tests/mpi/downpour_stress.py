"""Downpour stress: many tiny steps from several replicas at mixed fetch and
push periods; at the end every server must have applied exactly the pushes
the replicas sent (counted per replica) and its shard must equal w0 minus
the exact sum of every pushed gradient (integers, so float32 sums are exact).

Usage: mpiexec -n S+R python -m mpi4py tests/mpi/downpour_stress.py --servers S
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from engine.parallel import ps, ps_optim  # noqa: E402
from engine.parallel.source import Step  # noqa: E402
from engine.parallel.abort import abort_on_error  # noqa: E402
from engine.parallel.comm import get_comm  # noqa: E402
from engine.parallel.downpour import DownpourConfig, DownpourReplica, DownpourServer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--servers", type=int, default=1)
ap.add_argument("--samples", type=int, default=3000)
ap.add_argument("--n", type=int, default=1001)
args = ap.parse_args()


class CountingSource:
    """Gradient of step i on replica r: (r + 1) * ((i % 5) + 1) * pattern."""

    def __init__(self, r, n):
        self.r, self.i = r, 0
        self.pattern = (np.arange(n) % 3 + 1).astype(np.float32)
        self.weights = np.zeros(n, np.float32)
        self.mult = []

    def load(self):
        return None

    def deform(self, b):
        return b

    def compute(self, b):
        m = (self.r + 1) * (self.i % 5 + 1)
        self.i += 1
        self.mult.append(m)
        return Step(grad=m * self.pattern, n=1, loss=0.0, correct=0)


comm = get_comm()
with abort_on_error(comm):
    S, mc = args.servers, comm.comm
    R = comm.size - S
    bounds = ps.shard_bounds(args.n, S)
    w0 = np.zeros(args.n, np.float32)
    if comm.rank < S:
        lo, hi = bounds[comm.rank]
        cfg = DownpourConfig(lr=1.0, max_samples=args.samples, poll=1e-4)
        srv = DownpourServer(mc, comm.rank, bounds, w0, ps_optim.make_server_opt("sgd", hi - lo, 0.0, 0.0),
                             list(range(S, comm.size)), cfg)
        srv.run()
        if comm.rank == 0:
            srv.gather(final=True)
        mine = {"w": srv.w, "lo": lo, "hi": hi, "from": srv.pushes_from, "version": srv.version,
                "samples": srv.samples}
    else:
        r = comm.rank - S
        rng = np.random.default_rng(r)
        cfg = DownpourConfig(lr=1.0, fetch_every=int(rng.integers(1, 4)), push_every=int(rng.integers(1, 4)),
                             poll=1e-4)
        src = CountingSource(r, args.n)
        rep = DownpourReplica(mc, bounds, src, cfg, index=r).run()
        pushed = sum(src.mult[:rep.steps - rep.discarded_grads])
        mine = {"pushes": rep.pushes, "pushed_mult": pushed, "steps": rep.steps,
                "discarded": rep.discarded_grads, "fe": cfg.fetch_every, "pe": cfg.push_every}
    allst = comm.allgather_obj(mine)
    if comm.rank == 0:
        servers, reps = allst[:S], allst[S:]
        total = sum(r["pushed_mult"] for r in reps)
        pattern = (np.arange(args.n) % 3 + 1).astype(np.float64)
        for s, sv in enumerate(servers):
            for i, rp in enumerate(reps):
                got = sv["from"][S + i]
                assert got == rp["pushes"], f"server {s} applied {got} pushes of replica {i}, it sent {rp['pushes']}"
            want = -total * pattern[sv["lo"]:sv["hi"]]
            err = float(np.abs(sv["w"].astype(np.float64) - want).max())
            assert err == 0.0, f"server {s}: shard differs from the sum of the pushes by {err}"
            assert sv["samples"] == servers[0]["samples"]
        assert sum(r["pushes"] for r in reps) > 200, "too few pushes for a stress test"
        assert servers[0]["samples"] >= args.samples
        print(f"DOWNPOUR STRESS OK servers={S} replicas={R} pushes={[r['pushes'] for r in reps]} "
              f"periods={[(r['fe'], r['pe']) for r in reps]} discarded={[r['discarded'] for r in reps]}",
              flush=True)
