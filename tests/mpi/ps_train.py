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
if os.environ.get("SPRINT_TEST_KILL"):
    # "RANK:N": that rank SIGKILLs itself at its N-th slice gradient or slice push (fault tests)
    from mpi4py import MPI
    from engine.parallel import sandblaster, sandblaster_replica
    rank, after = map(int, os.environ["SPRINT_TEST_KILL"].split(":"))
    if MPI.COMM_WORLD.Get_rank() == rank:
        for cls, name in ((sandblaster_replica.SliceSource, "__call__"), (sandblaster.SandShard, "_on_push")):
            def killer(self, *a, _f=getattr(cls, name), _n=[0]):
                _n[0] += 1
                if _n[0] == after:
                    os.kill(os.getpid(), signal.SIGKILL)
                return _f(self, *a)
            setattr(cls, name, killer)
mod = {"downpour": "downpour", "sandblaster": "sandblaster_replica"}[strategy]
d.setdefault("parallel", strategy)
res = importlib.import_module(f"engine.parallel.{mod}").run(TrainConfig(**d))
if res["rank"] == 0:
    keep = {k: res.get(k) for k in ("test_acc", "test_loss", "epochs", "run_dir", "time_s")}
    keep["history"] = [{k: h[k] for k in ("epoch", "test_acc")} for h in res["history"]]
    keep["stats"] = {k: v for k, v in res["stats"].items() if not isinstance(v, (list, dict))}
    print("RESULT " + json.dumps(keep), flush=True)
