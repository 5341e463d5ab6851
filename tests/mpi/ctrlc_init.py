"""`sprint` whose ranks get their Ctrl-C at the worst moments of the start:
rank 0 inside MPI_Init (waiting there for rank 1), rank 1 while its modules
load, before it calls MPI_Init (tests/test_ctrlc_mpi.py). Run as a plain
script (not under `-m mpi4py`, which initialises MPI first):

    mpiexec -n 2 python ctrlc_init.py DIR train ...

DIR: a folder for the ranks' pid and "entering MPI_Init" files.
"""
import os
import signal
import sys
import time

folder, *argv = sys.argv[1:]
rank = os.environ["PMI_RANK"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import engine.cli as cli                                   # noqa: E402
from engine.parallel import comm as comm_mod              # noqa: E402

if rank == "0":
    real_init = comm_mod.MPIComm.__init__

    def entering(self, *a, **kw):
        with open(os.path.join(folder, "initing"), "w") as f:
            f.write(str(os.getpid()))
        return real_init(self, *a, **kw)
    comm_mod.MPIComm.__init__ = entering
else:
    real_build = cli.build_parser

    def build_parser():
        # rank 0 has reached MPI_Init, where it waits for this rank: Ctrl-C
        # reaches both (mpiexec forwards it to every rank), this one first
        path = os.path.join(folder, "initing")
        while not os.path.exists(path) or not open(path).read():
            time.sleep(0.01)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(int(open(path).read()), signal.SIGINT)
        time.sleep(0.2)
        return real_build()
    cli.build_parser = build_parser
sys.exit(cli.main(argv))
