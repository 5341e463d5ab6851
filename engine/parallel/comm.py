"""Communication between nodes (MPI ranks) for the parallel trainers.

One small interface, two implementations:

* ``MPIComm`` over mpi4py when the process was started by an MPI launcher
  (``mpiexec -n N ...``): in-place sum-allreduce of flat float32 vectors,
  broadcast, agreement checks and job-wide abort (how a failing rank
  ends the job, and what it says: engine.parallel.abort);
* ``LocalComm`` (one node) otherwise, so a plain ``sprint train --parallel
  asgd`` runs without MPI at all.

Device buffers (CuPy arrays) go through NCCL when ``cupy.cuda.nccl`` works,
through MPI directly when the MPI library is really CUDA-aware, and otherwise
are staged through host memory; ``Comm.device_path`` says which was chosen.
Only one thread may drive a communicator (the ASGD updater); MPI is
initialised with the highest thread level the library offers and the level
actually provided is checked by :func:`require_thread_level`.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time

import numpy as np

from . import waits
from .launcher import launched_under_mpi, unlink_mpich_segments

class CommError(RuntimeError):
    """A collective could not be completed."""


class ConfigMismatch(CommError, ValueError):
    """Ranks were started with different networks, data or options."""


def config_hash(obj) -> str:
    """Stable short hash of a JSON-able object (keys sorted)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _is_device_array(buf) -> bool:
    return type(buf).__module__.split(".")[0] == "cupy"


def _check_flat(buf, name="buf"):
    if not hasattr(buf, "dtype") or not hasattr(buf, "ndim"):
        raise TypeError(f"{name} must be a numpy or cupy array, got {type(buf).__name__}")
    if buf.ndim != 1:
        raise ValueError(f"{name} must be a flat (1-D) vector, got shape {buf.shape}")
    if buf.dtype != np.float32 and buf.dtype != np.float64:
        raise TypeError(f"{name} must be float32 or float64, got {buf.dtype}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name} must be contiguous")


class Comm:
    """Interface shared by both communicators."""

    rank = 0
    size = 1
    kind = "local"
    device_path = "none"
    failure_channel = None       # (communicator, its pending Idup request): MPIComm.open_failure_channel

    # -- collectives on flat vectors (in place) --------------------------------
    def allreduce_(self, buf):
        raise NotImplementedError

    def iallreduce_(self, buf):
        """Start an in-place sum-allreduce; returns an object with ``wait()``."""
        self.allreduce_(buf)
        return _Done()

    def bcast_(self, buf, root=0):
        raise NotImplementedError

    # -- small Python objects --------------------------------------------------
    def bcast_obj(self, obj, root=0):
        return obj

    def allgather_obj(self, obj):
        return [obj]

    def allreduce_scalars(self, values, op="sum"):
        """Reduce a short list of floats (float64) with sum|max|min."""
        return [float(v) for v in values]

    def barrier(self):
        pass

    def check_agreement(self, what: str, value) -> None:
        """Raise CommError on every rank unless all ranks pass the same value."""
        values = self.allgather_obj(value)
        if all(v == values[0] for v in values):
            return
        if all(isinstance(v, dict) for v in values):
            # name what differs, with every rank's value, not a hash of it all
            keys = sorted({k for v in values for k in v}, key=str)
            diff = [k for k in keys if any(v.get(k, _MISSING) != values[0].get(k, _MISSING) for v in values)]
            per_key = "; ".join(f"{k}: " + ", ".join(f"rank {r} {_short(v.get(k, '(unset)'))}"
                                                     for r, v in enumerate(values)) for k in diff)
            raise ConfigMismatch(f"ranks disagree on {what}: {per_key}; refusing to start")
        per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise ConfigMismatch(f"ranks disagree on {what} ({per_rank}); refusing to start")

    def abort(self, message: str, code: int = 1, report: bool = True):
        """Print a message naming this rank and end the whole job."""
        if report:
            from .abort import report_failure
            report_failure(self.rank, self.size, message)
        os._exit(code)

    def slice_bounds(self, n: int, rank=None):
        """Contiguous [lo, hi) of node ``rank``'s 1/N_Node share of n items."""
        r = self.rank if rank is None else rank
        base, extra = divmod(n, self.size)
        lo = r * base + min(r, extra)
        return lo, lo + base + (1 if r < extra else 0)

    def rank_map(self) -> str:
        """'rank R pid P@host' for every rank (a launcher reports dead processes
        by pid; this names their ranks)."""
        import socket
        me = (self.rank, os.getpid(), socket.gethostname())
        return ", ".join(f"rank {r} pid {p}@{h}" for r, p, h in self.allgather_obj(me))

    def describe(self, gpu: bool = False) -> str:
        """'mpi comm, rank 0 of 2' and, for GPU runs, how device vectors travel."""
        paths = {"nccl": "NCCL", "cuda-mpi": "CUDA-aware MPI", "host": "copies through host memory"}
        where = (f"GPU vectors reduced by {paths.get(self.device_path, self.device_path)}" if gpu
                 else "vectors in host memory")
        return f"{self.kind} comm, rank {self.rank} of {self.size}, {where}"


