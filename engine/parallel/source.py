"""The worker source protocol shared by the trainers of engine.parallel
(ASGD, sync, Downpour): one object per worker thread supplies the data and
the gradient, the trainer the threads, buffers and communication.

Worker source protocol (one object per worker)::

    src.weights            flat vector the worker computes on (FetchWeights copies into it)
    src.load() -> batch    LoadImage: next N_Subbatch samples
    src.deform(batch)      DeformImage
    src.compute(batch) -> Step(grad, n, loss, correct, tag=None)
                           ComputeGradient on src.weights; grad = mean gradient
    src.setup_thread()     optional: called first in the worker's own thread
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._xp import device_sync
from .timers import StepTimers


@dataclass
class Step:
    """What a worker source returns for one sub-batch."""
    grad: Any           # flat mean gradient (the source's own buffer; read before the next compute)
    n: int              # samples in the sub-batch
    loss: float = 0.0   # mean loss over the sub-batch
    correct: int = 0
    tag: Any = None     # opaque id, kept in traces (tests)


class NonFiniteLoss(FloatingPointError):
    """A sub-batch's loss became ``loss`` (NaN or Inf) in ``epoch`` (from 1).
    ASGD and sync raise it on every rank at the same update: the rank that
    met it puts the loss into that update's allreduce, where it makes a
    count non-finite for every rank."""

    def __init__(self, loss, epoch):
        self.loss, self.epoch = float(loss), int(epoch)
        super().__init__(f"loss became {self.loss} in epoch {self.epoch}")


def nonfinite_mark(loss: float) -> float:
    """What a rank whose loss was ``loss`` (NaN or Inf) puts in an allreduced
    slot instead of its count: the sum is then NaN or Inf on every rank (the
    other ranks' values are finite)."""
    return loss if not math.isfinite(loss) else math.nan


def source_step(src, T: StepTimers, xp=None):
    """LoadImage, DeformImage and ComputeGradient of one worker-source step,
    each under its SPEC timer (shared by ASGD and sync workers). With ``xp``
    the device is synchronised inside ComputeGradient, so that its timer
    holds the kernels' time on a GPU."""
    with T("LoadImage"):
        batch = src.load()
    with T("DeformImage"):
        batch = src.deform(batch)
    with T("ComputeGradient"):
        step = src.compute(batch)
        if xp is not None:
            device_sync(xp)
    return step
