"""What ``sprint predict | tune | simulate`` print, and one line on every term
they print (``--explain``)."""
from __future__ import annotations
from engine.errors import counted

# One line per printed term: what it is, in the units printed.
GLOSSARY = {
    "N_Node": "MPI ranks (SPRINT nodes); each runs one updater and N_GPU workers",
    "N_GPU": "worker threads per node (one GPU each on a GPU host; one core's thread on a CPU host)",
    "N_Subbatch": "samples one worker computes a gradient on per iteration",
    "N_Param": "parameters of the net (length of the flat vectors the steps copy and add)",
    "N_File": "training samples per epoch (T_Epoch's numerator; --n-file)",
    "host slowdown": "factor on every worker step for the ranks x workers sharing one host's cores "
                     "(CPU profiles: measured by the runner contention sweep; 1 on GPUs)",
    "oversubscribed": "more busy threads (ranks x workers x BLAS threads) than cores: they time-share",
    "fixed point": "T_GPU and T_Update depend on each other (fetch probability, lock waits, barrier); "
                   "the model iterates them until they agree",
    "share": "the step's part of T_GPU (worker) or T_Update (updater)",
    "LockWeights": "waiting for the LatestWeights lock (held by the updater's publish or another "
                   "worker's fetch)",
    "FetchWeights": "copying the latest weights, done only when they changed: P(fetch) x one copy; on a "
                    "shared CPU host, plus the wait for the core a deposit's woken updater took",
    "LoadImage": "gathering N_Subbatch samples into the input batch",
    "DeformImage": "crop, flip and normalisation of the batch",
    "ComputeGradient": "forward and backward of the net on the batch (the per-layer table below)",
    "ComputeUpdateVal": "weight decay and lr scaling of the gradient, plus the loop's own Python",
    "LockGradient": "worker: waiting for its GradBuf lock; updater: waiting for the workers' deposits",
    "UpdateGradient": "depositing the gradient (a swap when the buffer was empty, else an add)",
    "T_GPU": "seconds per worker iteration (sum of the worker steps)",
    "WaitGradient": "the updater waiting for the first local gradient of its cycle",
    "SumGradient": "summing the node's non-empty gradient buffers",
    "AddMomentum": "momentum added to the node's slice of the sum",
    "Allreduce": "the weight-carrying allreduce, including T_Barrier (and, with more ranks than cores, the "
                 "updaters' wait for time slices)",
    "T_Barrier": "waiting in the allreduce for the slowest node (its sum had more buffers)",
    "UpdateMomentum": "the new momentum from the reduced slice",
    "UpdateWeights": "publishing the new weights to the workers (plus the loop's Python)",
    "T_Update": "seconds per global update (sum of the updater steps)",
    "fwd / bwd": "ComputeGradient per layer: its kernels times the fitted factor of its kind and pass, plus "
                 "that pass's fitted per-call cost and, for weights larger than one core's L2 cache, a fitted "
                 "cost per byte beyond it (the last layer's fwd includes the softmax)",
    "P(fetch)": "probability a worker finds new weights to copy = min(T_GPU/T_Update, 1)",
    "P(GradBuf non-empty)": "probability a worker's buffer holds a gradient when the updater looks = "
                            "min(T_Update/T_GPU, 1)",
    "N_Minibatch_avg": "samples per global update = N_Node N_GPU N_Subbatch T_Update / T_GPU",
    "staleness": "updates published between a worker reading the weights and its gradient being applied",
    "T_Epoch": "seconds per epoch = N_File T_GPU / (N_Node N_GPU N_Subbatch)",
    "target": "tune: the N_Minibatch_avg to reach, +- --tolerance",
    "qualify": "tune: configurations of the searched grid whose N_Minibatch_avg is within the tolerance",
    "closed form": "simulate: the fixed-point model (sprint predict)",
    "simulated": "simulate: the discrete-event simulation of Algorithms 1 and 2 with the same step costs",
    "diff": "simulate: (closed form - simulated) / simulated",
    "worker lock wait": "simulate: LockWeights + LockGradient of a worker, seconds per iteration",
    "P(non-empty)": "simulate: P(GradBuf non-empty)",
}


def explain(terms) -> str:
    """The glossary lines of ``terms``, in that order."""
    width = max(len(t) for t in terms) + 2
    return "\n".join(["", "what each term means:"] +
                     [f"  {t:<{width}}{GLOSSARY[t]}" for t in terms])