_MISSING = object()


def _short(v, n=60):
    t = repr(v)
    return t if len(t) <= n else t[:n - 3] + "..."


class _Done:
    def wait(self):
        return None


class _Pending:
    __slots__ = ("req", "pause")

    def __init__(self, req, pause=0.0):
        self.req, self.pause = req, pause

    def wait(self):
        waits.wait(self.req, self.pause)


class LocalComm(Comm):
    """One node: collectives are identities."""

    def allreduce_(self, buf):
        _check_flat(buf)
        return buf

    def bcast_(self, buf, root=0):
        return buf


def _env_seconds(name) -> float:
    text = os.environ.get(name, "").strip() or "0"
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0 <= v < float("inf"):
        from engine.errors import RunError
        raise RunError(f"must be a number of seconds >= 0, got {text!r}", name)
    return v


class MPIComm(Comm):
    kind = "mpi"

    def __init__(self, mpi_comm=None):
        from mpi4py import MPI
        self.MPI = MPI
        self.world = mpi_comm if mpi_comm is not None else MPI.COMM_WORLD
        self._comm, self._dup = self.world, None
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.thread_level = MPI.Query_thread()
        self._nccl = None
        self._owner = None
        self.device_path = "host"
        # > 0: wait for host allreduces (allreduce_, the ASGD updater's) by
        # polling with sleeps, leaving the core to the worker threads. The
        # other collectives test without sleeping (waits.wait): a timed sleep
        # between the tests of sync's per-step gradient segments and loss sums
        # made its 2-rank step on digits 1.55x slower (bench/RESULTS.md section 3).
        self.poll_interval = _env_seconds("SPRINT_MPI_POLL")

    def open_failure_channel(self):
        """Start duplicating the communicator for engine.parallel.abort.end_job,
        where the ranks that failed alike meet to end the job cleanly. Started
        without blocking, as the first collective of every rank (get_comm), so
        that a rank waiting there never waits on a rank that died or froze
        first: it gives up and aborts the job instead."""
        self.failure_channel = self.world.Idup()
        self._dup = self.world.Idup()
        import atexit
        atexit.register(self._close_failure_channel)   # runs before mpi4py's MPI_Finalize

    @property
    def comm(self):
        """The communicator of the job's collectives: a duplicate of the
        world's (started beside the failure channel), so that a collective a
        Ctrl-C left unfinished is not on MPI_COMM_WORLD, whose pending
        references MPI_Finalize reports; the world's until then."""
        if self._dup is not None:
            mc, req = self._dup
            waits.wait(req)
            self._comm, self._dup = mc, None
            unlink_mpich_segments()     # all ranks mapped it in MPI_Init: a killed job leaves none
        return self._comm

    def _close_failure_channel(self):
        """At a normal exit: complete and free the channel (MPICH complains at
        MPI_Finalize of a communicator still referenced)."""
        channel, self.failure_channel = self.failure_channel, None
        if channel is None or self.MPI.Is_finalized():
            return
        mc, req = channel
        if waits.test_until(req, time.monotonic() + 5.0):    # else a rank never got here: left to the launcher
            mc.Free()
        self.settle()

    def settle(self, seconds: float = 5.0):
        """Before MPI_Finalize: complete the duplicate behind ``comm`` when no
        collective used it yet (an Idup left pending on MPI_COMM_WORLD is
        reported at MPI_Finalize). Every rank started it, so it completes."""
        if self._dup is not None and waits.test_until(self._dup[1], time.monotonic() + seconds):
            self._comm, self._dup = self._dup[0], None

    # Only one thread may drive this communicator; the first user claims it.
    def _claim(self):
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me and self.thread_level < self.MPI.THREAD_MULTIPLE:
            raise CommError("communicator used from two threads; only the updater may call MPI")

    def allreduce_(self, buf):
        _check_flat(buf)
        self._claim()
        if _is_device_array(buf):
            return self._allreduce_device(buf)
        waits.wait(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM), self.poll_interval)
        return buf

    def iallreduce_(self, buf):
        """Start an in-place sum-allreduce of a host vector; returns a request."""
        _check_flat(buf)
        self._claim()
        if _is_device_array(buf):
            return super().iallreduce_(buf)
        return _Pending(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM))

    def bcast_(self, buf, root=0):
        _check_flat(buf)
        self._claim()
        if _is_device_array(buf):
            host = _to_host_synced(buf)
            waits.wait(self.comm.Ibcast(host, root=root))
            buf.set(host)
            return buf
        waits.wait(self.comm.Ibcast(buf, root=root))
        return buf

    def bcast_obj(self, obj, root=0):
        self._claim()
        return waits.bcast_obj(self.comm, obj, root)

    def allgather_obj(self, obj):
        self._claim()
        return waits.allgather_obj(self.comm, obj)

    def allreduce_scalars(self, values, op="sum"):
        self._claim()
        ops = {"sum": self.MPI.SUM, "max": self.MPI.MAX, "min": self.MPI.MIN}
        if op not in ops:
            raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
        a = np.asarray(values, dtype=np.float64).ravel().copy()
        waits.wait(self.comm.Iallreduce(self.MPI.IN_PLACE, a, op=ops[op]))
        return [float(v) for v in a]

    def barrier(self):
        self._claim()
        waits.wait(self.comm.Ibarrier())

    def abort(self, message: str, code: int = 1, report: bool = True):
        if report:
            from .abort import report_failure
            report_failure(self.rank, self.size, message)
        # MPI_Abort makes the launcher kill every process at once and output
        # still in the pipes can be lost: give the forwarders a moment.
        time.sleep(0.5)
        self.abort_world(code)

    def abort_world(self, code: int):
        """MPI_Abort on the world, which ends the whole job."""
        # MPICH unlinks its /dev/shm bootstrap segment only in MPI_Finalize
        unlink_mpich_segments()
        from .deathwatch import quiet
        quiet()                  # a death on purpose: the death watcher stays silent
        if not os.environ.get("SPRINT_DEBUG"):
            # every caller said its line first; MPICH's own 'Abort(1) on node 0 (rank 0 in
            # comm 0): application called MPI_Abort(...)' was a second one naming nothing new
            try:
                sys.stderr.flush()
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
            except (OSError, ValueError):
                pass
        self.world.Abort(code)
        os._exit(code)  # pragma: no cover - Abort does not return

    # -- device buffers --------------------------------------------------------
    def setup_device(self):
        """Choose how device vectors are reduced: nccl, cuda-aware mpi or host."""
        from .device_path import probe_device_path
        self.device_path = probe_device_path(self)
        return self.device_path

    def _allreduce_device(self, buf):
        import cupy
        if self.device_path == "nccl":
            stream = cupy.cuda.get_current_stream()
            nccl = cupy.cuda.nccl
            dtype = nccl.NCCL_FLOAT32 if buf.dtype == np.float32 else nccl.NCCL_FLOAT64
            self._nccl.allReduce(buf.data.ptr, buf.data.ptr, buf.size, dtype,
                                 nccl.NCCL_SUM, stream.ptr)
            stream.synchronize()
            return buf
        # MPI must never read a buffer the stream is still writing.
        cupy.cuda.get_current_stream().synchronize()
        if self.device_path == "cuda-mpi":
            self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
            return buf
        host = _to_host_synced(buf)
        self.comm.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
        buf.set(host)
        return buf


