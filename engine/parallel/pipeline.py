"""Pipelined model parallelism: one stage of the network per MPI rank.

``mpiexec -n K sprint train --parallel pipeline --stages K --schedule
gpipe|1f1b|dualpipe --microbatches M --predict none|stash|spectrain``.
Rank k holds layers ``[lo_k, hi_k)`` (:mod:`.stage`) and runs the
instruction list its schedule gives it (:mod:`.pipeline_schedule`) with
:class:`StageExecutor`: activations travel forward and gradients backward by
non-blocking MPI point-to-point messages (:mod:`.pipeline_p2p`), the receives of the next few
instructions posted ahead so that they arrive while the stage computes.

Weights a pass uses (``--predict``):

* ``none``: the live parameters; a backward reads whatever is current when
  it runs (the stale baseline of 1f1b/dualpipe);
* ``stash`` (PipeDream weight stashing): the forward runs on a copy of the
  version it met and its backward reuses that copy;
* ``spectrain``: forward and backward run on ``W + s * velocity`` with the
  s the schedule implies for that pass (pipeline_schedule's docstring).

For every micro-batch the stage records the version its forward and
backward met and the one its update is applied to; when that update comes,
``||W_hat - W_actual||`` (SpecTrain's forward prediction) and
``||W_stale - W_actual||`` (the version the forward met) are measured.
"""
from __future__ import annotations

import time

import numpy as np

from . import pipeline_schedule as _sched
from .pipeline_p2p import _ACT, _GRAD, _LABEL, P2P, _host  # noqa: F401  (P2P: engine.perf.pipeline_probe)
from .timers import StepTimers

_now = time.perf_counter
PREDICT = ("none", "stash", "spectrain")
LOOKAHEAD = 6            # instructions whose receives are posted ahead
TRACE_KEEP = 4096        # micro-batch records a stage keeps (the latest)


