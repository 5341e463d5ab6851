"""The hand-overs of SPRINT ASGD (engine.parallel.asgd): GradBuf_t, where a
worker leaves its summed gradients for the updater, and the extra slots
SendBuf carries through the allreduce."""
from __future__ import annotations

import threading

# Extra slots appended to SendBuf: they ride the same allreduce, so every node
# learns the global counts of this update and all nodes take the same stop
# decision without another collective.
X_SAMPLES, X_LOSS, X_CORRECT, X_GRADS, X_STOP = range(5)
N_EXTRA = 5


class GradBuf:
    """GradBuf_t with its lock, empty flag and the bookkeeping of what it holds."""
    __slots__ = ("lock", "data", "empty", "n", "loss", "correct", "grads", "versions", "tags")

    def __init__(self, data):
        self.lock = threading.Lock()
        self.data = data
        self.empty = True
        self._reset_meta()

    def _reset_meta(self):
        self.n = 0
        self.loss = 0.0
        self.correct = 0
        self.grads = 0
        self.versions = []
        self.tags = []

    def take(self, spare):
        """The updater's hand-over: None when empty, else (the full array,
        (samples, loss, correct, gradients), versions, tags), ``spare``
        taking its place; a pointer swap, O(1) under the lock."""
        with self.lock:
            if self.empty:
                return None
            data, self.data = self.data, spare
            self.empty = True
            taken = (data, (self.n, self.loss, self.correct, self.grads), self.versions, self.tags)
            self._reset_meta()
        return taken

    def discard_into(self, discarded: dict):
        """At stop time: what the buffer still holds is dropped and counted
        in ``discarded`` (grads, samples, tags)."""
        with self.lock:
            if not self.empty:
                discarded["grads"] += self.grads
                discarded["samples"] += self.n
                discarded["tags"].extend(self.tags)
                self.empty = True
                self._reset_meta()
