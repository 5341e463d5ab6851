"""What the MPI launcher (mpiexec, srun) tells a process about its job,
read from the environment it sets for every rank, so that the CLI can ask
before MPI is initialised: whether there is a job, its size and this
process's rank."""
from __future__ import annotations

import os
import sys

# Environment variables set by the common launchers for every rank.
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                  "MPI_LOCALNRANKS", "HYDI_CONTROL_FD", "PMI_FD")


def launched_under_mpi() -> bool:
    """True when an MPI launcher started this process (or MPI is already up)."""
    if os.environ.get("SPRINT_NO_MPI"):
        return False
    if any(v in os.environ for v in _LAUNCHER_VARS):
        return True
    mod = sys.modules.get("mpi4py.MPI")
    return bool(mod is not None and mod.Is_initialized())


def launcher_world_size() -> int:
    """How many ranks the launcher started (1 without one)."""
    if not launched_under_mpi():
        return 1
    n = world_size_said()
    if n is not None:
        return n
    from .comm import get_comm
    return get_comm().size


def world_size_said() -> int | None:
    """The job's size as the launcher's environment says it, without
    initialising MPI; None when it does not say."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return None


def launcher_rank() -> int:
    """This process's rank as the launcher numbered it (0 without one),
    read from its environment so that MPI need not be initialised."""
    if not launched_under_mpi():
        return 0
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    from .comm import get_comm
    return get_comm().rank


def unlink_mpich_segments(maps: str = "/proc/self/maps") -> list:
    """Unlink the named MPICH shared-memory files this process maps (Linux)
    and return their paths. MPICH removes its node bootstrap segment only in
    MPI_Finalize, so a job ended by MPI_Abort or a kill leaves it in
    /dev/shm; the memory stays valid for the processes that map it."""
    try:
        with open(maps) as f:
            paths = sorted({ln.split()[-1] for ln in f if len(ln.split()) >= 6})
    except OSError:
        return []
    paths = [p for p in paths if p.startswith("/dev/shm/mpich_shm_")]
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass                    # a peer on this node got there first
    return paths
