"""The pipeline executor on K ranks (one stage each) against one process.

gpipe: every update's gradient and the weights after each of the updates
equal a single Net + SGD on the same mini-batches, to 1e-5.
1f1b / dualpipe: the per-micro-batch version trace matches the closed form of
pipeline_schedule, the weights a backward really used match its --predict
(checksums of the buffers), and the stream completes without deadlock.

Usage: mpiexec -n K python -m mpi4py tests/mpi/pipeline_equiv.py
           [--schedule gpipe|1f1b|dualpipe] [--predict none|stash|spectrain] [--replicas D]
"""
import argparse

import numpy as np

from engine.net import Net
from engine.optim import SGD, constant
from engine.parallel import pipeline_schedule as S
from engine.parallel.abort import abort_on_error
from engine.parallel.comm import MPIComm, get_comm
from engine.parallel.pipeline import StageExecutor, micro_sizes, split_micro
from engine.parallel.stage import Stage, even_partition

ap = argparse.ArgumentParser()
ap.add_argument("--schedule", default="gpipe")
ap.add_argument("--predict", default="none")
ap.add_argument("--micro", type=int, default=4)
ap.add_argument("--batch", type=int, default=10)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--replicas", type=int, default=1)
ap.add_argument("--model", default="digits")
ap.add_argument("--fault", choices=["raise", "freeze", "kill"], default=None,
                help="stage 1 fails this way after its 3rd update")
ap.add_argument("--timeout", type=float, default=60.0)
args = ap.parse_args()

comm = get_comm()
with abort_on_error(comm):
    D = args.replicas
    K = comm.size // D
    assert K * D == comm.size, (K, D, comm.size)
    k, d = comm.rank % K, comm.rank // K
    if args.fault == "kill":
        ranks = comm.rank_map()     # the launcher names a dead process by pid
        if comm.rank == 0:
            print(f"sprint: {ranks}", flush=True)
    net = Net(args.model, seed=3)
    n_layers = len(net.layers)
    lo, hi = even_partition(n_layers, K)[k]
    stage = Stage(args.model, lo, hi, seed=3)
    acc = stage.grads.copy()
    lr, mom, wd = (0.05 if args.schedule == "gpipe" else 0.01), 0.9, 1e-3
    opt = SGD(stage.params, acc, lr=lr, momentum=mom, weight_decay=wd, schedule=constant(lr))
    mpi = comm.comm if isinstance(comm, MPIComm) else None
    rep = None
    if D > 1:
        rep = MPIComm(comm.comm.Split(color=k, key=d))
    base = d * K
    ex = StageExecutor(stage, k, K, args.schedule, args.micro, args.predict, opt, acc, mpi_comm=mpi,
                       ranks=(base + k - 1 if k else None, base + k + 1 if k < K - 1 else None, base, base + K - 1),
                       replicas=rep, timeout=args.timeout)
    ex.keep_grads = True

    def fault(ex):
        if args.fault is None or k != 1 or ex.version != 3:
            return
        if args.fault == "raise":
            raise RuntimeError("injected failure in stage 1")
        if args.fault == "kill":
            import os
            import signal
            os.kill(os.getpid(), signal.SIGKILL)
        import time
        time.sleep(3600)
    # ragged on purpose: the last mini-batch is short
    n_all = args.batch * args.steps - 3
    rng = np.random.default_rng(7)
    c, h, w = net.spec.input_shape
    X = rng.normal(size=(D, n_all, c, h, w)).astype(np.float32)
    Y = rng.integers(0, net.spec.n_classes, size=(D, n_all))

    def micro_iter(xs, ys):
        for lo_ in range(0, n_all, args.batch):
            yield from split_micro(xs[lo_:lo_ + args.batch], ys[lo_:lo_ + args.batch], args.micro)

    sizes, minis = micro_sizes(n_all, args.batch, args.micro)
    n_upd = len(minis) if args.schedule == "gpipe" else len(sizes)
    ex.run_stream(sizes, minis, micro_iter(X[d], Y[d]) if k == 0 else None,
                  epoch_at=lambda u: u / n_upd, on_update=fault)
    assert args.fault is None, "UNEXPECTED: the fault did not stop the job"
    assert ex.version == n_upd, (ex.version, n_upd)

    if args.schedule == "gpipe":
        # reference: the whole net, one process, each mini-batch of all replicas at once
        ref = SGD(net, lr=lr, momentum=mom, weight_decay=wd, schedule=constant(lr))
        ref_grads, ref_w = [], []
        for u, lo_ in enumerate(range(0, n_all, args.batch)):
            xb = np.concatenate([X[r, lo_:lo_ + args.batch] for r in range(D)])
            yb = np.concatenate([Y[r, lo_:lo_ + args.batch] for r in range(D)])
            net.loss_and_grad(xb, yb)
            ref_grads.append(net.grads.copy())
            ref.step(u / n_upd)
            ref_w.append(net.params.copy())
        pieces = comm.allgather_obj((k, d, ex.grad_log, stage.params.copy()))
        if comm.rank == 0:
            own = sorted((p for p in pieces if p[1] == 0), key=lambda p: p[0])
            g_err = max(float(np.abs(np.concatenate([p[2][u] for p in own]) - ref_grads[u]).max())
                        for u in range(n_upd))
            w_err = float(np.abs(np.concatenate([p[3] for p in own]) - ref_w[-1]).max())
            moved = float(np.abs(ref_w[-1] - Net(args.model, seed=3).params).max())
            rep_err = max(float(np.abs(p[3] - own[p[0]][3]).max()) for p in pieces)
            assert g_err <= 1e-5 and w_err <= 1e-5, (g_err, w_err)
            assert moved > 1e-3, moved
            assert rep_err == 0.0, rep_err
            print(f"PIPE GPIPE OK stages={K} replicas={D} updates={n_upd} grad_err={g_err:.2e} "
                  f"w_err={w_err:.2e} moved={moved:.3f}", flush=True)
    else:
        ops = S.schedule(args.schedule, K, k, len(sizes))
        vers = S.versions(args.schedule, ops)
        bad = []
        for r in ex.trace:
            i = r["mb"]
            sf, sb = S.s_closed_form(args.schedule, K, k, i)
            vf, vb, tgt = vers[i]
            if (r["s_fwd"], r["s_bwd"], r["v_fwd"], r["v_bwd"], r["v_upd"]) != (sf, sb, vf, vb, tgt):
                bad.append(("version", i, r, (sf, sb, vf, vb, tgt)))
            if args.predict == "stash" and (r["w_bwd"] != r["w_fwd"] or r["sum_bwd"] != r["sum_fwd"]):
                bad.append(("stash", i, r))
            if args.predict == "none" and r["w_bwd"] - r["w_fwd"] != sf:
                bad.append(("stale", i, r))
            if args.predict == "none" and sf and r["sum_bwd"] == r["sum_fwd"]:
                bad.append(("live weights unchanged", i, r))
            if args.predict == "spectrain" and not (r["w_fwd"] == r["w_bwd"] == r["v_upd"]):
                bad.append(("spectrain", i, r))
        assert len(ex.trace) == len(sizes)
        assert not bad, bad[:3]
        stale = [r["s_fwd"] for r in ex.trace]
        errs = comm.allgather_obj((k, max(stale),
                                   float(np.mean([r["err_stale"] for r in ex.trace])),
                                   float(np.mean([r.get("err_hat", np.nan) for r in ex.trace]))))
        if comm.rank == 0:
            print(f"PIPE TRACE OK schedule={args.schedule} predict={args.predict} stages={K} "
                  f"max_s={[e[1] for e in errs]}", flush=True)
