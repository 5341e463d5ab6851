"""Run ASGD on every rank and check the weight-carrying allreduce:

* after every update all ranks hold bit-identical LatestWeights;
* new weights == old weights + nu * DeltaWeights + the sum of every update
  value (-lr (g + wd w_fetched)) produced anywhere since the last update;
* every gradient produced is applied exactly once or counted as discarded at
  stop -- none lost, none applied twice.

Usage: mpiexec -n N python -m mpi4py tests/mpi/asgd_conservation.py [--workers W] ...
Prints "CONSERVATION OK <updates> <gradients>" on rank 0.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from toy import SoftmaxSource, init_weights, make_data  # noqa: E402
from engine.parallel.asgd import ASGD, ASGDConfig  # noqa: E402
from engine.parallel.abort import abort_on_error  # noqa: E402
from engine.parallel.comm import get_comm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--samples", type=int, default=6000)
ap.add_argument("--lr", type=float, default=0.05)
ap.add_argument("--momentum", type=float, default=0.9)
ap.add_argument("--wd", type=float, default=1e-3)
ap.add_argument("--min-grads", type=int, default=1)
ap.add_argument("--max-pending", type=int, default=0)
ap.add_argument("--tol", type=float, default=None)
ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
ap.add_argument("--delay", type=float, default=0.0, help="seconds of sleep per gradient")
args = ap.parse_args()
dtype = np.dtype(args.dtype)
if args.tol is None:
    args.tol = 1e-9 if dtype == np.float64 else 2e-5

comm = get_comm()
with abort_on_error(comm):
    x, y, k = make_data(n=601, d=5, k=4, seed=0)   # noisy blobs: gradients stay non-zero
    W, world = args.workers, comm.size * args.workers
    w0 = init_weights(x.shape[1], k, dtype=dtype)
    srcs = [SoftmaxSource(x, y, k, args.batch, shard=(comm.rank * W + t, world),
                          tag_prefix=(comm.rank, t), record=True,
                          delay=args.delay, dtype=dtype) for t in range(W)]
    cfg = ASGDConfig(lr=args.lr, momentum=args.momentum, weight_decay=args.wd,
                     max_samples=args.samples, min_grads=args.min_grads, trace=True,
                     max_pending=args.max_pending)
    a = ASGD(comm, w0, srcs, cfg).run()
    records = {}
    for s in srcs:
        records.update(s.record)
    mine = {"weights": np.array(a.trace_weights), "tags": a.trace_tags,
            "discarded": a.discarded["tags"], "records": records,
            "minibatch": a.minibatch, "staleness": a.staleness}
    everyone = comm.allgather_obj(mine)

    # 1. identical LatestWeights on all ranks after every update
    ref = everyone[0]["weights"]
    for r, e in enumerate(everyone):
        assert e["weights"].shape == ref.shape, (r, e["weights"].shape, ref.shape)
        assert np.array_equal(e["weights"], ref), f"rank {r} LatestWeights differ from rank 0"

    # 2. each produced gradient applied exactly once (or discarded at stop)
    allrec = {}
    for e in everyone:
        allrec.update(e["records"])
    applied = [t for e in everyone for upd in e["tags"] for t in upd]
    discarded = [t for e in everyone for t in e["discarded"]]
    seen = applied + discarded
    assert len(seen) == len(set(seen)), "a gradient was applied twice"
    missing = set(allrec) - set(seen)
    assert not missing, f"{len(missing)} gradients lost, e.g. {sorted(missing)[:3]}"
    assert set(seen) <= set(allrec)

    # 3. new = old + nu * delta + sum(update values), update by update
    nu, lr, wd = dtype.type(args.momentum), args.lr, args.wd
    n_upd = ref.shape[0] - 1
    delta = np.zeros_like(ref[0])
    worst, smallest_single = 0.0, np.inf
    for u in range(n_upd):
        tags_u = [t for e in everyone for t in e["tags"][u]]
        total = np.zeros(ref.shape[1], np.float64)
        for t in tags_u:
            w_f, g = allrec[t]
            val = -lr * (g.astype(np.float64) + wd * w_f.astype(np.float64))
            smallest_single = min(smallest_single, float(np.abs(val).max()))
            total += val
        expect = ref[u].astype(np.float64) + (nu * delta).astype(np.float64) + total
        worst = max(worst, float(np.abs(ref[u + 1] - expect).max()))
        delta = ref[u + 1] - ref[u]   # the updater's DeltaWeights: fl(new - old)
        mb = args.batch * len(tags_u)
        assert everyone[0]["minibatch"][u] == mb, (u, everyone[0]["minibatch"][u], mb)
        if args.max_pending:
            assert len(tags_u) <= args.max_pending * W * comm.size, (u, len(tags_u))
    assert worst <= args.tol, f"weights differ from old+momentum+updates by {worst}"
    # the check must be able to see one lost update value
    assert smallest_single > 20 * args.tol, f"update values too small to test: {smallest_single}"
    if comm.rank == 0:
        stal = [s for e in everyone for s in e["staleness"]]
        print(f"CONSERVATION OK updates={n_upd} gradients={len(applied)} discarded={len(discarded)} "
              f"worst={worst:.2e} min_update={smallest_single:.2e} "
              f"mean_minibatch={np.mean(everyone[0]['minibatch']):.1f} max_staleness={max(stal)}",
              flush=True)