def micro_sizes(n_samples: int, batch: int, m: int) -> list:
    """Sizes of the micro-batches of one stream: each mini-batch of
    ``batch`` (the last one ragged) split into min(m, n) near-equal parts,
    as np.array_split does; also the mini-batch sizes."""
    sizes, minis = [], []
    for lo in range(0, n_samples, batch):
        n = min(batch, n_samples - lo)
        parts = min(m, n)
        sizes += [n // parts + (1 if j < n % parts else 0) for j in range(parts)]
        minis.append(n)
    return sizes, minis


def split_micro(x, y, m):
    """The micro-batches of one mini-batch, boundaries as micro_sizes."""
    n = len(y)
    parts = min(m, n)
    out, lo = [], 0
    for j in range(parts):
        hi = lo + n // parts + (1 if j < n % parts else 0)
        out.append((x[lo:hi], y[lo:hi]))
        lo = hi
    return out


class StageDiverged(FloatingPointError):
    """The loss became ``loss`` (NaN or Inf) before update ``u`` of the
    stream. Only the last stage sees the loss: it sends back a gradient
    filled with that value instead of the real one, each stage passes it on
    and adds it to the gradient its replicas allreduce, and every stage of
    every replica raises this at the same update, with the same value, so
    the job ends with one line instead of the other ranks timing out."""

    def __init__(self, loss, u):
        self.loss, self.u = float(loss), int(u)
        super().__init__(f"loss became {self.loss} before update {self.u + 1} of the stream: lower --lr")


class StageExecutor:
    """Runs one stage's instruction lists, one stream (epoch) at a time.

    ``opt`` is an :class:`engine.optim.SGD` over (stage.params, self.acc):
    backwards add their (already loss-scaled) gradients into ``acc`` and U
    applies and clears it. ``ranks`` = (previous stage's rank or None, next
    stage's rank or None, first and last stage's ranks) in ``mpi_comm``.
    """

    def __init__(self, stage, k, K, schedule, m, predict, opt, acc, mpi_comm=None, ranks=(None, None, 0, 0),
                 replicas=None, trace=True, timeout=300.0):
        if schedule not in _sched.SCHEDULES:
            raise ValueError(f"--schedule must be one of {', '.join(_sched.SCHEDULES)}, got {schedule!r}")
        if predict not in PREDICT:
            raise ValueError(f"--predict must be one of {', '.join(PREDICT)}, got {predict!r}")
        if schedule == "gpipe" and predict == "spectrain":
            raise ValueError("--predict spectrain needs --schedule 1f1b or dualpipe (gpipe has no stale weights)")
        self.stage, self.k, self.K = stage, k, K
        self.schedule, self.m, self.predict = schedule, m, predict
        self.opt, self.acc = opt, acc
        self.prev, self.next, self.first_rank, self.last_rank = ranks
        self.p2p = P2P(mpi_comm, timeout=timeout) if mpi_comm is not None and K > 1 else None
        self.replicas = replicas           # Comm among this stage's replicas (or None)
        self.trace_on = trace
        self.version = 0                   # updates applied by this stage
        self.timers = StepTimers()
        self.trace = []                    # per micro-batch dicts
        self.pair_threads = 1              # CPU threads of a DualPipe pair's forward
        self._pool = None
        self.keep_grads = False            # tests: keep each update's gradient
        self.grad_log = []
        self._fresh = True                 # the next backward starts the stage's gradient sums anew
        self.diverged = None               # the NaN/Inf loss met in this stream (StageDiverged)
        self.reset_window()

    # ---- bookkeeping --------------------------------------------------------
    def reset_window(self):
        self.loss_sum = self.correct = self.seen = 0.0

    def _weights_for(self, s):
        """The flat vector a pass uses: None = the live parameters."""
        if self.predict == "none" or (self.predict == "stash" and self.schedule == "gpipe"):
            return None
        if self.predict == "stash":
            return self.stage.params.copy()
        w = self.stage.params.copy()
        if s:
            w += s * self.opt.velocity
        return w

    def _pair_pool(self):
        """The thread that runs a DualPipe pair's forward beside its backward,
        limited to its share of the rank's CPU threads."""
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor
            from engine.backend import follow_device
            from .threads import limit_this_thread
            on_device = follow_device()     # the stage's GPU (a new thread starts on device 0)

            def init(threads=self.pair_threads):
                on_device()
                limit_this_thread(threads)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="sprint-dualpipe-fwd", initializer=init)
        return self._pool

    # ---- one stream ---------------------------------------------------------
    def run_stream(self, sizes, minis, micro_iter=None, epoch_at=None, on_update=None):
        """Run the schedule over micro-batches of ``sizes`` (``minis``: the
        mini-batch sizes; ``micro_iter`` yields (x, y) on the first stage).
        ``epoch_at(j)`` is the (fractional) epoch of the stream's j-th
        update, for the learning-rate schedule."""
        n_mb = len(sizes)
        if self.schedule == "gpipe":
            # the group boundaries must follow the ragged last mini-batch
            bounds, lo = [], 0
            for n in minis:
                parts = min(self.m, n)
                bounds.append((lo, lo + parts))
                lo += parts
            ops = []
            for g, (a, b) in enumerate(bounds):
                ops += [_sched.Op("F", i) for i in range(a, b)]
                ops += [_sched.Op("B", i) for i in range(a, b)]
                ops.append(_sched.Op("U", g))
            group_of = {i: g for g, (a, b) in enumerate(bounds) for i in range(a, b)}
            total_of = {g: minis[g] for g in range(len(minis))}
        else:
            ops = _sched.schedule(self.schedule, self.K, self.k, n_mb)
            group_of = {i: i for i in range(n_mb)}
            total_of = {i: sizes[i] for i in range(n_mb)}
        if self.replicas is not None:
            total_of = {g: n * self.replicas.size for g, n in total_of.items()}
        st = self.stage
        ctx, outs, labels, pend = {}, {}, {}, {}
        rec = {}
        v0 = self._v0 = self.version
        t_start = _now()
        T = self.timers
        in_dtype = np.dtype(st.dtype)

        def post(op):
            if self.p2p is None:
                return
            fs = [op.mb] if op.kind in ("F", "FB") else []
            bs = [op.mb2] if op.kind == "FB" else ([op.mb] if op.kind == "B" else [])
            for i in fs:
                if not st.first and (_ACT, i) not in pend:
                    pend[(_ACT, i)] = self.p2p.irecv((sizes[i],) + st.in_shape, in_dtype, self.prev, _ACT, i)
                if st.last and not st.first and (_LABEL, i) not in pend:
                    pend[(_LABEL, i)] = self.p2p.irecv((sizes[i],), np.int64, self.first_rank, _LABEL, i)
            for i in bs:
                if not st.last and (_GRAD, i) not in pend:
                    pend[(_GRAD, i)] = self.p2p.irecv((sizes[i],) + st.out_shape, in_dtype, self.next, _GRAD, i)

        def take(kind, i):
            req, buf = pend.pop((kind, i))
            t0 = _now()
            src = {_ACT: self.prev, _GRAD: self.next, _LABEL: self.first_rank}[kind]
            self.p2p.wait(req, f"the {('activation', 'gradient', 'labels')[kind]} of micro-batch {i}", src)
            T.add("wait", _now() - t0)
            return buf

        def forward(i, x):
            t0 = _now()
            s = group_of[i] + v0 - self.version
            w = self._weights_for(s if self.predict == "spectrain" else 0)
            out, c = st.forward(x, w)
            ctx[i] = c
            v = self.version - v0
            r = rec[i] = {"mb": i, "v_fwd": v, "s_fwd": s,
                          "w_fwd": v + (s if self.predict == "spectrain" else 0)}
            if self.trace_on:
                r["sum_fwd"] = float((st.params if w is None else w).sum())
            if self.trace_on and self.schedule != "gpipe":
                r["stale"] = self.stage.params.copy() if w is None or self.predict == "spectrain" else w
                r["hat"] = w.copy() if self.predict == "spectrain" else None
            T.add("fwd", _now() - t0)
            return out

        def poisoned(i):
            """The gradient a stage sends back once the loss diverged (StageDiverged)."""
            rec[i].update(v_bwd=self.version - v0, s_bwd=0, w_bwd=self.version - v0)
            return None if st.first else np.full((sizes[i],) + st.in_shape, self.diverged, in_dtype)

        def backward(i, dy_or_y):
            t0 = _now()
            c = ctx.pop(i)
            g = group_of[i]
            if st.last:
                if self.diverged is not None:
                    outs.pop(i)
                    return poisoned(i)
                loss, correct, dy = st.loss_grad(outs.pop(i), dy_or_y, total_of[g])
                if not np.isfinite(loss):
                    self.diverged = loss
                    return poisoned(i)
                self.loss_sum += loss * sizes[i]
                self.correct += correct
                self.seen += sizes[i]
            else:
                dy = dy_or_y
                if self.diverged is None and not np.isfinite(dy.flat[0]):
                    self.diverged = float(dy.flat[0])
                if self.diverged is not None:
                    return poisoned(i)
            s_b = g + v0 - self.version
            if self.predict == "spectrain" and c.weights is not None:
                c.weights[...] = st.params
                if s_b:
                    c.weights += s_b * self.opt.velocity
            if self.trace_on:
                rec[i]["sum_bwd"] = float((st.params if c.weights is None else c.weights).sum())
            # the stage's gradient sums continue micro-batch after micro-batch
            # (k = samples in order): acc equals one process's whole-batch
            # gradient bit for bit with the engine's SGEMM
            dx = st.backward(c, dy, accumulate=not self._fresh)
            self._fresh = False
            self.acc[...] = st.grads
            r, v = rec[i], self.version - v0
            r.update(v_bwd=v, s_bwd=s_b, w_bwd={"none": v, "stash": r["w_fwd"]}.get(self.predict, v + s_b))
            T.add("bwd", _now() - t0)
            return dx

        def get_input(i):
            if st.first:
                x, y = next(micro_iter)
                if st.last:
                    labels[i] = y
                elif self.p2p is not None:
                    self.p2p.isend(y, self.last_rank, _LABEL, i)
                return x
            if st.last:
                labels[i] = take(_LABEL, i)
            return take(_ACT, i)

        def get_dy(i):
            return labels.pop(i) if st.last else take(_GRAD, i)

        def emit_fwd(i, out):
            if st.last:
                outs[i] = out
            else:
                self.p2p.isend(out, self.next, _ACT, i)

        def emit_bwd(i, dx):
            if not st.first:
                self.p2p.isend(dx, self.prev, _GRAD, i)

        for j in range(min(LOOKAHEAD, len(ops))):
            post(ops[j])
        for j, op in enumerate(ops):
            if j + LOOKAHEAD < len(ops):
                post(ops[j + LOOKAHEAD])
            if self.p2p is not None:
                self.p2p.progress()
            if op.kind == "F":
                x = get_input(op.mb)
                emit_fwd(op.mb, forward(op.mb, x))
            elif op.kind == "B":
                dy = get_dy(op.mb)
                emit_bwd(op.mb, backward(op.mb, dy))
            elif op.kind == "FB":
                x = get_input(op.mb)
                dy = get_dy(op.mb2)
                fut = self._pair_pool().submit(forward, op.mb, x)
                try:
                    dx = backward(op.mb2, dy)
                finally:
                    out = fut.result()        # re-raises the forward's error here
                emit_bwd(op.mb2, dx)
                emit_fwd(op.mb, out)
            else:
                self._update(op.mb, rec, epoch_at, on_update, group_of)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        t_flush = _now()
        if self.p2p is not None:
            self.p2p.flush()
        T.add("wait", _now() - t_flush)
        wall = _now() - t_start
        T.add("stream", wall)
        return wall

    def _update(self, u, rec, epoch_at, on_update, group_of):
        t0 = _now()
        if self.replicas is not None:
            if self.diverged is not None:
                self.acc[...] = self.diverged      # the stage's replicas learn it in the allreduce
            self.replicas.allreduce_(self.acc)
            first = float(self.acc[0])
            if self.diverged is None and not np.isfinite(first):
                self.diverged = first
        if self.diverged is not None:
            raise StageDiverged(self.diverged, u)
        if self.keep_grads:
            self.grad_log.append(_host(self.acc).copy())
        W = self.opt.params
        mbs = [i for i, g in group_of.items() if g == u] if self.schedule == "gpipe" else [u]
        for i in mbs:
            r = rec.pop(i)
            r["v_upd"] = self.version - self._v0
            if "stale" in r:
                stale, hat = r.pop("stale"), r.pop("hat")
                with np.errstate(over="ignore", invalid="ignore"):    # a diverging run's: reported by the loss
                    r["err_stale"] = float(np.linalg.norm(_host(stale - W)))
                    if hat is not None:
                        r["err_hat"] = float(np.linalg.norm(_host(hat - W)))
            if self.trace_on:
                self.trace.append(r)
                if len(self.trace) > 2 * TRACE_KEEP:
                    del self.trace[:TRACE_KEEP]
        self.opt.step(epoch_at(u) if epoch_at is not None else None)
        self.acc[...] = 0
        self._fresh = True
        self.version += 1
        self.timers.add("update", _now() - t0)
        if on_update is not None:
            on_update(self)
