"""A pipeline training run on digits under mpiexec, as ``sprint train
--parallel pipeline`` does it; rank 0 prints one JSON line of results.

Usage: mpiexec -n K python -m mpi4py tests/mpi/pipeline_train.py '<json>'
where the JSON holds "cfg" (TrainConfig fields), optionally "save" (an .npy
path for the final weights) and "ref": true (rank 0 also trains the same
config in one process and reports the largest weight difference) and
"rank1" (fields rank 1 alone changes: a mismatched job).
"""
import json
import sys

import numpy as np

from engine.parallel.pipeline_run import run
from engine.train import TrainConfig

job = json.loads(sys.argv[1])
kw = dict(job["cfg"])
kw.setdefault("progress", False)
kw.setdefault("verbose", False)
if job.get("rank1"):
    from engine.parallel.comm import get_comm
    if get_comm().rank == 1:        # a rank started with other options
        kw.update(job["rank1"])
        kw["extra"] = dict(job["cfg"].get("extra", {}), **job["rank1"].get("extra", {}))
res = run(TrainConfig(**kw))
if res["rank"] == 0:
    st = res["stats"]
    w = res["net"].params
    out = {"test_acc": res["test_acc"], "epochs": res["epochs"],
           "history": [h["test_acc"] for h in res["history"]],
           "per_stage": [{k: s.get(k) for k in ("stage", "layers", "bubble", "err_stale_mean", "err_hat_mean",
                                                "err_ratio", "n_trace")} | {"n_trace": len(s["trace"])}
                         for s in st["per_stage"]]}
    if job.get("save"):
        np.save(job["save"], w)
    if job.get("ref"):
        from engine.train import train
        ref = dict(kw, resume=None, out=None, extra={})
        r = train(TrainConfig(**ref))
        out["ref_test_acc"] = r["test_acc"]
        out["ref_max_diff"] = float(np.abs(r["net"].params - w).max())
    print("PIPE RUN " + json.dumps(out), flush=True)