PREDICT_TERMS = ("N_Node", "N_GPU", "N_Subbatch", "N_Param", "N_File", "fixed point", "host slowdown",
                 "oversubscribed", "share", "LockWeights", "FetchWeights", "LoadImage", "DeformImage",
                 "ComputeGradient", "ComputeUpdateVal", "LockGradient", "UpdateGradient", "T_GPU", "fwd / bwd",
                 "WaitGradient", "SumGradient", "AddMomentum", "Allreduce", "T_Barrier", "UpdateMomentum",
                 "UpdateWeights", "T_Update", "P(fetch)", "P(GradBuf non-empty)", "N_Minibatch_avg",
                 "staleness", "T_Epoch")
TUNE_TERMS = ("target", "qualify", "N_Node", "N_GPU", "N_Subbatch", "T_Epoch", "N_Minibatch_avg", "T_GPU",
              "T_Update", "staleness")
SIMULATE_TERMS = ("closed form", "simulated", "diff", "T_GPU", "T_Update", "T_Barrier", "P(fetch)",
                  "P(non-empty)", "worker lock wait", "WaitGradient", "N_Minibatch_avg", "staleness", "T_Epoch")


def _fmt_t(s):
    if s == 0:
        return "0"
    for unit, f in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= f:
            return f"{s / f:.3f} {unit}"
    return f"{s / 1e-9:.1f} ns"


def host_line(p) -> str:
    """The host slowdown, said in words: what it multiplies and why."""
    ex = p.extra
    r, cores = ex.get("ranks_per_host", 1), ex.get("cores")
    busy = r * p.n_gpu * ex.get("threads", 1)
    if p.slowdown == 1.0 and busy <= (cores or busy):
        return "host slowdown x1.00: no core sharing priced (each worker has its own core or GPU)"
    who = (f"{counted(r, 'rank')} x {counted(p.n_gpu, 'worker')} x {counted(ex.get('threads', 1), 'thread')} on "
           f"{counted(cores, 'core')}")
    line = f"host slowdown x{p.slowdown:.2f}: each worker step takes {p.slowdown:.2f}x its one-thread " \
           f"kernel time, for {who}"
    if ex.get("oversubscribed"):
        line += f" -- oversubscribed ({busy} busy threads > {cores} cores): {ex['oversubscribed']}"
    return line


def format_prediction(p, per_layer: bool = True, explain_terms: bool = False) -> str:
    lines = [f"{p.model}: N_Node={p.n_node} N_GPU={p.n_gpu} N_Subbatch={p.n_subbatch} "
             f"N_Param={p.n_param:,} N_File={p.n_file:,}"]
    lines.append(f"fixed point: {'converged' if p.converged else 'NOT converged'} in {p.iterations} iterations")
    lines.append(host_line(p))
    lines.append("")
    lines.append(f"{'worker step (Alg. 1)':<28}{'time':>14}{'share':>9}")
    for k, v in p.worker.items():
        lines.append(f"  {k:<26}{_fmt_t(v):>14}{100 * v / p.t_gpu:>8.1f}%")
    lines.append(f"  {'T_GPU':<26}{_fmt_t(p.t_gpu):>14}")
    if per_layer:
        agg = {}
        for name, pas, kern, _, t in p.layers:
            agg[(name, pas)] = agg.get((name, pas), 0.0) + t
        lines.append("")
        lines.append(f"{'ComputeGradient by layer':<28}{'fwd':>14}{'bwd':>14}")
        for name in dict.fromkeys(r[0] for r in p.layers):
            lines.append(f"  {name:<26}{_fmt_t(agg.get((name, 'fwd'), 0) + agg.get((name, 'loss'), 0)):>14}"
                         f"{_fmt_t(agg.get((name, 'bwd'), 0) + agg.get((name, 'fwd+bwd'), 0)):>14}")
    lines.append("")
    lines.append(f"{'updater step (Alg. 2)':<28}{'time':>14}{'share':>9}")
    for k, v in p.updater.items():
        lines.append(f"  {k:<26}{_fmt_t(v):>14}{100 * v / p.t_update:>8.1f}%")
    lines.append(f"    {'of which T_Barrier':<24}{_fmt_t(p.t_barrier):>14}")
    lines.append(f"  {'T_Update':<26}{_fmt_t(p.t_update):>14}")
    lines.append("")
    lines.append(f"P(fetch) = min(T_GPU/T_Update,1)     {p.p_fetch:.4f}")
    lines.append(f"P(GradBuf non-empty)                 {p.p_nonempty:.4f}")
    lines.append(f"N_Minibatch_avg                      {p.n_minibatch_avg:.2f}")
    lines.append(f"expected staleness                   {p.staleness:.3f}")
    lines.append(f"T_Epoch                              {_fmt_t(p.t_epoch)}")
    if explain_terms:
        lines.append(explain(PREDICT_TERMS))
    return "\n".join(lines)
