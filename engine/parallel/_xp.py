"""Array-module helpers shared by the trainers (numpy on CPU, cupy on GPU)."""
from __future__ import annotations

import numpy as np


def array_module(a):
    """numpy or cupy, whichever owns ``a`` (cupy is imported only if it does)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


def device_sync(xp) -> None:
    """Wait for the calling thread's stream; a no-op on the CPU.

    Buffers change hands between threads (worker -> updater -> MPI) and each
    thread has its own stream, so a hand-over must not race pending copies."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)
