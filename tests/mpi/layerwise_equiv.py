"""A layer-wise plan on N ranks against one process: loss of every step,
the whole gradient vector and the weights after --steps SGD steps agree to
--tol (relative to the largest entry).

Usage: mpiexec -n N python -m mpi4py tests/mpi/layerwise_equiv.py --plan data,owt,channel,spatial,mixed
           [--model PRESET_OR_SPEC_FILE]
"""
import argparse
import math

import numpy as np

from engine.net import Net
from engine.optim import SGD, constant
from engine.parallel.layerwise import LayerwiseExecutor
from engine.perf import layerwise as L

ap = argparse.ArgumentParser()
ap.add_argument("--plan", default="owt")
ap.add_argument("--model", default="digits")
ap.add_argument("--batch", type=int, default=12)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--dtype", default="float32")
ap.add_argument("--tol", type=float, default=1e-5)
args = ap.parse_args()

from mpi4py import MPI
comm = MPI.COMM_WORLD
N = comm.Get_size()
B = args.batch


def plan_for(kind):
    if kind in ("data", "owt", "model"):
        return L.named_plan(kind, args.model, N, B)
    p = L.named_plan("data", args.model, N, B)
    for v in L.graph_nodes(args.model):
        c = L._largest_divisor(v.out[0], N)
        if kind == "channel" and v.kind in ("conv", "fc"):
            p.layers[v.name] = (N // c, c, 1, 1)      # channels as far as they divide, samples for the rest
        elif kind == "spatial" and v.kind == "conv":
            h = 2 if N % 2 == 0 else N
            p.layers[v.name] = (1, 1, h, N // h)
        elif kind == "mixed":
            # a different split on every layer: rows, samples x channels, features, samples
            h = 2 if N % 2 == 0 else N
            mixed = {"conv1": (N // h, 1, h, 1), "conv2": (N // c, c, 1, 1), "fc1": (1, N, 1, 1),
                     "fc2": (N // L._largest_divisor(10, N), L._largest_divisor(10, N), 1, 1)}
            p.layers[v.name] = mixed.get(v.name, p.layers[v.name])
    return p


dtype = np.dtype(args.dtype)
lr, mom, wd = 0.05, 0.9, 1e-3


def check(kind):
    plan = plan_for(kind)
    ex = LayerwiseExecutor(Net(args.model, seed=4, dtype=dtype), plan, comm)
    # a rank holds its channel block of the layers it runs, nothing more
    held = sum(v.geom.n_params // plan.layers[v.name][1] for v in L.graph_nodes(args.model)
               if v.kind != "softmax" and comm.Get_rank() < math.prod(plan.layers[v.name]))
    assert ex.params.shape == ex.grads.shape == (held,), (kind, ex.params.shape, held)
    opt = SGD(ex.params, ex.grads, lr=lr, momentum=mom, weight_decay=wd, schedule=constant(lr))
    ref = Net(args.model, seed=4, dtype=dtype)
    ropt = SGD(ref, lr=lr, momentum=mom, weight_decay=wd, schedule=constant(lr))
    rng = np.random.default_rng(9)
    sp = ref.spec
    worst = 0.0
    for s in range(args.steps):
        x = rng.normal(size=(B, sp.m0, sp.x0, sp.x0)).astype(dtype)
        y = rng.integers(0, sp.n_classes, B)
        loss, right = ex.step(x, y)
        rloss, rright = ref.loss_and_grad(x, y)
        g = ex.whole(ex.grads)
        err_g = float(np.abs(g - ref.grads).max()) / float(np.abs(ref.grads).max())
        err_l = abs(loss - rloss) / abs(rloss)
        assert right == rright, (kind, s, right, rright)
        assert err_l < args.tol and err_g < args.tol, (kind, s, err_l, err_g)
        worst = max(worst, err_l, err_g)
        opt.step(s)
        ropt.step(s)
    w = ex.whole(ex.params, root=0)
    if comm.Get_rank() == 0:
        err_w = float(np.abs(w - ref.params).max()) / float(np.abs(ref.params).max())
        assert err_w < args.tol, (kind, err_w)
        # the velocity gathered from the owners is the one-process velocity
        err_v = float(np.abs(ex.whole(opt.velocity, root=0) - ropt.velocity).max()) / float(np.abs(ropt.velocity).max())
        assert err_v < args.tol, (kind, err_v)
    else:
        assert w is None and ex.whole(opt.velocity, root=0) is None
    if comm.Get_rank() == 0:
        print(plan.layers)
        print(f"LAYERWISE {kind.upper()} OK on {N} ranks: max rel error {max(worst, err_w):.2e}", flush=True)


for kind in args.plan.split(","):
    check(kind)