def _to_host_synced(buf):
    import cupy
    cupy.cuda.get_current_stream().synchronize()
    return cupy.asnumpy(buf)


def local_rank(comm: Comm) -> int:
    from .device_path import local_rank as _local_rank
    return _local_rank(comm)


def select_device(comm: Comm) -> int:
    from .device_path import select_device as _select_device
    return _select_device(comm)


def require_thread_level(comm: Comm, updater_is_main: bool = True) -> None:
    """The updater is the only MPI caller: FUNNELED suffices when it is the
    thread that initialised MPI, SERIALIZED otherwise."""
    if not isinstance(comm, MPIComm):
        return
    MPI = comm.MPI
    need = MPI.THREAD_FUNNELED if (updater_is_main and MPI.Is_thread_main()) else MPI.THREAD_SERIALIZED
    if comm.thread_level < need:
        raise CommError(f"MPI provides thread level {comm.thread_level}, the updater needs {need}")


_COMM = None


def get_comm() -> Comm:
    """The process-wide communicator: MPI when launched by mpiexec, else local."""
    global _COMM
    if _COMM is None:
        if launched_under_mpi():
            import mpi4py
            from engine.errors import deferring_ctrl_c
            # Ask for MULTIPLE; the updater alone calls MPI, so less is fine too.
            mpi4py.rc.thread_level = "multiple"
            with deferring_ctrl_c():      # a Ctrl-C in MPI_Init is raised once the communicator is set
                _COMM = MPIComm()
                _COMM.open_failure_channel()
        else:
            _COMM = LocalComm()
    return _COMM


