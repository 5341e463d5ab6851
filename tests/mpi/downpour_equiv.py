"""Downpour with one replica and fetch_every = push_every = 1 equals the
sequential optimizer step for step: momentum SGD against the engine's own
single-process SGD (engine.optim.SGD), Adagrad against a float64 reference.

Usage: mpiexec -n S+1 python -m mpi4py tests/mpi/downpour_equiv.py --opt sgd|adagrad
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from toy import SoftmaxSource, init_weights, make_data  # noqa: E402
from engine.parallel import ps, ps_optim  # noqa: E402
from engine.parallel.abort import abort_on_error  # noqa: E402
from engine.parallel.comm import get_comm  # noqa: E402
from engine.parallel.downpour import DownpourConfig, DownpourReplica, DownpourServer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--opt", default="sgd", choices=["sgd", "adagrad"])
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--batch", type=int, default=8)
args = ap.parse_args()

comm = get_comm()
with abort_on_error(comm):
    S = comm.size - 1
    x, y, k = make_data(n=320, d=5, k=4, seed=3)
    w0 = init_weights(x.shape[1], k)
    bounds = ps.shard_bounds(w0.size, S)
    lr, mom, wd = (0.1, 0.9, 1e-3) if args.opt == "sgd" else (0.05, 0.0, 1e-3)
    cfg = DownpourConfig(lr=lr, max_samples=args.steps * args.batch, trace=True)
    mc = comm.comm
    if comm.rank < S:
        opt = ps_optim.make_server_opt(args.opt, bounds[comm.rank][1] - bounds[comm.rank][0], mom, wd)
        srv = DownpourServer(mc, comm.rank, bounds, w0, opt, [S], cfg)
        if comm.rank == 0:
            srv.on_epoch = None
        srv.run()
        if comm.rank == 0:
            srv.gather(final=True)
        mine = np.array(srv.trace)
        staleness = srv.staleness
    else:
        src = SoftmaxSource(x, y, k, args.batch)
        DownpourReplica(mc, bounds, src, cfg).run()
        mine, staleness = None, []
    traces = comm.allgather_obj(mine)
    stal = comm.allgather_obj(staleness)
    if comm.rank == 0:
        dist = np.concatenate(traces[:S], axis=1)
        # the sequential reference on the same data order
        src = SoftmaxSource(x, y, k, args.batch)
        ref = [w0.astype(np.float64)]
        if args.opt == "sgd":
            from engine.optim import SGD
            w, g = w0.copy(), np.zeros_like(w0)
            opt = SGD(w, g, lr=lr, momentum=mom, weight_decay=wd)
            for _ in range(args.steps):
                src.weights = w
                g[:] = src.compute(src.load()).grad
                opt.step()
                ref.append(w.astype(np.float64))
        else:
            w, h = w0.astype(np.float64), np.full(w0.size, 0.1)
            for _ in range(args.steps):
                src.weights = w.astype(np.float32)
                g = src.compute(src.load()).grad.astype(np.float64) + wd * w
                h += g * g
                w = w - lr * g / (np.sqrt(h) + 1e-10)
                ref.append(w.copy())
        ref = np.array(ref)
        assert dist.shape == ref.shape, (dist.shape, ref.shape)
        err = float(np.abs(dist - ref).max())
        moved = float(np.abs(ref[-1] - ref[0]).max())
        assert moved > 1e-2, f"weights hardly moved ({moved}); the comparison would be vacuous"
        assert err <= 1e-6, f"downpour ({args.opt}, {S} servers) differs from sequential by {err}"
        assert all(s == 0 for st in stal for s in st), "one replica, fetch every step: staleness must be 0"
        print(f"DOWNPOUR EQUIV OK opt={args.opt} servers={S} steps={args.steps} err={err:.2e} moved={moved:.2f}",
              flush=True)
