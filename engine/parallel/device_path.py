"""Which GPU each rank uses and how device vectors are reduced between
ranks (NCCL, CUDA-aware MPI or copies through host memory): decided by all
ranks together, so that their collectives match."""
from __future__ import annotations

import os


def probe_device_path(comm) -> str:
    forced = os.environ.get("SPRINT_DEVICE_ALLREDUCE")
    if forced in ("nccl", "cuda-mpi", "host"):
        choice = forced
    else:
        choice = "host"
        # NCCL needs one GPU per rank; a failed NcclCommunicator on one rank
        # would leave the others in its collective init, so all ranks decide
        # together from where everybody's device is.
        places = comm.comm.allgather(_device_place())
        if len(set(places)) == len(places) and _nccl_usable(comm):
            choice = "nccl"
        elif _mpi_cuda_aware(comm):
            choice = "cuda-mpi"
        # All ranks must take the same path or the collectives would not match.
        choices = comm.comm.allgather(choice)
        if any(c != choices[0] for c in choices):
            choice = "host"
    if choice == "nccl" and comm._nccl is None and not _nccl_usable(comm):
        raise _comm_error("SPRINT_DEVICE_ALLREDUCE=nccl but NCCL could not be initialised")
    return choice


def local_rank(comm) -> int:
    """This rank's index among the ranks of its host (launcher variables)."""
    for var in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return comm.rank


def select_device(comm) -> int:
    """Give each rank of a host its own GPU when there are enough (round robin)."""
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    dev = local_rank(comm) % max(1, n)
    cupy.cuda.Device(dev).use()
    return dev


def _device_place():
    import socket
    try:
        import cupy
        return (socket.gethostname(), int(cupy.cuda.runtime.getDevice()))
    except Exception:
        return (socket.gethostname(), -1)


def _nccl_usable(comm) -> bool:
    try:
        from cupy.cuda import nccl
        uid = nccl.get_unique_id() if comm.rank == 0 else None
        uid = comm.comm.bcast(uid, root=0)
        comm._nccl = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        return True
    except Exception:
        comm._nccl = None
        return False


def _mpi_cuda_aware(comm) -> bool:
    query = getattr(comm.MPI, "Query_cuda_support", None)
    try:
        return bool(query()) if query is not None else False
    except Exception:
        return False


def _comm_error(msg):
    from .comm import CommError
    return CommError(msg)
