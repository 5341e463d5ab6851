"""engine.train.train(TrainConfig(**json)) on every rank (parallel modes go to
engine.parallel.run). --override-rank R --override JSON changes rank R's
config (mismatch tests). Rank 0 prints 'RESULT {...}'."""
import argparse
import json

from engine.parallel.comm import get_comm
from engine.train import TrainConfig, train

ap = argparse.ArgumentParser()
ap.add_argument("cfg", help="TrainConfig fields as JSON")
ap.add_argument("--override-rank", type=int, default=None)
ap.add_argument("--override", default="{}")
args = ap.parse_args()

d = json.loads(args.cfg)
comm = get_comm()
if args.override_rank == comm.rank:
    d.update(json.loads(args.override))
res = train(TrainConfig(**d))
if comm.rank == 0:
    keep = {k: res.get(k) for k in ("test_acc", "test_loss", "epochs", "run_dir", "time_s", "n_node")}
    keep["stats"] = {k: v for k, v in res["stats"].items() if not isinstance(v, (list, dict))}
    print("RESULT " + json.dumps(keep), flush=True)
