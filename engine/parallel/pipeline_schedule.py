"""Pipeline schedules as instruction lists, and the weight versions they imply.

A schedule is, for each stage k of K, the ordered list of instructions the
stage executes over one *stream* of micro-batches (one epoch: the pipeline
is flushed at every epoch end, so evaluation and checkpoints see one
consistent set of weights). The executor (:mod:`engine.parallel.pipeline`)
runs a list as it comes; receiving activations and gradients from the
neighbours is implied by F and B and ordered by them, so a schedule is
correct when every stage's list is deadlock-free against its neighbours',
which :func:`check` verifies by playing all lists together.

Instructions (``Op(kind, mb, mb2)``):

* ``F i``   forward of micro-batch i (receive its activation unless first
  stage, send the output unless last stage);
* ``B i``   backward of micro-batch i (receive the output gradient, or form
  it from the loss on the last stage; send the input gradient);
* ``FB i j`` (DualPipe) forward of i and backward of j issued together and
  run concurrently; both read the weights as they are when the pair starts;
* ``U i``   apply an optimizer step: for gpipe ``i`` is the mini-batch
  (its micro-batches' gradients summed), otherwise the micro-batch whose
  gradient is applied.

Schedules
---------
``gpipe``: per mini-batch of M micro-batches, F 0..M-1, B 0..M-1, U; one
synchronous update per mini-batch, so the gradient is the mini-batch's.

``1f1b`` (PipeDream): stage k runs w_k = K-1-k forwards ahead (warm-up),
then alternates F(w_k + j), B(j), U(j), then drains; one update per
micro-batch, applied right after its backward.

``dualpipe`` (the seed's, Chen, Yang & Cheng 2018): time is cut into slots;
in slot t stage k issues the forward of micro-batch t-k *and* the backward
of micro-batch t-2(K-1)+k together -- two passes of two batches in flight on
one stage at once, which is how the seed balances the load: every stage
does one forward and one backward per slot. The last stage's pair is the
same micro-batch (F then B). The update of the backward's micro-batch
follows the pair. Here the pair's forward runs in a second thread beside the
backward (kernels release the GIL); on a GPU that would be two streams.

Weight versions and SpecTrain's s
---------------------------------
Stage k's version is the number of updates it has applied. Micro-batch i's
update is applied to version ``target(i)`` (i itself for 1f1b/dualpipe,
its mini-batch g for gpipe): that is ``W_actual``. When a pass of i starts
at version v, the stage will apply ``s = target(i) - v`` more updates before
i's own, so SpecTrain predicts ``W_hat = W - s * eta * v_grad``, i.e.
``W + s * velocity`` with the optimizer's velocity (``-eta`` times the
momentum-smoothed gradient, weight decay included). From the lists:

* gpipe: s_fwd = s_bwd = 0 (no staleness);
* 1f1b: s_fwd(k, i) = min(i, K-1-k), s_bwd = 0 (the update follows each
  backward in order, so B(i) meets version i);
* dualpipe: s_fwd(k, i) = min(i, 2(K-1-k)), s_bwd = 0 (the forward of slot
  t = i+k meets the updates of the backwards of slots < t).

:func:`versions` derives the same numbers by playing the lists, and the
runtime trace is tested against both.
"""
from __future__ import annotations

from typing import NamedTuple

SCHEDULES = ("gpipe", "1f1b", "dualpipe")


class Op(NamedTuple):
    kind: str          # "F", "B", "FB", "U"
    mb: int
    mb2: int = -1      # FB: the backward's micro-batch

    def __repr__(self):
        return f"{self.kind}{self.mb}" + (f"/{self.mb2}" if self.kind == "FB" else "")


def groups(n_mb: int, m: int) -> list:
    """Micro-batch ranges [lo, hi) of the mini-batches of a stream."""
    return [(lo, min(lo + m, n_mb)) for lo in range(0, n_mb, m)]


def gpipe(K: int, k: int, n_mb: int, m: int) -> list:
    out = []
    for g, (lo, hi) in enumerate(groups(n_mb, m)):
        out += [Op("F", i) for i in range(lo, hi)]
        out += [Op("B", i) for i in range(lo, hi)]
        out.append(Op("U", g))
    return out


