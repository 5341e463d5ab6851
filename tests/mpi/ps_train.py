"""A parameter-server strategy (downpour | sandblaster) trained from a
TrainConfig given as JSON on every rank. Rank 0 prints 'RESULT {...}'.

Usage: mpiexec -n S+R python -m mpi4py tests/mpi/ps_train.py STRATEGY JSON
"""
import importlib
import json
import os
import signal
import sys

from engine.train import TrainConfig

strategy, d = sys.argv[1], json.loads(sys.argv[2])
if os.environ.get("SPRINT_TEST_OVERRIDE"):
    # "RANK:JSON": that rank starts with other options (agreement tests)
    from mpi4py import MPI
    rank, more = os.environ["SPRINT_TEST_OVERRIDE"].split(":", 1)
    if MPI.COMM_WORLD.Get_rank() == int(rank):
        d.update(json.loads(more))
if os.environ.get("SPRINT_TEST_FAULT"):
    # "RANK:N:HOW": at its N-th step (a replica's gradient, a server's push)
    # that rank SIGKILLs itself (kill), freezes with SIGSTOP (stop), or its
    # main thread sleeps forever while its threads run (hang)
    import time
    from mpi4py import MPI
    from engine.parallel import downpour, runner, sandblaster, sandblaster_replica
    rank, after, how = os.environ["SPRINT_TEST_FAULT"].split(":")
    rank, after = int(rank), int(after)

    def fault():
        print(f"FAULT {how} PID {os.getpid()}", flush=True)
        if how == "hang":
            time.sleep(1e6)
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)

    if MPI.COMM_WORLD.Get_rank() == rank:
        count = [0]
        for cls, name in ((sandblaster_replica.SliceSource, "__call__"), (sandblaster.SandShard, "_on_push"),
                          (runner.NetSource, "compute"), (downpour.DownpourServer, "_apply")):
            def hooked(self, *a, _f=getattr(cls, name)):
                count[0] += 1
                if count[0] == after:
                    fault()
                return _f(self, *a)
            setattr(cls, name, hooked)
mod = {"downpour": "downpour_run", "sandblaster": "sandblaster_replica"}[strategy]
d.setdefault("parallel", strategy)
res = importlib.import_module(f"engine.parallel.{mod}").run(TrainConfig(**d))
if res["rank"] == 0:
    keep = {k: res.get(k) for k in ("test_acc", "test_loss", "epochs", "run_dir", "time_s")}
    keep["history"] = [{k: h[k] for k in ("epoch", "test_acc")} for h in res["history"]]
    keep["stats"] = {k: v for k, v in res["stats"].items() if not isinstance(v, (list, dict))}
    print("RESULT " + json.dumps(keep), flush=True)
