"""The emulated GPU's devices and streams (tests/gpu_emu.py): a per-thread
current device, streams, the stream-order check, and the ledger of what a
process did (written at exit to ``$SPRINT_EMU_LOG``)."""
from __future__ import annotations

import json
import os
import sys
import threading
import weakref
from pathlib import Path

import numpy as np

# ---- what a process did (tests read it) --------------------------------------------
LEDGER = {"launches": {}, "h2d": 0, "d2h": 0, "devices_used": set(), "selected": None,
          "threads_devices": set(), "races": {}}
_ledger_lock = threading.Lock()


def _note(key, n=1):
    with _ledger_lock:
        LEDGER[key] += n


def _write_ledger():
    d = os.environ.get("SPRINT_EMU_LOG")
    if not d:
        return
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    out = dict(LEDGER, devices_used=sorted(LEDGER["devices_used"]),
               threads_devices=sorted(LEDGER["threads_devices"]), pid=os.getpid())
    Path(d).mkdir(parents=True, exist_ok=True)
    p = Path(d) / f"rank{rank}.json"
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, p)


# ---- devices and streams ---------------------------------------------------------------
class CUDARuntimeError(RuntimeError):
    pass


_tls = threading.local()


def device_count() -> int:
    return int(os.environ.get("SPRINT_EMU_GPUS", "4"))


def current_device() -> int:
    return getattr(_tls, "device", 0)


class Device:
    def __init__(self, device=None):
        self.id = current_device() if device is None else int(device)
        if not 0 <= self.id < device_count():
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id}")

    def use(self):
        _tls.device = self.id
        _tls.stream = None
        if threading.current_thread() is threading.main_thread():
            LEDGER["selected"] = self.id

    def synchronize(self):
        _synchronized(lambda w: w.device_id == self.id)

    def __enter__(self):
        self._prev = current_device()
        self.use()
        return self

    def __exit__(self, *exc):
        Device(self._prev).use()
        return False


class Stream:
    """A CUDA stream. The emulation runs work at once, but remembers which
    stream wrote each buffer until that stream is synchronised (see _use)."""
    _next = [1]

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.device_id = current_device()
        self.null, self.non_blocking = bool(null), bool(non_blocking)
        if null:
            self.ptr = 0
        else:
            self.ptr = Stream._next[0]
            Stream._next[0] += 1
        self.thread = threading.current_thread().name

    def __repr__(self):
        if self.null:
            return f"the null stream of device {self.device_id}"
        kind = "non-blocking" if self.non_blocking else "blocking"
        return f"{kind} stream {self.ptr} of device {self.device_id} (made by thread {self.thread})"

    def use(self):
        if self.device_id != current_device():
            raise ValueError(f"stream of device {self.device_id} made current on device {current_device()}")
        _tls.stream = self
        return self

    def synchronize(self):
        if self.null:       # the legacy default stream also waits for the blocking streams
            _synchronized(lambda w: w.device_id == self.device_id and not w.non_blocking)
        else:
            _synchronized(lambda w: w is self)

    def __enter__(self):
        self._prev = getattr(_tls, "stream", None)
        return self.use()

    def __exit__(self, *exc):
        _tls.stream = self._prev
        return False


_NULL = {}


def get_current_stream():
    s = getattr(_tls, "stream", None)
    if s is None:
        s = _NULL.get(current_device())
        if s is None:
            s = _NULL[current_device()] = Stream(null=True)
    return s


# id(buffer) -> (weak reference to the buffer, the stream that last wrote it)
# until that stream is synchronised (buffer: the root numpy array of a view)
_WRITER: dict = {}
_writer_lock = threading.RLock()


def _synchronized(which):
    with _writer_lock:
        for k, (_, w, _t) in list(_WRITER.items()):
            if which(w):
                _WRITER.pop(k, None)


def _writer(root):
    e = _WRITER.get(id(root))
    return e[1:] if e is not None and e[0]() is root else (None, None)


def _wrote(root, stream):
    k = id(root)
    _WRITER[k] = (weakref.ref(root, lambda _, k=k: _WRITER.pop(k, None)), stream,
                  threading.current_thread().name)


def _ordered(w, r) -> bool:
    """Whether work queued on stream r runs after what stream w has queued:
    the same stream, or the legacy null stream and a blocking stream (each
    waits for the other); never a non_blocking stream and another."""
    if w is r:
        return True
    if w.device_id != r.device_id or w.non_blocking or r.non_blocking:
        return False
    return w.null or r.null


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _use(a, write=False, view=False):
    """Device work on ``a`` from this thread: on its own device, and after
    the stream that last wrote it (else a race on a GPU: the writer's stream
    must be synchronised before another stream touches the buffer)."""
    if a._dev != current_device():
        raise ValueError(f"emulated GPU: an array of device {a._dev} used on device {current_device()} "
                         f"(thread {threading.current_thread().name})")
    if view:            # no device work (a view, a shape, a pointer)
        return
    cur = get_current_stream()
    root = _root(a._a)
    with _writer_lock:
        w, by = _writer(root)
        if w is not None and not _ordered(w, cur):
            if os.environ.get("SPRINT_EMU_RACES") != "log":
                raise RuntimeError(f"emulated GPU: stream race: a buffer written by thread {by} on {w} was used "
                                   f"by thread {threading.current_thread().name} on {cur} before that stream was "
                                   f"synchronised")
            _log_race(w, cur)
        if write:
            _wrote(root, cur)


def cuda_aware_mpi() -> bool:
    return os.environ.get("SPRINT_EMU_CUDA_MPI") == "1"


def _settled(a):
    """MPI is about to read or write device array ``a`` outside any stream:
    the stream that last wrote it must have been synchronised."""
    w, by = _writer(_root(a._a))
    if w is not None:
        msg = (f"emulated GPU: stream race: a buffer written by thread {by} on {w} was handed to CUDA-aware "
               f"MPI before that stream was synchronised")
        # mpi4py may take this error for "not a buffer" and say only that: say it here
        print(msg, file=sys.stderr, flush=True)
        raise RuntimeError(msg)


def _log_race(w, cur):
    """$SPRINT_EMU_RACES=log: count each race site in the ledger and go on
    (to survey a strategy's hand-overs at once)."""
    import traceback
    where = [f"{f.filename.split('/engine/')[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()
             if "/engine/" in f.filename]
    key = f"{w!r} -> {cur!r}: " + " < ".join(where[-4:])
    with _ledger_lock:
        LEDGER["races"][key] = LEDGER["races"].get(key, 0) + 1