def one_f_one_b(K: int, k: int, n_mb: int, m: int = 1) -> list:
    w = min(K - 1 - k, n_mb)
    out = [Op("F", i) for i in range(w)]
    for j in range(n_mb - w):
        out += [Op("F", w + j), Op("B", j), Op("U", j)]
    for j in range(max(0, n_mb - w), n_mb):
        out += [Op("B", j), Op("U", j)]
    return out


def dualpipe(K: int, k: int, n_mb: int, m: int = 1) -> list:
    out = []
    for t in range(n_mb + 2 * (K - 1)):
        f, b = t - k, t - 2 * (K - 1) + k
        has_f, has_b = 0 <= f < n_mb, 0 <= b < n_mb
        if has_f and has_b and f != b:
            out += [Op("FB", f, b), Op("U", b)]
        else:
            if has_f:
                out.append(Op("F", f))
            if has_b:
                out += [Op("B", b), Op("U", b)]
    return out


_BUILDERS = {"gpipe": gpipe, "1f1b": one_f_one_b, "dualpipe": dualpipe}


def schedule(name: str, K: int, k: int, n_mb: int, m: int = 1) -> list:
    if name not in _BUILDERS:
        raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    if not 0 <= k < K:
        raise ValueError(f"stage {k} out of range for {K} stages")
    return _BUILDERS[name](K, k, n_mb, m)


def target(name: str, i: int, m: int) -> int:
    """The version micro-batch i's update is applied to."""
    return i // m if name == "gpipe" else i


def s_closed_form(name: str, K: int, k: int, i: int) -> tuple:
    """(s_fwd, s_bwd) of micro-batch i on stage k (module docstring)."""
    if name == "gpipe":
        return 0, 0
    lag = (K - 1 - k) if name == "1f1b" else 2 * (K - 1 - k)
    return min(i, lag), 0


def check(lists) -> list:
    """Play the stages' lists against each other (a forward needs the
    previous stage's forward of the same micro-batch done, a backward the
    next stage's backward); return the global order of (stage, op). Raises
    on a deadlock."""
    K = len(lists)
    pos = [0] * K
    done_f = [set() for _ in range(K)]
    done_b = [set() for _ in range(K)]
    order = []

    def ready(k, op):
        f = op.mb if op.kind in ("F", "FB") else None
        b = op.mb2 if op.kind == "FB" else (op.mb if op.kind == "B" else None)
        if f is not None and k > 0 and f not in done_f[k - 1]:
            return False
        if b is not None and k < K - 1 and b not in done_b[k + 1]:
            return False
        if b is not None and k == K - 1 and op.kind == "B" and b not in done_f[k]:
            return False
        return True

    total = sum(len(x) for x in lists)
    while len(order) < total:
        moved = False
        for k in range(K):
            if pos[k] < len(lists[k]) and ready(k, lists[k][pos[k]]):
                op = lists[k][pos[k]]
                if op.kind in ("F", "FB"):
                    done_f[k].add(op.mb)
                if op.kind == "B":
                    done_b[k].add(op.mb)
                if op.kind == "FB":
                    done_b[k].add(op.mb2)
                order.append((k, op))
                pos[k] += 1
                moved = True
        if not moved:
            stuck = {k: lists[k][pos[k]] for k in range(K) if pos[k] < len(lists[k])}
            raise RuntimeError(f"schedule deadlocks; stages wait at {stuck}")
    return order


def versions(name: str, ops: list, m: int = 1) -> dict:
    """{mb: (version at its forward, version at its backward, target)} of one
    stage's list, counting the U instructions before each pass."""
    v = 0
    fwd, bwd = {}, {}
    for op in ops:
        if op.kind in ("F", "FB"):
            fwd[op.mb] = v
        if op.kind == "B":
            bwd[op.mb] = v
        if op.kind == "FB":
            bwd[op.mb2] = v
        if op.kind == "U":
            v += 1
    return {i: (fwd[i], bwd[i], target(name, i, m)) for i in fwd}


def in_flight(ops: list) -> int:
    """Most micro-batches between their forward and backward at once: the
    number of activations (and, with stashing, weight versions) kept."""
    live = peak = 0
    for op in ops:
        if op.kind in ("F", "FB"):
            live += 1
            peak = max(peak, live)
        if op.kind in ("B", "FB"):
            live -= 1
    return peak
