"""`sprint` whose rank R stalls in the K-th call of a named function (it
prints 'stalled' and sleeps), so that the other ranks sit waiting for it in
MPI when Ctrl-C comes (tests/test_ctrlc_mpi.py). A rank says 'MPI_Abort
called' before it calls MPI_Abort (said_abort.py).

    mpiexec -n N python -m mpi4py ctrlc_stall.py R MODULE:OBJ.ATTR K train ...
"""
import importlib
import sys
import time

from mpi4py import MPI

import said_abort  # noqa: F401  (a rank says so before it calls MPI_Abort)

rank, target, k, *argv = sys.argv[1:]
if MPI.COMM_WORLD.Get_rank() == int(rank):
    module, path = target.split(":")
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    real, calls = getattr(owner, name), [0]

    def stalled(*a, **kw):
        calls[0] += 1
        if calls[0] == int(k):
            print("stalled", flush=True)
            time.sleep(60)            # until the Ctrl-C
        return real(*a, **kw)

    setattr(owner, name, stalled)

from engine.cli import main  # noqa: E402

sys.exit(main(argv))
