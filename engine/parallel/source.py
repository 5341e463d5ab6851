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
