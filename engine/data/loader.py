"""The prefetching loader: a thread gathers (LoadImage) and deforms
(DeformImage) the next batches on the device while the current one computes.

Everything random is derived from (seed, epoch[, rank]), so an epoch's
batches are the same whether or not the run was interrupted before it, and
``rank``/``world`` shards one shared permutation into disjoint slices.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from .deform import DeformConfig, NO_DEFORM


class Loader:
    """Batches ``(x, y)`` of a Dataset on the current device, deformed and normalised.

    ``Loader(dataset, batch, shuffle=True, seed=0, deform=None, prefetch=2,
    drop_last=False, rank=0, world=1)``: iterating gives one epoch, the
    images as float32 ``(N, C, H, W)`` and the labels as int64; ``deform`` is a
    ``DeformConfig`` (None: no augmentation and no normalisation, use
    ``DeformConfig().with_stats(dataset)`` for the training statistics).
    ``set_epoch(e)`` picks epoch ``e``'s order; ``rank``/``world`` take one
    shard of it; ``prefetch`` batches are prepared by a thread ahead of use.
    """

    def __init__(self, dataset, batch, shuffle=True, seed=0, deform=None, prefetch=2,
                 drop_last=False, rank=0, world=1, threads=1):
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        if not (isinstance(world, int) and world >= 1 and 0 <= rank < world):
            raise ValueError(f"need 0 <= rank < world, got rank={rank} world={world}")
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if deform is not None and not isinstance(deform, DeformConfig):
            raise TypeError(f"deform must be a DeformConfig or None, got {type(deform).__name__}")
        self.dataset = dataset
        self.batch = batch
        self.shuffle = shuffle
        self.seed = int(seed)
        self.deform_cfg = deform or NO_DEFORM
        self.prefetch = prefetch
        self.drop_last = drop_last
        self.rank, self.world = rank, world
        self.threads = threads   # of the prefetch thread, which runs beside the compute
        self.epoch = 0
        c, h, w = dataset.shape
        self.in_hw = (h, w)
        self.out_hw = self.deform_cfg.out_hw or (h, w)
        self.mean, self.std = self.deform_cfg.norm(c)
        self.times = {"LoadImage": 0.0, "DeformImage": 0.0}
        n = len(self.indices())
        if n == 0:
            raise ValueError(f"shard {rank}/{world} of {len(dataset)} samples is empty")

    def set_epoch(self, epoch: int):
        """The epoch whose order and deformations the next iteration gives."""
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's sample indices of the current epoch, in order."""
        n = len(self.dataset)
        idx = (np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle
               else np.arange(n))
        return idx[self.rank::self.world]

    def __len__(self):
        n = len(self.indices())
        return n // self.batch if self.drop_last else -(-n // self.batch)

    # ---- the two stages, usable one by one (the ASGD worker times them) ----
    def load(self, idx):
        """LoadImage: the host arrays of the samples ``idx``."""
        t = time.perf_counter()
        x, y = self.dataset.take(idx)
        self.times["LoadImage"] += time.perf_counter() - t
        return x, y

    def deform(self, x, y, rng):
        """DeformImage: to the device, augment, normalise -> (x float32, y int64)."""
        from engine import backend, ops
        t = time.perf_counter()
        params = (self.deform_cfg.draw(rng, len(x), self.in_hw, self.out_hw) if self.deform_cfg.augments
                  else _identity(len(x), self.in_hw, self.out_hw))
        be = backend.get_backend()
        xd = ops.deform(backend.asarray(x, dtype=x.dtype), backend.asarray(params), self.out_hw,
                        backend.asarray(self.mean), backend.asarray(self.std))
        yd = be.xp.asarray(y)
        self.times["DeformImage"] += time.perf_counter() - t
        return xd, yd

    def batches(self):
        """The epoch's batches, computed in this thread."""
        idx = self.indices()
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, 1])
        stop = len(idx) - (len(idx) % self.batch if self.drop_last else 0)
        for i in range(0, stop, self.batch):
            x, y = self.load(idx[i:i + self.batch])
            if len(y):   # a lazy tree drops unreadable files: a batch may come out empty
                yield self.deform(x, y, rng)

    def __iter__(self):
        if self.prefetch == 0:
            return self.batches()
        return _Prefetcher(self)


# How long close() waits for the data thread: it stops after the batch it is
# computing; past this it is left to end on its own (it is a daemon).
JOIN_TIMEOUT = 10.0


class _Done:
    pass


class _Failed:
    def __init__(self, exc):
        self.exc = exc


class _Prefetcher:
    """The iterator of a prefetching Loader: a data thread fills a bounded
    queue. Whenever the consumer stops -- the epoch ends, it breaks out,
    raises, calls close() or drops the iterator -- the thread is told to halt
    and never blocks on the full queue, so stopping takes bounded time."""

    def __init__(self, loader):
        self._q = queue.Queue(maxsize=loader.prefetch)
        self._halt = threading.Event()
        self._finished = False
        # the thread holds the queue and the event, not this iterator, so the
        # iterator can be garbage-collected (and halt the thread) while it runs
        from engine.backend import follow_device
        self._th = threading.Thread(target=_produce, args=(loader, self._q, self._halt, follow_device()),
                                    name="sprint-loader", daemon=True)
        self._th.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        item = self._q.get()
        if isinstance(item, _Done):
            self.close()
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            raise item.exc
        return item

    def close(self, timeout=JOIN_TIMEOUT):
        """Stop the data thread; returns once it ended (or after ``timeout``)."""
        self._finished = True
        self._halt.set()
        while True:      # free a put() waiting on the full queue
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        if self._th is not threading.current_thread():
            self._th.join(timeout)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _produce(loader, q, halt, on_device):
    from engine.backend import synchronize

    def put(item):
        # the batch leaves this thread: its kernels must be done, the
        # consumer's stream may not wait for this thread's (GPU)
        synchronize()
        while not halt.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    try:
        on_device()         # the consumer's GPU (a new thread starts on device 0)
        if loader.threads:
            from engine.parallel.threads import limit_this_thread
            limit_this_thread(loader.threads)
        for item in loader.batches():
            if not put(item):
                return
        put(_Done())
    except BaseException as e:  # re-raised in the consumer
        put(_Failed(e))


def _identity(n, in_hw, out_hw):
    p = np.zeros((n, 4), np.float32)
    p[:, 0] = out_hw[0] / in_hw[0]
    return p
