"""`sprint` whose ranks all get a Ctrl-C at the K-th call of a named
function, and rank R's lands in a __del__ where Python drops its
KeyboardInterrupt ("Exception ignored"), as it does in an import lock's
callback (tests/test_ctrlc_mpi.py). A rank says 'MPI_Abort called' before
it calls MPI_Abort (said_abort.py).

    mpiexec -n N python -m mpi4py ctrlc_dropped.py R MODULE:OBJ.ATTR K train ...
"""
import importlib
import os
import signal
import sys
import time

from mpi4py import MPI

import said_abort  # noqa: F401  (a rank says so before it calls MPI_Abort)

rank, target, k, *argv = sys.argv[1:]
dropper = MPI.COMM_WORLD.Get_rank() == int(rank)
module, path = target.split(":")
owner = importlib.import_module(module)
*outer, name = path.split(".")
for part in outer:
    owner = getattr(owner, part)
real, calls = getattr(owner, name), [0]


class _Dropped:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)               # the handler runs in here: Python drops its KeyboardInterrupt


def ctrl_c_here(*a, **kw):
    calls[0] += 1
    if calls[0] == int(k):
        if dropper:
            _Dropped()                # made and collected at once
            print("dropped", flush=True)
        else:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    return real(*a, **kw)


setattr(owner, name, ctrl_c_here)

from engine.cli import main  # noqa: E402

sys.exit(main(argv))
