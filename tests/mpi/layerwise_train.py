"""A layer-wise training run (engine.parallel.layerwise_run.run, as ``sprint
train --parallel layerwise`` does it) under mpiexec; rank 0 prints one JSON line.

Usage: mpiexec -n N python -m mpi4py tests/mpi/layerwise_train.py '<json>'
where the JSON holds "cfg" (TrainConfig fields, extra.plan a plan file),
optionally "save" (an .npy path for the final whole weights and velocity)
and "fault": raise | kill | freeze -- rank 1 raises, SIGKILLs or SIGSTOPs
itself at its 3rd step; the job must end naming it.
"""
import json
import os
import signal
import sys

import numpy as np

from engine.parallel import layerwise as LW
from engine.parallel.comm import get_comm
from engine.parallel.layerwise_run import run
from engine.train import TrainConfig

job = json.loads(sys.argv[1])
kw = dict(job["cfg"])
kw.setdefault("progress", False)
kw.setdefault("verbose", False)
fault = job.get("fault")
if fault and get_comm().rank == 1:
    real_step, calls = LW.LayerwiseExecutor.step, [0]

    def faulty_step(self, x, y):
        calls[0] += 1
        if calls[0] == 3:
            if fault == "raise":
                raise RuntimeError("injected failure in layer-wise step 3")
            os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        return real_step(self, x, y)
    LW.LayerwiseExecutor.step = faulty_step
res = run(TrainConfig(**kw))
if fault:
    print("UNEXPECTED: the fault did not stop the job", flush=True)
if res["rank"] == 0:
    if job.get("save"):
        np.save(job["save"], np.stack([res["net"].params, res["executor"].whole(res["optimizer"].velocity)]))
    else:
        res["executor"].whole(res["optimizer"].velocity)
    print("LW RUN " + json.dumps({"epochs": res["epochs"], "history": res["history"], "stats": res["stats"]}),
          flush=True)
else:
    res["executor"].whole(res["optimizer"].velocity)     # collective: every rank takes part
