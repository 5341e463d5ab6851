"""`sprint` whose ranks believe they run on the hosts named, one name a rank:
a job across hosts on one machine (tests/test_deathwatch_mpi.py).

    mpiexec -n N python hosts.py NAME0,NAME1,... train ...

Each name must resolve to this machine ('localhost', '127.0.0.1'): rank 0
routes the watcher's TCP address toward them as toward real hosts."""
import os
import runpy
import socket
import sys

names, *argv = sys.argv[1:]
name = names.split(",")[int(os.environ["PMI_RANK"])]
socket.gethostname = lambda: name
sys.argv = ["sprint", *argv]
runpy.run_module("engine.cli", run_name="__main__", alter_sys=True)
