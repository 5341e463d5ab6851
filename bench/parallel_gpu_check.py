"""GPU check of SPRINT ASGD: 1 vs 2 workers on ONE GPU (each worker its own
CUDA stream), cifar net, synthetic data. For bench/gpu_check.sh:

    python bench/parallel_gpu_check.py --seconds 20

Prints one JSON line per configuration and fails (exit 1) if a run made no
update, produced a non-finite loss, or the weights are not finite.
"""
import argparse
import json
import math
import sys

import numpy as np

from parallel_bench import synthetic_cifar  # noqa: E402  (bench/ is on sys.path when run as a script)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    from engine import backend
    backend.set_backend("gpu")
    from engine.data import DeformConfig, Loader
    from engine.net import Net
    from engine.parallel.asgd import ASGD, ASGDConfig
    from engine.parallel.runner import NetSource
    ds = synthetic_cifar(4096)
    deform = DeformConfig(out_hw=(32, 32)).with_stats(ds)
    ok, rates = True, {}
    for workers in (1, 2):
        nets = [Net("cifar", seed=0) for _ in range(workers)]
        srcs = [NetSource(n, Loader(ds, args.batch, deform=deform, prefetch=0, rank=t, world=workers), gpu=True)
                for t, n in enumerate(nets)]
        a = ASGD(None, nets[0].params, srcs, ASGDConfig(lr=0.001, momentum=0.9, max_seconds=args.seconds)).run()
        st = a.stats({"n_subbatch": args.batch})
        w = backend.to_host(a.latest)
        rates[workers] = st["samples"] / st["wall_s"]
        row = {"check": "asgd_gpu", "workers": workers, "images_per_s": rates[workers], "updates": st["updates"],
               "T_GPU": st["T_GPU"], "T_Update": st["T_Update"], "N_Minibatch_avg": st["N_Minibatch_avg"],
               "staleness_mean": st["staleness_mean"], "worker_wait_share": st["worker_wait_share"],
               "last_loss": a.last_loss, "weights_finite": bool(np.isfinite(w).all())}
        print(json.dumps(row), flush=True)
        ok &= st["updates"] > 0 and math.isfinite(a.last_loss) and row["weights_finite"]
    print(json.dumps({"check": "asgd_gpu_two_streams_speedup", "ratio": rates[2] / rates[1]}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
