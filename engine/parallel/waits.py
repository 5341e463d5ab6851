"""Waiting for an MPI collective in Python, between tests of its request,
instead of inside MPI_Wait. Ctrl-C under mpiexec reaches every rank, but a
rank blocked in MPI's C wait for a peer that the signal stopped elsewhere (rank
0 writing the checkpoint the others wait for) never returns to Python to see
it: the job then ended in MPI_Abort and MPICH's 'Abort(130)' line instead of
the ranks meeting to end it (engine.parallel.abort.abort_once). The object
collectives pickle into byte buffers for the same reason (mpi4py's
bcast/allgather of objects block in C)."""
from __future__ import annotations

import os
import pickle
import time

import numpy as np

from engine.errors import raise_if_ctrl_c


def wait(req, pause: float = 0.0) -> None:
    """Complete ``req``; between tests sleep ``pause`` seconds (0: only
    yield the core and the interpreter to other threads). A Ctrl-C that
    Python dropped on this rank is raised here (engine.errors.raise_if_ctrl_c):
    its peers stopped, and this rank would wait for them."""
    if pause > 0:
        while not req.Test():
            raise_if_ctrl_c()
            time.sleep(pause)
        return
    # os.sched_yield, not time.sleep(0): both release the GIL, but
    # sleep(0) is a timed sleep that lasts the kernel's timer slack (69 us
    # here), and MPICH moves a non-blocking collective on only inside Test:
    # with it the 2-rank sync step on digits ran 1.55x slower than the C
    # wait it replaced (bench/RESULTS.md section 3)
    while not req.Test():
        raise_if_ctrl_c()
        os.sched_yield()


def test_until(req, deadline: float, pause: float = 0.01) -> bool:
    """``wait`` bounded: poll ``req`` until it completes (True) or
    time.monotonic() passes ``deadline`` (False), for a wait that must not
    hang on a rank that will not come."""
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
    return True


def bcast_obj(mc, obj, root: int = 0, pause: float = 0.0):
    """mpi4py's ``mc.bcast(obj, root)``, interruptible."""
    from mpi4py import MPI
    n = np.zeros(1, np.int64)
    if mc.Get_rank() == root:
        blob = np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), np.uint8)
        n[0] = blob.size
    wait(mc.Ibcast([n, MPI.INT64_T], root=root), pause)
    if mc.Get_rank() != root:
        blob = np.empty(int(n[0]), np.uint8)
    wait(mc.Ibcast([blob, MPI.BYTE], root=root), pause)
    return obj if mc.Get_rank() == root else pickle.loads(blob.tobytes())


def allgather_obj(mc, obj, pause: float = 0.0) -> list:
    """mpi4py's ``mc.allgather(obj)``, interruptible."""
    from mpi4py import MPI
    blob = np.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), np.uint8)
    sizes = np.zeros(mc.Get_size(), np.int64)
    wait(mc.Iallgather([np.array([blob.size], np.int64), MPI.INT64_T], [sizes, MPI.INT64_T]), pause)
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    every = np.empty(int(sizes.sum()), np.uint8)
    wait(mc.Iallgatherv([blob, MPI.BYTE], [every, (sizes.tolist(), displs.tolist()), MPI.BYTE]), pause)
    return [pickle.loads(every[d:d + s].tobytes()) for d, s in zip(displs, sizes)]
