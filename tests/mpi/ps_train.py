"""A parameter-server strategy (downpour | sandblaster) trained from a
TrainConfig given as JSON on every rank. Rank 0 prints 'RESULT {...}'.

Usage: mpiexec -n S+R python -m mpi4py tests/mpi/ps_train.py STRATEGY JSON
"""
import importlib
import json
import sys

from engine.train import TrainConfig

strategy, d = sys.argv[1], json.loads(sys.argv[2])
res = importlib.import_module(f"engine.parallel.{strategy}").run(TrainConfig(**d))
if res["rank"] == 0:
    keep = {k: res.get(k) for k in ("test_acc", "test_loss", "epochs", "run_dir", "time_s")}
    keep["history"] = [{k: h[k] for k in ("epoch", "test_acc")} for h in res["history"]]
    keep["stats"] = {k: v for k, v in res["stats"].items() if not isinstance(v, (list, dict))}
    print("RESULT " + json.dumps(keep), flush=True)
