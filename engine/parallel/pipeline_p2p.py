"""The point-to-point messages between neighbouring pipeline stages
(:mod:`engine.parallel.pipeline`): activations forward, gradients back and
the labels from the first stage to the last, each non-blocking, tagged by
kind and micro-batch, and waited for by polling with a deadline, so that a
frozen or dead neighbour ends the job instead of hanging it."""
from __future__ import annotations

import time

import numpy as np

_now = time.perf_counter
_ACT, _GRAD, _LABEL = 0, 1, 2     # message kinds
POLL = 2e-4              # seconds between tests of a pending receive (CPU ranks share cores)


def _host(a):
    from engine import backend
    return np.ascontiguousarray(backend.to_host(a))


class StageTimeout(RuntimeError):
    """A neighbouring stage sent nothing for too long (frozen or dead)."""


class P2P:
    """Non-blocking sends and receives between neighbouring stages. A wait
    longer than ``timeout`` seconds raises StageTimeout naming the rank and
    the message waited for: a frozen stage ends the job instead of hanging it."""

    def __init__(self, mpi_comm, poll=POLL, timeout=300.0):
        self.c = mpi_comm
        self.poll = poll
        self.timeout = float(timeout)
        self.sends = []

    @staticmethod
    def tag(kind, mb):
        return kind + 4 * (mb % 8000)

    def isend(self, arr, dest, kind, mb):
        buf = _host(arr)
        self.sends.append((self.c.Isend(buf, dest=dest, tag=self.tag(kind, mb)), buf))
        if len(self.sends) > 64:
            self.sends = [(r, b) for r, b in self.sends if not r.Test()]

    def irecv(self, shape, dtype, src, kind, mb):
        buf = np.empty(shape, dtype)
        return self.c.Irecv(buf, source=src, tag=self.tag(kind, mb)), buf

    def wait(self, req, what="a message", rank=None):
        deadline = _now() + self.timeout
        while not req.Test():
            if _now() > deadline:
                raise StageTimeout(f"waited {self.timeout:g} s for {what} from rank {rank}: "
                                   f"that stage is frozen or dead (--timeout)")
            if self.poll > 0:
                time.sleep(self.poll)

    def progress(self):
        """Let MPI move this rank's pending sends: a message above the eager
        size leaves only when its sender calls into MPI again, which a stage
        busy with its next pass would otherwise do only at its next receive."""
        if self.sends:
            self.sends = [(r, b) for r, b in self.sends if not r.Test()]

    def flush(self):
        for r, _ in self.sends:
            self.wait(r, "a send to complete", "a neighbour")
        self.sends = []
